"""``sandhold.client``: against a real ``sandhold serve`` (TCP and its unix socket, as
root and as the unprivileged user), and its HTTP (``client/_http.py``) against local
asyncio servers that misbehave on purpose: keep-alive, a connection the server
closed while idle, timeouts, oversized and malformed answers, server-sent events
cut at every byte."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from conftest import World
from sandhold.client import ApiError, Client, ClientError, SyncClient, _http
from serverkit import git_repo, served

# -- against the real server -------------------------------------------------------------


def test_the_client_drives_a_real_server_over_tcp_and_its_unix_socket(world: World) -> None:
    repo = git_repo(world, "repo")
    sock = world.root / "serve.sock"
    with served(world, "--listen", "127.0.0.1:0", "--unix", str(sock)) as srv:
        assert srv.url and srv.unix
        for how in ("tcp", "unix"):
            where: dict[str, Any] = {"unix": srv.unix} if how == "unix" else {}
            url = None if how == "unix" else srv.url
            with SyncClient(url, token=srv.token, **where) as api:
                assert api.healthz() == {"status": "ok"}
                ws = api.create_workspace(f"w-{how}", [str(repo)])
                run = api.create_run(ws["id"], mode="chat", network="deny")
                done = api.run(run["id"], argv=["sh", "-c", "echo out; echo err >&2; exit 3"])
                assert (done["exit_code"], done["stdout"], done["stderr"]) == (3, "out\n", "err\n")
                # one connection, kept alive, served every request of this client
                assert len(api._client._http._idle) == 1
                with pytest.raises(ApiError) as refused:
                    api.exec(run["id"], shell="git push origin HEAD")
                assert (refused.value.status, refused.value.code) == (403, "command_policy")
                with pytest.raises(ApiError) as missing:
                    api.get_run("run-that-never-was")
                assert missing.value.status == 404
                kinds = []
                for _, event in api.events(run["id"]):
                    kinds.append(event["type"])
                    if event["type"] == "exit":
                        break
                assert "stdout" in kinds and kinds[-1] == "exit", kinds
                api.delete_run(run["id"])
        with SyncClient(srv.url, token="wrong") as api, pytest.raises(ApiError) as bad:
            api.runs()
        assert bad.value.status == 401


def test_refused_urls_and_an_absent_server() -> None:
    refused = (
        "https://127.0.0.1:1",
        "ftp://x",
        "http://",
        "http://127.0.0.1:1/prefix",
        "http://u:p@127.0.0.1:1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:1/?q=1",
    )
    for url in refused:
        with pytest.raises(ClientError):
            Client(url)

    async def absent() -> None:
        async with Client("http://127.0.0.1:1", token="t") as api:
            await api.healthz()

    with pytest.raises(ClientError, match="cannot connect"):
        asyncio.run(absent())


# -- the transport against scripted servers ----------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def scripted(handler: Handler) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A local server running ``handler(reader, writer, n)`` for its n-th connection;
    yields its port and every request head it read (``read_head`` appends them)."""
    seen: list[bytes] = []
    count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        reader.seen = seen  # type: ignore[attr-defined]
        try:
            await handler(reader, writer, count)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, seen
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    reader.seen.append(head)  # type: ignore[attr-defined]
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


def answer(body: bytes, *, status: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status,
        len(body),
        extra,
        body,
    )


def transport(port: int, **kw: Any) -> _http.Transport:
    return _http.Transport(host="127.0.0.1", port=port, **kw)


def test_keep_alive_reuses_one_connection_and_closes_when_told() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            head, _ = await read_request(reader)
            close = b"/close" in head
            writer.write(answer(b"{}", extra=b"connection: close\r\n" if close else b""))
            await writer.drain()
            if close:
                return

    async def main() -> tuple[list[int], list[bytes]]:
        conns = []
        async with scripted(handler) as (port, seen):
            t = transport(port, headers=[(b"authorization", b"Bearer x")])
            for path in ("/a", "/b", "/close", "/c", "/d"):
                assert (await t.request("GET", path)).status == 200
                conns.append(id(t._idle[-1]) if t._idle else 0)
            await t.aclose()
            return conns, seen

    conns, seen = asyncio.run(main())
    assert conns[0] == conns[1] and conns[2] == 0 and conns[3] == conns[4] != conns[0]
    assert all(b"host: 127.0.0.1:" in h and b"authorization: Bearer x" in h for h in seen)


