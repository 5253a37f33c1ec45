"""git's and hg's per-user config beside ~/.gitconfig and ~/.hgrc (F-SET-5).

git reads ``~/.config/git/config`` and hg ``~/.config/hg/hgrc`` (or the same below
``$XDG_CONFIG_HOME``) in every repository, and their hooks, ``core.fsmonitor`` and
extensions run commands: with the home writable, none may be edited or made, in
any way, as root and as an unprivileged user. Each attack plants a command, and
``git status`` and ``hg status`` on the host afterwards must run none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import World
from sandhold.policy.mandatory import HOME_PATHS, USER_CONFIG_FILES, home_paths, user_config_paths

pytestmark = pytest.mark.sandbox

GIT = "[core]\\n\\tfsmonitor = touch {mark}; false #\\n"
HG = "[hooks]\\npre-status = touch {mark}\\n"


def _under(*bases: str) -> tuple[str, ...]:
    return tuple(f"{b}/{rel}" for b in bases for rel, _ in USER_CONFIG_FILES)


@pytest.mark.parametrize(
    ("home", "xdg", "jj_config", "expected"),
    [
        ("/h", None, None, _under("/h/.config")),
        ("/h/", "", "", _under("/h/.config")),
        ("/h", "relative/x", None, _under("/h/.config")),
        ("/h", "/x/../y", None, _under("/h/.config")),
        ("/h", "//cfg/./", None, _under("/h/.config", "/cfg")),
        ("/h", "/h/.config", None, _under("/h/.config")),
        # $JJ_CONFIG: files or directories jj reads instead; relative ones, '..' and
        # '/' are not guessed at
        ("/h", None, "/d/jj.toml", (*_under("/h/.config"), "/d/jj.toml")),
        (
            "/h",
            None,
            "/d/a.toml::rel.toml:/d/../x:/:/d/conf.d/",
            (*_under("/h/.config"), "/d/a.toml", "/d/conf.d"),
        ),
        ("/h", None, "/h/.config/jj", _under("/h/.config")),  # said once
    ],
)
def test_user_config_paths(
    home: str, xdg: str | None, jj_config: str | None, expected: tuple[str, ...]
) -> None:
    got = user_config_paths(home, xdg, jj_config)
    assert tuple(p for p, _ in got) == expected
    assert all(origin.startswith("mandatory: ") for _, origin in got)
    # among them, what a writable home must not let the sandbox plant
    must = {"git/config", "jj", "systemd", "autostart", "fish"}
    assert {f"/h/.config/{m}" for m in must} <= dict(got).keys()


def test_home_paths() -> None:
    got = dict(home_paths("/h/"))
    assert tuple(got) == tuple(f"/h/{rel}" for rel, _ in HOME_PATHS)
    # the directories of $PATH below the home, as absolute and plain as git spells them
    # every absolute directory of $PATH, ~ expanded as a shell does: where each leads is
    # the plan's to resolve (fsplan.ungranted keeps those below a writable home)
    path = "/usr/bin:/h/go/bin:rel/bin::/h/x/../y:/h:/h/:~:~/tools:/hh/bin:/h/go/bin"
    extra = [p for p in dict(home_paths("/h", path)) if p not in got]
    assert extra == ["/usr/bin", "/h/go/bin", "/h/x/../y", "/h/tools", "/hh/bin"]
    must = {".local/bin", "bin", ".local/lib", ".ssh", ".aws", ".kube", ".cargo/config.toml"}
    assert {f"/h/{m}" for m in must} <= got.keys()
    assert all(origin.startswith("home: ") for origin in got.values())


def _host(world: World, argv: list[str], cwd: Path, **env: str) -> None:
    r = world.ident.run(argv, cwd=cwd, env=world.env(**env))
    assert r.returncode == 0, r.stderr


def test_user_config_of_git_and_hg_cannot_be_planted(world: World) -> None:
    home = world.home
    mark = world.root / "PWNED"
    project = world.mkdir("home/proj")
    other = world.mkdir("elsewhere/git")  # a config made outside, to link to
    (other / "config").write_text(GIT.format(mark=mark).replace("\\n", "\n").replace("\\t", "\t"))
    world.ident.chown(other / "config")
    world.mkfile("home/.config/git/config", "[user]\n\tname = t\n")  # an existing one
    xdg = world.mkdir("home/xdg")
    _host(world, ["git", "init", "-q", "."], project)
    _host(world, ["hg", "init"], project, HGRCPATH="")
    # ~/.config granted by name (else a writable home's dot entries stay read-only)
    s = world.settings({"filesystem": {"allowWrite": ["~", "~/.config"]}})
    script = (
        f"printf '{GIT.format(mark=mark)}' >> ~/.config/git/config; echo git=$?; "
        f"mkdir -p ~/.config/hg && printf '{HG.format(mark=mark)}' > ~/.config/hg/hgrc; "
        "echo hg=$?; "
        f"mv ~/.config/git ~/.config/git2; echo move=$?; "
        f"ln -s {other} ~/xdg/git; echo link=$?; "
        f"mkdir -p ~/xdg/hg && printf '{HG.format(mark=mark)}' > ~/xdg/hg/hgrc; echo xdg=$?; "
        "echo fine > ~/.config/other; echo other=$?"
    )
    r = world.sandhold(
        "-s",
        str(s),
        "--",
        "sh",
        "-c",
        script,
        cwd=project,
        env=world.env(XDG_CONFIG_HOME=str(xdg)),
    )
    assert r.stdout.split() == ["git=2", "hg=2", "move=1", "link=1", "xdg=2", "other=0"], r.stderr
    assert (home / ".config/git/config").read_text() == "[user]\n\tname = t\n"
    assert not (home / ".config/hg/hgrc").exists() and not (xdg / "hg/hgrc").exists()
    assert not (xdg / "git").is_symlink()
    for env in ({}, {"XDG_CONFIG_HOME": str(xdg)}):
        _host(world, ["git", "status", "--short"], project, **env)
        _host(world, ["hg", "status"], project, **env)
    assert not mark.exists()


def test_a_writable_home_keeps_what_the_host_runs_from_it(world: World) -> None:
    """With the home writable, the places a login, a shell, PATH, Python, ssh and the
    tools' credential helpers run or source from cannot be planted, made or moved."""
    home = world.home
    mark = world.root / "PWNED"
    world.mkfile("home/.ssh/config", "Host *\n")
    world.mkfile("home/.local/bin/tool", "#!/bin/sh\n")
    world.mkfile("home/.bashrc", "[ -f ~/.bash_aliases ] && . ~/.bash_aliases\n")
    s = world.settings({"filesystem": {"allowWrite": ["~"]}})
    plant = f"touch {mark}"
    attempts = {
        "aliases": f"echo '{plant}' > ~/.bash_aliases",
        "bin": "printf '#!/bin/sh\\n' > ~/.local/bin/git",
        "bin_tool": "echo x >> ~/.local/bin/tool",
        "home_bin": "mkdir -p ~/bin",
        "pth": "mkdir -p ~/.local/lib/python3.11/site-packages",
        "ssh": "echo '  ProxyCommand sh -c x' >> ~/.ssh/config",
        "ssh_move": "mv ~/.ssh ~/.ssh-old",
        "aws": "mkdir -p ~/.aws && echo '[default]' > ~/.aws/config",
        "systemd": "mkdir -p ~/.config/systemd/user",
        "autostart": "mkdir -p ~/.config/autostart",
        "fish": "mkdir -p ~/.config && mv ~/.local ~/.config/fish",
        "vimrc": "echo x > ~/.vimrc",
        "cargo": "mkdir -p ~/.cargo && echo x > ~/.cargo/config.toml",
        "claude": "echo '{}' > ~/.claude.json",
        "on_path": "printf '#!/bin/sh\\n' > ~/go/bin/git",
        "cargo_env": "mkdir -p ~/.cargo && echo x >> ~/.cargo/env",
        "exrc": "echo '!touch x' > ~/.exrc",
        "lesskey": "printf '#env\\nLESSOPEN=|x\\n' > ~/.lesskey",
        "nvm": "mkdir -p ~/.nvm && echo x > ~/.nvm/nvm.sh",
        "other": "echo fine > ~/notes.txt && mkdir -p ~/.cache/pip ~/projects/x",
    }
    script = "; ".join(f"({cmd}) 2>/dev/null; echo {name}=$?" for name, cmd in attempts.items())
    world.mkdir("home/go/bin")
    path = f"{home}/go/bin:{world.env()['PATH']}"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=home, env=world.env(PATH=path))
    got = dict(line.split("=") for line in r.stdout.split())
    assert got.pop("other") == "0", r.stdout
    assert "0" not in got.values(), got
    assert (home / ".ssh/config").read_text() == "Host *\n"
    assert (home / ".local/bin/tool").read_text() == "#!/bin/sh\n"
    made_names = (".bash_aliases", ".local/bin/git", "bin", ".local/lib", ".aws", ".vimrc")
    for made in (*made_names, "go/bin/git", ".cargo/env", ".exrc", ".lesskey", ".nvm"):
        assert not (home / made).exists(), made
    assert not (home / ".config/systemd").exists() and not (home / ".config/fish").exists()
    assert not (home / ".ssh-old").exists() and not (home / ".claude.json").exists()
    # the host's next interactive shell sources nothing the sandbox wrote
    world.ident.run(["bash", "-ic", "true"], cwd=home, env=world.env(HOME=str(home)))
    assert not mark.exists()


