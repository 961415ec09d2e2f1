"""A Model Context Protocol server for baton's tests, written with the official Python SDK
(`mcp` on PyPI), serving Streamable HTTP on 127.0.0.1 at /mcp.

It binds --port (default 0: any) and prints `PORT <n>` once it listens. Every call of `record` appends one JSON
line to --calls (the note, the `_meta` baton sent, the auth header it saw) before it sleeps,
so a test can count how often a call ran, even one in flight when its worker was killed.
With --require-header NAME=VALUE, a request without that header gets 401.
"""

import argparse
import asyncio
import json
import socket
import sys

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--calls", required=True)
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--require-header", default=None)
parser.add_argument("--extra-tool", action="store_true", help="offer one more tool (a changed list)")
args = parser.parse_args()

server = MCPServer("baton-test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str) -> str:
    """Looks a key up. Changes nothing."""
    return f"the value of {key} is 42"


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
async def record(note: str, ctx: Context, seconds: float = 0) -> str:
    """Records a note (a side effect), then takes `seconds`."""
    meta = dict(ctx.request_context.meta or {})
    headers = ctx.headers or {}
    line = {
        "note": note,
        "fence": meta.get("dev.baton/fence"),
        "idempotencyKey": meta.get("dev.baton/idempotencyKey"),
        "run": meta.get("dev.baton/run"),
        "auth": headers.get("x-test-token"),
    }
    with open(args.calls, "a") as f:
        f.write(json.dumps(line) + "\n")
    count = sum(1 for _ in open(args.calls))
    await asyncio.sleep(seconds)
    return f"recorded {note} (call {count})"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami(ctx: Context) -> str:
    """Says which credential the request carried (a server that echoes a secret)."""
    headers = ctx.headers or {}
    return f"you sent x-test-token {headers.get('x-test-token')}"


@server.tool()
def explode() -> str:
    """Always fails."""
    # A ToolError's message reaches the client; other exceptions are hidden by the SDK.
    raise ToolError("the tool failed on purpose")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def huge() -> str:
    """Returns 300,000 bytes."""
    return "x" * 300_000


if args.extra_tool:

    @server.tool()
    def extra() -> str:
        """Only offered by a changed server."""
        return "extra"


app = server.streamable_http_app()

if args.require_header:
    name, _, value = args.require_header.partition("=")
    inner = app

    async def app(scope, receive, send):  # noqa: F811
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get(name.lower()) != value:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no token"})
                return
        await inner(scope, receive, send)


sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", args.port))
sock.listen(64)
print(f"PORT {sock.getsockname()[1]}", flush=True)
config = uvicorn.Config(app, log_level="warning", lifespan="on")
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
