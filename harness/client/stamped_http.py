"""A small HTTP/1.1 streaming client whose reads carry the kernel's receive time.

Why its own client: aiohttp reads through the event loop's transport, which calls recv(), so the
only time the client can stamp is when the coroutine resumes, after the loop got round to it. On
Linux a socket with SO_TIMESTAMPNS hands recvmsg() the time its bytes reached the socket, so a busy
loop delays the reading, not the stamp. This client reads with recvmsg() from a plain non-blocking
socket (loop.add_reader) and leaves HTTP to httptools (llhttp, Node's C parser: status, headers,
chunked decoding, bad chunk sizes), one parser per response. Plain http:// only: TLS
(and every OS without SO_TIMESTAMPNS) uses the aiohttp path (backend.stamps, harness/client/runner.py).

What one stamp can say (benchmarks/rx_timestamp_probe.py): a TCP recvmsg() returns one stamp, that of
the newest segment it read, and a segment that arrives while unread data waits is merged into it
(tcp_try_coalesce keeps the newer time). So reads are not bounded to one SSE event: once two events
wait in one socket, no read size can give the older one its own time. Each read is taken whole; an
event gets the stamp of the read that completed it, exact when it was the newest segment of that
read and an upper bound otherwise (events that share a stamp show it in requests.jsonl).
"""

from __future__ import annotations

import asyncio
import platform
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

# Python's socket module does not name it; 35 on Linux x86 and the asm-generic architectures (arm64,
# riscv), where its struct timespec is two 64-bit integers on 64-bit builds
SO_TIMESTAMPNS = getattr(
    socket,
    "SO_TIMESTAMPNS",
    35 if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64", "riscv64") else None,
)
ANCILLARY_BYTES = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # one struct timespec
READ_BYTES = 1 << 16


