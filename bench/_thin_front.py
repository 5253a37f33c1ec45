"""The thinnest HTTP front over ``SandboxPort`` (bench only): what any HTTP hop costs.

``bench/server.py`` runs this in a process of its own beside ``sandhold serve``
and times the same execs through it, so that the server's figure splits into
what one more process and an HTTP round trip cost on the host (this front) and
what the server itself adds (auth, validation, the store, events, the command
policy). It is llhttp's parser under a bare asyncio protocol, with no auth, no
validation, no store and no events: never a server to run anything real with.

Routes (POST only; bodies JSON):
- ``/launch/NAME`` -> ``{"id"}``: a sandbox of ``library_spec`` (a checkout of
  its own under the scratch dir);
- ``/run/ID`` ``{"argv"}`` -> ``{"exit_code"}``: ``port.run``;
- ``/destroy/ID`` -> ``{}``.

Usage (by bench/server.py): python _thin_front.py SCRATCH REPO; prints the port.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))


def library_spec(name: str, own: Path, repo: Path) -> Any:
    """The spec the server's dispatch makes for a ``chat`` run with the network off:
    a checkout of its own, made as the server makes one (its ``.git`` brings the same
    protected names into the writable root), the registered repo read-only and
    protected."""
    from sandhold.server.checkout import make_checkout, remove_checkout
    from sandhold.spec import SandboxBindMount, SandboxSpec

    remove_checkout(str(own))
    own.parent.mkdir(parents=True, exist_ok=True)
    make_checkout(str(repo), str(own), f"sandhold/{name}")
    return SandboxSpec(
        name,
        "bench",
        bind_mounts=(SandboxBindMount(str(own)), SandboxBindMount(str(repo), read_only=True)),
        network_enabled=False,
        guest_workdir=str(own),
        protected_paths=(str(repo),),
    )


class _Front(asyncio.Protocol):
    def __init__(self, port: Any, scratch: Path, repo: Path) -> None:
        import httptools

        self.port, self.scratch, self.repo = port, scratch, repo
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        url, body, self.url, self.body = self.url.decode(), self.body, b"", b""
        asyncio.get_running_loop().create_task(self._answer(url, body))

    async def _answer(self, url: str, body: bytes) -> None:
        _, route, arg = url.split("/", 2)
        out: dict[str, Any] = {}
        if route == "launch":
            spec = await asyncio.to_thread(library_spec, arg, self.scratch / arg, self.repo)
            out["id"] = (await self.port.launch(spec)).session_id
        elif route == "run":
            out["exit_code"] = (await self.port.run(arg, json.loads(body)["argv"])).exit_code
        else:
            await self.port.destroy(arg)
        data = json.dumps(out).encode()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(data), data)
        )


async def _main(scratch: Path, repo: Path) -> None:
    from sandhold.port import SandboxPort

    async with SandboxPort() as port:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Front(port, scratch, repo), "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(_main(Path(sys.argv[1]), Path(sys.argv[2])))
    except KeyboardInterrupt:
        pass
