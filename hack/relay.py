#!/usr/bin/env python3
"""hack/relay.py: a TCP relay from 127.0.0.1 in the root network namespace into the node's.

    relay.py LISTEN_PORT NETNS_PATH TARGET_HOST:TARGET_PORT

It binds 127.0.0.1:LISTEN_PORT first, while still in the root namespace, then moves itself into
the node's network namespace (setns), so every connection it makes afterwards starts inside
that namespace: the tests reach the node's API server on loopback and nothing of the node is
exposed on any other address. Half-closes pass through (exec and log streams rely on them).

Python's standard library has no setns before 3.12, so it is called through libc.
"""

import asyncio
import ctypes
import os
import resource
import socket
import sys

CLONE_NEWNET = 0x40000000
# The kernel buffers of each relayed connection, both ways (Linux keeps twice this). Left to
# itself Linux grows them to megabytes while the relay keeps up, and a test that holds a
# thousand streams open and reads nothing would park gigabytes here, past the machine's TCP
# memory limit (net.ipv4.tcp_mem), where the kernel drops packets on every connection.
BUFFER_BYTES = 64 * 1024


def bounded(sock: socket.socket) -> socket.socket:
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, BUFFER_BYTES)
    return sock


def enter_netns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def serve(listener: socket.socket, host: str, port: int) -> None:
    async def handle(client_r, client_w):
        upstream = bounded(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        try:
            upstream.setblocking(False)
            await asyncio.get_running_loop().sock_connect(upstream, (host, port))
            up_r, up_w = await asyncio.open_connection(sock=upstream)
        except OSError as e:
            upstream.close()
            print(f"relay: connecting to {host}:{port}: {e}", file=sys.stderr, flush=True)
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))
        for w in (client_w, up_w):
            w.close()

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    listen_port, netns, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host, _, port = target.rpartition(":")
    # Two sockets per relayed connection: a test that holds a thousand streams open needs more
    # than the usual soft limit of 1,024 files.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # Accepted connections inherit the listener's buffers.
    listener = bounded(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", listen_port))
    listener.listen(512)
    enter_netns(netns)
    print(f"relay: 127.0.0.1:{listen_port} -> {target} in {netns}", flush=True)
    asyncio.run(serve(listener, host, int(port)))


if __name__ == "__main__":
    main()
