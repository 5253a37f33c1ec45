"""The one backend chooser (policy/backend.py), as a table: F-BE-1, F-BE-6, F-BE-7."""

from __future__ import annotations

import pytest

from sandhold.errors import BackendUnavailable, UsageError
from sandhold.policy.backend import choose_backend
from sandhold.probe import Probe

HERE = Probe(
    "linux", True, False, "native", "bubblewrap: namespace isolation", bwrap="/usr/bin/bwrap"
)
MISSING = Probe(
    "linux", False, True, "none", "bubblewrap is not installed", hint="apt-get install bubblewrap"
)


@pytest.mark.parametrize(
    ("requested", "probe", "switch", "expected"),
    [
        # explicit backends are exact, whatever the switch
        ("native", HERE, "off", ("native", "/usr/bin/bwrap", "")),
        ("none", HERE, "require", ("none", None, "")),
        ("none", MISSING, "require", ("none", None, "")),
        ("native", MISSING, "on", "unavailable:native"),
        ("microvm", HERE, "on", "unavailable:microvm"),
        ("microvm", MISSING, "off", "unavailable:microvm"),
        # unspecified: the switch decides, and every fallback is logged
        (None, HERE, "require", ("native", "/usr/bin/bwrap", "info")),
        (None, HERE, "on", ("native", "/usr/bin/bwrap", "info")),
        (None, HERE, "off", ("none", None, "warning")),
        (None, MISSING, "require", "unavailable:native"),
        (None, MISSING, "on", ("none", None, "warning")),
        (None, MISSING, "off", ("none", None, "warning")),
    ],
)
def test_choice(requested: str | None, probe: Probe, switch: str, expected: object) -> None:
    try:
        choice = choose_backend(requested, probe, switch=switch)
    except BackendUnavailable as exc:
        assert expected == f"unavailable:{exc.backend}"
        if exc.backend == "native":  # the refusal says how to go without, on purpose
            assert "pass --backend none" in exc.hint and probe.hint in exc.hint
        else:
            assert "no fallback" in exc.hint
        return
    assert (choice.backend, choice.bwrap, choice.log_level) == expected
    assert bool(choice.log_line) == bool(choice.log_level)


def test_the_refusal_speaks_the_callers_language() -> None:
    with pytest.raises(BackendUnavailable, match=r"or launch with backend=NONE to run"):
        choose_backend(None, MISSING, unisolated="launch with backend=NONE")
    with pytest.raises(BackendUnavailable, match=r"/dev/kvm absent"):
        choose_backend("microvm", HERE, kvm=False)


@pytest.mark.parametrize(("requested", "switch"), [("docker", "require"), (None, "maybe")])
def test_unknown_names_are_usage_errors(requested: str | None, switch: str) -> None:
    with pytest.raises(UsageError):
        choose_backend(requested, HERE, switch=switch)