def _closes_after_first(reply_first: bytes) -> Handler:
    """Answers the first request of its first connection, then closes it while the
    client holds it idle; later connections answer everything."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(answer(reply_first))
            await writer.drain()
            if n == 1:
                return

    return handler


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_an_idempotent_request_on_a_connection_closed_while_idle_is_sent_again(
    method: str,
) -> None:
    async def main() -> int:
        async with scripted(_closes_after_first(b"{}")) as (port, seen):
            t = transport(port)
            await t.request("GET", "/first")
            conn = t._idle[-1]
            conn.reader.at_eof = lambda: False  # type: ignore[method-assign]  # as if not seen yet
            await asyncio.sleep(0.05)
            assert (await t.request(method, "/again")).status == 200
            await t.aclose()
            return len(seen)

    assert asyncio.run(main()) == 2  # the server read /again once, on the new connection


def test_a_post_is_never_sent_twice() -> None:
    async def main() -> list[bytes]:
        async with scripted(_closes_after_first(b"{}")) as (port, seen):
            t = transport(port)
            await t.request("GET", "/first")
            t._idle[-1].reader.at_eof = lambda: False  # type: ignore[method-assign]
            await asyncio.sleep(0.05)
            with pytest.raises(ClientError, match="connection failed"):
                await t.request("POST", "/execs", b"{}")
            await t.aclose()
            return seen

    seen = asyncio.run(main())
    assert [h.split(b" ")[1] for h in seen] == [b"/first"]


def test_a_connection_seen_closed_or_idle_too_long_is_not_reused() -> None:
    async def main() -> int:
        async with scripted(_closes_after_first(b"{}")) as (port, seen):
            t = transport(port)
            await t.request("GET", "/first")
            await asyncio.sleep(0.05)  # the loop sees the server's end: at_eof()
            await t.request("POST", "/second", b"{}")  # a POST, on a fresh connection
            t._idle[-1].idle_since -= _http.IDLE_MAX + 1
            await t.request("POST", "/third", b"{}")
            await t.aclose()
            return len(seen)

    assert asyncio.run(main()) == 3


def test_timeouts_oversized_and_malformed_answers_are_client_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head, _ = await read_request(reader)
        path = head.split(b" ")[1]
        if path == b"/slow":
            await asyncio.sleep(5)
        elif path == b"/big":
            writer.write(answer(b"x" * 5000))
        elif path == b"/garbage":
            writer.write(b"SMTP ready\r\n\r\n")
        elif path == b"/cut":
            writer.write(b"HTTP/1.1 200 X\r\ncontent-length: 100\r\n\r\nshort")
        elif path == b"/huge-head":
            writer.write(b"HTTP/1.1 200 X\r\nx: " + b"a" * 200_000 + b"\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        async with scripted(handler) as (port, _):
            t = transport(port, timeout=0.3, max_body=1000)
            with pytest.raises(ClientError, match="no answer within"):
                await t.request("GET", "/slow")
            with pytest.raises(ClientError, match="over 1000 bytes"):
                await t.request("GET", "/big")
            for path in ("/garbage", "/cut", "/huge-head"):
                with pytest.raises(ClientError):
                    await t.request("POST", path, b"{}")
            assert t._idle == []  # none of those connections was kept

    asyncio.run(main())


def test_a_status_without_json_and_an_error_body_reach_the_caller() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            head, _ = await read_request(reader)
            if b"/err" in head:
                err = {"error": {"code": "nope", "message": "refused"}}
                writer.write(answer(json.dumps(err).encode(), status=409))
            elif b"/html" in head:
                writer.write(answer(b"<html>", status=502))
            else:
                writer.write(answer(b"not json"))
            await writer.drain()

    async def main() -> None:
        async with (
            scripted(handler) as (port, _),
            Client(f"http://127.0.0.1:{port}", token="t") as api,
        ):
            with pytest.raises(ApiError) as e:
                await api.request("GET", "/err")
            assert (e.value.status, e.value.code, e.value.message) == (409, "nope", "refused")
            with pytest.raises(ApiError) as e:
                await api.request("GET", "/html")
            assert (e.value.status, e.value.code) == (502, "http_error")
            with pytest.raises(ClientError, match="without JSON"):
                await api.request("GET", "/plain")

    asyncio.run(main())


EVENTS = (
    b": keep-alive\r\n\r\n"
    b'id: 1\r\ndata: {"type": "a"}\r\n\r\n'
    b'id: 2\ndata: {"type":\ndata:  "b"}\n\n'
    b"event: ignored\n\n"
)


@pytest.mark.parametrize("step", [1, 2, 7, len(EVENTS)])
def test_events_are_parsed_however_the_stream_is_cut(step: int) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head, _ = await read_request(reader)
        assert b"last-event-id: 7" in head and b"accept: text/event-stream" in head
        writer.write(b"HTTP/1.1 200 X\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        for i in range(0, len(EVENTS), step):
            piece = EVENTS[i : i + step]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with (
            scripted(handler) as (port, _),
            Client(f"http://127.0.0.1:{port}", token="t") as api,
        ):
            return [e async for e in api.events("r1", last_event_id=7)]

    assert asyncio.run(main()) == [(1, {"type": "a"}), (2, {"type": "b"})]


def test_a_malformed_event_is_a_client_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 X\r\ncontent-length: 20\r\n\r\nid: x\ndata: {}\n\n\n\n\n\n")
        await writer.drain()

    async def main() -> None:
        async with (
            scripted(handler) as (port, _),
            Client(f"http://127.0.0.1:{port}", token="t") as api,
        ):
            with pytest.raises(ClientError, match="malformed event"):
                async for _ in api.events("r1"):
                    pass

    asyncio.run(main())
