"""A scenario's load on a simulated deployment: the discrete-event loop of `bench plan`.

Events on one virtual clock: a request arrives (the router's own Policy picks its replica), a
replica's step ends (its tokens are out; the next step starts at once while it has work). Each
replica is the engine's Scheduler and BlockManager (replica.py); a step lasts what the step model
says for its batch. Requests are `bench run`'s plan (harness/scenario/workload.py), their prompts encoded
to token ids, so prefix sharing is exact; a request reaches the engine `request_overhead_s` after
it is sent (the server's HTTP and tokenization, measured), and its tokens reach the client when
the step that made them ends. The records and summary are `bench run`'s (harness/metrics/latencies.py),
with `simulated: true` and the models used.

Nothing is dropped silently: a request the server's rules refuse (a full waiting queue, a prompt past the
context) is recorded as bench run records a refusal and counted by reason in a `plan_refused` finding; an
offline load (load.arrival: offline) is held client-side and fed as the engines' waiting queues have room, so
none is refused for a full queue. Steps past the batches and contexts the step model was fitted on are
counted (range_tally.py) and said in a `plan_beyond_fitted_range` finding.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import heapq
import itertools
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from harness.client.runner import http_failure_reason
from harness.engine.step_trace import write_engine_trace
from harness.metrics.explain import explain
from harness.metrics.latencies import summarize
from harness.plan.decode_run import DecodeRun, admits, commit, plan_decode_run
from harness.plan.deployment import Deployment, engine_choice, scenario_deployment, size_to_memory
from harness.plan.disaggregation import (
    DECODE,
    PREFILL,
    KVTransfer,
    disaggregation_line,
    handoff_timings,
    plan_transfer,
)
from harness.plan.host import HostShare, host_share
from harness.plan.prompt_ids import KeptEncodings, PromptIds, prompt_token_ids
from harness.plan.range_tally import RangeTally
from harness.plan.replica import Replica, Step
from harness.plan.step_model import (
    FitRange,
    FittedStepModel,
    StepModel,
    fit_step_model,
    trace_fit_range,
)
from harness.results.folder import RequestRecord, ResultWriter, versions
from harness.results.schema import Backend, CpuSeconds, Finding, PlanAccount, RunInfo, Summary
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import resolve_tokenizer
from harness.scenario.workload import RequestSpec, build_schedule
from native_engine.llm_engine import request_timings
from native_engine.routing_policy import Policy, prompt_text
from native_engine.scheduler import QueueFullError
from native_engine.sequence import Sequence
from native_engine.server import RequestError, sampling_params

MAX_TRACED_REQUESTS = 20_000  # beyond this many requests the steps are not kept (memory): no engine_trace.json
# engine_trace.json holds the last this many steps, as the engine's own trace does (native_engine/step_trace.py
# StepTrace's max_steps): 10,000 requests over 10 replicas made 960,000 steps, and writing them all as the
# report's timeline took 3/4 of that plan's time (cProfile); the diagnosis still reads every step
MAX_WRITTEN_STEPS = 200_000
# Event kinds, in their order at equal times: arrivals first, as the engine drains its inbox before a step;
# then KV handoffs reaching a decode replica (disaggregation.py: admitted at its next step boundary, so one that
# comes as a step ends joins the step that starts then); then step ends; then the requests a finish at that
# instant releases (a session's next turn after no think time, a closed loop's next request): they are sent after
# it, so never join a step that starts at it; last, an offline load's feed of the requests held client-side into
# the room those steps' admissions left.
ARRIVE, HANDOFF, STEP_END, RELEASED, FEED = 0, 1, 2, 3, 4
QUEUE_FULL = "waiting queue full"  # a refusal's reason (Simulation.refused) when the engine's queue bound is hit
ANY_VOCAB = 1 << 31  # prompts are the tokenizer's own ids; sampling_params checks only stop_token_ids against it


class VirtualClock:
    """The simulated time in seconds; the schedulers read it where the engine reads perf_counter."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Simulation:
    def __init__(
        self,
        deployment: Deployment,
        step_model: StepModel,
        request_overhead_s: float = 0.0,
        keep_steps: bool = True,
        fast_forward: bool = True,
        host: HostShare | None = None,
        fit_range: FitRange | None = None,
        transfer: KVTransfer | None = None,
    ):
        """`transfer`: the KV handoff's link, for a disaggregated deployment (deployment.disaggregate)."""
        self.clock = VirtualClock()
        self.step_model = step_model
        self.request_overhead_s = request_overhead_s
        # replicas sharing the host's cores (host.py): a step's slowdown depends on the other replicas' state at
        # its start, which a decode run timed ahead cannot know, so they step one by one
        self.host = host if host is not None and deployment.replicas > 1 else None
        self.fast_forward = fast_forward and self.host is None  # pure-decode stretches as one event (decode_run.py)
        split = self.disaggregate = deployment.disaggregate
        if split is not None and transfer is None:
            raise ValueError("a disaggregated deployment needs its KV transfer (disaggregation.py plan_transfer)")
        self.transfer = transfer
        roles = [(f"replica-{i}", None) for i in range(deployment.replicas)]
        if split is not None:  # the engine's worker names
            roles = [(f"prefill-{i}", PREFILL) for i in range(split.prefill)]
            roles += [(f"decode-{i}", DECODE) for i in range(split.decode)]
        names = [n for n, _ in roles]
        self.replicas = {n: Replica(n, deployment, self.clock, role) for n, role in roles}
        self.rank = {n: i for i, n in enumerate(names)}  # orders replicas' step ends at equal times
        # the replicas a request is sent to first (a disaggregated deployment's prefill ones), in order
        self.entry = [n for n, role in roles if role != DECODE]
        self.decoders = [n for n, role in roles if role == DECODE]
        self.up = set(self.entry)  # every simulated replica takes requests
        routed = len(names) > 1 and split is None
        self.policy = Policy(deployment.router_policy, names, deployment.cache_aware) if routed else None
        self.in_flight = dict.fromkeys(names, 0)
        self.steps: list[dict] | None = [] if keep_steps else None  # engine_trace.py's step form
        self.sequence_steps = 0  # sequences summed over every step's batch: the simulation's unit of work
        self.engine_steps = 0
        self.fast_forwarded_steps = 0  # of engine_steps, those committed as part of a decode run
        self.refused: dict[str, int] = {}  # requests the server refused, by reason (never silently dropped)
        self.refused_example: dict[str, str] = {}  # the first refusal's detail, by reason
        # the committed steps against the batches and contexts the step model was fitted on (range_tally.py)
        self.range_tally = RangeTally(fit_range) if fit_range is not None else None
        self._events: list = []
        # the arrivals known from the start (a trace's, an open loop's), in time order, and the next of them:
        # kept out of the heap, which then holds only the events made on the way (a shallower heap)
        self._scheduled: list = []
        self._next_scheduled = 0
        self._order = itertools.count()

    def push(self, time_s: float, kind: int, item, rank: int = 0) -> None:
        """At equal times arrivals in the order pushed, then step ends by replica: not by when each step
        started, so that a decode run (pushed at its start) ends where its last step would."""
        heapq.heappush(self._events, (time_s, kind, rank, next(self._order), item))

    def schedule_arrivals(self, arrivals: list[tuple[float, object]]) -> None:
        """(time, item) arrivals, before any push: ordered as pushed one by one would order them."""
        self._scheduled = sorted((t, ARRIVE, 0, next(self._order), item) for t, item in arrivals)

    def pop(self) -> tuple | None:
        """The next event (time_s, kind, rank, order, item): the earlier of the heap's and the next scheduled
        arrival (their keys are unique: the order pushed); None when none is left."""
        events, i = self._events, self._next_scheduled
        if i < len(self._scheduled) and (not events or self._scheduled[i] < events[0]):
            self._next_scheduled += 1
            return self._scheduled[i]
        return heapq.heappop(events) if events else None

    def route(self, text: str, up: set[str] | None = None) -> Replica:
        """The replica the router picks among `up` (default: every replica)."""
        if self.disaggregate is not None:
            return self.least_busy([n for n in self.entry if n in (self.up if up is None else up)])
        if self.policy is None:
            return next(iter(self.replicas.values()))
        name = self.policy.choose(text, self.in_flight, self.up if up is None else up).replica
        return self.replicas[name]

    def least_busy(self, names: list[str]) -> Replica:
        """The first of names with the fewest requests in flight: the coordinator's choice of a worker of a role
        (native_engine/disaggregation.py Disaggregator.send)."""
        return self.replicas[min(names, key=self.in_flight.__getitem__)]

    def with_room(self) -> set[str]:
        """The replicas a request may be sent to whose waiting queue is below the engine's bound (--max-waiting)."""
        return {n for n in self.entry if has_room(self.replicas[n])}

    def start_step(self, replica: Replica) -> None:
        now_s = self.clock.now_s
        run = plan_decode_run(replica, self.step_model, now_s) if self.fast_forward else None
        if run is not None:
            replica.in_flight = run
            self.push(run.end_s, STEP_END, (replica, run), self.rank[replica.name])
            return
        step = replica.start_step()
        replica.in_flight = step
        if step is not None:
            step_s = self.step_model.step_time_s(step.shape)
            if self.host is not None:  # the replicas stepping now, this one included
                busy = 1 + sum(r.in_flight is not None for r in self.replicas.values() if r is not replica)
                step_s *= self.host.slowdown(busy)
            end_s = now_s + step_s
            self.push(end_s, STEP_END, (replica, step), self.rank[replica.name])

    def arrived(self, replica: Replica, after_steps: bool) -> None:
        """A sequence was added to replica's waiting queue now (after_steps: after the step ends at this
        instant, a RELEASED event): a step starts, or a decode run is cut back where the scheduler would
        admit it (else it waits behind the full batch)."""
        run = replica.in_flight
        if run is None:
            self.start_step(replica)
        elif isinstance(run, DecodeRun) and not admits(replica.scheduler):
            run.queued_s.append((self.clock.now_s, after_steps))
        elif isinstance(run, DecodeRun) and (shorter := run.cut_back(self.clock.now_s, after_steps)) is not None:
            replica.in_flight = shorter  # the longer run's end event is now stale
            self.push(shorter.end_s, STEP_END, (replica, shorter), self.rank[replica.name])


