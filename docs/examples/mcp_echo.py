"""A minimal stdio MCP-style server: JSON-RPC 2.0, one request per line on stdin.

It answers ``initialize``, ``tools/list`` and ``tools/call`` (an ``echo`` tool)
and ignores notifications. Used by the README to show a wrapped MCP server.
"""

import json
import sys


def answer(request: dict) -> dict | None:
    if "id" not in request:
        return None  # a notification
    method = request.get("method")
    if method == "initialize":
        result: object = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "echo", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        text = request["params"]["arguments"]["text"]
        result = {"content": [{"type": "text", "text": text}]}
    else:
        return {
            "jsonrpc": "2.0",
            "id": request["id"],
            "error": {"code": -32601, "message": f"no method {method}"},
        }
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


for line in sys.stdin:
    reply = answer(json.loads(line))
    if reply is not None:
        sys.stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
        sys.stdout.flush()
