"""A TCP proxy that holds every chunk of bytes for a fixed delay before passing it on, in order: a
database "further away" than loopback, for benchmarks (no root, no ``tc netem`` on the shared ``lo``).

    python3 tools/bench/delay_proxy.py LISTEN_PORT TARGET_PORT ONE_WAY_MS

Listens on 127.0.0.1:LISTEN_PORT, connects each client to 127.0.0.1:TARGET_PORT, and delays both
directions by ONE_WAY_MS, so a round trip takes about twice that more than on loopback (the event
loop wakes with about a millisecond's precision). Prints ``ready`` once it listens. It is its own
process, so its CPU is not the benchmarked client's.
"""

from __future__ import annotations

import asyncio
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def forward() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(forward())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
    except ConnectionError:
        queue.put_nowait((0.0, b""))
    await sender


async def main(listen: int, target: int, delay: float) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer, delay), pipe(upstream_reader, writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(client, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))