def has_room(replica: Replica) -> bool:
    scheduler = replica.scheduler
    return len(scheduler.waiting) < scheduler.config.max_waiting


def _tokenizer(scenario: Scenario):
    """The scenario's local token source (never the engine's /tokenize: no engine runs). A non-native engine's plan
    downloads nothing: a backend.tokenizer that is not a file or folder here (a hub name) is passed over, and the
    prompts are counted by the approximate source, the workload's or trace's lengths holding as given."""
    backend = scenario.backend
    update: dict = {"url": None}
    if backend.kind != "native" and backend.tokenizer and not Path(backend.tokenizer).expanduser().exists():
        update["tokenizer"] = None
    offline = backend.model_copy(update=update)
    return resolve_tokenizer(scenario.model_copy(update={"backend": offline}))


def _step_model(scenario: Scenario, deployment: Deployment) -> tuple[StepModel, float]:
    """The plan's step model and the request overhead in s: a fitted model's own (measured), a roofline's from the
    engine profile (0 for the native engine, as before profiles)."""
    spec = scenario.plan.step_model
    if spec.kind == "fitted":
        model = fit_step_model(spec.fitted, deployment.kv_block_size)
        return model, model.request_overhead_s
    from harness.plan.roofline_scenario import roofline_memory, roofline_step_model  # planroof's

    model = roofline_step_model(scenario)
    spread = model.expert_gpus // model.tp  # replicas whose GPUs share one set of experts (expert parallelism)
    if deployment.replicas % spread:
        raise ValueError(
            f"plan.expert_parallel {model.ep} spreads the experts over {spread} replicas of tensor parallel "
            f"{model.tp}: give a multiple of {spread} replicas (plan.replicas), not {deployment.replicas}"
        )
    # on a GPU the KV blocks are what its memory leaves after the weights, not the launch args' CPU-sized cache
    memory = roofline_memory(scenario, deployment.kv_block_size)
    if not memory.weights_fit:
        raise ValueError(
            f"plan: {model.arch.name} at {model.arch.weight_bits:g} bits leaves no KV cache on "
            f"{model.tp} x {scenario.plan.hardware} (weights "
            f"{memory.weights_bytes_per_gpu / 1e9:.1f} GB per GPU); raise plan.tensor_parallel"
        )
    choice = deployment.engine
    if choice is None:
        deployment.num_kv_blocks, deployment.max_model_len = memory.num_kv_blocks, memory.kv_tokens
        return model, getattr(model, "request_overhead_s", 0.0)
    size_to_memory(deployment, memory.kv_tokens)
    return model, choice.profile.overheads.request_ms / 1e3


