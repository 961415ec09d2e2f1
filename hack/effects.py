#!/usr/bin/env python3
"""hack/effects.py: the ground truth of side effects for the tests and the demo on the node.

    effects.py HOST:PORT FILE

A test's shell tools record each effect by sending one line over TCP (bash's /dev/tcp, from
inside a worker pod); every line received is appended to FILE and flushed before the next is
read, so FILE counts what really happened, whatever baton's own ledger says. Run it inside the
node's network namespace (hack/node.sh nsenter ...) on the node IP: the pods reach it there and
nothing outside the namespace can.
"""

import asyncio
import sys


async def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    host, _, port = sys.argv[1].rpartition(":")
    out = open(sys.argv[2], "a", buffering=1)
    lock = asyncio.Lock()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                async with lock:
                    out.write(line.decode(errors="replace").rstrip("\n") + "\n")
                    out.flush()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, int(port))
    print(f"effects: listening on {host}:{port}, recording to {sys.argv[2]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
