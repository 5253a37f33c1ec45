"""policy/dispatch.py as tables: what sandbox a server run gets."""

from __future__ import annotations

import pytest

from sandhold.policy.dispatch import (
    DispatchError,
    HostOffer,
    RunRequest,
    choose_run_backend,
    plan_run,
    repo_path_problem,
    run_credentials_problem,
)

ON = HostOffer(native_available=True, native_note="bubblewrap")
OFF = HostOffer(native_available=True, native_note="bubblewrap", switch="off")
MISSING = HostOffer(
    native_available=False,
    native_note="bubblewrap is not installed",
    native_hint="apt-get install bubblewrap",
)
REPOS = ("/w/a", "/w/b")


@pytest.mark.parametrize(
    ("requested", "offer", "expected"),
    [
        (None, ON, "native"),
        (None, OFF, "none"),
        (None, MISSING, "none"),
        ("native", ON, "native"),
        ("none", ON, "none"),
        ("none", OFF, "none"),
        ("native", OFF, "--sandbox off"),
        ("native", MISSING, "not available"),
        ("microvm", ON, "microVM"),
        ("microvm", MISSING, "microVM"),
        ("kvm", ON, "backend must be"),
    ],
)
def test_backend(requested: str | None, offer: HostOffer, expected: str) -> None:
    if expected in ("native", "none"):
        assert choose_run_backend(requested, offer) == expected
    else:
        with pytest.raises(DispatchError) as exc:
            choose_run_backend(requested, offer)
        assert expected.lower() in exc.value.message.lower() or expected in exc.value.message
        assert 400 <= exc.value.status < 500


@pytest.mark.parametrize(
    ("mode", "writable"),
    [("chat", True), ("review", False), ("plan", False), ("orchestrate", False)],
)
def test_only_chat_writes_its_checkout_and_registered_ones_are_always_protected(
    mode: str, writable: bool
) -> None:
    plan = plan_run(RunRequest(mode=mode, network="allow"), REPOS, ON)
    assert plan.checkout_writable is writable
    assert plan.protected_paths == REPOS and plan.read_only_binds == REPOS
    assert plan.repo == "/w/a"


@pytest.mark.parametrize(
    ("network", "enabled", "ask"),
    [("allow", True, False), ("ask", True, True), ("deny", False, False)],
)
def test_network(network: str, enabled: bool, ask: bool) -> None:
    plan = plan_run(RunRequest(mode="chat", network=network), REPOS, ON)
    assert (plan.network_enabled, plan.ask) == (enabled, ask)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (RunRequest(mode="chat", network="deny", egress_allowlist=("x.com",)), "invalid_body"),
        (RunRequest(mode="review", network="allow", push="allow"), "invalid_body"),
        (RunRequest(mode="chat", network="allow", repo="/w/c"), "unknown_repo"),
        (RunRequest(mode="chat", network="allow", repo="/w/a/"), "unknown_repo"),
        (RunRequest(mode="yolo", network="allow"), "invalid_body"),
        (RunRequest(mode="chat", network="open"), "invalid_body"),
        (RunRequest(mode="chat", network="allow", push="maybe"), "invalid_body"),
        (RunRequest(mode="chat", network="allow", backend="microvm"), "backend_unavailable"),
    ],
)
def test_refusals(request_: RunRequest, code: str) -> None:
    with pytest.raises(DispatchError) as exc:
        plan_run(request_, REPOS, ON)
    assert exc.value.code == code and exc.value.message


def test_push_allow_in_chat_and_the_chosen_repo() -> None:
    plan = plan_run(RunRequest(mode="chat", network="allow", push="allow", repo="/w/b"), REPOS, ON)
    assert plan.push is True and plan.repo == "/w/b"


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/w/a", True),
        ("/", False),
        ("w/a", False),
        ("/w/../a", False),
        ("/w/./a", False),
        ("/w//a", False),
        ("/w/a/", False),
        ("/w/a\n", False),
        ("/w/\x00", False),
        ("", False),
    ],
)
def test_repo_spelling(path: str, ok: bool) -> None:
    assert (repo_path_problem(path) is None) is ok


_KEY = {"name": "K", "mode": "mask", "value": "v", "injectHosts": ["a.test"]}

# block, network, the words the refusal must hold (None: given to the run)
CREDENTIALS = [
    ({"envVars": [_KEY]}, "allow", None),
    ({"envVars": [_KEY], "allowPlaintextInject": True}, "ask", None),
    ({"envVars": [_KEY]}, "deny", "needs a network"),
    ({"envVars": [_KEY], "files": [{"path": "/root/.aws/credentials"}]}, "allow", "files"),
    ({"envVars": [{"name": "K", "mode": "mask"}]}, "allow", "needs its 'value'"),
    ({"envVars": [{**_KEY, "value": 3}]}, "allow", "needs its 'value'"),
    ({"envVars": ["K"]}, "allow", "needs its 'value'"),
    ({"envVars": []}, "allow", "non-empty list"),
    ({}, "allow", "non-empty list"),
    (["K"], "allow", "is an object"),
]


@pytest.mark.parametrize(("block", "network", "words"), CREDENTIALS)
def test_a_runs_credentials_carry_their_values(
    block: object, network: str, words: str | None
) -> None:
    problem = run_credentials_problem(block, network)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem, problem
