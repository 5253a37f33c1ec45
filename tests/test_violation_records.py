"""What a run records of its refusals is bounded: the report memfd is the host's memory,
the --violations file the user's disk, the --debug summary this process's memory."""

from __future__ import annotations

import io
import json
import os
from types import SimpleNamespace

import pytest

from sandhold.backends.linux.supervisor import runner
from sandhold.backends.linux.supervisor.violation import Violation
from sandhold.net import egress_runner
from sandhold.policy.cliplan import EgressPlan
from sandhold.policy.refusal import CREDENTIAL
from sandhold.settings import FilesystemSettings


def test_the_supervisor_report_ends_with_one_dropped_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "MAX_REPORTED", 3)
    monkeypatch.setattr(runner, "_records", {})
    fd = os.memfd_create("report")
    try:
        for i in range(10):
            v = Violation("file-write-create", f"/w/{i}.pem", "credential", "openat", 1, CREDENTIAL)
            runner._report(fd, v)
        lines = [json.loads(x) for x in os.pread(fd, 1 << 20, 0).splitlines()]
    finally:
        os.close(fd)
    assert [x["target"] for x in lines[:3]] == ["/w/0.pem", "/w/1.pem", "/w/2.pem"]
    assert len(lines) == 4 and lines[3]["action"] == "violations-dropped"
    assert "more than 3 refusals" in lines[3]["rule"]


def test_the_supervisor_report_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths may be 4 KiB long: the count alone would let 20,000 lines take 80 MB."""
    monkeypatch.setattr(runner, "_records", {})
    fd = os.memfd_create("report")
    try:
        for i in range(runner.MAX_REPORTED):
            long = "/w/" + "d/" * 2000 + f"{i}.pem"
            v = Violation("file-write-create", long, "credential", "openat", 1, CREDENTIAL)
            runner._report(fd, v)
        size = os.fstat(fd).st_size
        lines = [json.loads(x) for x in os.pread(fd, size, 0).splitlines()]
    finally:
        os.close(fd)
    assert size <= runner.MAX_REPORTED_BYTES + 1024
    assert lines[-1]["action"] == "violations-dropped"
    assert "bytes of refusals" in lines[-1]["rule"]
    assert all(x["action"] == "file-write-create" for x in lines[:-1])


def test_the_violations_file_and_summary_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(egress_runner, "MAX_LOGGED", 2)
    monkeypatch.setattr(egress_runner, "MAX_SUMMARY_KEYS", 2)
    out = io.StringIO()
    er = egress_runner.EgressRunner(EgressPlan((), ()), FilesystemSettings(), violations=out)
    try:
        for i in range(6):
            er._record(
                SimpleNamespace(
                    allowed=False, action="network-outbound", target=f"h{i}.test:80",
                    rule="not allowed", reason="r", proxy="http",
                )
            )  # fmt: skip
    finally:
        er.stop()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["action"] for x in lines] == ["network-outbound"] * 2 + ["violations-dropped"]
    assert er.refused == {
        ("h0.test:80", "not allowed"): 1,
        ("h1.test:80", "not allowed"): 1,
        ("(other hosts)", ""): 4,
    }
