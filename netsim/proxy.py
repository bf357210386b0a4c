"""A user-space TCP proxy that makes a link slow or bad (the kernel's netem is not always there).

Placed on a site's path (run inside the site's namespace, the agent pointed at its loopback port),
it forwards every connection to the upstream address and applies the current conditions:

- `delay_ms`: one-way delay added in each direction (RTT grows by twice this);
- `up_mbit` / `down_mbit`: bandwidth cap client→server / server→client (a serialising link: a chunk
  leaves when the previous one has, then travels `delay_ms`);
- `mode`: "pass"; "stall" (connections are accepted and their bytes read, but nothing is forwarded
  or answered — what a half-dead middlebox does; a connection stalled once stays a black hole until
  its client gives up on it, as the peer would never hear of the end of the stall: only connections
  made after it pass); "mute" (requests pass, answers are swallowed: the request took effect and the
  client never hears of it — what a retried request must survive; a connection muted once stays so);
  "drop" (every connection is reset at once, new ones as soon as they are accepted);
- `reset_every`: reset every open connection each N seconds;
- `schedule`: [[AT_SECONDS, {changes}], ...], changes applied AT seconds after the conditions were set
  (e.g. a cut from 5 s to 25 s: [[5, {"mode": "drop"}], [25, {"mode": "pass"}]]).

Control: `--control FILE` (JSON of the fields above; re-read when it changes), or `Proxy.set()` in
process. Counters (connections, HTTP requests by route, bytes each way, resets) go to `--stats FILE`
(JSON, rewritten as they change) and `Proxy.stats`. Requests are counted by following HTTP/1.1 framing
on the client's stream (request heads, Content-Length and chunked bodies).

`--upstream-netns NS` opens the upstream connections inside network namespace NS (netsim.hosts): a
test in the root namespace reaches a host's port through a loopback port of its own.

    python -m netsim.proxy --listen 127.0.0.1:9000 --upstream 10.203.0.1:8000 --control c.json --stats s.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import socket
import struct
import sys
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

CHUNK = 16384


@dataclass(frozen=True)
class Conditions:
    delay_ms: float = 0.0
    up_mbit: float | None = None
    down_mbit: float | None = None
    mode: str = "pass"
    reset_every: float | None = None
    schedule: tuple = ()

    def __post_init__(self):
        if self.mode not in ("pass", "stall", "mute", "drop"):
            raise ValueError(f"mode {self.mode!r}: expected pass, stall, mute or drop")

    def rate(self, direction: str) -> float | None:
        """Bytes per second in `direction` ("up": client→server), None for no cap."""
        mbit = self.up_mbit if direction == "up" else self.down_mbit
        return None if not mbit else mbit * 1e6 / 8

    @classmethod
    def parse(cls, data: dict) -> Conditions:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "schedule" in known:
            known["schedule"] = tuple((float(at), dict(ch)) for at, ch in known["schedule"])
        return cls(**known)


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    resets: int = 0
    stalled: int = 0
    muted: int = 0
    refused: int = 0
    upstream_failures: int = 0
    routes: dict = field(default_factory=collections.Counter)

    def as_dict(self) -> dict:
        return {**asdict(self), "routes": dict(sorted(self.routes.items()))}


_ID = re.compile(r"^[0-9a-f]{8,}$|^[0-9a-f-]{16,}$|^j[-_0-9a-z]{6,}$", re.I)


def route_of(target: bytes) -> str:
    """A request target reduced to its route: the query dropped, a job id and what follows a message
    topic folded (GET /jobs/ID/messages/share/a/b → GET /jobs/*/messages/...)."""
    path = target.split(b"?", 1)[0].decode("latin-1")
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "jobs":
        parts[1] = "*"
        if len(parts) > 3:
            parts = parts[:3] + ["..."]
    return "/" + "/".join(parts)


class RequestCounter:
    """HTTP/1.1 request framing on a client's byte stream: counts each request head, skips its body."""

    def __init__(self, stats: Stats):
        self.stats, self.buf, self.body, self.chunked = stats, b"", 0, False

    def feed(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.body:
                n = min(self.body, len(self.buf))
                self.buf, self.body = self.buf[n:], self.body - n
                if self.body:
                    return
            if self.chunked:
                line_end = self.buf.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(self.buf[:line_end].split(b";")[0] or b"0", 16)
                if size == 0:  # the last chunk, then (no trailers from our clients) the closing CRLF
                    if len(self.buf) < line_end + 4:
                        return
                    self.buf, self.chunked = self.buf[line_end + 4:], False
                    continue
                self.buf, self.body = self.buf[line_end + 2:], size + 2
                continue
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            lines = head.split(b"\r\n")
            method, target = (lines[0].split(b" ") + [b"", b""])[:2]
            self.stats.requests += 1
            self.stats.routes[f"{method.decode('latin-1')} {route_of(target)}"] += 1
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    self.body = int(value.strip())
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    self.chunked = True


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a middlebox that drops the connection would."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Conn:
    def __init__(self, client: asyncio.StreamWriter):
        self.writers = [client]
        self.stalled = self.muted = False

    def abort(self) -> None:
        for w in self.writers:
            _abort(w)


class Proxy:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], conditions: Conditions | None = None,
                 upstream_netns: str | None = None, stats_file: str | os.PathLike | None = None):
        self.listen, self.upstream, self.upstream_netns = listen, upstream, upstream_netns
        self.stats, self.stats_file = Stats(), Path(stats_file) if stats_file else None
        self.conns: set[_Conn] = set()
        self.cond = Conditions()
        self._pending = conditions or Conditions()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    # --- conditions -------------------------------------------------------------------------------
    def set(self, conditions: Conditions | None = None, **changes) -> None:
        """New conditions (from any thread): `conditions`, or the current ones with `changes`."""
        new = conditions or replace(self.cond, **{k: (tuple((float(a), dict(c)) for a, c in v) if k == "schedule"
                                                      else v) for k, v in changes.items()})
        if self._loop is None:
            self._pending = new
        else:
            self._loop.call_soon_threadsafe(self._apply, new, True)

    def _apply(self, new: Conditions, fresh: bool) -> None:
        self.cond = new
        if fresh:
            for t in self._schedule_handles:
                t.cancel()
            self._schedule_handles = [self._loop.call_later(at, self._apply, replace(new, **ch, schedule=()), False)
                                      for at, ch in new.schedule]
            self._reset_at = self._loop.time() + (new.reset_every or 0)
        if new.mode == "drop":
            self._reset_all()

    def _reset(self, conn: _Conn) -> None:
        self.stats.resets += 1
        conn.abort()
        self.conns.discard(conn)

    def _reset_all(self) -> None:
        for c in list(self.conns):
            self._reset(c)

    # --- serving ----------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule_handles: list[asyncio.TimerHandle] = []
        self._apply(self._pending, True)
        self._server = await asyncio.start_server(self._handle, *self.listen)
        self.port = self._server.sockets[0].getsockname()[1]
        self._tasks.append(asyncio.create_task(self._ticker()))

    async def _ticker(self) -> None:
        last = None
        while True:
            await asyncio.sleep(0.1)
            if self.cond.reset_every and self._loop.time() >= self._reset_at:
                self._reset_at = self._loop.time() + self.cond.reset_every
                self._reset_all()
            if self.stats_file is not None:
                now = json.dumps(self.stats.as_dict(), sort_keys=True)
                if now != last:
                    tmp = self.stats_file.with_suffix(".tmp")
                    tmp.write_text(now)
                    tmp.replace(self.stats_file)
                    last = now

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _open_upstream(self):
        if self.upstream_netns is None:
            return await asyncio.wait_for(asyncio.open_connection(*self.upstream), 10)
        from netsim.hosts import netns_socket

        sock = netns_socket(self.upstream_netns)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(self._loop.sock_connect(sock, self.upstream), 10)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if self.cond.mode == "drop":
            self.stats.refused += 1
            _abort(cwriter)
            return
        conn = _Conn(cwriter)
        self.conns.add(conn)
        try:
            if self.cond.mode == "stall":
                await self._stall(conn, creader)
                return
            try:
                sreader, swriter = await self._open_upstream()
            except (TimeoutError, OSError):
                self.stats.upstream_failures += 1
                self._reset(conn)
                return
            conn.writers.append(swriter)
            if conn not in self.conns:  # reset while connecting
                _abort(swriter)
                return
            counter = RequestCounter(self.stats)
            await asyncio.gather(self._pipe(conn, creader, swriter, "up", counter.feed),
                                 self._pipe(conn, sreader, cwriter, "down", None))
        finally:
            if conn in self.conns:
                self.conns.discard(conn)
                for w in conn.writers:
                    with contextlib.suppress(Exception):
                        w.close()

    async def _stall(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        conn.stalled = True
        self.stats.stalled += 1
        with contextlib.suppress(OSError):
            while await reader.read(CHUNK):
                pass
        self.conns.discard(conn)

    async def _pipe(self, conn: _Conn, reader, writer, direction: str, observe) -> None:
        """Bytes from `reader` to `writer`, each chunk held until the link would have delivered it."""
        loop = self._loop
        queue: asyncio.Queue = asyncio.Queue(maxsize=1024)

        async def feed():
            while True:
                try:
                    data = await reader.read(CHUNK)
                except OSError:
                    data = None
                if data and (self.cond.mode == "stall" or conn.stalled):
                    if not conn.stalled:
                        conn.stalled = True
                        self.stats.stalled += 1
                    continue  # swallowed: never forwarded, never answered
                if data and direction == "down" and (self.cond.mode == "mute" or conn.muted):
                    if not conn.muted:
                        conn.muted = True
                        self.stats.muted += 1
                    continue  # the answer to a request that did reach the server, lost
                if data:
                    if observe is not None:
                        observe(data)
                    setattr(self.stats, f"bytes_{direction}", getattr(self.stats, f"bytes_{direction}") + len(data))
                await queue.put((loop.time(), data))
                if not data:
                    return

        async def deliver():
            free_at = 0.0  # when the link has finished sending the previous chunk
            while True:
                arrived, data = await queue.get()
                if data is None:  # the reading side failed: reset the whole connection
                    if conn in self.conns:
                        self._reset(conn)
                    return
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                cond = self.cond
                rate = cond.rate(direction)
                start = max(arrived, free_at)
                free_at = start + (len(data) / rate if rate else 0.0)
                wait = free_at + cond.delay_ms / 1000 - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if conn.stalled or (conn.muted and direction == "down"):
                    continue
                try:
                    writer.write(data)
                    await writer.drain()
                except (OSError, RuntimeError):
                    if conn in self.conns:
                        self._reset(conn)
                    return

        reader_task = asyncio.ensure_future(feed())
        try:
            await deliver()
        finally:
            if not reader_task.done():
                # the writing side is gone; the reading side ends when the connection is closed
                await asyncio.wait([reader_task], timeout=0 if conn not in self.conns else None)
            if not reader_task.done():
                reader_task.cancel()


class ProxyThread:
    """A Proxy on its own event loop in a daemon thread (for tests in the test process)."""

    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0), **kw):
        self.proxy = Proxy(listen, upstream, **kw)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="netsim-proxy")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.proxy.start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def stats(self) -> dict:
        return asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result(10)

    async def _snapshot(self) -> dict:
        return self.proxy.stats.as_dict()

    def set(self, conditions: Conditions | None = None, **changes) -> None:
        self.proxy.set(conditions, **changes)


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


async def _watch_control(proxy: Proxy, path: Path) -> None:
    seen = None
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = None
        if text and text != seen:
            seen = text
            try:
                proxy._apply(Conditions.parse(json.loads(text)), True)
            except (ValueError, TypeError) as exc:
                print(f"netsim.proxy: ignoring {path}: {exc}", file=sys.stderr, flush=True)
        await asyncio.sleep(0.05)


async def _main(args) -> None:
    cond = Conditions.parse(json.loads(Path(args.control).read_text())) if args.control and \
        Path(args.control).exists() else Conditions()
    proxy = Proxy(_addr(args.listen), _addr(args.upstream), cond, upstream_netns=args.upstream_netns,
                  stats_file=args.stats)
    await proxy.start()
    if args.port_file:
        Path(args.port_file).write_text(str(proxy.port))
    print(f"netsim.proxy: {args.listen.rpartition(':')[0]}:{proxy.port} -> {args.upstream}", file=sys.stderr,
          flush=True)
    if args.control:
        await _watch_control(proxy, Path(args.control))
    else:
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netsim.proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free one)")
    p.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    p.add_argument("--upstream-netns", default=None, help="open upstream connections in this network namespace")
    p.add_argument("--control", default=None, help="JSON file of the conditions, re-read when it changes")
    p.add_argument("--stats", default=None, help="JSON file the counters are written to")
    p.add_argument("--port-file", default=None, help="write the port listened on to this file once listening")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