class HttpStreamError(Exception):
    """A request that got no complete answer; `reason` is the record's failure category. `partial`: what of the
    answer arrived before it failed (a stream cut or stalled after some tokens), when any did."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail
        self.partial: StampedResponse | None = None


def too_large_detail(max_bytes: int) -> str:
    return (
        f"the answer passed backend.max_response_bytes={max_bytes} bytes; raise it if the engine really sends that much"
    )


def kernel_stamps_unavailable(url: str) -> str | None:
    """Why reads to `url` cannot carry kernel stamps here, or None when they can."""
    if SO_TIMESTAMPNS is None or not sys.platform.startswith("linux"):
        return f"{sys.platform} has no SO_TIMESTAMPNS receive timestamps"
    if urlsplit(url).scheme != "http":
        return "TLS (https): the stamped client speaks plain HTTP only"
    return None


@dataclass
class StampedResponse:
    """One answer: the decoded body piece by piece, each with the kernel and loop stamps of the read that
    brought it (perf_counter_ns; kernel_ns is the loop stamp where a read had no kernel stamp)."""

    status: int = 0
    location: str | None = None  # a redirect's Location header (the runner fails it, naming where it points)
    pieces: list[bytes] = field(default_factory=list)
    kernel_ns: list[int] = field(default_factory=list)
    loop_ns: list[int] = field(default_factory=list)
    written_ns: int = 0  # the whole request was handed to the kernel
    end_ns: int = 0  # the loop's time of the read that completed the answer
    reads: int = 0
    unstamped_reads: int = 0


class _Exchange:
    """httptools' callbacks for one response, and the read loop that feeds it."""

    def __init__(
        self,
        conn: _Connection,
        clock: ClockOffset,
        max_bytes: int,
        error_body_bytes: int,
        answered: Callable[[_Exchange], None],
    ):
        self.conn, self.clock, self.answered = conn, clock, answered
        self.parser = httptools.HttpResponseParser(self)
        self.out = StampedResponse()
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        self.budget = self.max_bytes = max_bytes
        self.error_body_bytes = error_body_bytes
        self.kernel_now = self.loop_now = 0
        self.start_ns = 0  # the request's send began (perf_counter_ns)
        self.unsent = b""  # what a first send left for when the socket has room
        self.send_error: OSError | None = None
        self.then: Callable[[StampedResponse], None] | None = None  # post's `then`
        self.close_delimited = True  # no Content-Length, not chunked: the body ends when the connection does
        self.complete = self.keep_alive = False

    # --- httptools callbacks ---
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self.close_delimited = False
        elif name == b"location":
            self.out.location = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.out.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # asked after the message it is always False

    def on_body(self, body: bytes) -> None:
        out = self.out
        out.pieces.append(body)
        out.kernel_ns.append(self.kernel_now)
        out.loop_ns.append(self.loop_now)
        self.budget -= len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # --- reading ---
    def on_readable(self) -> None:
        """The hot path: one recvmsg, two clock reads, the parser; nothing else."""
        if self.done.done():  # answered; the reader goes when the request's task resumes
            return
        try:
            data, ancillary, _, _ = self.conn.sock.recvmsg(READ_BYTES, ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self._end(HttpStreamError("stream_cut", f"reading the response failed: {e}"))
        self.loop_now = loop_ns = time.perf_counter_ns()
        out = self.out
        out.reads += 1
        kernel_ns = self.clock.monotonic_ns(ancillary, loop_ns)
        if kernel_ns is not None:
            self.kernel_now = kernel_ns
        else:
            self.kernel_now = loop_ns
            out.unstamped_reads += data != b""
        if not data:
            if self.close_delimited and out.status:
                self.complete = True
                return self._end(None)
            return self._end(
                HttpStreamError(
                    "stream_cut",
                    f"the server closed the connection after {out.reads - 1} reads, before the response's end",
                )
            )
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return self._end(HttpStreamError("malformed_http", "the server asked to upgrade the connection"))
        except httptools.HttpParserError as e:
            return self._end(HttpStreamError("malformed_http", f"not a valid HTTP/1.1 response: {e}"))
        if self.complete:
            self._end(None)
        elif self.budget < 0 and out.status < 300:
            self._end(HttpStreamError("response_too_large", too_large_detail(self.max_bytes)))
        elif out.status >= 300 and sum(map(len, out.pieces)) >= self.error_body_bytes:
            self._end(None)  # the head of an error (or redirect) body is all that is kept; it may never end

    def _end(self, error: HttpStreamError | None) -> None:
        if not self.done.done():
            if error:
                error.partial = self.out if self.out.pieces and error.reason != "response_too_large" else None
                self.done.set_exception(error)
            else:
                self.out.end_ns = self.loop_now
                self.done.set_result(self.out)
                self.answered(self)


class ClockOffset:
    """CLOCK_REALTIME − CLOCK_MONOTONIC, measured between two monotonic reads a few µs apart (a process
    preempted between its clock reads would otherwise shift every stamp by the preemption)."""

    def __init__(self):
        self.realtime_minus_monotonic_ns = 0
        self.measure()

    def measure(self, tries: int = 5) -> None:
        best = None
        for _ in range(tries):
            before = time.perf_counter_ns()
            real = time.time_ns()
            after = time.perf_counter_ns()
            if best is None or after - before < best[0]:
                best = (after - before, real - (before + after) // 2)
        self.realtime_minus_monotonic_ns = best[1]

    def monotonic_ns(self, ancillary: list, read_ns: int) -> int | None:
        """A recvmsg's SO_TIMESTAMPNS stamp (CLOCK_REALTIME) on the perf_counter_ns timeline (CLOCK_MONOTONIC),
        never after read_ns, the moment of the read; None when the read carried no stamp."""
        if not ancillary:
            return None
        sec, nsec = struct.unpack_from("qq", ancillary[0][2])
        return min(read_ns, sec * 1_000_000_000 + nsec - self.realtime_minus_monotonic_ns)


class _Connection:
    """One socket, read through one callback for its whole life (registering a reader per request cost more
    than the request's send); between requests a readable socket means the server closed it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.exchange: _Exchange | None = None
        self.dead = False

    def on_readable(self) -> None:
        if self.exchange is not None:
            return self.exchange.on_readable()
        self.dead = True  # idle: an EOF, a reset or stray bytes; never reused
        asyncio.get_running_loop().remove_reader(self.sock.fileno())


class StampedClient:
    """Keep-alive connections to one http:// server; `post` sends one request and reads its answer, `send_wave`
    sends many that are due at once (post then reads each)."""

    def __init__(
        self,
        url: str,
        path: str,
        headers: dict,
        keep_alive: bool = True,
        max_response_bytes: int = 1 << 26,
        error_body_bytes: int = 300,
        timeout_s: float = 600.0,
    ):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.keep_alive, self.max_response_bytes, self.error_body_bytes = (
            keep_alive,
            max_response_bytes,
            error_body_bytes,
        )
        # every request is a POST to one path: the head is built once, the length added per request
        lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}"] + (["Connection: close"] if not keep_alive else [])
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        # one sweeper for every request's deadline: a timer per request cost as much as its send
        self.timeout_s = timeout_s
        self._deadlines: dict[_Exchange, int] = {}
        self._sweeper: asyncio.Task | None = None
        self.clock = ClockOffset()

    async def open_connections(self, count: int) -> None:
        """Connects before t0 so TCP handshakes stay out of the first measurements."""
        conns = await asyncio.gather(*(self._connect() for _ in range(count)), return_exceptions=True)
        self._idle += [c for c in conns if isinstance(c, _Connection)]

    def request_bytes(self, body: bytes) -> bytes:
        """The whole HTTP request for `body`, ready for `post`: built before t0 where the plan allows."""
        return b"%s%d\r\n\r\n%s" % (self._head, len(body), body)

    def send_wave(self, requests: list[bytes]) -> list[_Exchange | None]:
        """Sends every request of a wave (all due now) on idle connections, one after another in one tight loop:
        nothing but the send and its two clock reads sits between two sends, and each request's exchange (its
        parser, deadline, reader) is made after the whole wave is on the wire, before anything can be read.
        Returns per request its exchange, for post(request, sent=exchange), or None where no idle connection was
        left (post then connects). A failed send fails only its own request, when post is called."""
        clock = time.perf_counter_ns
        take_idle = self._take_idle
        sends = []
        for request in requests:
            conn = take_idle()
            if conn is None:
                sends.append(None)
                continue
            start_ns = clock()
            try:
                sent = conn.sock.send(request)
            except OSError as e:
                sent = e
            sends.append((conn, start_ns, sent, clock()))
        return [None if s is None else self._exchange(request, *s) for request, s in zip(requests, sends)]

    async def post(
        self,
        request: bytes,
        on_written=None,
        sent: _Exchange | None = None,
        then: Callable[[StampedResponse], None] | None = None,
    ) -> StampedResponse:
        """Sends `request` (from request_bytes) and returns the whole answer within timeout_s; with `sent`, the
        exchange send_wave made for it, only what its send left. `on_written()` is called as soon as the request
        is with the kernel, before this coroutine yields to any other task when a connection is idle. `then(answer)`
        is called in the read that completes the answer, its connection already idle again, before this coroutine
        resumes (a closed loop sends its next request there). Raises HttpStreamError (connect_error, timeout,
        stream_cut, malformed_http, response_too_large)."""
        exchange = sent
        if exchange is None:
            start_ns = time.perf_counter_ns()
            conn = self._take_idle() or await self._connect_or_fail()
            # on an idle connection the send is all that comes before the request is on the wire; the exchange that
            # reads the answer is made after it, which is still before any read since nothing yields in between
            try:
                n = conn.sock.send(request)
            except OSError as e:
                n = e
            exchange = self._exchange(request, conn, start_ns, n, time.perf_counter_ns())
        conn = exchange.conn
        exchange.then = then
        try:
            if exchange.send_error is not None:
                raise HttpStreamError("stream_cut", f"sending the request failed: {exchange.send_error}")
            if exchange.unsent:  # a long prompt: the rest when the socket has room
                left_s = self.timeout_s - (time.perf_counter_ns() - exchange.start_ns) / 1e9
                try:
                    await asyncio.wait_for(
                        asyncio.get_running_loop().sock_sendall(conn.sock, exchange.unsent), max(0.0, left_s)
                    )
                except TimeoutError:  # an OSError too: asked first
                    raise HttpStreamError("timeout", self._timeout_detail()) from None
                except OSError as e:
                    raise HttpStreamError("stream_cut", f"sending the request failed: {e}") from None
                exchange.out.written_ns = time.perf_counter_ns()
            if on_written is not None:
                on_written()
            return await exchange.done
        except BaseException:
            if conn.exchange is exchange:  # else it was answered, and its connection may carry another request now
                self._discard(conn)
            raise
        finally:
            if conn.exchange is exchange:
                conn.exchange = None
            self._deadlines.pop(exchange, None)

    def _answered(self, exchange: _Exchange) -> None:
        """An answer is whole: its connection is idle again at once, then its `then` runs."""
        conn = exchange.conn
        conn.exchange = None
        self._deadlines.pop(exchange, None)
        if self.keep_alive and exchange.complete and exchange.keep_alive:
            self._idle.append(conn)
        else:
            self._discard(conn)
        if exchange.then is not None:
            exchange.then(exchange.out)

    def _exchange(
        self, request: bytes, conn: _Connection, start_ns: int, sent: int | OSError, written_ns: int
    ) -> _Exchange:
        """What reads the answer to a request whose first send returned `sent` (bytes, or the error)."""
        exchange = _Exchange(conn, self.clock, self.max_response_bytes, self.error_body_bytes, self._answered)
        exchange.start_ns, exchange.out.written_ns = start_ns, written_ns
        if isinstance(sent, OSError):
            exchange.send_error = sent
        elif sent < len(request):
            exchange.unsent = request[sent:]
        self._deadlines[exchange] = start_ns + int(self.timeout_s * 1e9)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        conn.exchange = exchange
        return exchange

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._open):
            self._discard(conn)

    def _timeout_detail(self) -> str:
        return f"no complete answer within request_timeout_s={self.timeout_s:g}"

    async def _sweep(self) -> None:
        tick_s = min(0.05, self.timeout_s / 10)
        while True:
            await asyncio.sleep(tick_s)
            self.clock.measure()  # follows NTP's slewing of CLOCK_REALTIME
            now = time.perf_counter_ns()
            for exchange in [e for e, due in self._deadlines.items() if due <= now]:
                exchange._end(HttpStreamError("timeout", self._timeout_detail()))

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.dead:
                return conn
            self._discard(conn)
        return None

    async def _connect_or_fail(self) -> _Connection:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._connect()
        except TimeoutError:
            raise HttpStreamError("timeout", self._timeout_detail()) from None
        except OSError as e:
            raise HttpStreamError("connect_error", f"cannot connect to {self.host}:{self.port}: {e}") from None

    async def _connect(self) -> _Connection:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # before any byte arrives
        except OSError:
            pass  # its reads come without a stamp: unstamped_reads, and the record says loop
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (self.host, self.port))
        except BaseException:
            sock.close()
            raise
        conn = _Connection(sock)
        loop.add_reader(sock.fileno(), conn.on_readable)
        self._open.add(conn)
        return conn

    def _discard(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            if not conn.dead:
                asyncio.get_running_loop().remove_reader(conn.sock.fileno())
            conn.sock.close()


STAMPS = ("auto", "kernel", "loop")


def choose_stamps(setting: str, url: str) -> tuple[str, str | None]:
    """backend.stamps -> ("kernel" | "loop", why kernel stamps are not used). `kernel` where they cannot
    be had is an error naming the fix; `auto` falls back to the loop's stamps (aiohttp) and says why."""
    if setting not in STAMPS:
        raise ValueError(f"backend.stamps: {setting!r} is not valid: use auto, kernel or loop")
    if setting == "loop":
        return "loop", "backend.stamps: loop"
    why_not = kernel_stamps_unavailable(url)
    if why_not is None:
        return "kernel", None
    if setting == "kernel":
        raise ValueError(f"backend.stamps: kernel is not available here ({why_not}); use auto or loop")
    return "loop", why_not
