"""Replays a plan against a serving engine, in its backend's dialect, on an absolute timeline.

Every request has an intended send time on one timeline (t0 + offset). Latency counts from
that time, wrk2-style, so a server that makes the client queue cannot hide it (no
coordinated omission). The hot path only stamps perf_counter_ns() and keeps the bytes;
SSE parsing happens after the stream has ended. Reads carry the kernel's receive time where it can
(harness/client/stamped_http.py, backend.stamps), else the loop's time on the aiohttp path.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import re
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import yarl

from backends import load_backend
from backends.openai import StreamError
from harness.client.stamped_http import HttpStreamError, StampedClient, choose_stamps, too_large_detail
from harness.limits import DEFAULT_MAX_RESPONSE_BYTES
from harness.results.folder import RequestRecord
from harness.scenario.agentic import assistant_message as agent_answer_message
from harness.scenario.agentic import turn_messages as agent_turn_messages
from harness.scenario.answers import keep_answer
from harness.scenario.sampling import request_sampling

LOOP_TICK_S = 0.005
INTERRUPT_GRACE_S = 3.0
ERROR_BODY_BYTES = 300  # of a 4xx/5xx body, kept as the failure's detail
# First turns whose request bytes are built before t0 (~10 µs each, so a closed loop's wave of sends is not
# slowed by JSON encoding); the bound keeps a huge plan from eating t0's lead. Later ones are built at send time.
PREBUILT_REQUESTS = 8192
# A finished stream's parsing waits until no stream has ended for QUIET_NS: a closed loop's streams end in waves,
# each end sending the next request at once, and a parse (~0.1 ms per 100 tokens) between two of those sends is
# send lag. It waits at most DEFER_NS, so records still come out under a steady stream of ends (open loops).
QUIET_NS = 1_000_000
DEFER_NS = 100_000_000
# An answer that ended on its own (or on max_tokens); abort, error, cancelled... are cut answers.
COMPLETE_FINISH_REASONS = {"stop", "length", "tool_calls", "function_call"}


@dataclass(kw_only=True)
class Target:
    """Where and how to send requests."""

    url: str
    api: str = "completions"
    model: str = "default"
    request_timeout_s: float = 600.0
    headers: dict = field(default_factory=dict)
    ignore_eos: bool = False
    kind: str = "openai"  # the backend dialect (backends.available())
    eos_token_ids: tuple[int, ...] = ()
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES  # one answer's bytes, all buffered until it ends
    stamps: str = "auto"  # kernel | loop | auto: where token arrival times come from (harness/client/stamped_http.py)
    sampling: dict = field(default_factory=dict)  # workload.sampling's fields (none: the engine's defaults)
    extra_body: dict = field(default_factory=dict)  # backend.extra_body, merged into every request
    record_outputs: str = "hash"  # workload.record_outputs: text | hash | none (harness/scenario/answers.py)


@dataclass
class RunOutcome:
    records: list[RequestRecord]
    loop_lag_s: list[float]
    t0_ns: int
    interrupted: bool
    lost_workers: list[dict] = field(default_factory=list)  # client processes that died (harness.client.workers)
    client_cpu_s: float | None = None  # CPU the client processes used while sending (harness.client.workers)
    incomplete_reasons: list[str] = field(default_factory=list)  # why records are missing (harness.client.workers)


def answer_problem(rec: RequestRecord, asked_tokens: int, length_forced: bool, text: str = "") -> tuple | None:
    """(reason, detail) when a stream that parsed cleanly is still not a complete answer (bad counts from the server
    are found as the stream is taken, RequestRecord.take_stream). TEST06's checks (MLPerf) among them: the count
    asked is met, never passed, and only an EOS (finish_reason stop) ends an answer early; the answer is not empty."""
    finish, tokens = rec.finish_reason, rec.output_tokens
    if rec.embedded_items is not None:
        return None  # nothing was asked to be generated (backend.api: embeddings)
    if finish is not None and finish not in COMPLETE_FINISH_REASONS:
        name = finish if isinstance(finish, str) and re.fullmatch(r"[a-z_]{1,24}", finish) else "other"
        return f"finish_{name}", f"the stream ended with finish_reason {finish!r} after {tokens} tokens"
    if tokens > asked_tokens:
        return "over_length", f"{tokens} tokens, more than the {asked_tokens} asked (max_tokens)"
    if length_forced and tokens < asked_tokens:
        return "short_output", f"ignore_eos: {tokens} of the {asked_tokens} tokens asked (finish_reason {finish!r})"
    if finish == "length" and rec.output_tokens_usage is not None and tokens < asked_tokens:
        return "early_length", (
            f"finish_reason 'length' after {tokens} of the {asked_tokens} tokens asked: neither max_tokens nor an "
            "EOS ended the answer (a context limit of the engine?)"
        )
    if not text and not rec.reasoning_tokens:
        return "empty_answer", f"{tokens} tokens streamed, but no answer text (finish_reason {finish!r})"
    return None


def http_failure_reason(status: int) -> str:
    if 300 <= status < 400:
        return "http_redirect"
    if status == 429:
        return "http_429"
    return "http_4xx" if status < 500 else "http_5xx"


def http_failure(status: int, body: str, location: str | None) -> tuple[str, str]:
    """(reason, detail) of an answer that is no stream: an error status with the head of its body, or a redirect
    with where it points. A redirect is not followed: the record would time two exchanges as one request."""
    if 300 <= status < 400:
        return http_failure_reason(status), (
            f"HTTP {status} redirect to {location or '(no Location header)'}: bench does not follow redirects; set "
            f"backend.url to the address the server redirects to"
        )
    return http_failure_reason(status), f"HTTP {status}: {body}"


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to `limit` bytes of a body: a body that never ends must not be read whole."""
    data = b""
    while len(data) < limit:
        more = await content.read(limit - len(data))
        if not more:
            break
        data += more
    return data


