"""A ground-truth OpenAI streaming server: it streams an exact, known schedule.

Written on plain non-blocking sockets under asyncio so it keeps time itself: each request gets
its first token TTFT ms after it read it, then one token every ITL ms (k tokens per chunk
every k*ITL ms). One timer serves all streams (a heap of due times), so the server
stays cheap at hundreds of streams. It records when it really wrote each chunk, which is
the truth the harness is compared against (GET /stats), and how late it was, and when each
request reached it: the kernel's receive stamp (SO_TIMESTAMPNS, read with recvmsg) of the request's
last bytes as well as its own read time, which a busy single-threaded server takes later.

Per-request controls go in the prompt as `[gt key=value ...]`: id (to match records),
ttft_ms, itl_ms, k, and fail=http_500|http_429|http_400|cut_after_N|malformed_json|
malformed_sse|stall, or one of the faults a broken engine shows: abort_after_N (finish_reason
"abort" after N tokens, then [DONE], as vLLM ends a request its engine loop aborted), short_after_N
(finish_reason "length" after N tokens, fewer than max_tokens), usage_N (the final usage claims N
completion tokens), endless (a 200 stream that never ends) and endless_500 (an error body that never ends).
Run standalone: python tests/groundtruth_server.py --port 0
(prints "PORT <n>" once listening).
With --ttft-cycle-ms 50,400 --cycle-every K its default TTFT steps to the next value every K streaming requests:
repeated runs of K requests each meet a server that is fast, then slow (variation between runs).
With --max-streams N it streams at most N requests at a time and queues the rest in arrival order (each
one's TTFT counts from when it gets a slot): its latency steps up at a known load, N / (TTFT + tokens x ITL)
requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import re
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run standalone: the harness is one folder up
    sys.path.append(str(Path(__file__).resolve().parents[1]))
from harness.client.stamped_http import ANCILLARY_BYTES, SO_TIMESTAMPNS, ClockOffset  # noqa: E402

_DIRECTIVE = re.compile(rb"\[gt ([^\]]*)\]")


@dataclass
class GroundTruthConfig:
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    tokens_per_chunk: int = 1
    keep_alive: bool = True
    max_streams: int = 0  # streams served at once, the rest queued (0: no limit)
    # a server whose speed changes between runs: the default TTFT steps through these values, one step every
    # `cycle_every` streaming requests (a run of that many requests sees one value, the next run the next)
    ttft_cycle_ms: tuple[float, ...] = ()
    cycle_every: int = 0


class _Stream:
    __slots__ = (
        "proto",
        "chat",
        "total",
        "sent",
        "k",
        "itl_ns",
        "first_due_ns",
        "recv_ns",
        "write_ns",
        "fail",
        "prompt_tokens",
        "rid",
        "ttft_ns",
    )


class _Socket:
    """One accepted connection on a plain non-blocking socket, read with recvmsg so each read carries the kernel's
    receive time (an asyncio transport reads with recv and cannot); writes as a transport does: send at once,
    buffer the rest until the socket has room, close after the buffer is out."""

    def __init__(self, server: GroundTruthServer, sock: socket.socket):
        self.server, self.sock, self.fd = server, sock, sock.fileno()
        self.proto = _Http(server, self)
        self.pending = b""
        self.closing = False

    def on_readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(65536, ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._lost()
        if not data:
            return self._lost()
        read_ns = time.perf_counter_ns()
        kernel_ns = self.server.clock.monotonic_ns(ancillary, read_ns)
        self.proto.data_received(data, read_ns if kernel_ns is None else kernel_ns)

    def write(self, data: bytes) -> None:
        if self.closing or self.fd < 0:
            return
        if not self.pending:
            try:
                data = data[self.sock.send(data) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return self._lost()
            if not data:
                return
            asyncio.get_running_loop().add_writer(self.fd, self._flush)
        self.pending += data

    def _flush(self) -> None:
        try:
            self.pending = self.pending[self.sock.send(self.pending) :]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._lost()
        if not self.pending:
            asyncio.get_running_loop().remove_writer(self.fd)
            if self.closing:
                self._lost()

    def is_closing(self) -> bool:
        return self.closing or self.fd < 0

    def close(self) -> None:
        self.closing = True
        if not self.pending:
            self._lost()

    def _lost(self) -> None:
        if self.fd < 0:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.fd)
        loop.remove_writer(self.fd)
        self.sock.close()
        self.fd = -1
        self.server.connections.discard(self.proto)


class GroundTruthServer:
    def __init__(self, config: GroundTruthConfig):
        self.config = config
        self._heap: list = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due_ns = 0
        self.lateness_ns: list[int] = []
        self.records: dict[str, dict] = {}
        self.active = 0  # streams holding a slot (config.max_streams)
        self.waiting: deque = deque()  # streams queued for a slot
        self.connections: set = set()
        self.listener: socket.socket | None = None
        self.clock = ClockOffset()  # the kernel's receive stamps onto perf_counter_ns, as the stamped client does
        self._clock_measured_ns = 0
        self.streams_started = 0  # streaming requests taken, for config.ttft_cycle_ms

    async def start(self, port: int = 0) -> int:
        self.listener = socket.create_server(("127.0.0.1", port), backlog=4096)
        self.listener.setblocking(False)
        asyncio.get_running_loop().add_reader(self.listener.fileno(), self._accept)
        return self.listener.getsockname()[1]

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. out of file descriptors: the client sees its connect fail
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if SO_TIMESTAMPNS is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                except OSError:
                    pass  # its requests' kernel time is then the time it read them
            conn = _Socket(self, sock)
            self.connections.add(conn.proto)
            asyncio.get_running_loop().add_reader(conn.fd, conn.on_readable)

    async def stop_listening(self, drop_connections: bool = True) -> None:
        """Later connects are refused; with drop_connections, open ones are closed too."""
        asyncio.get_running_loop().remove_reader(self.listener.fileno())
        self.listener.close()
        if drop_connections:
            for proto in list(self.connections):
                proto.transport.close()

    # --- scheduling: one timer for every stream ---
    def add_stream(self, s: _Stream) -> None:
        if self.config.max_streams and self.active >= self.config.max_streams:
            self.waiting.append(s)
            return
        self.active += 1
        self._push(s.first_due_ns, s)

    def _stream_ended(self) -> None:
        self.active -= 1
        while self.waiting and self.waiting[0].proto.transport.is_closing():
            self.waiting.popleft()  # its client gave up while it waited
        if self.waiting:
            s = self.waiting.popleft()
            s.first_due_ns = time.perf_counter_ns() + s.ttft_ns  # its TTFT runs from when it got the slot
            self.add_stream(s)

    def _push(self, due_ns: int, s: _Stream) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due_ns, self._seq, s))
        if self._timer is None or due_ns < self._timer_due_ns:
            self._arm(due_ns)

    def _arm(self, due_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_due_ns = due_ns
        self._timer = loop.call_later(max(0, due_ns - time.perf_counter_ns()) / 1e9, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = time.perf_counter_ns()
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, s = heapq.heappop(heap)
            self.lateness_ns.append(now - due)
            next_due = self._send_chunk(s, now)
            if next_due is not None:
                self._seq += 1
                heapq.heappush(heap, (next_due, self._seq, s))
            else:
                self._stream_ended()
            now = time.perf_counter_ns()
        if heap:  # one timer for whatever is due next
            self._arm(heap[0][0])

    def _send_chunk(self, s: _Stream, now: int) -> int | None:
        t = s.proto.transport
        if t.is_closing():
            return None
        n = min(s.k, s.total - s.sent)
        s.sent += n
        s.write_ns.append(now)
        if s.fail == "malformed_json" and s.sent > n:
            t.write(_chunked(b"data: {not json\n\n") + _END)
            return None
        if s.fail == "malformed_sse" and s.sent > n:
            t.write(_chunked(b"this line is not sse\n\n") + _END)
            return None
        out = _token_event(s, n)
        if s.fail.startswith("endless"):  # 64 KiB a tick, never the end
            t.write(_chunked(out * (65536 // len(out) + 1)))
            return now + s.itl_ns
        if s.fail.startswith(("abort_after_", "short_after_")) and s.sent >= int(s.fail.rsplit("_", 1)[1]):
            s.total = s.sent  # the final events report what was really sent
            finish = b"abort" if s.fail.startswith("abort") else b"length"
            t.write(_chunked(out + _final_events(s).replace(b'"length"', b'"%s"' % finish)) + _END)
            s.proto.finished()
            return None
        if s.fail.startswith("cut_after_") and s.sent >= int(s.fail[len("cut_after_") :]):
            t.write(_chunked(out))
            t.close()  # no terminating chunk: the stream is cut mid-way
            return None
        if s.sent >= s.total:
            final = _final_events(s)
            if s.fail.startswith("usage_"):
                final = final.replace(
                    b'"completion_tokens":%d' % s.total, b'"completion_tokens":%s' % s.fail[len("usage_") :].encode()
                )
            out += final
            t.write(_chunked(out) + _END)
            s.proto.finished()
            return None
        t.write(_chunked(out))
        return s.first_due_ns + (s.sent // s.k) * s.itl_ns * s.k

    # --- requests ---
    def handle(self, proto: _Http, method: str, path: str, body: bytes, kernel_ns: int) -> None:
        """kernel_ns: when the request's last bytes reached the socket (the kernel's stamp), before this
        single-threaded server got round to reading them."""
        if method == "GET" and path in ("/health", "/v1/models"):
            return proto.respond(200, {"status": "ok", "data": [{"id": "groundtruth"}]})
        if method == "GET" and path == "/stats":
            return proto.respond(200, self.pop_stats())
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return proto.respond(404, {"error": {"message": f"no route {method} {path}"}})
        recv_ns = time.perf_counter_ns()  # its own schedule starts when it read the request
        if recv_ns - self._clock_measured_ns > 50_000_000:  # follows NTP's slewing of CLOCK_REALTIME
            self.clock.measure()
            self._clock_measured_ns = recv_ns
        try:
            req = json.loads(body)
        except ValueError:
            return proto.respond(400, {"error": {"message": "body is not JSON"}})
        opts = {}
        found = _DIRECTIVE.findall(body)
        if found:  # the last one: earlier turns of a conversation carry their own
            opts = dict(kv.split("=", 1) for kv in found[-1].decode().replace(",", " ").split() if "=" in kv)
        fail = opts.get("fail", "")
        if fail.startswith("http_"):
            code = int(fail[5:])
            return proto.respond(code, {"error": {"message": f"ground-truth {code}", "code": code}})
        s = _Stream()
        s.proto, s.chat, s.recv_ns, s.fail = proto, path.endswith("chat/completions"), recv_ns, fail
        s.total, s.sent = int(req.get("max_tokens") or 16), 0
        s.k = int(opts.get("k", self.config.tokens_per_chunk))
        s.itl_ns = int(float(opts.get("itl_ms", self.config.itl_ms)) * 1e6)
        s.ttft_ns = int(float(opts.get("ttft_ms", self._default_ttft_ms())) * 1e6)
        s.first_due_ns = recv_ns + s.ttft_ns
        s.prompt_tokens = len(body.split()) // 2
        s.write_ns = []
        s.rid = opts.get("id")
        if s.rid is not None and len(self.records) < 200_000:
            self.records[s.rid] = {
                "recv_ns": recv_ns,
                "recv_kernel_ns": kernel_ns,
                "write_ns": s.write_ns,
                "k": s.k,
                "body_bytes": len(body),
            }
        proto.start_stream(s.chat, status=500 if fail == "endless_500" else 200)
        if fail != "stall":
            self.add_stream(s)

    def _default_ttft_ms(self) -> float:
        """config.ttft_ms, or this request's step of config.ttft_cycle_ms."""
        c = self.config
        self.streams_started += 1
        if not c.ttft_cycle_ms:
            return c.ttft_ms
        return c.ttft_cycle_ms[((self.streams_started - 1) // c.cycle_every) % len(c.ttft_cycle_ms)]

    def pop_stats(self) -> dict:
        late = sorted(self.lateness_ns)

        def pct(q):
            return late[min(len(late) - 1, int(q * len(late)))] / 1e6 if late else None

        stats = {
            "lateness_ms": {
                "count": len(late),
                "mean": sum(late) / len(late) / 1e6 if late else None,
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": late[-1] / 1e6 if late else None,
            },
            "records": self.records,
        }
        self.lateness_ns, self.records = [], {}
        return stats


_END = b"0\r\n\r\n"


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_ONE_TOKEN_EVENTS: dict = {}  # chat? -> bytes: with one token per chunk all chunks are alike


def _token_event(s: _Stream, n: int) -> bytes:
    if s.k == 1:
        event = _ONE_TOKEN_EVENTS.get(s.chat)
        if event is None:
            event = _ONE_TOKEN_EVENTS[s.chat] = _build_token_event(s, n)
        return event
    return _build_token_event(s, n)


def _build_token_event(s: _Stream, n: int) -> bytes:
    text = " tok" * n
    if s.chat:
        choice = f'{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}'
    else:
        choice = f'{{"index":0,"text":"{text}","finish_reason":null}}'
    usage = ""
    if s.k > 1:  # running usage tells the client how many tokens this chunk carries
        usage = f',"usage":{{"prompt_tokens":{s.prompt_tokens:d},"completion_tokens":{s.sent:d}}}'
    return b'data: {"id":"gt","object":"gt.chunk","choices":[%s]%s}\n\n' % (choice.encode(), usage.encode())


def _final_events(s: _Stream) -> bytes:
    finish = (
        '{"index":0,"delta":{},"finish_reason":"length"}'
        if s.chat
        else '{"index":0,"text":"","finish_reason":"length"}'
    )
    usage = (
        f'{{"prompt_tokens":{s.prompt_tokens:d},"completion_tokens":{s.total:d},'
        f'"total_tokens":{s.prompt_tokens + s.total:d}}}'
    )
    return b'data: {"id":"gt","choices":[%s]}\n\ndata: {"id":"gt","choices":[],"usage":%s}\n\ndata: [DONE]\n\n' % (
        finish.encode(),
        usage.encode(),
    )


class _Http:
    """Just enough HTTP/1.1: Content-Length bodies in, chunked SSE or JSON out."""

    def __init__(self, server: GroundTruthServer, transport: _Socket):
        self.server = server
        self.buf = b""
        self.transport = transport

    def data_received(self, data: bytes, kernel_ns: int) -> None:
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buf) < head_end + 4 + length:
            return
        body = self.buf[head_end + 4 : head_end + 4 + length]
        self.buf = self.buf[head_end + 4 + length :]
        method, path = head[0].split(" ")[:2]
        self.server.handle(self, method, path.split("?")[0], body, kernel_ns)

    def _conn_header(self) -> bytes:
        return b"keep-alive" if self.server.config.keep_alive else b"close"

    def respond(self, status: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.transport.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: %s\r\n\r\n%s" % (status, len(body), self._conn_header(), body)
        )
        self.finished()

    def start_stream(self, chat: bool, status: int = 200) -> None:
        head = (
            b"HTTP/1.1 %d X\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: %s\r\n\r\n" % (status, self._conn_header())
        )
        if chat:  # like real servers: a role-only delta before any token
            head += _chunked(b'data: {"id":"gt","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n')
        self.transport.write(head)

    def finished(self) -> None:
        if not self.server.config.keep_alive:
            self.transport.close()


class GroundTruthProcess:
    """Runs the server in its own process (so it keeps its own time); a context manager."""

    def __init__(self, config: GroundTruthConfig = GroundTruthConfig(), prefix: tuple[str, ...] = ()):
        self.config = config
        self.prefix = list(prefix)  # e.g. chrt -f 50 taskset -c 0: its own core at real-time priority
        self.proc = None
        self.port = None

    def __enter__(self) -> GroundTruthProcess:
        c = self.config
        args = [
            sys.executable,
            __file__,
            "--port",
            "0",
            "--ttft-ms",
            str(c.ttft_ms),
            "--itl-ms",
            str(c.itl_ms),
            "--tokens-per-chunk",
            str(c.tokens_per_chunk),
            "--max-streams",
            str(c.max_streams),
        ]
        if c.ttft_cycle_ms:
            args += ["--ttft-cycle-ms", ",".join(map(str, c.ttft_cycle_ms)), "--cycle-every", str(c.cycle_every)]
        args += [] if c.keep_alive else ["--close"]
        self.proc = subprocess.Popen(self.prefix + args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"ground-truth server did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def _main(args) -> None:
    server = GroundTruthServer(
        GroundTruthConfig(
            args.ttft_ms,
            args.itl_ms,
            args.tokens_per_chunk,
            keep_alive=not args.close,
            max_streams=args.max_streams,
            ttft_cycle_ms=tuple(float(v) for v in args.ttft_cycle_ms.split(",") if v),
            cycle_every=args.cycle_every,
        )
    )
    port = await server.start(args.port)
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--close", action="store_true", help="Connection: close after each response")
    p.add_argument("--max-streams", type=int, default=0, help="streams served at once, the rest queued (0: no limit)")
    p.add_argument("--ttft-cycle-ms", default="", help="default TTFTs stepped through, e.g. 50,400")
    p.add_argument("--cycle-every", type=int, default=1, help="streaming requests per --ttft-cycle-ms step")
    try:
        asyncio.run(_main(p.parse_args()))
    except KeyboardInterrupt:
        pass


def gt_request(index: int, offset_s: float | None, output_tokens: int = 16, chat: bool = False, **directives):
    """A RequestSpec whose prompt carries ground-truth directives (id is the index unless given)."""
    try:
        from harness.scenario.workload import RequestSpec
    except ImportError:  # the workload module is written in parallel; same fields
        from dataclasses import field as dc_field
        from dataclasses import make_dataclass

        RequestSpec = make_dataclass(
            "RequestSpec",
            [
                ("index", int),
                ("prompt", object),
                ("messages", object),
                ("prompt_tokens", int),
                ("output_tokens", int),
                ("intended_offset_s", object),
                ("session_id", object, dc_field(default=None)),
                ("turn_index", int, dc_field(default=0)),
                ("think_time_s", float, dc_field(default=0.0)),
                ("is_warmup", bool, dc_field(default=False)),
            ],
        )
    directives.setdefault("id", index)
    tag = "[gt " + " ".join(f"{k}={v}" for k, v in directives.items()) + "]"
    prompt = f"request {index} {tag}"
    messages = [{"role": "user", "content": prompt}] if chat else None
    return RequestSpec(
        index=index,
        prompt=None if chat else prompt,
        messages=messages,
        prompt_tokens=4,
        output_tokens=output_tokens,
        intended_offset_s=offset_s,
    )


def fetch_stats(url: str) -> dict:
    """The server's write times and lateness since the last call (the call clears them)."""
    import urllib.request

    with urllib.request.urlopen(url + "/stats", timeout=30) as resp:
        return json.loads(resp.read())


def errors_against_truth(records, t0_ns: int, server_records: dict, loop_stamps: bool = False) -> dict:
    """Measured minus true, in ms, per request (TTFT) and per gap (ITL per chunk).

    Truth is what the server really did: TTFT from the request reaching it (the kernel's receive stamp of its
    last bytes) to its first write, gaps between its writes. The TTFT error splits into the client's send lag
    (intended send to request written), the request's way in (written to the server's kernel stamp) and the
    first token's way back (first_delivery: server write to client stamp; delivery: every chunk's). Apart,
    not in the error: server_queue, how long the single-threaded server left a request in its socket before
    reading it (its read time starts its own schedule, so that wait is in the true TTFT).

    loop_stamps: judge the loop's stamps of kernel-stamped records (token_loop_times_s) instead of
    token_times_s. Both clocks are perf_counter_ns (CLOCK_MONOTONIC), shared across processes on Linux.
    """
    by_index = {r.index: r for r in records if r.ok}
    ttft_err, itl_err, true_ttft, send_lag, first_delivery, delivery = [], [], [], [], [], []
    way_in, server_queue = [], []
    for rid, srv in server_records.items():
        rec = by_index.get(int(rid))
        writes = srv["write_ns"]
        times = rec.token_loop_times_s if rec is not None and loop_stamps else getattr(rec, "token_times_s", [])
        if rec is None or len(times) != len(writes):
            continue
        got = [t0_ns + round(t * 1e9) for t in times]
        intended_ns = t0_ns + round(rec.intended_send_s * 1e9)
        arrived_ns = srv["recv_kernel_ns"]
        true_ttft.append((writes[0] - arrived_ns) / 1e6)
        ttft_err.append((got[0] - intended_ns) / 1e6 - true_ttft[-1])
        # until the request is on the wire (written), else until the client started sending it
        sent_s = rec.request_written_s if rec.request_written_s is not None else rec.actual_send_s
        send_lag.append((sent_s - rec.intended_send_s) * 1e3)
        way_in.append((arrived_ns - (t0_ns + round(sent_s * 1e9))) / 1e6)
        server_queue.append((srv["recv_ns"] - arrived_ns) / 1e6)
        first_delivery.append((got[0] - writes[0]) / 1e6)
        itl_err += [((b - a) - (wb - wa)) / 1e6 for a, b, wa, wb in zip(got, got[1:], writes, writes[1:])]
        delivery += [(g - w) / 1e6 for g, w in zip(got, writes)]
    return {
        "ttft_err_ms": ttft_err,
        "itl_err_ms": itl_err,
        "true_ttft_ms": true_ttft,
        "send_lag_ms": send_lag,
        "first_delivery_ms": first_delivery,
        "delivery_ms": delivery,
        "way_in_ms": way_in,
        "server_queue_ms": server_queue,
    }