def run_simulation(
    sim: Simulation,
    requests: list[RequestSpec],
    token_ids: PromptIds | list[list[int]],
    concurrency: int | None,
    on_record,
    offline: bool = False,
) -> None:
    """Plays every request through the simulated deployment; on_record(RequestRecord) as each finishes or is
    refused. offline: the requests due at 0 wait client-side and go in as the engines' waiting queues have room."""
    playback = _Playback(sim, token_ids, on_record, offline)
    playback.schedule(requests, concurrency)
    while (event := sim.pop()) is not None:
        time_s, kind, _, _, item = event
        sim.clock.now_s = time_s
        if kind == FEED:
            playback.feed()
            continue
        if kind == HANDOFF:
            playback.handoff(*item)
            continue
        if kind != STEP_END:
            playback.arrive(time_s, kind, item)
            continue
        replica, work = item
        if work is not replica.in_flight:
            continue  # a decode run an arrival cut back
        if isinstance(work, DecodeRun):
            playback.decode_run_ended(replica, work)
        else:
            playback.step_ended(replica, work, time_s)
        playback.next_step(replica)
        if playback.backlog:
            playback.feed_at(time_s)  # the step's admissions left room in the waiting queue
    playback.refuse_backlog()


class _Playback:
    """The requests' side of one simulation: which wait for a slot or a turn, which are live where."""

    def __init__(self, sim: Simulation, token_ids: PromptIds | list[list[int]], on_record, offline: bool = False):
        self.sim, self.token_ids, self.on_record = sim, token_ids, on_record
        self.waiting_slots: deque[RequestSpec] = deque()  # a closed loop's requests not yet sent
        self.next_turn: dict[tuple[int, int], RequestSpec] = {}  # (session, turn): sent after the turn before
        self.live: dict[str, tuple[RequestSpec, float, list[float], Replica]] = {}
        # offline: the requests sent (the time) that wait client-side until an engine's waiting queue has room
        self.offline = offline
        self.backlog: deque[tuple[RequestSpec, float]] = deque()
        self.feed_pending_s: float | None = None  # the time of the FEED event pushed and not yet run

    def schedule(self, requests: list[RequestSpec], concurrency: int | None) -> None:
        """The arrivals known from the start, and a closed loop's first `concurrency` requests at 0; offline, the
        first turns all wait client-side, fed once the server's overhead has passed."""
        scheduled = []
        for r in requests:
            if self.offline and r.turn_index == 0:
                self.backlog.append((r, r.intended_offset_s or 0.0))
            elif r.intended_offset_s is not None:
                scheduled.append((r.intended_offset_s, (r, r.intended_offset_s)))
            elif r.turn_index > 0:
                self.next_turn[(r.session_id, r.turn_index)] = r
            else:
                self.waiting_slots.append(r)
        self.sim.schedule_arrivals(scheduled)
        for _ in range(min(concurrency or 0, len(self.waiting_slots))):
            self.sim.push(0.0, ARRIVE, (self.waiting_slots.popleft(), 0.0))
        if self.backlog:
            self.feed_at(self.sim.request_overhead_s)

    def feed_at(self, time_s: float) -> None:
        """A FEED event at time_s (one an instant): after that instant's step ends, releases and admissions."""
        if self.feed_pending_s != time_s:
            self.feed_pending_s = time_s
            self.sim.push(time_s, FEED, None)

    def feed(self) -> None:
        """The requests held client-side, in order, to the replicas the router picks among those whose waiting
        queue has room, until none has or none is left: the engine pulls, none is refused for a full queue."""
        sim, backlog = self.sim, self.backlog
        self.feed_pending_s = None
        room = sim.with_room()
        while backlog and room:
            spec, sent_s = backlog.popleft()
            replica = sim.route(request_text(spec), room)
            self.admit(spec, sent_s, replica, sim.clock.now_s, after_steps=True)
            if not has_room(replica):
                room.discard(replica.name)

    def refuse_backlog(self) -> None:
        """Requests still held when no event is left (none should be: an idle replica has room): refused, said."""
        while self.backlog:
            spec, sent_s = self.backlog.popleft()
            self.refuse(spec, sent_s, 503, "never admitted: the simulation ended with it held client-side")

    def release_after(self, spec: RequestSpec) -> None:
        """What waits on this request: its session's next turn, or (closed loop) the next request."""
        sim = self.sim
        after = self.next_turn.pop((spec.session_id, spec.turn_index + 1), None)
        if after is not None:
            at_s = sim.clock.now_s + after.think_time_s
            sim.push(at_s, ARRIVE if at_s > sim.clock.now_s else RELEASED, (after, at_s))
        elif spec.turn_index == 0 and self.waiting_slots and spec.intended_offset_s is None:
            sim.push(sim.clock.now_s, RELEASED, (self.waiting_slots.popleft(), sim.clock.now_s))

    def refuse(self, spec: RequestSpec, sent_s: float, status: int, detail: str, reason: str | None = None) -> None:
        """The server's refusal of a request, recorded as bench run records it and counted by reason."""
        reason = reason or f"HTTP {status}: {detail}"
        self.sim.refused[reason] = self.sim.refused.get(reason, 0) + 1
        self.sim.refused_example.setdefault(reason, detail)
        rec = RequestRecord(
            spec.index,
            sent_s,
            sent_s,
            sent_s,
            end_s=self.sim.clock.now_s,
            http_status=status,
            prompt_tokens=spec.prompt_tokens,
            is_warmup=spec.is_warmup,
        )
        rec.fail(http_failure_reason(status), f"HTTP {status}: {detail}")
        self.on_record(rec)
        self.release_after(spec)

    def arrive(self, time_s: float, kind: int, item: tuple[RequestSpec, float]) -> None:
        """A request reaches the server; once its overhead has passed, its replica's scheduler takes it."""
        sim = self.sim
        spec, sent_s = item
        engine_s = sent_s + sim.request_overhead_s
        if time_s < engine_s:
            sim.push(engine_s, ARRIVE, item)  # the server's share before the engine sees it
            return
        self.admit(spec, sent_s, sim.route(request_text(spec)), engine_s, after_steps=kind == RELEASED)

    def admit(self, spec: RequestSpec, sent_s: float, replica: Replica, engine_s: float, after_steps: bool) -> None:
        """The request into the replica's scheduler at engine_s (now), or refused as its server would refuse it;
        offline, one that finds the waiting queue full waits client-side instead."""
        sim = self.sim
        ids = self.token_ids[spec.index]  # PromptIds lists it afresh; Sequence copies it to append to
        try:  # the server's own rule: the prompt and its answer must fit the context
            params = sampling_params(
                {"max_tokens": spec.output_tokens, "ignore_eos": True},
                len(ids),
                replica.max_model_len,
                None,
                "prompt",
                ANY_VOCAB,
            )
        except RequestError as e:
            self.refuse(spec, sent_s, e.status, e.message, f"HTTP {e.status}: the server's request rule")
            return
        if replica.role == PREFILL:  # the prefill worker runs the prompt to its first token
            params = dataclasses.replace(params, max_tokens=1)
        seq = Sequence(str(spec.index), ids, params, arrival_s=engine_s)
        try:
            replica.scheduler.add(seq)
        except QueueFullError as e:
            if self.offline:
                self.backlog.append((spec, sent_s))
                self.feed_at(sim.clock.now_s)
            else:
                self.refuse(spec, sent_s, 503, str(e), f"HTTP 503: {QUEUE_FULL} (--max-waiting)")
            return
        self.live[seq.request_id] = (spec, sent_s, [], replica)
        sim.in_flight[replica.name] += 1
        sim.arrived(replica, after_steps)

    def decode_run_ended(self, replica: Replica, work: DecodeRun) -> None:
        sim = self.sim
        self.first_tokens_out(replica, work.ends_s[0])
        taken = commit(work, replica)
        times = work.ends_s[: work.steps]
        for seq in work.seqs:
            self.live[seq.request_id][2].extend(times)  # one list of floats shared by the batch
        sim.engine_steps += work.steps
        sim.fast_forwarded_steps += work.steps
        sim.sequence_steps += work.steps * len(work.seqs)
        if sim.range_tally is not None:
            sim.range_tally.decode_run(len(work.seqs), work.context_tokens, work.steps)
        if sim.steps is not None:
            sim.steps += _trace_decode_run(replica, work, taken)

    def step_ended(self, replica: Replica, work: Step, time_s: float) -> None:
        sim = self.sim
        self.first_tokens_out(replica, time_s)
        replica.end_step(work)
        if replica.role != PREFILL:  # a prefill replica's token goes to the decode replica, not the client
            for seq in work.sampled:
                self.live[seq.request_id][2].append(time_s)
        sim.engine_steps += 1
        sim.sequence_steps += work.shape.prefill_seqs + work.shape.decode_seqs
        if sim.range_tally is not None:
            sim.range_tally.step(work.shape)
        if sim.steps is not None:
            sim.steps.append(_trace_step(replica.name, work, time_s))
        for seq in work.finished:
            if replica.role == PREFILL:
                sim.push(time_s + sim.transfer.seconds(seq.num_prompt_tokens), HANDOFF, (replica, seq))
            else:
                self.finished(seq)

    def finished(self, seq: Sequence) -> None:
        """The request's record, and what waits on it released."""
        spec, sent_s, times, at = self.live.pop(seq.request_id)
        self.sim.in_flight[at.name] -= 1
        self.on_record(_record(spec, sent_s, times, seq))
        self.release_after(spec)

    def next_step(self, replica: Replica) -> None:
        """At a step boundary: the KV handoffs that reached the replica are admitted, then its next step starts; an
        idle replica sends their first tokens at once (the engine's step with nothing to run returns them)."""
        now_s = self.sim.clock.now_s
        for seq in replica.handoffs:
            try:
                replica.admit_handoff(seq, now_s)
            except QueueFullError as e:
                spec, sent_s, _, at = self.live.pop(seq.request_id)
                self.sim.in_flight[at.name] -= 1
                self.refuse(spec, sent_s, 503, str(e), f"HTTP 503: {QUEUE_FULL} (--max-waiting) on a decode replica")
                continue
            replica.first_out.append(seq)
        replica.handoffs.clear()
        self.sim.start_step(replica)
        if replica.in_flight is None:
            self.first_tokens_out(replica, now_s)

    def first_tokens_out(self, replica: Replica, time_s: float) -> None:
        """The handed-off requests admitted at the step's start get their first token now, as the step's outputs
        (llm_engine.step returns the inbox's outputs with the step's); one whose answer was that token ends."""
        for seq in replica.first_out:
            self.live[seq.request_id][2].append(time_s)
            if seq.finish_reason is not None:
                self.finished(seq)
        replica.first_out.clear()

    def handoff(self, prefill: Replica, seq: Sequence) -> None:
        """A prompt's KV has crossed the link: the prefill replica frees its blocks, the least busy decode replica
        takes the request at its next step boundary (a decode run in flight is cut back to its step in flight)."""
        sim, now_s = self.sim, self.sim.clock.now_s
        prefill.block_manager.free(seq)
        spec, sent_s, times, _ = self.live[seq.request_id]
        sim.in_flight[prefill.name] -= 1
        decode = sim.least_busy(sim.decoders)
        sim.in_flight[decode.name] += 1
        self.live[seq.request_id] = (spec, sent_s, times, decode)
        # the request as the decode worker gets it: the client's max_tokens, the prefill's phases in its timings
        params = dataclasses.replace(seq.params, max_tokens=spec.output_tokens)
        handed = Sequence(seq.request_id, seq.prompt_token_ids, params, arrival_s=now_s)
        handed.kv_transfer = handoff_timings(request_timings(seq), seq.num_prompt_tokens, sim.transfer)
        decode.handoffs.append(handed)
        run = decode.in_flight
        if run is None:
            self.next_step(decode)
        elif isinstance(run, DecodeRun) and (shorter := run.cut_back(now_s, after_steps=False)) is not None:
            decode.in_flight = shorter  # the longer run's end event is now stale
            sim.push(shorter.end_s, STEP_END, (decode, shorter), sim.rank[decode.name])
        if prefill.in_flight is None and prefill.scheduler.waiting:  # the freed blocks may admit a waiting one
            sim.start_step(prefill)


