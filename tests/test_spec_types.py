"""The launch contract's types (SPEC §4): JSON round trips, validation, backends, the state table.

Pure: nothing here starts a sandbox. The state machine test walks every
(state, action) pair against ``TRANSITIONS`` (STYLE §5.4).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from sandhold.errors import ConfigError, InvalidTransition, SpecError
from sandhold.spec import (
    TRANSITIONS,
    Action,
    ExitEvent,
    KilledEvent,
    KillReason,
    ReadyEvent,
    SandboxBackend,
    SandboxBindMount,
    SandboxHandle,
    SandboxMode,
    SandboxSpec,
    SandboxState,
    SandboxViolation,
    StartingEvent,
    StderrEvent,
    StdoutEvent,
    ViolationEvent,
    event_from_json,
    event_to_json,
    json_dumps,
    transition,
)

S, A = SandboxState, Action
NATIVE = SandboxBackend.NATIVE

# The expected machine, written out independently of spec.TRANSITIONS.
EXPECTED = {
    (S.CREATED, A.READY): S.WARM,
    (S.CREATED, A.FAIL): S.ERROR,
    (S.CREATED, A.DESTROY): S.DESTROYED,
    (S.WARM, A.EXEC): S.ACTIVE,
    (S.WARM, A.SUSPEND): S.SUSPENDED,
    (S.WARM, A.FAIL): S.ERROR,
    (S.WARM, A.DESTROY): S.DESTROYED,
    (S.ACTIVE, A.EXEC): S.ACTIVE,
    (S.ACTIVE, A.EXEC_EXIT): S.ACTIVE,
    (S.ACTIVE, A.IDLE): S.WARM,
    (S.ACTIVE, A.SUSPEND): S.SUSPENDED,
    (S.ACTIVE, A.FAIL): S.ERROR,
    (S.ACTIVE, A.DESTROY): S.DESTROYED,
    (S.SUSPENDED, A.EXEC_EXIT): S.SUSPENDED,
    (S.SUSPENDED, A.RESUME): S.WARM,
    (S.SUSPENDED, A.RESUME_BUSY): S.ACTIVE,
    (S.SUSPENDED, A.FAIL): S.ERROR,
    (S.SUSPENDED, A.DESTROY): S.DESTROYED,
    (S.ERROR, A.DESTROY): S.DESTROYED,
}


@pytest.mark.parametrize(("state", "action"), list(itertools.product(S, A)))
def test_every_state_action_pair(state: SandboxState, action: Action) -> None:
    if (state, action) in EXPECTED:
        assert transition(state, action) is EXPECTED[(state, action)]
    else:
        with pytest.raises(InvalidTransition) as info:
            transition(state, action)
        assert info.value.state is state and info.value.action is action
        assert state.value in str(info.value) and action.value in str(info.value)


def test_table_is_exactly_the_expected_machine() -> None:
    assert TRANSITIONS == EXPECTED


def test_destroyed_is_final_and_error_only_destroys() -> None:
    assert not [a for (s, a) in TRANSITIONS if s is S.DESTROYED]
    assert [a for (s, a) in TRANSITIONS if s is S.ERROR] == [A.DESTROY]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("", SandboxBackend.NONE),  # F-BE-1
        (None, SandboxBackend.NONE),
        ("bogus", SandboxBackend.NONE),
        ("docker", SandboxBackend.NATIVE),
        ("Docker", SandboxBackend.NATIVE),
        ("native", SandboxBackend.NATIVE),
        (" microvm ", SandboxBackend.MICROVM),
        ("none", SandboxBackend.NONE),
    ],
)
def test_backend_from_name(name: str | None, expected: SandboxBackend) -> None:
    assert SandboxBackend.from_name(name) is expected


def test_backend_constructor_is_strict() -> None:
    with pytest.raises(ValueError):
        SandboxBackend("docker")


FULL = SandboxSpec(
    session_id="s1",
    workspace_id="w1",
    agent_id="a1",
    bind_mounts=(SandboxBindMount("/w/proj"), SandboxBindMount("/w/ref", "/w/ref", True)),
    network_enabled=False,
    egress_allowlist=("*.example.com", "bedrock.*.amazonaws.com"),
    guest_workdir="/w/proj",
    mode=SandboxMode.REVIEW,
    protected_paths=("/w/proj/.git",),
    runner_state_dirs=("/w/state",),
    exec_grant_roots=("/w/bin",),
)


def test_spec_round_trips_through_json() -> None:
    text = json_dumps(FULL)
    assert SandboxSpec.from_json(json.loads(text)) == FULL.validate()
    minimal = SandboxSpec.from_json({"session_id": "s", "workspace_id": "w"})
    assert minimal.mode is SandboxMode.CHAT and minimal.network_enabled is True
    assert minimal.bind_mounts == () and minimal.agent_id is None


def test_validate_normalises() -> None:
    spec = SandboxSpec("s", "w", bind_mounts=[SandboxBindMount("/a//b/")], mode="plan")  # type: ignore[arg-type]
    checked = spec.validate()
    assert checked.bind_mounts == (SandboxBindMount("/a/b", "", False),)
    assert checked.mode is SandboxMode.PLAN


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"workspace_id": "w"}, "session_id"),
        ({"session_id": "", "workspace_id": "w"}, "session_id"),
        ({"session_id": "s", "workspace_id": "w", "mode": "yolo"}, "mode"),
        ({"session_id": "s", "workspace_id": "w", "colour": 1}, "spec"),
        (
            {"session_id": "s", "workspace_id": "w", "bind_mounts": [{"host_path": "rel"}]},
            "bind_mounts[0].host_path",
        ),
        ({"session_id": "s", "workspace_id": "w", "bind_mounts": [{}]}, "bind_mounts[0].host_path"),
        (
            {"session_id": "s", "workspace_id": "w", "bind_mounts": [{"host_path": "/a/../b"}]},
            "bind_mounts[0].host_path",
        ),
        ({"session_id": "s", "workspace_id": "w", "protected_paths": ["x"]}, "protected_paths[0]"),
        ({"session_id": "s", "workspace_id": "w", "network_enabled": "yes"}, "network_enabled"),
        ({"session_id": "s", "workspace_id": "w", "guest_workdir": "./w"}, "guest_workdir"),
        ({"session_id": "s", "workspace_id": "w", "egress_allowlist": [""]}, "egress_allowlist[0]"),
        ({"session_id": "s", "workspace_id": "w", "runner_state_dirs": "/a"}, "runner_state_dirs"),
        ([], "spec"),
    ],
)
def test_bad_specs_name_the_field(data: object, field: str) -> None:
    with pytest.raises(SpecError) as info:
        SandboxSpec.from_json(data)
    assert info.value.field == field
    assert isinstance(info.value, ConfigError)


def _with(**kw: object) -> dict[str, object]:
    return {"session_id": "s", "workspace_id": "w", **kw}


@pytest.mark.parametrize(
    ("data", "field", "why"),
    [
        # ids are names for logs and lookups: printable, no '/', bounded
        (_with(session_id="a\0b"), "session_id", "printable"),
        (_with(session_id="a\nERROR forged log line"), "session_id", "printable"),
        (_with(session_id="\x1b[31mred"), "session_id", "printable"),
        (_with(session_id="a\u202eb"), "session_id", "printable"),  # bidi override
        (_with(session_id="a/b"), "session_id", "'/'"),
        (_with(session_id="s" * 129), "session_id", "at most 128 characters, got 129"),
        (_with(session_id="s" * 10_000_000), "session_id", "got 10000000"),
        (_with(workspace_id="w\0"), "workspace_id", "printable"),
        (_with(workspace_id="../w"), "workspace_id", "'/'"),
        (_with(workspace_id="w" * 129), "workspace_id", "at most 128"),
        # the host's kernel trees, and / which holds them
        (_with(bind_mounts=[{"host_path": "/proc"}]), "bind_mounts[0].host_path", "/proc"),
        (_with(bind_mounts=[{"host_path": "/proc/1/"}]), "bind_mounts[0].host_path", "/proc"),
        (_with(bind_mounts=[{"host_path": "/sys"}]), "bind_mounts[0].host_path", "/sys"),
        (_with(bind_mounts=[{"host_path": "/sys/kernel"}]), "bind_mounts[0].host_path", "/sys"),
        (_with(bind_mounts=[{"host_path": "/dev"}]), "bind_mounts[0].host_path", "devices"),
        (_with(bind_mounts=[{"host_path": "/dev/shm"}]), "bind_mounts[0].host_path", "/dev"),
        (
            _with(bind_mounts=[{"host_path": "/w"}, {"host_path": "/dev/null", "read_only": True}]),
            "bind_mounts[1].host_path",
            "/dev",
        ),
        (_with(bind_mounts=[{"host_path": "//"}]), "bind_mounts[0].host_path", "/ holds"),
        (_with(runner_state_dirs=["/proc"]), "runner_state_dirs[0]", "/proc"),
        (_with(runner_state_dirs=["/w", "/sys/fs/cgroup"]), "runner_state_dirs[1]", "/sys"),
        (_with(runner_state_dirs=["/"]), "runner_state_dirs[0]", "/ holds"),
    ],
)
def test_ids_and_kernel_trees_are_refused_naming_the_field(
    data: dict[str, object], field: str, why: str
) -> None:
    with pytest.raises(SpecError) as info:
        SandboxSpec.from_json(data)
    assert info.value.field == field
    assert why in info.value.reason, info.value.reason
    assert len(str(info.value)) < 400  # a huge id is not repeated back


@pytest.mark.parametrize(
    "data",
    [
        _with(session_id="s" * 128, workspace_id="w" * 128),
        _with(session_id="feature x: été 2.0_1@host", workspace_id=""),
        _with(bind_mounts=[{"host_path": "/procfs"}, {"host_path": "/devices"}]),
        _with(bind_mounts=[{"host_path": "/system"}], runner_state_dirs=["/srv/proc"]),
        _with(bind_mounts=[{"host_path": "/etc", "read_only": False}]),  # trusted, kept
    ],
)
def test_names_and_paths_near_the_refused_ones_are_kept(data: dict[str, object]) -> None:
    assert SandboxSpec.from_json(data).to_json()["session_id"] == data["session_id"]


def test_handle_round_trips_and_carries_backend() -> None:
    handle = SandboxHandle(
        "s", NATIVE, S.ERROR, error="boom", details=(("pid", "12"), ("workdir", "/w"))
    )
    data = json.loads(json_dumps(handle))
    assert data["backend"] == "native" and data["details"] == {"pid": "12", "workdir": "/w"}
    assert SandboxHandle.from_json(data) == handle
    assert handle.detail("pid") == "12" and handle.detail("nope", "-") == "-"
    with pytest.raises(SpecError):
        SandboxHandle.from_json({**data, "state": "sleeping"})


EVENTS = [
    StartingEvent("s", NATIVE),
    ReadyEvent("s", SandboxBackend.NONE),
    StdoutEvent("s", NATIVE, 3, b"\x00\xffbinary\n"),
    StderrEvent("s", NATIVE, 3, b""),
    KilledEvent("s", NATIVE, 3, KillReason.TIMEOUT, "after 1 s"),
    ExitEvent("s", NATIVE, 3, 137, 9),
    ExitEvent("s", NATIVE, 4, 127, 0, "nope: No such file or directory"),
    ViolationEvent("s", NATIVE, 5, SandboxViolation("network-outbound", "evil.com", "raw", "r")),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type)
def test_events_round_trip_and_name_the_backend(event: object) -> None:
    data = json.loads(json_dumps(event))  # type: ignore[arg-type]
    assert data["backend"] in ("native", "none")
    assert data["type"] == event.type  # type: ignore[attr-defined]
    assert event_from_json(data) == event
    assert event_to_json(event) == data  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "nope"}, "event.type"),
        ({"type": "exit", "session_id": "s", "backend": "native", "exec_id": 1}, "event.exit_code"),
        (
            {
                "type": "stdout",
                "session_id": "s",
                "backend": "native",
                "exec_id": 1,
                "data_b64": "!",
            },
            "event.data_b64",
        ),
        ({"type": "ready", "session_id": "s", "backend": "vm"}, "event.backend"),
        ({"type": "ready", "session_id": "s", "backend": "none", "extra": 1}, "event"),
        (
            {"type": "exit", "session_id": "s", "backend": "none", "exec_id": "1", "exit_code": 0},
            "event.exec_id",
        ),
    ],
)
def test_bad_events_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as info:
        event_from_json(data)
    assert info.value.field == field


def test_records_are_immutable() -> None:
    with pytest.raises(AttributeError):
        FULL.session_id = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        EVENTS[0].session_id = "x"  # type: ignore[misc]


def test_spec_and_plan_modules_are_pure() -> None:
    """STYLE §5.1: spec.py and policy/specplan.py import nothing that touches the OS."""
    code = "import sandhold.spec, sandhold.policy.specplan, sandhold.agent.protocol"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    loaded = {ln.rsplit("|", 1)[1].strip() for ln in out.stderr.splitlines() if "|" in ln}
    bad = {"subprocess", "socket", "asyncio", "ctypes", "fcntl", "shutil", "select"}
    assert loaded & bad == set()


def test_nothing_of_the_lifecycle_api_loads_with_the_package() -> None:
    code = "import sandhold, sys; print(sorted(m for m in sys.modules if m.startswith('sandhold')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['sandhold']"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"memory_bytes": "max"}, "limits.memory_bytes"),  # would reach memory.max as is
        ({"memory_bytes": 0}, "limits.memory_bytes"),
        ({"memory_bytes": -1}, "limits.memory_bytes"),
        ({"memory_bytes": 1 << 63}, "limits.memory_bytes"),
        ({"memory_bytes": 1.5e9}, "limits.memory_bytes"),
        ({"memory_bytes": True}, "limits.memory_bytes"),
        ({"pids": "max"}, "limits.pids"),
        ({"pids": 0}, "limits.pids"),
        ({"pids": (1 << 22) + 1}, "limits.pids"),  # above the kernel's PID_MAX_LIMIT
        ({"cpus": float("inf")}, "limits.cpus"),
        ({"cpus": float("nan")}, "limits.cpus"),
        ({"cpus": 0}, "limits.cpus"),
        ({"cpus": -2.0}, "limits.cpus"),
        ({"cpus": 4097}, "limits.cpus"),
        ({"cpus": 10**400}, "limits.cpus"),  # too big for a float
        ({"cpus": "2"}, "limits.cpus"),
        ({"cpus": False}, "limits.cpus"),
    ],
)
def test_resource_limits_are_checked_when_made(kwargs: dict[str, object], field: str) -> None:
    from sandhold._record import replace
    from sandhold.spec import ResourceLimits

    with pytest.raises(SpecError) as info:
        ResourceLimits(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(SpecError):  # a changed copy is checked too
        replace(ResourceLimits(), **kwargs)


def test_resource_limits_in_range_are_kept() -> None:
    from sandhold.spec import ResourceLimits

    limits = ResourceLimits(memory_bytes=1, pids=1 << 22, cpus=4096)
    assert limits.controllers == ("memory", "pids", "cpu")
    assert ResourceLimits(cpus=0.01).cpus == 0.01 and ResourceLimits().controllers == ()