async def sleep_until(due_ns: int) -> None:
    """uvloop timers are millisecond-grained and may fire early; finish the wait by yielding."""
    rem = due_ns - time.perf_counter_ns()
    if rem > 0:
        await asyncio.sleep(rem / 1e9)
    while time.perf_counter_ns() < due_ns:
        await asyncio.sleep(0)


def own_messages(spec) -> list[dict]:
    return spec.messages or [{"role": "user", "content": spec.prompt or ""}]


def turn_messages(history: list[dict], spec) -> list | None:
    """A turn's chat messages: the session so far plus its own; None for a lone prompt."""
    return history + own_messages(spec) if (history or spec.messages is not None) else None


def collect_young() -> None:
    """What the automatic collector would do for the young generations, at a moment the caller chose."""
    threshold0, threshold1, _ = gc.get_threshold()
    count0, count1, _ = gc.get_count()
    if count1 >= threshold1:
        gc.collect(1)
    elif count0 >= threshold0:
        gc.collect(0)


def group_jobs(requests) -> list[list]:
    """Single requests are one-turn jobs; the turns of a session run in order as one job, its sub-agents' sessions
    (agentic) in the same job after its own turns."""
    sessions = {s.session_id for s in requests if s.session_id is not None}
    # a sub-agent's session -> the session that started it, where that one is in the schedule too (lone requests and
    # a session of its own have no parent: None is no session, or a lone request's None would be its own parent)
    parents = {
        s.session_id: s.parent_session_id
        for s in requests
        if s.session_id is not None and getattr(s, "parent_session_id", None) in sessions
    }

    def root(session_id: int) -> int:
        while session_id in parents:
            session_id = parents[session_id]
        return session_id

    jobs: dict = {}
    for spec in requests:
        key = ("s", root(spec.session_id)) if spec.session_id is not None else ("r", spec.index)
        jobs.setdefault(key, []).append(spec)
    out = [
        sorted(turns, key=lambda s: (s.session_id != key[1], s.session_id, s.turn_index)) for key, turns in jobs.items()
    ]
    out.sort(key=lambda turns: (turns[0].intended_offset_s is None, turns[0].intended_offset_s or 0.0, turns[0].index))
    return out


def _unrun(own: list, spawned: dict[int, list[list]], first: int, first_spawner: int) -> list:
    """An agent session's turns from its `first` on, and the sub-agents its turns from `first_spawner` on start."""
    spawners = {spec.turn_index for spec in own[first_spawner:]}
    return own[first:] + [s for turn, kids in spawned.items() if turn in spawners for kid in kids for s in kid]


async def _note_request_written(session, ctx, params) -> None:
    """aiohttp has written (a chunk of) the request body: the request is on the wire."""
    rec, written = ctx.trace_request_ctx
    rec.request_written_s = time.perf_counter_ns()  # made relative to t0 in _stream
    written()


