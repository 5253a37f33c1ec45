"""Every error sandhold raises on purpose, in one tree.

    SandholdError
     ├── ConfigError            the caller's input is wrong; nothing was run (exit 2)
     │    ├── UsageError        command line
     │    └── SettingsError     settings file: which file, which dotted key, why
     │    └── SpecError         a spec, handle or event (API or wire): which field, why
     ├── UnenforceablePolicy    a rule this host/backend cannot enforce (exit 2)
     ├── BackendUnavailable     the requested backend is not offered here (exit 2)
     ├── InvalidTransition      a lifecycle call not legal in the sandbox's state;
     │                          the sandbox was left as it was (exit 2)
     ├── LaunchError            the sandbox could not be started (exit 125);
     │    │                     the OS error or tool failure is ``__cause__``
     │    └── LaunchFailed      ... by ``SandboxPort.launch``: ``handle`` is its
     │                          ``error`` snapshot
     ├── ApiError               ``sandhold serve`` refused a request of the client
     │                          (``sandhold.client``): ``status``, ``code``, ``message``
     └── ClientError            the client got no usable answer: the server could not
                                be reached, broke off, timed out or spoke bad HTTP

Errors are data: the CLI renders them once (``render``); the server will render
the same fields as JSON. Anything else escaping sandhold is a bug in sandhold.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandhold.spec import Action, SandboxHandle, SandboxState

EXIT_CONFIG = 2
EXIT_LAUNCH = 125


class SandholdError(Exception):
    exit_code = EXIT_LAUNCH

    def render(self) -> str:
        return str(self)


class ConfigError(SandholdError):
    exit_code = EXIT_CONFIG


class UsageError(ConfigError):
    pass


class SettingsError(ConfigError):
    """A settings file is unusable. ``key`` is the dotted path ("" for the whole file)."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file, self.key, self.reason = file, key, reason
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.file}: {self.key}" if self.key else self.file
        return f"invalid settings: {where}: {self.reason}"


class UnenforceablePolicy(SandholdError):
    """A rule cannot be enforced by ``backend``; the launch is refused, never weakened."""

    exit_code = EXIT_CONFIG

    def __init__(self, rule: str, backend: str, why: str) -> None:
        self.rule, self.backend, self.why = rule, backend, why
        super().__init__(self.render())

    def render(self) -> str:
        return f"cannot enforce {self.rule} on the {self.backend} backend: {self.why}"


class BackendUnavailable(SandholdError):
    exit_code = EXIT_CONFIG

    def __init__(self, backend: str, hint: str) -> None:
        self.backend, self.hint = backend, hint
        super().__init__(self.render())

    def render(self) -> str:
        return f"the {self.backend} backend is not available on this host: {self.hint}"


class LaunchError(SandholdError):
    """Starting the sandbox failed at ``step``; the cause is chained."""

    def __init__(self, backend: str, step: str, detail: str = "") -> None:
        self.backend, self.step, self.detail = backend, step, detail
        super().__init__(self.render())

    def render(self) -> str:
        tail = f": {self.detail}" if self.detail else ""
        return f"{self.backend} sandbox failed to start ({self.step}){tail}"


class SpecError(ConfigError):
    """A spec, handle or event (from the API or the wire) is malformed; nothing was done."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(self.render())

    def render(self) -> str:
        return f"invalid sandbox spec: {self.field}: {self.reason}"


class InvalidTransition(SandholdError):
    """``action`` is not legal in ``state``; the sandbox was left as it was."""

    exit_code = EXIT_CONFIG

    def __init__(self, state: SandboxState, action: Action) -> None:
        self.state, self.action = state, action
        super().__init__(self.render())

    def render(self) -> str:
        return f"cannot {self.action.value} a sandbox that is {self.state.value}"


class LaunchFailed(LaunchError):
    """The sandbox could not be started; ``handle`` is its ``error`` snapshot."""

    def __init__(self, backend: str, step: str, detail: str, handle: SandboxHandle) -> None:
        super().__init__(backend, step, detail)
        self.handle = handle


class ApiError(SandholdError):
    """The server refused a request: ``status``, ``code`` and ``message`` say why
    (``sandhold.client`` raises it; the server's JSON error body carries the same)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(self.render())

    def render(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


class ClientError(SandholdError):
    """``sandhold.client`` got no usable answer from the server (it could not connect,
    the connection broke, the answer was malformed or too large, or it timed out)."""


def is_fd_number(text: str) -> bool:
    """``text`` is a file descriptor number as a command line gives one: ASCII digits
    (``str.isdigit`` also takes other scripts' digits and superscripts), below 2**31."""
    return text.isascii() and text.isdigit() and len(text) <= 9
