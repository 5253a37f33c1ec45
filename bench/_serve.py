"""Start a real ``sandhold serve`` for a benchmark: its own state dir, its log in a file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def start_server(
    scratch: Path, *, unix: Path | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    """The server process, its URL and the first client's token; with ``unix``, it
    listens on that socket too."""
    state = scratch / "state"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True, mode=0o700)
    log = scratch / "server.log"
    with open(log, "wb") as out:  # a file, not a pipe: an unread pipe would stall the server
        proc = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "sandhold",
                "serve",
                "--listen",
                "127.0.0.1:0",
                *(("--unix", str(unix)) if unix is not None else ()),
                "--state-dir",
                str(state),
            ],
            stderr=out,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
    deadline = time.monotonic() + 30
    while not (m := re.search(r"listening on (http://\S+)", log.read_text())) or (
        unix is not None and "listening on unix:" not in log.read_text()
    ):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return proc, m.group(1), (state / "token").read_text().strip()