class SendGate:
    """Bookkeeping (parsing, the record's writing) waits while a request is being sent, so in a closed loop
    the next request is on the wire before the previous one's record is made."""

    def __init__(self):
        self.sending = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin(self) -> Callable[[], None]:
        """A new send; call what it returns once the request is written (or failed); more calls do nothing."""
        self.sending += 1
        self._idle.clear()
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self.sending -= 1
                if not self.sending:
                    self._idle.set()

        return end

    async def idle(self) -> None:
        await self._idle.wait()


def t0_ahead_ns(workers: int, *, spawn: bool, connect: bool) -> int:
    """The run's t0 (a perf_counter_ns value): now plus a lead for what must still happen before the first send.

    The one rule for that lead, because t0 is fixed at three moments: by the run pipeline before the load
    (so telemetry and server metrics share the requests' clock), by the parent once its spawned client
    processes are all ready (if the first t0 is too close by then), and by a Runner given none. Too short a
    lead makes the first requests late, which shows as schedule lag and can flag a run client-bound; too
    long only idles. spawn: `workers` client processes are still to start (each imports the harness anew,
    seconds on a loaded machine). connect: connections are still to be opened (by one process, or by
    several sharing the cores)."""
    lead_s = 0.02  # the event loop's first dispatch
    if connect:
        lead_s += 0.3 if workers <= 1 else 1.0
    if spawn and workers > 1:
        lead_s += 2.0 + 0.5 * workers
    return time.perf_counter_ns() + int(lead_s * 1e9)


