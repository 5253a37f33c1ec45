"""The ``--control-fd`` protocol: whole configs, one JSON object a line (F-CTL-1).

Rules:
- Each line is a complete settings object in the settings file's format; it
  replaces the previous one. Only the network lists take effect live, from the
  next connection; filesystem rules were fixed at launch, and a line that
  changes them is applied to the network only, with a note saying so.
- A line that is not valid settings changes nothing: it yields ``Rejected``
  with the reason (the caller logs one line), and the previous config stays.
- ``Applied`` also carries the line's credentials settings: the proxies apply
  its ``tlsTerminate`` lists and bounds and its ``sigv4`` policy live; masks and
  files stay as launched.
- Lines are at most ``MAX_LINE`` bytes; a longer one is rejected whole.
- Bytes in, events out: the caller owns the fd (STYLE §5.5).
"""

from __future__ import annotations

from sandhold._record import record
from sandhold.errors import SettingsError
from sandhold.settings import (
    CredentialSettings,
    FilesystemSettings,
    NetworkSettings,
    parse_settings,
)

MAX_LINE = 1 << 20


@record
class Applied:
    network: NetworkSettings
    note: str = ""  # set when parts of the line could not apply live
    credentials: CredentialSettings = CredentialSettings()


@record
class Rejected:
    reason: str


class ControlChannel:
    """Feed it bytes from the control fd; it returns what each complete line means."""

    def __init__(
        self, launch_filesystem: FilesystemSettings, launch_network: NetworkSettings | None = None
    ) -> None:
        self._filesystem = launch_filesystem
        self._network = launch_network
        self._buffer = b""
        self._discarding = False
        self._count = 0

    def feed(self, data: bytes) -> list[Applied | Rejected]:
        """Consume ``data``; an empty ``data`` means end of stream (a partial line is dropped)."""
        events: list[Applied | Rejected] = []
        if not data:
            if self._buffer.strip() and not self._discarding:
                events.append(Rejected("the control stream ended in the middle of a line"))
            self._buffer = b""
            return events
        self._buffer += data
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if not sep:
                if len(self._buffer) > MAX_LINE:
                    if not self._discarding:
                        events.append(Rejected(f"line longer than {MAX_LINE} bytes"))
                    self._discarding = True
                    self._buffer = b""
                break
            self._buffer = rest
            if self._discarding:
                self._discarding = False
                continue
            if line.strip():
                events.append(self._line(line))
        return events

    def _line(self, line: bytes) -> Applied | Rejected:
        self._count += 1
        source = f"control line {self._count}"
        if len(line) > MAX_LINE:
            return Rejected(f"{source}: longer than {MAX_LINE} bytes")
        try:
            text = line.decode("utf-8")
            settings = parse_settings(text, source)
        except UnicodeDecodeError:
            return Rejected(f"{source}: not UTF-8")
        except SettingsError as exc:
            return Rejected(exc.render())
        fixed = []
        if settings.filesystem != self._filesystem:
            fixed.append("filesystem rules")
        net, was = settings.network, self._network
        if was is not None and (
            net.allow_unix_sockets,
            net.allow_all_unix_sockets,
            net.allow_local_binding,
        ) != (was.allow_unix_sockets, was.allow_all_unix_sockets, was.allow_local_binding):
            fixed.append("unix socket and local binding rules")
        note = ""
        if fixed:
            note = (
                f"{source}: {' and '.join(fixed)} are fixed at launch; "
                "only the network lists were applied"
            )
        return Applied(settings.network, note, settings.credentials)
