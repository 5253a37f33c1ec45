"""The launch contract: what a sandbox is asked to be (a spec), and what it reports back.

Rules:
- Every type here is an immutable record that round-trips through JSON
  (``to_json`` gives plain dicts, lists, strings and numbers; ``from_json``
  validates and rebuilds, raising ``SpecError`` naming the field). Bytes travel
  as base64 under ``data_b64``.
- Every handle and every event names the backend actually in use, so nothing
  can claim isolation while running on the host (F-BE-6).
- ``SandboxState`` moves only through ``TRANSITIONS``, one table of legal
  ``(state, action) -> state`` moves. ``transition`` raises
  ``InvalidTransition(state, action)`` for anything else and changes nothing.
- ``SandboxBackend.from_name`` reads stored names: "" and unknown names are
  ``none``, the legacy ``"docker"`` is ``native`` (F-BE-1).
- ``session_id`` and ``workspace_id`` are names for logs and lookups: at most
  ``MAX_ID_LENGTH`` printable characters, no ``/`` (``session_id`` not empty).
- A bind mount or runner state dir may not be the host's ``/proc``, ``/sys`` or
  ``/dev``, anything below them, or ``/`` (which holds them): ``KERNEL_TREES``.
  The sandbox has a ``/proc`` and ``/dev`` of its own; the host's would show
  every host process's command line, or its devices.
- Pure: no I/O, no OS calls. Paths are checked as strings (absolute, normal),
  never against the disk (the plan checks where they resolve to). The one edge is
  ``SandboxSpec.from_settings``, which reads the settings file (``load_settings``),
  the working directory and ``$HOME``, then maps purely (``spec_from_settings``,
  with a ``realpath`` resolver).
- ``credentials`` (``SandboxCredentials``) and ``tls_terminate`` are checked by the
  settings file's schema and rules (``settings.read_credential_blocks``), against
  ``egress_allowlist`` and ``egress_denylist``; their errors name the spec's field
  and never quote a value, and no ``repr`` shows one.
- A settings file becomes a spec only whole: a key the spec cannot express
  (``UNEXPRESSIBLE_SETTINGS``, a glob to bind, a ``denyRead`` path a bind would
  show) is a ``SettingsError`` naming it, never dropped.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping as _MappingBase

from sandhold._record import record
from sandhold.errors import InvalidTransition, SpecError
from sandhold.policy.paths import has_surrogate, is_within

TYPE_CHECKING = False
if TYPE_CHECKING:
    import os
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import Any, ClassVar, Literal, TypeAlias, TypeVar

    from sandhold.policy.credentials import TlsTerminate
    from sandhold.settings import CredentialSettings, Settings

    _E = TypeVar("_E", bound=enum.Enum)


# --- enumerations --------------------------------------------------------------


class SandboxBackend(enum.Enum):
    """Where a sandbox runs: ``native`` (namespaces, bubblewrap), ``none`` (on the host,
    no isolation) or ``microvm`` (a kernel boundary; not offered here). Only ``microvm``
    has a kernel boundary of its own."""

    MICROVM = "microvm"
    NATIVE = "native"
    NONE = "none"

    @classmethod
    def from_name(cls, name: str | None) -> SandboxBackend:
        """A stored backend name: "" and unknown names are ``none``; "docker" is ``native``.

        This is for names read back from storage or older clients. An API that
        takes a backend from a caller should use ``SandboxBackend(name)``, which
        refuses unknown names instead of quietly dropping isolation.
        """
        key = (name or "").strip().lower()
        if key == "docker":
            return cls.NATIVE
        for member in cls:
            if member.value == key:
                return member
        return cls.NONE


class SandboxMode(enum.Enum):
    """How a session may touch its bind mounts: ``chat`` writes, the others only read."""

    CHAT = "chat"
    REVIEW = "review"
    PLAN = "plan"
    ORCHESTRATE = "orchestrate"

    @property
    def writes_binds(self) -> bool:
        return self is SandboxMode.CHAT


class SandboxState(enum.Enum):
    CREATED = "created"  # launch under way
    WARM = "warm"  # running, ready for exec
    ACTIVE = "active"  # running at least one exec
    SUSPENDED = "suspended"  # the whole process tree frozen
    DESTROYED = "destroyed"  # gone; the handle is invalid
    ERROR = "error"  # failed; ``SandboxHandle.error`` says why


class Action(enum.Enum):
    """What can happen to a sandbox; the port applies these, never raw states."""

    READY = "ready"  # the in-sandbox agent said hello
    FAIL = "fail"  # launch failed, or the sandbox died under us
    EXEC = "exec"  # a command was started
    EXEC_EXIT = "exec_exit"  # a command ended, others still run (or the tree is frozen)
    IDLE = "idle"  # the last running command ended
    SUSPEND = "suspend"
    RESUME = "resume"  # back to warm: nothing was running
    RESUME_BUSY = "resume_busy"  # back to active: commands were running when frozen
    DESTROY = "destroy"


_S, _A = SandboxState, Action

TRANSITIONS: dict[tuple[SandboxState, Action], SandboxState] = {
    (_S.CREATED, _A.READY): _S.WARM,
    (_S.CREATED, _A.FAIL): _S.ERROR,
    (_S.CREATED, _A.DESTROY): _S.DESTROYED,
    (_S.WARM, _A.EXEC): _S.ACTIVE,
    (_S.WARM, _A.SUSPEND): _S.SUSPENDED,
    (_S.WARM, _A.FAIL): _S.ERROR,
    (_S.WARM, _A.DESTROY): _S.DESTROYED,
    (_S.ACTIVE, _A.EXEC): _S.ACTIVE,
    (_S.ACTIVE, _A.EXEC_EXIT): _S.ACTIVE,
    (_S.ACTIVE, _A.IDLE): _S.WARM,
    (_S.ACTIVE, _A.SUSPEND): _S.SUSPENDED,
    (_S.ACTIVE, _A.FAIL): _S.ERROR,
    (_S.ACTIVE, _A.DESTROY): _S.DESTROYED,
    (_S.SUSPENDED, _A.EXEC_EXIT): _S.SUSPENDED,  # an exit already in flight when frozen
    (_S.SUSPENDED, _A.RESUME): _S.WARM,
    (_S.SUSPENDED, _A.RESUME_BUSY): _S.ACTIVE,
    (_S.SUSPENDED, _A.FAIL): _S.ERROR,
    (_S.SUSPENDED, _A.DESTROY): _S.DESTROYED,
    (_S.ERROR, _A.DESTROY): _S.DESTROYED,
}
"""Every legal move. A pair that is not here raises ``InvalidTransition``."""

RUNNING_STATES = frozenset({_S.WARM, _S.ACTIVE, _S.SUSPENDED})


def transition(state: SandboxState, action: Action) -> SandboxState:
    """The state after ``action`` in ``state``.

    Raises:
        InvalidTransition: the pair is not in ``TRANSITIONS``.
    """
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        raise InvalidTransition(state, action) from None


class KillReason(enum.Enum):
    """Why the host killed a command (the ``killed`` event)."""

    TIMEOUT = "timeout"
    MANUAL = "manual"
    OOM = "oom"
    DESTROYED = "destroyed"
    ERROR = "error"  # the sandbox failed and was killed whole


# --- validation helpers -----------------------------------------------------------


def _abs_path(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise SpecError(field, f"must be an absolute path, got {value!r}")
    parts = value.split("/")
    if has_surrogate(value):
        raise SpecError(field, f"must be text, got a lone surrogate in {value!r}")
    if any(p in (".", "..") for p in parts) or "\0" in value:
        raise SpecError(field, f"must be a normal path (no '.', '..' or NUL), got {value!r}")
    return "/" + "/".join(p for p in parts if p) if value != "/" else "/"


MAX_ID_LENGTH = 128  # characters of a session_id or workspace_id

# (tree, why the sandbox may not have the host's). The sandbox gets a /proc and a
# /dev of its own (its PID namespace's processes; null, zero, random, tty...).
KERNEL_TREES: tuple[tuple[str, str], ...] = (
    ("/proc", "every host process and its command line"),
    ("/sys", "the host's kernel and device settings"),
    ("/dev", "the host's devices"),
)


def kernel_tree(path: str) -> str | None:
    """Why ``path`` (absolute, normal) may not be bound: it is in, or holds, a host
    kernel tree of ``KERNEL_TREES``; None if it is not."""
    if path == "/":
        return "/ holds the host's /proc, /sys and /dev: bind the directories the sandbox needs"
    for tree, shows in KERNEL_TREES:
        if is_within(path, tree):
            where = "is the host's" if path == tree else "is inside the host's"
            own = " (the sandbox has one of its own)" if tree != "/sys" else ""
            return f"{path} {where} {tree}, which shows {shows}{own}"
    return None


def _no_kernel_tree(field: str, path: str) -> str:
    why = kernel_tree(path)
    if why is not None:
        raise SpecError(field, why)
    return path


def _ident(field: str, value: object, *, empty: bool = False) -> str:
    """A name for logs and lookups: printable, no '/', at most ``MAX_ID_LENGTH`` long."""
    text = _str(field, value, empty=empty)
    if len(text) > MAX_ID_LENGTH:
        raise SpecError(field, f"must be at most {MAX_ID_LENGTH} characters, got {len(text)}")
    if not text.isprintable() or "/" in text:
        raise SpecError(
            field,
            f"must be printable text without '/' (no NUL, newline or other control "
            f"character), got {text!r}",
        )
    return text


def _str(field: str, value: object, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise SpecError(field, f"must be a {'' if empty else 'non-empty '}string, got {value!r}")
    return value


def _opt_str(field: str, value: object) -> str | None:
    return None if value is None else _str(field, value)


def _bool(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {value!r}")
    return value


def _int(field: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(field, f"must be an integer, got {value!r}")
    return value


def _list(field: str, value: object) -> list[object]:
    if not isinstance(value, list | tuple):
        raise SpecError(field, f"must be a list, got {value!r}")
    return list(value)


def _obj(field: str, value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise SpecError(field, f"must be an object, got {value!r}")
    return value


def _enum(field: str, cls: type[_E], value: object) -> _E:
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in cls)
        raise SpecError(field, f"must be one of {choices}, got {value!r}") from None


def _keys(field: str, data: dict[str, object], allowed: Iterable[str]) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SpecError(field or "spec", f"unknown field(s) {', '.join(unknown)}")


# --- the spec ------------------------------------------------------------------------


@record
class SandboxBindMount:
    """A host path the sandbox sees. On ``native`` the guest path is the host path."""

    host_path: str
    guest_path: str = ""  # "" means the host path
    read_only: bool = False

    @property
    def target(self) -> str:
        return self.guest_path or self.host_path

    def to_json(self) -> dict[str, object]:
        return {
            "host_path": self.host_path,
            "guest_path": self.target,
            "read_only": self.read_only,
        }

    @classmethod
    def from_json(cls, data: object, field: str = "bind_mount") -> SandboxBindMount:
        d = _obj(field, data)
        _keys(field, d, ("host_path", "guest_path", "read_only"))
        if "host_path" not in d:
            raise SpecError(f"{field}.host_path", "is required")
        host = _no_kernel_tree(
            f"{field}.host_path", _abs_path(f"{field}.host_path", d["host_path"])
        )
        guest = d.get("guest_path") or ""
        guest = _abs_path(f"{field}.guest_path", guest) if guest else ""
        return cls(
            host_path=host,
            guest_path="" if guest == host else guest,
            read_only=_bool(f"{field}.read_only", d.get("read_only", False)),
        )


class SandboxCredentials:
    """Secrets a spec's sandbox may use without holding them: srt's ``credentials`` block.

    The block is srt 0.0.83's (``envVars`` and ``files`` entries with ``mode`` deny
    or mask, ``extract``, ``onExtractNoMatch``, ``decode``, ``maskClaims``,
    ``maskDuplicates``, ``injectHosts``; ``allowPlaintextInject``, ``awsPairs``,
    ``sigv4``), checked by the settings file's own schema and rules. Two things
    differ, as a spec has no host environment or working directory of its own:
    an ``envVars`` entry may carry the real ``value`` (the harness holds it;
    without one the harness's own environment variable is used at launch), and a
    ``files`` path is absolute (a host path, read at launch; native shows the
    masked copy at the same path).

    The real values are never in ``repr`` or in an error; ``to_json(redact=True)``
    leaves them out (for storing or logging a spec).
    """

    __slots__ = ("_data", "_key")

    def __init__(self, data: Mapping[str, object]) -> None:
        import json

        try:
            self._data: dict[str, object] = json.loads(json.dumps(dict(data)))
        except (TypeError, ValueError):
            raise SpecError("credentials", "must be JSON data (objects, lists, text)") from None
        self._key = json.dumps(self._data, sort_keys=True)

    def to_json(self, *, redact: bool = False) -> dict[str, object]:
        import json

        data: dict[str, object] = json.loads(self._key)
        if redact:
            for entry in _entries(data, "envVars"):
                if isinstance(entry, dict) and "value" in entry:
                    entry["value"] = "<redacted>"
        return data

    def block(self) -> dict[str, object]:
        """The srt block without the values (what the settings schema reads)."""
        data = self.to_json()
        for entry in _entries(data, "envVars"):
            entry.pop("value", None)
        return data

    def values(self) -> dict[str, str]:
        """name -> the real value, for the ``envVars`` entries that carry one."""
        out: dict[str, str] = {}
        for entry in _entries(self._data, "envVars"):
            value = entry.get("value")
            if isinstance(value, str):
                out[str(entry.get("name"))] = value
        return out

    def __repr__(self) -> str:
        names = [e.get("name") for e in _entries(self._data, "envVars")]
        files = [e.get("path") for e in _entries(self._data, "files")]
        return f"SandboxCredentials(envVars={names!r}, files={files!r}, values=<hidden>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxCredentials) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple[object, ...]:
        return (SandboxCredentials, (self._data,))


def _entries(data: Mapping[str, object], group: str) -> list[dict[str, object]]:
    """The object entries of ``data[group]`` (others are the schema check's to refuse)."""
    found = data.get(group)
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


_TLS_KEYS = (
    ("caCertPath", "ca_cert_path"),
    ("caKeyPath", "ca_key_path"),
    ("excludeDomains", "exclude_domains"),
    ("extraCaCertPaths", "extra_ca_cert_paths"),
    ("maxTunnels", "max_tunnels"),
    ("handshakeTimeoutMs", "handshake_timeout_ms"),
)


def _tls_json(tls: object) -> object:
    """``network.tlsTerminate``'s JSON shape of a ``TlsTerminate`` (anything else as given)."""
    from sandhold.policy.credentials import TlsTerminate

    if not isinstance(tls, TlsTerminate):
        return tls
    out: dict[str, object] = {}
    for key, attr in _TLS_KEYS:
        value = getattr(tls, attr)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _credential_fields(
    d: Mapping[str, object], allow: tuple[str, ...], deny: tuple[str, ...], enabled: bool
) -> tuple[SandboxCredentials | None, object]:
    """The spec's ``credentials`` and ``tls_terminate`` (see ``SandboxCredentials``),
    checked as a settings file's blocks are, against ``egress_allowlist``.

    Raises:
        SpecError: naming the key; never quoting a value.
    """
    raw, tls_raw = d.get("credentials"), _tls_json(d.get("tls_terminate"))
    if raw is None and tls_raw is None:
        return None, None
    creds = None
    block: dict[str, object] | None = None
    if raw is not None:
        creds = (
            raw
            if isinstance(raw, SandboxCredentials)
            else SandboxCredentials(_obj("credentials", raw))
        )
        for i, entry in enumerate(_list("credentials.envVars", creds.to_json().get("envVars", []))):
            if isinstance(entry, dict) and "value" in entry:
                field = f"credentials.envVars[{i}].value"
                if not isinstance(entry["value"], str):
                    raise SpecError(field, "must be a string (the real value)")
                if entry.get("mode") != "mask":
                    raise SpecError(
                        field, 'only a "mask" entry takes a value: a denied one is withheld'
                    )
        for i, entry in enumerate(_list("credentials.files", creds.to_json().get("files", []))):
            if isinstance(entry, dict) and "path" in entry:
                _abs_path(f"credentials.files[{i}].path", entry["path"])
        block = creds.block()
    if tls_raw is not None:
        tls_obj = _obj("tls_terminate", tls_raw)
        for key in ("caCertPath", "caKeyPath"):
            if key in tls_obj:
                _abs_path(f"tls_terminate.{key}", tls_obj[key])
        for i, p in enumerate(
            _list("tls_terminate.extraCaCertPaths", tls_obj.get("extraCaCertPaths", []))
        ):
            _abs_path(f"tls_terminate.extraCaCertPaths[{i}]", p)
    settings = _read_credentials(block, tls_raw, allow if enabled else (), deny)
    for src in settings.masked:
        if not src.inject_hosts:
            raise SpecError(
                src.key,
                "a masked secret needs a host to be put back at: list its injectHosts, "
                "or the hosts in egress_allowlist (it is empty"
                + ("" if enabled else ", and network_enabled is false")
                + ")",
            )
    return creds, settings.tls_terminate


def _read_credentials(
    block: object, tls: object, allow: tuple[str, ...], deny: tuple[str, ...]
) -> Any:
    """``settings.read_credential_blocks`` with its errors as ``SpecError``s."""
    from sandhold.errors import SettingsError
    from sandhold.settings import read_credential_blocks

    try:
        return read_credential_blocks(
            "<spec>", block, tls, allowed_domains=allow, denied_domains=deny
        )
    except SettingsError as exc:
        reason = exc.reason
        for theirs, ours in _SETTING_NAMES:
            reason = reason.replace(theirs, ours)
        key = exc.key.replace("network.tlsTerminate", "tls_terminate", 1)
        raise SpecError(key or "credentials", reason) from None


# settings keys named in the shared rules' reasons, as a spec spells them
_SETTING_NAMES = (
    ("network.allowedDomains", "egress_allowlist"),
    ("network.deniedDomains", "egress_denylist"),
    ("network.tlsTerminate", "tls_terminate"),
    ("Enable tlsTerminate", "Set tls_terminate"),
    ("to allowedDomains", "to egress_allowlist"),
)


@record
class SandboxSpec:
    """What to launch. Build it directly, with ``from_json`` or ``from_settings``; ``validate`` it.

    ``bind_mounts`` are the only host paths the sandbox sees (besides a
    read-only system base); ``mode`` decides whether they are writable;
    ``protected_paths`` are never writable and ``runner_state_dirs`` always are;
    ``exec_grant_roots`` only matters on macOS. ``follow_symlinks`` names the host
    symlinks a bind or runner state dir may pass through although a sandbox could
    have planted them (see ``policy.specplan``): the harness vouches for each one.
    """

    session_id: str
    workspace_id: str
    agent_id: str | None = None
    bind_mounts: tuple[SandboxBindMount, ...] = ()
    network_enabled: bool = True
    egress_allowlist: tuple[str, ...] = ()
    guest_workdir: str | None = None
    mode: SandboxMode = SandboxMode.CHAT
    protected_paths: tuple[str, ...] = ()
    runner_state_dirs: tuple[str, ...] = ()
    exec_grant_roots: tuple[str, ...] = ()
    follow_symlinks: tuple[str, ...] = ()
    # False: egress_allowlist alone, without the baseline (LLM providers, registries,
    # GitHub): a settings file's model (``from_settings``)
    egress_baseline: bool = True
    egress_denylist: tuple[str, ...] = ()  # beats every allow, as deniedDomains does
    # masked and withheld secrets (``SandboxCredentials``); masking needs tls_terminate
    # (srt's ``network.tlsTerminate``, a ``policy.credentials.TlsTerminate``) unless
    # the block sets allowPlaintextInject
    credentials: SandboxCredentials | None = None
    tls_terminate: TlsTerminate | None = None

    def validate(self) -> SandboxSpec:
        """A checked, normalised copy (tuples, enums, normal absolute paths).

        Raises:
            SpecError: naming the first bad field.
        """
        return SandboxSpec.from_json(self.to_json())

    def to_json(self, *, redact: bool = False) -> dict[str, object]:
        """The spec as JSON data; ``redact``: the credentials' real values left out
        (for storing or logging it; such a spec launches with placeholders only for
        the variables it can find in the harness's environment)."""
        return {
            "session_id": self.session_id,
            "workspace_id": self.workspace_id,
            "agent_id": self.agent_id,
            "bind_mounts": [
                b.to_json() if isinstance(b, SandboxBindMount) else b for b in self.bind_mounts
            ],
            "network_enabled": self.network_enabled,
            "egress_allowlist": list(self.egress_allowlist),
            "guest_workdir": self.guest_workdir,
            "mode": self.mode.value if isinstance(self.mode, SandboxMode) else self.mode,
            "protected_paths": list(self.protected_paths),
            "runner_state_dirs": list(self.runner_state_dirs),
            "exec_grant_roots": list(self.exec_grant_roots),
            "follow_symlinks": list(self.follow_symlinks),
            "egress_baseline": self.egress_baseline,
            "egress_denylist": list(self.egress_denylist),
            "credentials": None
            if self.credentials is None
            else (
                self.credentials.to_json(redact=redact)
                if isinstance(self.credentials, SandboxCredentials)
                else self.credentials
            ),
            "tls_terminate": _tls_json(self.tls_terminate),
        }

    def credential_settings(self) -> CredentialSettings:
        """The spec's ``credentials`` and ``tls_terminate`` as the policy reads them
        (``policy.credentials``), for a validated spec.

        Raises:
            SpecError: as ``validate``.
        """
        block = self.credentials.block() if self.credentials is not None else None
        allow = self.egress_allowlist if self.network_enabled else ()
        result: CredentialSettings = _read_credentials(
            block, _tls_json(self.tls_terminate), tuple(allow), tuple(self.egress_denylist)
        )
        return result

    @classmethod
    def from_settings(
        cls,
        source: str | os.PathLike[str] | Mapping[str, object],
        *,
        session_id: str,
        workspace_id: str = "",
        cwd: str | None = None,
        home: str | None = None,
        mode: SandboxMode | str = SandboxMode.CHAT,
        agent_id: str | None = None,
        bind_mounts: Iterable[SandboxBindMount] = (),
    ) -> SandboxSpec:
        """A spec with the filesystem and network policy of a sandhold/srt settings file.

        Args:
            source: the file's path (``~`` expanded), or its JSON already parsed.
            session_id, workspace_id, agent_id, mode: as the spec's fields.
            cwd, home: what ``.`` and ``~`` in the file mean (default: this
                process's working directory and ``$HOME``), as for the CLI.
            bind_mounts: more binds of the harness's own, added as given.

        Returns:
            A validated spec (the mapping is ``spec_from_settings``'s: allowWrite
            becomes writable binds, the working directory a read-only one,
            denyWrite ``protected_paths``, allowedDomains ``egress_allowlist``
            with no baseline, deniedDomains ``egress_denylist``).

        Raises:
            SettingsError: the file is unusable, or sets a key this spec cannot
                express (named, with what to do instead): nothing is dropped.
            SpecError: a field of the result is bad (a session id, say).
        """
        import os

        from sandhold.errors import SettingsError
        from sandhold.settings import load_settings, parse_settings

        # the edge: the file, the working directory and $HOME are read here only
        home = home if home is not None else os.path.expanduser("~")
        if isinstance(source, _MappingBase):
            import json

            try:
                text = json.dumps(dict(source))
            except (TypeError, ValueError) as exc:
                raise SettingsError("<settings dict>", "", f"not JSON data: {exc}") from None
            settings = parse_settings(text, "<settings dict>")
        else:
            settings = load_settings(os.path.expanduser(os.fspath(source)), home)
        return spec_from_settings(
            settings,
            session_id=session_id,
            workspace_id=workspace_id,
            cwd=cwd if cwd is not None else os.getcwd(),
            home=home,
            realpath=os.path.realpath,
            mode=mode,
            agent_id=agent_id,
            bind_mounts=tuple(bind_mounts),
        )

    @classmethod
    def from_json(cls, data: object) -> SandboxSpec:
        """Rebuild and validate a spec from ``to_json``'s shape.

        Raises:
            SpecError: unknown or missing field, wrong type, relative path, bad mode.
        """
        d = _obj("spec", data)
        _keys("", d, cls._fields)  # type: ignore[attr-defined]
        for name in ("session_id", "workspace_id"):
            if name not in d:
                raise SpecError(name, "is required")
        binds = tuple(
            SandboxBindMount.from_json(b, f"bind_mounts[{i}]")
            for i, b in enumerate(_list("bind_mounts", d.get("bind_mounts", [])))
        )
        workdir = d.get("guest_workdir")

        def paths(name: str) -> tuple[str, ...]:
            return tuple(
                _abs_path(f"{name}[{i}]", p) for i, p in enumerate(_list(name, d.get(name, [])))
            )

        runner_dirs = paths("runner_state_dirs")
        for i, p in enumerate(runner_dirs):
            _no_kernel_tree(f"runner_state_dirs[{i}]", p)

        def domains(name: str) -> tuple[str, ...]:
            return tuple(
                _str(f"{name}[{i}]", p, empty=False)
                for i, p in enumerate(_list(name, d.get(name, [])))
            )

        allow = domains("egress_allowlist")
        enabled = _bool("network_enabled", d.get("network_enabled", True))
        credentials, tls = _credential_fields(d, allow, domains("egress_denylist"), enabled)
        return cls(
            session_id=_ident("session_id", d["session_id"]),
            workspace_id=_ident("workspace_id", d["workspace_id"], empty=True),
            agent_id=_opt_str("agent_id", d.get("agent_id")),
            bind_mounts=binds,
            network_enabled=_bool("network_enabled", d.get("network_enabled", True)),
            egress_allowlist=allow,
            guest_workdir=None if workdir is None else _abs_path("guest_workdir", workdir),
            mode=_enum("mode", SandboxMode, d.get("mode", "chat")),
            protected_paths=paths("protected_paths"),
            runner_state_dirs=runner_dirs,
            exec_grant_roots=paths("exec_grant_roots"),
            follow_symlinks=paths("follow_symlinks"),
            egress_baseline=_bool("egress_baseline", d.get("egress_baseline", True)),
            egress_denylist=domains("egress_denylist"),
            credentials=credentials,
            tls_terminate=tls,  # type: ignore[arg-type]
        )


# Settings keys a spec has no field for, with what to do instead (``spec_from_settings``
# refuses a file that sets one: ignoring it would run another policy than the file's).
UNEXPRESSIBLE_SETTINGS: dict[str, str] = {
    "filesystem.allowCredentialWrite": "a spec keeps credential files read-only inside its "
    "writable binds; run the CLI with this file to allow them",
    "network.allowAllDomains": "a spec names the hosts it allows: list them in "
    "network.allowedDomains",
    "network.allowUnixSockets": "a spec's sandbox reaches no host socket; bind the "
    "socket's directory (bind_mounts) if the harness means it to",
    "network.allowAllUnixSockets": "a spec's sandbox reaches no host socket",
    "env.passthrough": "a spec's commands get the port's scrubbed environment: pass a "
    "variable with exec(..., env={...})",
    "bwrapPath": "the port picks bubblewrap: SandboxPort(bwrap=...)",
    "git.safeDirectories": "a spec has no git settings of its own",
    "git.allowConfig": "a spec's sandbox writes no repository config (the CLI applies "
    "allowed changes after a run)",
}


def spec_from_settings(
    settings: Settings,
    *,
    session_id: str,
    workspace_id: str,
    cwd: str,
    home: str,
    realpath: Callable[[str], str],
    mode: SandboxMode | str = SandboxMode.CHAT,
    agent_id: str | None = None,
    bind_mounts: tuple[SandboxBindMount, ...] = (),
) -> SandboxSpec:
    """The spec of ``settings`` (pure: ``realpath`` answers where a path resolves).

    The CLI's model reads the whole host but ``denyRead``; a spec shows only its
    binds. So: ``allowWrite`` entries are writable binds, ``allowRead`` entries
    read-only ones, the working directory a read-only bind unless one covers it
    (it is the workdir); ``denyWrite`` entries are ``protected_paths`` (globs
    kept); a ``denyRead`` entry (and ``credentials.files``) must stay out of sight:
    outside every bind, or a home's secret location the spec hides anyway; one a
    bind would show is refused. ``allowedDomains`` is ``egress_allowlist`` with no
    baseline (empty: no network), ``deniedDomains`` is ``egress_denylist``.

    Raises:
        SettingsError: a key of ``UNEXPRESSIBLE_SETTINGS`` is set, an ``allowWrite``
            or ``allowRead`` entry is a glob, or a ``denyRead`` path would be shown.
        SpecError: ``cwd`` or ``home`` is not absolute, or a field of the result is bad.
    """
    import fnmatch

    from sandhold.errors import SettingsError
    from sandhold.policy import mandatory, paths
    from sandhold.policy.systembase import ETC_SECRETS, SYSTEM_BASE

    source = settings.source
    for name, value in (("cwd", cwd), ("home", home)):
        if not value.startswith("/"):
            raise SpecError(name, f"must be an absolute path, got {value!r}")
    fs, net = settings.filesystem, settings.network
    given: dict[str, object] = {
        "filesystem.allowCredentialWrite": fs.allow_credential_write,
        "network.allowAllDomains": net.allow_all_domains,
        "network.allowUnixSockets": net.allow_unix_sockets,
        "network.allowAllUnixSockets": net.allow_all_unix_sockets,
        "env.passthrough": settings.env_passthrough,
        "bwrapPath": settings.bwrap_path,
        "git.safeDirectories": settings.git_safe_directories,
        "git.allowConfig": settings.git_allow_config,
    }
    for key, why in UNEXPRESSIBLE_SETTINGS.items():
        if given[key]:
            raise SettingsError(source, key, f"SandboxSpec.from_settings cannot honour it: {why}")

    def bind_path(key: str, entries: tuple[str, ...]) -> list[str]:
        out = []
        for i, entry in enumerate(entries):
            path = paths.absolute(entry, cwd, home)
            if paths.is_glob(path):
                raise SettingsError(
                    source,
                    f"{key}[{i}]",
                    f"{entry!r} is a glob, and a spec binds paths: name each one",
                )
            out.append(path)
        return list(dict.fromkeys(out))

    writable = bind_path("filesystem.allowWrite", fs.allow_write)
    binds = [SandboxBindMount(p) for p in writable]
    readable = bind_path("filesystem.allowRead", fs.allow_read)
    binds += [
        SandboxBindMount(p, read_only=True)
        for p in readable
        if not any(paths.is_within(p, w) for w in writable)
    ]
    if not any(paths.is_within(cwd, b.host_path) for b in binds):
        binds.append(SandboxBindMount(cwd, read_only=True))  # the CLI shows it too
    binds += bind_mounts
    # what every spec shows (the system base), then the binds; what it hides in them
    shown = [realpath(p) for p in SYSTEM_BASE] + [realpath(b.host_path) for b in binds]
    home_secrets = [realpath(paths.absolute(e, home, home)) for e in mandatory.SECRET_READ_DENY]
    # credentials.files entries are hidden by the spec's plan wherever a bind shows them
    credential_files = set(settings.credentials.file_paths)
    for i, entry in enumerate(fs.deny_read):
        if entry in credential_files:
            continue
        path = paths.absolute(entry, cwd, home)
        fixed = realpath(paths.static_prefix(path) if paths.is_glob(path) else path)
        inside = [b for b in shown if paths.is_within(b, fixed)]
        under = [b for b in shown if paths.is_within(fixed, b)]
        hidden = any(paths.is_within(fixed, s) for s in home_secrets) or any(
            fnmatch.fnmatchcase(fixed, e) or paths.is_within(fixed, e) for e, _ in ETC_SECRETS
        )
        if inside or (under and not hidden):
            raise SettingsError(
                source,
                f"filesystem.denyRead[{i}]",
                f"{entry!r} (or the credentials.files path it came from) would be shown "
                f"in the sandbox (through {(inside or under)[0]}), and a spec cannot hide a "
                "path inside what it shows: drop that bind, or move what must stay unread "
                "out of it",
            )
    allowed = net.allowed_domains
    return SandboxSpec(
        session_id=session_id,
        workspace_id=workspace_id,
        agent_id=agent_id,
        bind_mounts=tuple(binds),
        network_enabled=bool(allowed),
        egress_allowlist=allowed,
        guest_workdir=cwd,
        mode=_enum("mode", SandboxMode, mode),
        protected_paths=tuple(paths.absolute(e, cwd, home) for e in fs.deny_write),
        egress_baseline=False,
        egress_denylist=net.denied_domains,
        credentials=_credentials_of(settings, cwd, home),
        tls_terminate=_tls_of(settings, cwd, home),
    ).validate()


def _credentials_of(settings: Settings, cwd: str, home: str) -> SandboxCredentials | None:
    """A settings file's ``credentials`` block as a spec's (its files' paths made
    absolute; no values: a masked variable is the harness's own, read at launch)."""
    from sandhold.policy import paths

    creds = settings.credentials
    if not creds.sources:
        return None
    groups: dict[str, list[dict[str, object]]] = {"envVars": [], "files": []}
    for src in creds.sources:
        entry: dict[str, object] = {"mode": src.mode}
        if src.kind == "env":
            entry["name"] = src.target
        else:
            entry["path"] = paths.absolute(src.target, cwd, home)
        if src.extract is not None:
            entry["extract"] = src.extract  # Python's spelling reads the same again
        if src.on_no_match != "warn":
            entry["onExtractNoMatch"] = src.on_no_match
        if src.decode is not None:
            entry["decode"] = src.decode
        if src.mask_claims is not None:
            entry["maskClaims"] = list(src.mask_claims)
        if src.mask_duplicates:
            entry["maskDuplicates"] = True
        entry["injectHosts"] = list(src.inject_hosts)  # resolved: allowedDomains' hosts
        groups["envVars" if src.kind == "env" else "files"].append(entry)
    block: dict[str, object] = {k: v for k, v in groups.items() if v}
    if creds.allow_plaintext_inject:
        block["allowPlaintextInject"] = True
    pairs = [
        {
            "accessKeyIdVar": p.access_key_id_var,
            "secretAccessKeyVar": p.secret_access_key_var,
            **({"sessionTokenVar": p.session_token_var} if p.session_token_var else {}),
        }
        for p in creds.aws_pairs
        if not p.automatic
    ]
    if pairs:
        block["awsPairs"] = pairs
    if creds.sigv4 is not None:
        sig = creds.sigv4
        block["sigv4"] = {
            "streaming": sig.streaming,
            "presigned": sig.presigned,
            "sigv4a": sig.sigv4a,
        }
    return SandboxCredentials(block)


def _tls_of(settings: Settings, cwd: str, home: str) -> TlsTerminate | None:
    """``network.tlsTerminate`` with ``~`` spelled out (a spec's paths are absolute)."""
    from sandhold._record import replace
    from sandhold.policy import paths

    tls = settings.credentials.tls_terminate
    if tls is None:
        return None

    def full(p: str | None) -> str | None:
        return None if p is None else paths.absolute(p, cwd, home)

    return replace(
        tls,
        ca_cert_path=full(tls.ca_cert_path),
        ca_key_path=full(tls.ca_key_path),
        extra_ca_cert_paths=tuple(paths.absolute(p, cwd, home) for p in tls.extra_ca_cert_paths),
    )


MAX_CPUS = 4096  # cores a ResourceLimits may ask for (cgroup cpu.max has a ceiling)


@record
class ResourceLimits:
    """Per-sandbox limits, enforced through cgroup v2 only where the host delegates it.

    A launch asking for a limit the host cannot enforce fails (never pretends).
    Each value is None (no limit) or in its range, checked here: ``memory_bytes``
    an int from 1 to 2**63 - 1, ``pids`` an int from 1 to 4,194,304 (the kernel's
    most), ``cpus`` a finite number of cores above 0, at most 4,096.

    Raises:
        SpecError: a value of the wrong type or out of its range.
    """

    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None  # CPU bandwidth in cores (1.5 = one and a half CPUs)

    def __post_init__(self) -> None:
        for name, most in (("memory_bytes", (1 << 63) - 1), ("pids", 1 << 22)):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"limits.{name}", f"must be an int or None, not {value!r}")
            if not 1 <= value <= most:
                raise SpecError(f"limits.{name}", f"must be from 1 to {most}, not {value}")
        cpus = self.cpus
        if cpus is not None:
            if not isinstance(cpus, int | float) or isinstance(cpus, bool):
                raise SpecError("limits.cpus", f"must be a number of cores or None, not {cpus!r}")
            if not 0 < cpus <= MAX_CPUS:  # false for nan and inf too
                raise SpecError("limits.cpus", f"must be above 0, at most {MAX_CPUS}, not {cpus}")

    @property
    def controllers(self) -> tuple[str, ...]:
        wanted = (
            ("memory", self.memory_bytes),
            ("pids", self.pids),
            ("cpu", self.cpus),
        )
        return tuple(name for name, value in wanted if value is not None)


# --- handle ----------------------------------------------------------------------------


class HandleDetails(_MappingBase[str, str]):
    """A read-only, hashable mapping of a handle's facts (name -> text), in name order.

    Made from a mapping or from (name, value) pairs; equal to any mapping with the
    same items (``handle.details == {"pid": "12"}``).
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        pairs = items.items() if isinstance(items, _MappingBase) else items
        self._items: dict[str, str] = dict(sorted((str(k), str(v)) for k, v in pairs))

    def __getitem__(self, name: str) -> str:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __repr__(self) -> str:
        return f"HandleDetails({self._items!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (HandleDetails, (tuple(self._items.items()),))


@record
class SandboxHandle:
    """A snapshot of one sandbox. ``details`` is a read-only mapping of the backend's
    facts (``pid``, ``workdir``, ``network``, …; see docs/api.md), all text.

    Handles are values: the port returns a fresh one after each change
    (``SandboxPort.handle`` gives the current one).
    """

    session_id: str
    backend: SandboxBackend
    state: SandboxState
    error: str | None = None
    details: Mapping[str, str] = HandleDetails()

    def __post_init__(self) -> None:
        # a dict (or the (name, value) pairs older callers pass) becomes read-only here
        if not isinstance(self.details, HandleDetails):
            object.__setattr__(self, "details", HandleDetails(self.details))

    def detail(self, name: str, default: str = "") -> str:
        """The fact ``name``, or ``default`` when the backend did not report it."""
        return self.details.get(name, default)

    def to_json(self) -> dict[str, object]:
        return {
            "session_id": self.session_id,
            "backend": self.backend.value,
            "state": self.state.value,
            "error": self.error,
            "details": dict(self.details),
        }

    @classmethod
    def from_json(cls, data: object) -> SandboxHandle:
        d = _obj("handle", data)
        _keys("handle", d, cls._fields)  # type: ignore[attr-defined]
        details = _obj("handle.details", d.get("details", {}))
        return cls(
            session_id=_str("handle.session_id", d.get("session_id"), empty=False),
            backend=_enum("handle.backend", SandboxBackend, d.get("backend")),
            state=_enum("handle.state", SandboxState, d.get("state")),
            error=_opt_str("handle.error", d.get("error")),
            details={str(k): _str(f"handle.details.{k}", v) for k, v in details.items()},
        )


# --- events ----------------------------------------------------------------------------


@record
class SandboxViolation:
    """Something the sandbox refused: ``action`` (``file-write-create``,
    ``network-outbound``, …), ``target`` (a path or a host), the ``rule`` that
    decided it, and the backend's ``raw`` record of it."""

    action: str
    target: str
    raw: str = ""
    rule: str = ""

    def to_json(self) -> dict[str, object]:
        return {"action": self.action, "target": self.target, "raw": self.raw, "rule": self.rule}

    @classmethod
    def from_json(cls, data: object) -> SandboxViolation:
        d = _obj("violation", data)
        _keys("violation", d, cls._fields)  # type: ignore[attr-defined]
        return cls(
            action=_str("violation.action", d.get("action"), empty=False),
            target=_str("violation.target", d.get("target")),
            raw=_str("violation.raw", d.get("raw", "")),
            rule=_str("violation.rule", d.get("rule", "")),
        )


@record
class StartingEvent:
    session_id: str
    backend: SandboxBackend
    exec_id: int = 0
    if TYPE_CHECKING:
        type: ClassVar[Literal["starting"]]
    type = "starting"


@record
class ReadyEvent:
    session_id: str
    backend: SandboxBackend
    exec_id: int = 0
    if TYPE_CHECKING:
        type: ClassVar[Literal["ready"]]
    type = "ready"


@record
class StdoutEvent:
    session_id: str
    backend: SandboxBackend
    exec_id: int
    data: bytes
    if TYPE_CHECKING:
        type: ClassVar[Literal["stdout"]]
    type = "stdout"


@record
class StderrEvent:
    session_id: str
    backend: SandboxBackend
    exec_id: int
    data: bytes
    if TYPE_CHECKING:
        type: ClassVar[Literal["stderr"]]
    type = "stderr"


@record
class ExitEvent:
    """A command ended: ``exit_code`` is shell-style (128+N when signal N killed it).

    ``error`` is set when the command never started (exit 127: not found;
    126: not runnable, or its working directory is missing).
    """

    session_id: str
    backend: SandboxBackend
    exec_id: int
    exit_code: int
    signal: int = 0
    error: str = ""
    if TYPE_CHECKING:
        type: ClassVar[Literal["exit"]]
    type = "exit"


@record
class KilledEvent:
    """The host killed a command (``reason``: timeout, manual, oom, destroyed,
    error); its ``exit`` event follows."""

    session_id: str
    backend: SandboxBackend
    exec_id: int
    reason: KillReason
    detail: str = ""
    if TYPE_CHECKING:
        type: ClassVar[Literal["killed"]]
    type = "killed"


@record
class ViolationEvent:
    """A refusal, attributed to the command that caused it (``exec_id`` 0: unknown)."""

    session_id: str
    backend: SandboxBackend
    exec_id: int
    violation: SandboxViolation
    if TYPE_CHECKING:
        type: ClassVar[Literal["violation"]]
    type = "violation"


if TYPE_CHECKING:
    SandboxEvent: TypeAlias = (
        StartingEvent
        | ReadyEvent
        | StdoutEvent
        | StderrEvent
        | ExitEvent
        | KilledEvent
        | ViolationEvent
    )

_EVENT_CLASSES = (
    StartingEvent,
    ReadyEvent,
    StdoutEvent,
    StderrEvent,
    ExitEvent,
    KilledEvent,
    ViolationEvent,
)
EVENT_TYPES: dict[str, type[Any]] = {cls.type: cls for cls in _EVENT_CLASSES}


def event_to_json(event: SandboxEvent) -> dict[str, object]:
    """The event as a JSON-ready dict with a ``type`` discriminator."""
    import base64

    out: dict[str, object] = {"type": event.type}
    for name in event._fields:  # type: ignore[union-attr]
        value = getattr(event, name)
        if isinstance(value, bytes):
            out["data_b64"] = base64.b64encode(value).decode("ascii")
        elif isinstance(value, enum.Enum):
            out[name] = value.value
        elif isinstance(value, SandboxViolation):
            out[name] = value.to_json()
        else:
            out[name] = value
    return out


_FIELD_READERS: dict[str, Callable[[str, object], object]] = {
    "session_id": lambda f, v: _str(f, v, empty=False),
    "backend": lambda f, v: _enum(f, SandboxBackend, v),
    "exec_id": _int,
    "exit_code": _int,
    "signal": _int,
    "error": _str,
    "detail": _str,
    "reason": lambda f, v: _enum(f, KillReason, v),
    "violation": lambda _f, v: SandboxViolation.from_json(v),
}


def event_from_json(data: object) -> SandboxEvent:
    """Rebuild an event from ``event_to_json``'s shape.

    Raises:
        SpecError: unknown type, unknown or missing field, wrong type.
    """
    import base64
    import binascii

    d = dict(_obj("event", data))
    kind = d.pop("type", None)
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SpecError("event.type", f"must be one of {', '.join(EVENT_TYPES)}, got {kind!r}")
    fields: tuple[str, ...] = cls._fields
    allowed = [f for f in fields if f != "data"] + (["data_b64"] if "data" in fields else [])
    _keys("event", d, allowed)
    kwargs: dict[str, object] = {}
    for name, value in d.items():
        if name == "data_b64":
            try:
                kwargs["data"] = base64.b64decode(_str("event.data_b64", value), validate=True)
            except (binascii.Error, ValueError):
                raise SpecError("event.data_b64", "is not valid base64") from None
        else:
            kwargs[name] = _FIELD_READERS[name](f"event.{name}", value)
    missing = [f for f in fields if f not in kwargs and f not in cls._defaults]
    if missing:
        raise SpecError(f"event.{missing[0]}", "is required")
    event: SandboxEvent = cls(**kwargs)
    return event


def json_dumps(value: SandboxSpec | SandboxHandle | SandboxEvent | Mapping[str, object]) -> str:
    """Compact JSON for any of this module's types (the server's wire format)."""
    import json

    if isinstance(value, SandboxSpec | SandboxHandle):
        data: object = value.to_json()
    elif isinstance(value, _EVENT_CLASSES):
        data = event_to_json(value)
    else:
        data = dict(value)
    return json.dumps(data, separators=(",", ":"), sort_keys=True)