class Runner:
    """Sends `requests` (RequestSpecs) on one timeline and records each as it finishes.

    Open loop (turn-0 offsets given): a dispatcher starts each job at t0 + offset; with
    `concurrency` set, at most that many are in flight and the rest wait, the wait counting
    as latency. Closed loop (offsets None): `concurrency` workers each send their next job
    when the previous one ends. `on_record` gets every record, failed ones too; setting
    `stop` ends dispatching and gives in-flight requests INTERRUPT_GRACE_S to finish.
    """

    def __init__(
        self,
        target: Target,
        requests: list,
        concurrency: int | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        t0_ns: int | None = None,
        stop: asyncio.Event | None = None,
        dispatch_until_s: float | None = None,
    ):
        self.target = target
        self.dispatch_until_s = dispatch_until_s  # load.duration_s runs: no new request after this offset
        self.jobs = group_jobs(requests)
        self.concurrency = concurrency
        self.on_record = on_record or (lambda rec: None)
        self.t0_ns = t0_ns
        self.stop = stop or asyncio.Event()
        self.records: list[RequestRecord] = []
        self._tasks: set[asyncio.Task] = set()  # open loop: requests in flight
        self.loop_lag_s: list[float] = []
        self.backend = load_backend(target.kind, target.eos_token_ids)
        self._url = yarl.URL(
            target.url.rstrip("/") + self.backend.endpoint_path(target.api)
        )  # parsed once, not per request
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "identity", **target.headers}
        self.stamps, self.stamps_fallback = choose_stamps(target.stamps, target.url)
        self._client: StampedClient | None = None
        self._gate = SendGate()
        self._prebuilt: dict[int, bytes] = {}  # spec.index -> request bytes of a first turn, built before t0
        # spec.index -> (spec, due_ns, the stamped client's exchange) of a first turn sent before its worker took it up:
        # in a closed loop's first wave, or the moment the worker's previous answer ended
        self._sent_early: dict[int, tuple] = {}
        self._last_end_ns = 0  # when the latest stream ended (perf_counter_ns)
        self._record_error: Exception | None = None  # the first exception on_record raised

    async def run(self) -> RunOutcome:
        # No automatic collection during the run: a full (oldest-generation) one walks every record kept so far
        # and stalls the loop for tens of ms on long runs, and even a young one (~1 ms at 512 streams) lands
        # wherever allocation crosses its threshold, often in the middle of a closed loop's wave of sends. The
        # digester collects the young generations instead, between parses (collect_young).
        # The objects alive now are frozen, not collected: a full collection walks every one of them (a tune holding
        # SmolLM2's GGUF tokenizer: 664,000 objects, 1.4-2.2 s on 2 cores beside four busy processes), and t0 is
        # already fixed (the run pipeline fixes it before the load, 0.32 s ahead), so the first requests went out
        # late by that much. freeze() only sets them aside; after the run they rejoin the oldest generation,
        # unless the caller had frozen objects itself.
        frozen_by_caller = gc.get_freeze_count() > 0
        gc.freeze()
        gc.disable()
        try:
            outcome = await self._run()
        finally:
            gc.enable()
            if not frozen_by_caller:
                gc.unfreeze()
        if self._record_error is not None:
            raise self._record_error
        return outcome

    async def _run(self) -> RunOutcome:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:  # one socket per stream in flight: a 1,024 default is too few
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        closed_loop = bool(self.jobs) and self.jobs[0][0].intended_offset_s is None
        slots = self.concurrency or (1 if closed_loop else 0)
        # one session for all requests; enough connections for every stream in flight
        connector = aiohttp.TCPConnector(
            limit=slots, limit_per_host=0, enable_cleanup_closed=True, force_close=not self.backend.keep_alive
        )
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        self._sem = asyncio.Semaphore(slots) if slots and not closed_loop else None
        written = aiohttp.TraceConfig()
        written.on_request_chunk_sent.append(_note_request_written)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            read_bufsize=1 << 22,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            trace_configs=[written],
        ) as session:
            self._session = session
            if self.stamps == "kernel":
                self._client = StampedClient(
                    self.target.url,
                    self._url.raw_path_qs,
                    self._headers,
                    self.backend.keep_alive,
                    self.target.max_response_bytes,
                    ERROR_BODY_BYTES,
                    self.target.request_timeout_s,
                )
            if self.backend.keep_alive:  # else each request opens its own connection anyway
                if self._client is not None:
                    await self._client.open_connections(min(len(self.jobs), slots or 64))
                else:
                    await self._open_connections(min(len(self.jobs), slots or 64))
            for job in self.jobs[:PREBUILT_REQUESTS]:  # a first turn has no history: its bytes are known now
                self._prebuilt[job[0].index] = self._request_bytes(job[0], turn_messages([], job[0]))
            if self.t0_ns is None:
                self.t0_ns = t0_ahead_ns(1, spawn=False, connect=False)  # connections are open
            ticker = asyncio.create_task(self._tick_loop_lag())
            self._digests: asyncio.Queue = asyncio.Queue()
            digester = asyncio.create_task(self._digester())
            if closed_loop:
                it = iter(self.jobs)
                firsts = list(itertools.islice(it, slots))
                start = asyncio.Event()
                workers = [asyncio.create_task(self._closed_worker(job, it, start)) for job in firsts]
                workers.append(asyncio.create_task(self._start_at_t0(start, [job[0] for job in firsts])))
            else:
                workers = [asyncio.create_task(self._dispatch_open())]
            interrupted = await self._wait(workers)
            await self._digests.join()  # every finished stream gets its record
            digester.cancel()
            if self._client is not None:
                self._client.close()
        ticker.cancel()
        return RunOutcome(self.records, self.loop_lag_s, self.t0_ns, interrupted)

    async def _open_connections(self, count: int) -> None:
        """Opens connections before t0 so TCP handshakes stay out of the first measurements."""
        base = self.target.url.rstrip("/")

        async def touch():
            try:
                async with self._session.get(base + "/health", headers=self._headers) as resp:
                    await read_at_most(resp.content, ERROR_BODY_BYTES)
            except aiohttp.ClientError:
                pass  # a missing /health is fine: the connection was still opened

        await asyncio.gather(*(touch() for _ in range(count)))

    async def _wait(self, workers: list[asyncio.Task]) -> bool:
        stop_wait = asyncio.create_task(self.stop.wait())
        done_all = asyncio.gather(*workers)
        await asyncio.wait([done_all, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        if not self.stop.is_set():
            stop_wait.cancel()
            await done_all
            return False
        # interrupted: no new requests (workers check stop); in-flight ones get a short grace
        await asyncio.wait([done_all], timeout=INTERRUPT_GRACE_S)
        for task in list(self._tasks) + workers:
            task.cancel()
        await asyncio.gather(done_all, return_exceptions=True)
        for spec, due_ns, _ in self._sent_early.values():  # sent, but its worker was cancelled before taking it up
            rec = self._new_record(spec, due_ns)
            rec.fail("interrupted", "stopped by Ctrl-C before the stream ended")
            rec.end_s = (time.perf_counter_ns() - self.t0_ns) / 1e9
            self._finish(rec)
        self._sent_early.clear()
        return True

    async def _dispatch_open(self) -> None:
        for job in self.jobs:
            due_ns = self.t0_ns + int(job[0].intended_offset_s * 1e9)
            await sleep_until(due_ns)
            if self.stop.is_set() or self._past_end(due_ns):
                break
            task = asyncio.create_task(self._run_job(job, due_ns))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _start_at_t0(self, start: asyncio.Event, first_turns: list) -> None:
        """Starts a closed loop's workers with one timer, not one each. A uvloop timer wakes at the millisecond
        tick after it is due, so it is set early and the rest is waited by yielding.

        On the stamped client the first wave (every worker's first request, all due at t0) is sent from here, in
        one tight loop (StampedClient.send_wave): sent by the workers, each send waited for the workers resumed
        before it and their records, and the last one went out twice as late."""
        wave = [self._first_turn_bytes(spec) for spec in first_turns] if self._client is not None else []
        await sleep_until(self.t0_ns - 1_500_000)
        await sleep_until(self.t0_ns)
        if wave and not self.stop.is_set() and not self._past_end(self.t0_ns):
            for spec, exchange in zip(first_turns, self._client.send_wave(wave)):
                if exchange is not None:  # else its worker connects and sends it
                    self._sent_early[spec.index] = (spec, self.t0_ns, exchange)
        start.set()

    async def _closed_worker(self, job: list, jobs, start: asyncio.Event) -> None:
        """Runs `job`, then the next of the shared `jobs` as each ends.

        The next job is due when the previous one ended: client work in between (parsing, bookkeeping) shows
        up as send lag instead of being hidden. On the stamped client its first request is sent in the very
        read that completed the previous answer (send_next), before this task resumes: the answers of a closed
        loop's streams end together, and resumed one by one, each waited for every task resumed before it."""
        due_ns = self.t0_ns
        chained: list = []

        def send_next(answer) -> None:
            if self.stop.is_set() or self._past_end(answer.end_ns):
                return
            following = next(jobs, None)
            if following is None:
                return
            chained.append(following)
            spec = following[0]
            exchange = self._client.send_wave([self._first_turn_bytes(spec)])[0]
            if exchange is not None:  # else this worker connects and sends it
                self._sent_early[spec.index] = (spec, answer.end_ns, exchange)

        then = send_next if self._client is not None else None
        await start.wait()
        while job is not None:
            # a request already sent is run to its end whatever happened since
            if job[0].index not in self._sent_early and (self.stop.is_set() or self._past_end(due_ns)):
                return
            due_ns = await self._run_job(job, due_ns, then)
            job = chained.pop() if chained else next(jobs, None)

    def _past_end(self, ns: int) -> bool:
        return self.dispatch_until_s is not None and ns > self.t0_ns + self.dispatch_until_s * 1e9

    async def _run_job(self, turns: list, first_due_ns: int, then=None) -> int:
        """Runs a request or a session's turns; returns when (perf_counter_ns) the last one ended. `then`: the
        stamped client calls it with the last turn's answer as it completes."""
        if getattr(turns[0], "turn_kind", None) is not None:  # an agent session, its sub-agents with it
            return (await self._run_agent(turns, first_due_ns))[0]
        history: list[dict] = []
        due_ns = first_due_ns
        prev_end_ns = first_due_ns  # set by each turn's request; read only from the second turn on
        for n, spec in enumerate(turns):
            if n > 0:
                # a later turn is due think_time after the previous answer completed
                due_ns = prev_end_ns + int(spec.think_time_s * 1e9)
                await sleep_until(due_ns)
                if self.stop.is_set():
                    return prev_end_ns
            messages = turn_messages(history, spec)
            last_turn = n == len(turns) - 1
            rec, answer, prev_end_ns = await self._request(
                spec, due_ns, messages, need_answer=not last_turn, then=then if last_turn else None
            )
            if last_turn:
                break
            if not rec.ok:
                for later in turns[n + 1 :]:  # the session cannot go on without this answer
                    skipped = self._new_record(later, prev_end_ns)
                    skipped.fail("previous_turn_failed", f"turn {spec.turn_index} failed: {rec.error_reason}")
                    self._finish(skipped)
                return prev_end_ns
            history = (messages or own_messages(spec)) + [{"role": "assistant", "content": answer}]
        return prev_end_ns

    async def _run_agent(self, job: list, first_due_ns: int) -> tuple[int, str | None]:
        """An agent session (harness/scenario/agentic.py): its own turns in order, each due its delay after the
        previous answer ended; the sub-agents a turn's answer starts run in parallel, each due its delay after that
        answer ended, and the next turn waits for the last of them. Returns (when it ended, its last answer; None
        when a turn failed)."""
        own = [s for s in job if s.session_id == job[0].session_id]
        spawned: dict[int, list[list]] = {}
        for child in group_jobs([s for s in job if s.session_id != job[0].session_id]):  # its sub-agents' jobs
            spawned.setdefault(child[0].parent_turn, []).append(child)
        history: list[dict] = []
        due_ns = end_ns = first_due_ns
        answers: list[str] = []
        for n, spec in enumerate(own):
            if n > 0:
                due_ns = end_ns + int(spec.think_time_s * 1e9)
                await sleep_until(due_ns)
                if self.stop.is_set():
                    return end_ns, None
            messages = agent_turn_messages(history, spec, own[n - 1] if n else None, answers)
            rec, answer, end_ns = await self._request(spec, due_ns, messages, need_answer=True)
            children = spawned.get(spec.turn_index, [])
            if rec.ok and children:
                ran = await asyncio.gather(
                    *(self._run_agent(child, end_ns + int(child[0].think_time_s * 1e9)) for child in children)
                )
                end_ns = max([end_ns] + [child_end for child_end, _ in ran])
                answers = [child_answer for _, child_answer in ran]
                lost = sum(a is None for a in answers)
                if lost:
                    if not self.stop.is_set():  # stopped: what was not sent has no record, as in any session
                        later = _unrun(own, spawned, n + 1, n + 1)
                        self._skip(later, end_ns, f"{lost} of the {len(children)} sub-agents of turn {n} failed")
                    return end_ns, None
            if not rec.ok:
                self._skip(_unrun(own, spawned, n + 1, n), end_ns, f"turn {spec.turn_index} failed: {rec.error_reason}")
                return end_ns, None
            following = own[n + 1] if n + 1 < len(own) else None
            history = messages + [agent_answer_message(spec, answer, following, len(children))]
        return end_ns, answer

    def _skip(self, specs: list, end_ns: int, detail: str) -> None:
        """A failed record for each turn a session cannot go on to without an answer it lost."""
        for later in specs:
            skipped = self._new_record(later, end_ns)
            skipped.fail("previous_turn_failed", detail)
            self._finish(skipped)

    def _new_record(self, spec, due_ns: int) -> RequestRecord:
        return RequestRecord(
            index=spec.index,
            intended_send_s=(due_ns - self.t0_ns) / 1e9,
            prompt_tokens=spec.prompt_tokens,
            is_warmup=spec.is_warmup,
            session_id=spec.session_id,
            turn_index=spec.turn_index,
            model=spec.model,
            turn_kind=getattr(spec, "turn_kind", None),
            parent_session_id=getattr(spec, "parent_session_id", None),
            image_count=getattr(spec, "image_count", None),
            image_bytes=getattr(spec, "image_bytes", None),
        )

    def _finish(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        try:
            self.on_record(rec)
        except Exception as e:  # the caller's bug must not kill the digester (the run would wait on it for good):
            self._record_error = self._record_error or e  # the load stops, run() raises it once the records are in
            self.stop.set()

    async def _request(
        self, spec, due_ns: int, messages: list | None, need_answer: bool, then=None
    ) -> tuple[RequestRecord, str, int]:
        # a first turn's bytes were built before t0; a later turn's depend on the answers so far
        payload = self._prebuilt.pop(spec.index, None) or self._request_bytes(spec, messages)
        sent = self._sent_early.pop(spec.index, (None, None, None))[2]
        rec = self._new_record(spec, due_ns)
        try:
            if self._sem is not None:
                wait_from = time.perf_counter_ns()
                async with self._sem:
                    rec.cap_wait_s = (time.perf_counter_ns() - wait_from) / 1e9
                    reads, times, end_ns = await self._stream(rec, payload)
            else:
                reads, times, end_ns = await self._stream(rec, payload, sent, then)
        except asyncio.CancelledError:
            rec.fail("interrupted", "stopped by Ctrl-C before the stream ended")
            rec.end_s = (time.perf_counter_ns() - self.t0_ns) / 1e9
            self._finish(rec)
            raise
        # Parsing waits in the digester's queue, so the next send (closed loop) and the
        # other streams' reads go first; only a next turn has to wait for the answer.
        answer = asyncio.get_running_loop().create_future()
        self._digests.put_nowait((rec, spec, reads, times, answer, need_answer, end_ns))
        return rec, (await asyncio.shield(answer) if need_answer else ""), end_ns

    def _streams_still_ending(self, end_ns: int) -> bool:
        """Whether the parse of a stream that ended at end_ns should wait (QUIET_NS, DEFER_NS)."""
        now_ns = time.perf_counter_ns()
        return now_ns - self._last_end_ns < QUIET_NS and now_ns - end_ns < DEFER_NS

    def _first_turn_bytes(self, spec) -> bytes:
        """A first turn's request bytes, built before t0 where they could be; kept for its _request to take."""
        payload = self._prebuilt.get(spec.index)
        if payload is None:
            payload = self._prebuilt[spec.index] = self._request_bytes(spec, turn_messages([], spec))
        return payload

    def _request_bytes(self, spec, messages: list | None) -> bytes:
        """What is sent for one turn: the JSON body, with its HTTP head on the stamped client's path."""
        t = self.target
        body = self.backend.request_body(
            t.api,
            spec.model or t.model,
            spec.output_tokens,
            prompt=spec.prompt,
            messages=messages,
            ignore_eos=t.ignore_eos,
        )
        if t.sampling:
            self.backend.add_sampling(body, t.api, request_sampling(t.sampling, spec.index))
        body = json.dumps({**body, **t.extra_body, **(spec.extra_body or {})}).encode()
        return self._client.request_bytes(body) if self._client is not None else body

    async def _digester(self) -> None:
        """Parses finished streams one per loop turn, so a chunk never waits behind many parses."""
        while True:
            rec, spec, reads, times, answer, need_answer, end_ns = await self._digests.get()
            # a next turn waits for this answer (its wait would be its send lag): it goes at once
            while not need_answer and self._streams_still_ending(end_ns):
                await asyncio.sleep(QUIET_NS / 1e9)
            await self._gate.idle()  # a request being sent goes first
            try:
                if rec.ok:
                    text = self._digest(rec, spec.output_tokens, reads, times)
                else:
                    text = self._keep_partial(rec, reads, times)
                keep_answer(rec, spec, text, self.target.record_outputs)
            except Exception as e:  # a parser bug must cost one record, not hang the run
                rec.fail("client_error", f"parsing the stream failed: {type(e).__name__}: {e}")
                text = ""
            self._finish(rec)
            answer.set_result(text)
            self._digests.task_done()
            collect_young()
            await asyncio.sleep(0)

    async def _stream(self, rec: RequestRecord, payload: bytes, sent=None, then=None) -> tuple[list[bytes], tuple, int]:
        """Sends one request (or, given the exchange `sent` of a wave, finishes what its send began) and keeps
        each read with its arrival times (kernel or None, loop); failures go into rec."""
        rec.actual_send_s = ((time.perf_counter_ns() if sent is None else sent.start_ns) - self.t0_ns) / 1e9
        written = self._gate.begin()
        try:
            if self._client is not None:
                reads, times, end_ns = await self._send_and_read_stamped(rec, payload, written, sent, then)
            else:
                reads, loop_times, end_ns = await self._send_and_read(rec, payload, written)
                times = (None, loop_times)
                rec.stamp_source = "loop"
        finally:
            written()
        rec.end_s = (end_ns - self.t0_ns) / 1e9
        self._last_end_ns = max(self._last_end_ns, end_ns)
        if rec.request_written_s is not None:
            rec.request_written_s = (rec.request_written_s - self.t0_ns) / 1e9
        return reads, times, end_ns

    async def _send_and_read_stamped(
        self, rec: RequestRecord, request: bytes, written, sent=None, then=None
    ) -> tuple[list[bytes], tuple, int]:
        """The stamped client's path: each body piece with the kernel's and the loop's time of its read."""
        try:
            resp = await self._client.post(request, written, sent, then)
        except HttpStreamError as e:
            rec.fail(e.reason, e.detail)
            part = e.partial
            if part is None or part.status >= 300:
                return [], (None, []), time.perf_counter_ns()
            rec.http_status = part.status
            rec.stamp_source = "loop" if part.unstamped_reads else "kernel"
            return (
                part.pieces,
                (part.kernel_ns if rec.stamp_source == "kernel" else None, part.loop_ns),
                time.perf_counter_ns(),
            )  # what arrived before the failure: the record keeps it (partial)
        rec.request_written_s = resp.written_ns
        rec.http_status = resp.status
        rec.stamp_source = "loop" if resp.unstamped_reads else "kernel"
        end_ns = resp.end_ns  # the last read, not the wake-up
        if resp.status >= 300:
            detail = b"".join(resp.pieces)[:ERROR_BODY_BYTES].decode("utf-8", "replace")
            rec.fail(*http_failure(resp.status, detail, resp.location))
            return [], (None, []), end_ns
        kernel = resp.kernel_ns if rec.stamp_source == "kernel" else None
        return resp.pieces, (kernel, resp.loop_ns), end_ns

    async def _send_and_read(self, rec: RequestRecord, body: bytes, written) -> tuple[list[bytes], list[int], int]:
        reads: list[bytes] = []
        times: list[int] = []
        clock = time.perf_counter_ns
        try:
            async with asyncio.timeout(self.target.request_timeout_s):
                async with self._session.post(
                    self._url,
                    data=body,
                    headers=self._headers,
                    trace_request_ctx=(rec, written),
                    allow_redirects=False,  # as the stamped client: a redirect fails the request (http_redirect)
                ) as resp:
                    rec.http_status = resp.status
                    if resp.status >= 300:
                        detail = (await read_at_most(resp.content, ERROR_BODY_BYTES)).decode("utf-8", "replace")
                        rec.fail(*http_failure(resp.status, detail, resp.headers.get("Location")))
                        return reads, times, clock()
                    read = resp.content.readany
                    budget = self.target.max_response_bytes
                    while True:  # the hot path: stamp first, keep the bytes, nothing else
                        data = await read()
                        now = clock()
                        if not data:
                            break
                        reads.append(data)
                        times.append(now)
                        budget -= len(data)
                        if budget < 0:  # leaving the block closes the connection: the rest is never read
                            rec.fail("response_too_large", too_large_detail(self.target.max_response_bytes))
                            reads.clear()
                            times.clear()
                            break
        except TimeoutError:
            rec.fail("timeout", f"no complete answer within request_timeout_s={self.target.request_timeout_s}")
        except aiohttp.ClientConnectorError as e:
            rec.fail("connect_error", str(e))
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            rec.fail("stream_cut", f"{type(e).__name__}: {e}")
        except aiohttp.ClientError as e:
            rec.fail("client_error", f"{type(e).__name__}: {e}")
        return reads, times, clock()

    def _digest(self, rec: RequestRecord, asked_tokens: int, reads: list[bytes], times: tuple) -> str:
        try:
            parsed = self._parse(rec, reads, times)
        except StreamError as e:
            rec.fail(e.reason, e.detail)
            return ""
        rec.take_stream(parsed, self.t0_ns)
        problem = answer_problem(rec, asked_tokens, self.target.ignore_eos and self.backend.forces_length, parsed.text)
        if rec.ok and problem is not None:
            rec.fail(*problem)
        rec.partial = not rec.ok and bool(rec.token_times_s)  # an aborted or short answer keeps its tokens too
        return parsed.text

    def _keep_partial(self, rec: RequestRecord, reads: list[bytes], times: tuple) -> str:
        """A failed request keeps the tokens and times that arrived before it failed (rec.partial); bytes that do not
        parse (a cut inside an event) keep nothing. Returns "": a next turn needs a whole answer."""
        if not reads:
            return ""
        try:
            parsed = self._parse(rec, reads, times)
        except StreamError:
            return ""
        rec.take_partial(parsed, self.t0_ns)
        return ""

    def _parse(self, rec: RequestRecord, reads: list[bytes], times: tuple):
        """The stream's events, each timed by the read that completed it (kernel stamp, else loop); with kernel
        stamps, rec.token_loop_times_s gets the loop's times too. Raises StreamError."""
        kernel_ns, loop_ns = times
        parsed = self.backend.parse_stream(self.target.api, reads, range(len(reads)))
        read_of_chunk = parsed.token_times_ns
        parsed.token_times_ns = [(kernel_ns or loop_ns)[i] for i in read_of_chunk]
        if kernel_ns is not None:
            rec.token_loop_times_s = [(loop_ns[i] - self.t0_ns) / 1e9 for i in read_of_chunk]
        return parsed

    async def _tick_loop_lag(self) -> None:
        """Measures how late the event loop wakes a sleeper: a busy client shows here first."""
        while True:
            start = time.perf_counter_ns()
            await asyncio.sleep(LOOP_TICK_S)
            self.loop_lag_s.append(max(0.0, (time.perf_counter_ns() - start) / 1e9 - LOOP_TICK_S))


def run_async(coro):
    """Runs a coroutine to its end on uvloop (asyncio's loop where uvloop is missing)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_blocking(runner_factory: Callable[[], Runner]) -> RunOutcome:
    """Runs a Runner (made inside the loop) to its end."""

    async def main():
        return await runner_factory().run()

    return run_async(main())
