"""A pre-exec hook for tests/test_agent_process.py: shows the seam the supervisor will use.

``prepare`` makes a pipe in the agent; ``pre_exec`` (in the child, after chdir,
before execve) writes its pid and cwd into it; ``spawned`` (in the agent)
watches the read end and reports what arrives as a violation of that exec.
"""

from __future__ import annotations

import os


class ExampleHook:
    def __init__(self, agent: object) -> None:
        self.agent = agent

    def prepare(self, ctx: object) -> tuple[int, int]:
        return os.pipe2(os.O_CLOEXEC)

    def pre_exec(self, ctx: object, state: tuple[int, int]) -> None:
        argv = getattr(ctx, "argv")  # noqa: B009
        if argv[0] == b"refuse-me":
            raise OSError(13, "refused by the example hook")
        os.write(state[1], f"{os.getpid()} {os.getcwd()}".encode())

    def spawned(self, ctx: object, state: tuple[int, int], pid: int) -> None:
        r, w = state
        os.close(w)
        exec_id = getattr(ctx, "exec_id")  # noqa: B009
        agent = self.agent

        def ready(fd: int, events: int) -> None:
            data = os.read(fd, 4096)
            agent.unwatch(fd)  # type: ignore[attr-defined]
            os.close(fd)
            if data:
                agent.violation(exec_id, "hook-saw", data.decode(), raw="example", rule="test")  # type: ignore[attr-defined]

        agent.watch(r, ready)  # type: ignore[attr-defined]


def factory(agent: object) -> ExampleHook:
    return ExampleHook(agent)
