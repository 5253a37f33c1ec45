"""The egress seam: a ``NetworkSetup`` puts the sandbox in a network namespace it made.

The setup here is a stand-in for the per-session proxies (the integrator wires
the real ones): it starts bwrap through ``netns.spawn_in_netns``, so the
sandbox's only reachable listeners are the two it holds, and it names each exec
in the environment so that a refusal can be attributed. As root and as a user.
"""

from __future__ import annotations

from conftest import World
from portdriver import drive


def test_a_network_setup_runs_before_bwrap_and_reaches_every_exec(world: World) -> None:
    out = drive(
        world,
        """
        import socket
        from sandhold.backends.linux.netns import spawn_in_netns

        class Setup:
            share_net = True
            def __init__(self):
                self.listeners = []
                self.closed = False
            def spawn(self, argv, env, pass_fds, stderr):
                pid, http, socks = spawn_in_netns(argv[0], argv, env, pass_fds)
                self.listeners = [http, socks]
                return pid
            def environment(self):
                return {"HTTP_PROXY": "http://127.0.0.1:3128"}
            def exec_environment(self, exec_id):
                return {"SANDHOLD_EXEC_TOKEN": f"exec-{exec_id}"}
            def close(self):
                self.closed = True
                for s in self.listeners:
                    s.close()

        async def main(port):
            setups = []
            def factory(spec):
                setups.append(Setup())
                return setups[-1]
            port._network_factory = factory
            h = await port.launch(spec())
            setup = setups[0]
            http = setup.listeners[0]
            http.setblocking(False)
            probe = (
                "import os, socket; "
                "c = socket.create_connection(('127.0.0.1', 3128), 2); "
                "e = os.environ; "
                "c.sendall((e['SANDHOLD_EXEC_TOKEN'] + ' ' + e['HTTP_PROXY']).encode()); "
                "c.close(); "
                "socket.create_connection(('1.1.1.1', 80), 1)"
            )
            ex = await port.exec(h, ["python3", "-c", probe])
            loop = asyncio.get_running_loop()
            conn, _ = await asyncio.wait_for(loop.sock_accept(http), 5)
            OUT["received"] = (await loop.sock_recv(conn, 100)).decode()
            conn.close()
            r = await ex.output()
            OUT["direct"] = r.stderr.decode().strip().splitlines()[-1]
            OUT["exec_id"] = ex.exec_id
            await port.destroy(h)
            OUT["closed"] = setup.closed
        """,
    )
    assert out["received"] == f"exec-{out['exec_id']} http://127.0.0.1:3128"
    assert "Network is unreachable" in str(out["direct"])  # no other way out
    assert out["closed"] is True