def request_text(spec: RequestSpec) -> str:
    """What the router matches of a request (its prompt, or its chat's messages)."""
    return prompt_text({"prompt": spec.prompt} if spec.messages is None else {"messages": spec.messages})


def _record(spec: RequestSpec, sent_s: float, times: list[float], seq: Sequence) -> RequestRecord:
    n = len(times)
    return RequestRecord(
        spec.index,
        sent_s,
        sent_s,
        sent_s,
        token_times_s=times,
        tokens_per_chunk=[1] * n,
        end_s=times[-1],
        prompt_tokens=seq.num_prompt_tokens,
        output_tokens=n,
        output_tokens_counted=n,
        output_tokens_usage=n,
        finish_reason=seq.finish_reason,
        server_timings=request_timings(seq),
        is_warmup=spec.is_warmup,
        session_id=spec.session_id,
        turn_index=spec.turn_index,
    )


def _trace_step(replica: str, s: Step, end_s: float) -> dict:
    """A simulated step in harness/engine/step_trace.py's step form (what diagnosis reads)."""
    return {
        "t_s": s.start_s,
        "dur_s": end_s - s.start_s,
        "forward_s": end_s - s.start_s,
        "prefill_tokens": s.shape.prefill_tokens,
        "prefill_chunks": [],
        "decode_seqs": s.shape.decode_seqs,
        "kv_blocks_used": s.kv_blocks_used,
        "preemptions": s.preemptions,
        "prefix_hit_tokens": s.prefix_hit_tokens,
        "bytes_read": 0,
        "flops": 0,
        "running": s.running,
        "waiting": s.waiting,
        "kv_positions_read": s.shape.context_tokens,
        "replica": replica,
    }