def test_a_file_granted_inside_a_home_place_opens_only_itself(world: World) -> None:
    """``allowWrite: ["~", "~/.ssh/known_hosts"]`` (git over ssh) lets that file be
    written, not ``~/.ssh/config`` beside it; and a $PATH directory below the home is
    protected however $PATH spells it (through a symlink to the home, or ``~/``)."""
    home = world.home
    world.mkfile("home/.ssh/known_hosts", "old\n")
    world.mkfile("home/.ssh/config", "Host *\n")
    world.mkdir("home/tools")
    world.mkdir("home/tools2")
    link = world.symlink("homelink", str(home))
    s = world.settings({"filesystem": {"allowWrite": ["~", "~/.ssh/known_hosts"]}})
    script = (
        "echo new >> ~/.ssh/known_hosts; echo known=$?; "
        "echo '  ProxyCommand x' >> ~/.ssh/config; echo config=$?; "
        "echo k > ~/.ssh/authorized_keys; echo keys=$?; "
        "printf '#!/bin/sh\\n' > ~/tools/git; echo linked=$?; "
        "printf '#!/bin/sh\\n' > ~/tools2/git; echo tilde=$?"
    )
    path = f"{link}/tools:~/tools2:{world.env()['PATH']}"
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=home, env=world.env(PATH=path))
    assert r.stdout.split() == ["known=0", "config=2", "keys=2", "linked=2", "tilde=2"], r.stderr
    assert (home / ".ssh/known_hosts").read_text() == "old\nnew\n"
    assert (home / ".ssh/config").read_text() == "Host *\n"
    assert not (home / ".ssh/authorized_keys").exists()
    assert not (home / "tools/git").exists() and not (home / "tools2/git").exists()


