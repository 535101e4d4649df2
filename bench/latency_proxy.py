"""A loopback TCP proxy that adds a fixed network round-trip time, for bench/fetch_bench.py.

    python bench/latency_proxy.py --target-port 9090 --rtt-ms 20 [--listen-port 0]

Listens on 127.0.0.1 (a free port by default) and, once ready, prints one line
``listening 127.0.0.1:<port>`` on stdout. Every accepted connection is forwarded to
127.0.0.1:<target-port>. Each direction is a delay line: every chunk of bytes is written out
``rtt/2`` after the proxy read it, so a request/response exchange on a kept-alive connection pays
one round trip of ``rtt`` on top of the server's own time. The delay is a fixed propagation delay,
not a per-read sleep: the reads that make up one large response are all shifted by the same
``rtt/2`` instead of paying it one after another.

What it does not model: bandwidth limits, loss, jitter, and the handshake of a new connection (the
kernel completes the client's connect() to the proxy at once; a real network would add one round
trip per new connection). Run it as its own process, so its CPU does not compete for the GIL of
the program being measured. SIGTERM or SIGINT closes the listener and every connection, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

_READ_SIZE = 256 * 1024


async def _read_into(reader: asyncio.StreamReader, line: asyncio.Queue, delay: float) -> None:
    """Stamp every chunk read with the time it is due at the other end; ``b""`` marks EOF."""
    loop = asyncio.get_running_loop()
    while True:
        data = await reader.read(_READ_SIZE)
        line.put_nowait((loop.time() + delay, data))
        if not data:
            return


async def _write_from(line: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
    """Write every chunk when it is due; pass EOF on as a half-close."""
    loop = asyncio.get_running_loop()
    while True:
        due, data = await line.get()
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if not data:
            if writer.can_write_eof():
                writer.write_eof()
            return
        writer.write(data)
        await writer.drain()  # a slow receiver pushes back, as TCP would


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target_port: int,
    one_way: float,
) -> None:
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        client_writer.close()
        return
    to_server: asyncio.Queue = asyncio.Queue()
    to_client: asyncio.Queue = asyncio.Queue()
    tasks = [
        asyncio.create_task(_read_into(client_reader, to_server, one_way)),
        asyncio.create_task(_write_from(to_server, upstream_writer)),
        asyncio.create_task(_read_into(upstream_reader, to_client, one_way)),
        asyncio.create_task(_write_from(to_client, client_writer)),
    ]
    try:
        # Both directions run to their EOF; a reset on either side ends the connection.
        await asyncio.gather(*tasks)
    except OSError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in (client_writer, upstream_writer):
            writer.close()


async def serve(target_port: int, rtt_ms: float, listen_port: int = 0) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    one_way = rtt_ms / 2000.0
    connections: set[asyncio.Task] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await _relay(reader, writer, target_port, one_way)
        except asyncio.CancelledError:
            # Cancelled by shutdown (its sockets are closed by now): end normally, since
            # Python 3.11's asyncio.streams logs a traceback for a cancelled connection task.
            pass
        finally:
            connections.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    port = server.sockets[0].getsockname()[1]
    print(f"listening 127.0.0.1:{port}", flush=True)
    await stop.wait()
    server.close()
    for task in list(connections):
        task.cancel()
    await asyncio.gather(*connections, return_exceptions=True)
    await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--rtt-ms", type=float, required=True,
                        help="added round-trip time; half of it on each direction")
    parser.add_argument("--listen-port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    if args.rtt_ms < 0:
        parser.error("--rtt-ms must be >= 0")
    asyncio.run(serve(args.target_port, args.rtt_ms, args.listen_port))


if __name__ == "__main__":
    main()