def _trace_decode_run(replica: Replica, run: DecodeRun, taken: list[int]) -> list[dict]:
    """A decode run's steps in _trace_step's form, as each would have been traced alone (written out here: one
    dict a step, no Step and StepShape a step, since a plan's steps are mostly these)."""
    bm, n, name, queued = replica.block_manager, len(run.seqs), replica.name, run.queued_s
    used = bm.num_blocks - bm.num_free_blocks - sum(taken)  # before the run's first step
    steps, start_s = [], run.start_s
    for end_s, context, took in zip(run.ends_s[: run.steps], run.context_tokens, taken):
        used += took
        # the sequences queued behind the batch before the step began
        waiting = run.waiting + (bisect.bisect_left(queued, (start_s, True)) if queued else 0)
        dur_s = end_s - start_s
        steps.append(
            {
                "t_s": start_s,
                "dur_s": dur_s,
                "forward_s": dur_s,
                "prefill_tokens": 0,
                "prefill_chunks": [],
                "decode_seqs": n,
                "kv_blocks_used": used,
                "preemptions": 0,
                "prefix_hit_tokens": 0,
                "bytes_read": 0,
                "flops": 0,
                "running": n,
                "waiting": waiting,
                "kv_positions_read": context,
                "replica": name,
            }
        )
        start_s = end_s
    return steps


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off, and the objects alive at the start set aside (gc.freeze), until the end.
    A plan allocates millions of objects that live to its end (the prompts, every replica's KV blocks, the records,
    the tokenizer's ~660,000) and makes almost no cycles (~2 objects a request: router tree nodes): the collections
    found nothing and cost 13 of 138 CPU-s of a 100,000-request plan, mostly full ones walking all of them
    (benchmarks/planner_scale.py). As harness/client/runner.py does around a run: the caller's frozen objects stay
    frozen, and what was left for the collector is collected once it runs again."""
    frozen_by_caller, enabled = gc.get_freeze_count() > 0, gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        if not frozen_by_caller:
            gc.unfreeze()


@collector_paused()
def simulate_scenario(
    scenario: Scenario,
    out_dir: str | Path | None = None,
    reporter=None,
    overwrite: bool = False,
    step_model: StepModel | None = None,
    transfer: KVTransfer | None = None,
) -> Summary:
    """The summary (bench run's summary.json, `simulated: true`) of the scenario on its plan: deployment;
    with out_dir, the results folder too (run.json, requests.jsonl, summary.json). `step_model`: use this
    one instead of the plan's (benchmarks, tests); its request overhead is then 0. `transfer`: a disaggregated
    deployment's KV link instead of the plan's (disaggregation.py plan_transfer)."""
    deployment, step_model, overhead_s, transfer = _deployment_and_model(scenario, step_model, transfer)
    started_s = time.process_time()
    tokenizer = KeptEncodings(_tokenizer(scenario))  # the plan's encodings, kept for the engine's prompts
    schedule = build_schedule(scenario, tokenizer)
    token_ids = prompt_token_ids(schedule.requests, tokenizer)
    tokenizer.kept.clear()
    writer = ResultWriter(out_dir, overwrite) if out_dir is not None else None
    records: list[RequestRecord] = []

    def on_record(rec: RequestRecord) -> None:
        records.append(rec)
        if writer is not None:
            writer.append(rec)

    planned_s = time.process_time()
    keep_steps = len(schedule.requests) <= MAX_TRACED_REQUESTS
    host = host_share(scenario.plan, scenario.plan.step_model.fitted)
    fitted_range = _fit_range(scenario, step_model, deployment)
    sim = Simulation(
        deployment, step_model, overhead_s, keep_steps=keep_steps, host=host, fit_range=fitted_range, transfer=transfer
    )
    offline = scenario.load.process.paced_by == "offline"
    try:
        run_simulation(sim, schedule.requests, token_ids, scenario.load.concurrency, on_record, offline)
    finally:
        if writer is not None:
            writer.close()
    records.sort(key=lambda r: r.index)
    summary = _simulated_summary(scenario, records, schedule.token_count_method)
    summary.plan = PlanAccount(
        step_model=step_model.describe() | ({"fit_range": asdict(fitted_range)} if fitted_range else {}),
        request_overhead_s=overhead_s,
        deployment=_describe_deployment(deployment, transfer),
        host=sim.host.describe() if sim.host is not None else None,
        preemptions=sum(r.scheduler.num_preemptions for r in sim.replicas.values()),
        engine_steps=sim.engine_steps,
        fast_forwarded_steps=sim.fast_forwarded_steps,
        sequence_steps=sim.sequence_steps,
        cpu_s=CpuSeconds(plan=planned_s - started_s, simulation=time.process_time() - planned_s),
    )
    explain(summary, records, Path(out_dir or "."), sim.steps or [], scenario.resolved_dict())
    summary.diagnosis = [*plan_findings(sim, step_model, len(schedule.requests)), *(summary.diagnosis or [])]
    if writer is not None:
        _write_folder(writer, scenario, schedule.token_count_method, tokenizer.name, summary, sim.steps)
    return summary


def _fit_range(scenario: Scenario, step_model: StepModel, deployment: Deployment) -> FitRange | None:
    """The batches and contexts of the measured steps the plan's step model was fitted on: a fitted model's own,
    or those of the run a roofline's efficiencies were fitted to; None for a stated model."""
    fitted = getattr(step_model, "fit_range", None)
    if fitted is not None or isinstance(step_model, FittedStepModel):
        return fitted
    spec = scenario.plan.step_model
    run_dir = spec.roofline.fit if spec.kind == "roofline" and spec.roofline is not None else None
    return trace_fit_range(run_dir, deployment.kv_block_size) if run_dir else None


def plan_findings(sim: Simulation, step_model: StepModel, requests: int) -> list[Finding]:
    """What the plan itself must say beside the diagnosis: requests refused (by reason), a disaggregated
    deployment's split and KV transfer constants, and steps past the range the step model was fitted on
    (range_tally.py)."""
    findings = []
    if sim.refused:
        refused = sum(sim.refused.values())
        reasons = "; ".join(
            f"{count:,} {reason} (e.g. {sim.refused_example[reason]!r})" for reason, count in sim.refused.items()
        )
        hint = (
            " With load.arrival: offline the client holds the requests until the engine has room."
            if any(QUEUE_FULL in reason for reason in sim.refused)
            else ""
        )
        findings.append(
            Finding(
                rule="plan_refused",
                severity="warning",
                message=f"{refused:,} of {requests:,} requests refused by the simulated server: {reasons}.{hint}",
                evidence={"refused": refused, "requests": requests, "by_reason": dict(sim.refused)},
            )
        )
    if sim.disaggregate is not None:
        findings.append(
            Finding(
                rule="plan_disaggregation",
                severity="info",
                message=disaggregation_line(sim.disaggregate, sim.transfer),
                evidence=sim.transfer.describe(),
            )
        )
    if sim.range_tally is not None:
        how = _extrapolation(step_model)
        if (finding := sim.range_tally.finding(how)) is not None:
            findings.append(finding)
    return findings


def _extrapolation(step_model: StepModel) -> str:
    """How the plan's step model times a step past its fitted range, for the warning."""
    if not isinstance(step_model, FittedStepModel):
        return "follows the roofline with the efficiencies fitted on the run's steps"
    roofline = step_model.beyond_range
    if roofline is None:
        return "extrapolates along the fitted form (the fitted trace counts no FLOPs and bytes to shape it)"
    charged = [
        name for name, rate in (("FLOPs", roofline.seconds_per_flop), ("bytes", roofline.seconds_per_byte)) if rate
    ]
    return f"extrapolates by the roofline of the fitted steps' {' and '.join(charged)} (step_model.beyond_range)"


def _deployment_and_model(
    scenario: Scenario, step_model: StepModel | None, transfer: KVTransfer | None = None
) -> tuple[Deployment, StepModel, float, KVTransfer | None]:
    """The plan's deployment, its step model (the one given, else the plan's), the request overhead in s and, when
    disaggregated, the KV transfer (the one given, else the plan's)."""
    if scenario.workload.kind == "agentic":  # its turns are built from answers, its sub-agents run side by side
        raise ScenarioError(
            "workload.kind: agentic is not simulated by bench plan yet (tool-result turns and sub-agent fan-out); "
            "plan a multi_turn workload of the same turns and think times, or measure it with bench run"
        )
    if scenario.plan is None:
        raise ScenarioError(
            "plan: missing; bench plan needs a plan: block, e.g. plan: {step_model: "
            "{fitted: [results/run-a]}} (docs/planner.md)"
        )
    try:
        deployment = scenario_deployment(scenario, engine_choice(scenario))
        step_model, overhead_s = (step_model, 0.0) if step_model else _step_model(scenario, deployment)
        if deployment.disaggregate is not None and transfer is None:
            transfer = plan_transfer(scenario, step_model, deployment.kv_block_size)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    return deployment, step_model, overhead_s, transfer


def _simulated_summary(scenario: Scenario, records: list[RequestRecord], token_count_method: str) -> Summary:
    # windowed as `bench run` windows a measured run (load.trim), so prediction and measurement compare alike
    figures = summarize(records, scenario.slo.model_dump(), trim=scenario.load.trim is not False)
    return Summary.of_requests(figures, simulated=True, workers=0, token_count_method=token_count_method)


def _write_folder(writer: ResultWriter, scenario: Scenario, token_count_method, tokenizer_name, summary, steps):
    """run.json, summary.json and (when the steps were kept) engine_trace.json of a simulated run."""
    writer.write_run_info(
        RunInfo(
            scenario=scenario.resolved_dict(),
            versions=versions(),
            simulated=True,
            backend=Backend(kind=scenario.backend.kind, model=scenario.backend.model, simulated=True),
            token_count_method=token_count_method,
            tokenizer=tokenizer_name,
            time_unit="simulated seconds from t0",
        )
    )
    writer.write_summary(summary)
    if steps:  # the report's step timeline of the simulated engine(s)
        write_engine_trace(writer.dir / "engine_trace.json", steps[-MAX_WRITTEN_STEPS:])


def _describe_deployment(d: Deployment, transfer: KVTransfer | None = None) -> dict:
    """The simulated deployment in summary.json's plan.deployment: the scheduler's settings, the engine's profile
    with where each of its settings came from (the profile's default, a flag, a plan field), and a disaggregated
    deployment's split and KV transfer."""
    s = d.scheduler
    split = d.disaggregate
    return {
        "disaggregation": {"prefill": split.prefill, "decode": split.decode, "kv_transfer": transfer.describe()}
        if split is not None and transfer is not None
        else None,
        "engine_profile": d.engine.profile.kind if d.engine else "native",
        "engine": d.engine.describe() if d.engine else None,
        "replicas": d.replicas,
        "router_policy": d.router_policy if d.replicas > 1 else None,
        "num_kv_blocks": d.num_kv_blocks,
        "kv_block_size": d.kv_block_size,
        "prefix_cache": d.prefix_cache if d.enable_prefix_caching else None,
        "max_model_len": d.max_model_len,
        "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "enable_chunked_prefill": s.enable_chunked_prefill,
        "schedule_policy": s.schedule_policy,
        "prefill_apart": s.prefill_apart,  # SGLang's order: prefill chunks in steps of their own
        "reserve_max_tokens": s.reserve_max_tokens,  # TensorRT-LLM's GUARANTEED_NO_EVICT admission
    }