def test_the_same_holds_for_a_sandboxport_bind_of_the_home(world: World) -> None:
    from portdriver import drive

    mark = world.root / "PWNED"
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(bind_mounts=(SandboxBindMount(HOME),)))
            r = await port.run(h, "echo x > $HOME/.inputrc; echo $?; mkdir -p $HOME/.config/git && "
                "printf '{GIT.format(mark=mark)}' > $HOME/.config/git/config; echo $?")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "2\n1\n"  # a writable home's dot names are not made
    assert not (world.home / ".config/git/config").exists()
    assert not (world.home / ".inputrc").exists()


def test_no_repository_inside_a_repository_the_sandbox_cannot_see(world: World) -> None:
    """A denyRead (CLI) or a bind of a subdirectory (SandboxPort) hides the repository
    a writable root lies in; the supervisor still refuses a new one inside it, which
    git on the host would use there instead of the user's (its config the sandbox's)."""
    from portdriver import drive

    mono = world.mkdir("home/mono")
    svc = world.mkdir("home/mono/svc")
    _host(world, ["git", "init", "-q", "."], mono)
    s = world.settings({"filesystem": {"denyRead": ["~"], "allowRead": ["."], "allowWrite": ["."]}})
    script = (
        "ls -A ..; git init -q . 2>/dev/null; echo git=$?; "
        "mkdir d && cd d && git init -q .; echo sub=$?"
    )
    r = world.sandhold("-s", str(s), "--", "sh", "-c", script, cwd=svc)
    assert r.stdout.split() == ["svc", "git=1", "sub=1"], r.stderr
    out = drive(
        world,
        f"""
        async def main(port):
            h = await port.launch(spec(bind_mounts=(SandboxBindMount("{svc}"),)))
            r = await port.run(h, "git init -q . 2>/dev/null; echo $?")
            OUT["r"] = r.stdout.decode()
            await port.destroy(h)
        """,
    )
    assert out["r"] == "1\n"
    assert sorted(p.name for p in svc.iterdir()) == ["d"]
