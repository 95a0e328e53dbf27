"""The engine: one step = schedule, forward, sample, check stops, emit outputs.

`generate()` runs steps in the caller's thread (tests, benchmarks); engine_thread.py runs them in a
thread of their own for the asyncio server. Requests and aborts reach the engine through an inbox
(thread-safe) and are applied between steps, so the scheduler and block manager are only touched by
the thread that steps. Beside the loop: a disaggregated worker's KV handoff (kv_handoff.py), grammars
(guided.py), the step trace (step_trace.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from native_engine.block_manager import BlockManager
from native_engine.config import EngineConfig  # defined with the other settings; imported from here too
from native_engine.gguf_model import ModelConfig, ModelWeights, load_gguf
from native_engine.guided import GrammarError, GuidedDecoding
from native_engine.kv_handoff import PromptKVHandoff
from native_engine.kv_transfer import KVHandoff
from native_engine.metrics import EngineMetrics
from native_engine.model_files import resolve_model
from native_engine.model_runner import SeqChunk
from native_engine.request_output import Completion, RequestOutput
from native_engine.runtime import make_runner
from native_engine.sampler import mask_stop_tokens, sample_with_drafts
from native_engine.scheduler import QueueFullError, ScheduledChunk, Scheduler
from native_engine.sequence import SamplingParams, Sequence, SequenceStatus
from native_engine.spec_decode import NgramProposer
from native_engine.step_trace import StepRecord, StepTrace, step_flops
from native_engine.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """Weights and tokenizer, loadable once and shared (read-only) by several engines."""

    config: ModelConfig
    weights: ModelWeights
    tokenizer: Tokenizer

    @classmethod
    def load(cls, model: str) -> LoadedModel:
        path = resolve_model(model)
        config, weights = load_gguf(path)
        return cls(config, weights, Tokenizer.from_gguf(path))


def request_timings(seq: Sequence) -> dict:
    """Where a finished request's time went inside the engine, in ms, like llama.cpp's `timings`:
    queue (arrival to first schedule), prefill (first schedule to first token), decode (first to
    last token); a preempted request's re-prefill counts in decode, where the client waits for it.
    prompt_n counts the prompt tokens computed, cached ones excluded (cache_n), as llama.cpp's do."""
    ms = lambda a, b: round((b - a) * 1e3, 3) if a is not None and b is not None else None  # noqa: E731
    return {
        "queue_ms": ms(seq.arrival_s, seq.scheduled_s),
        "prefill_ms": ms(seq.scheduled_s, seq.first_token_s),
        "decode_ms": ms(seq.first_token_s, seq.last_token_s),
        "prompt_n": seq.num_prompt_tokens - seq.num_cached_tokens,
        "cache_n": seq.num_cached_tokens,
        "predicted_n": seq.num_output_tokens,
        "preemptions": seq.num_preemptions,
        **seq.kv_transfer,
    }


@dataclass
class StepBatch:
    """One step's scheduled chunks and what the forward pass and the sampler need of each, in batch order."""

    chunks: list[ScheduledChunk]
    seq_chunks: list[SeqChunk] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)  # each chunk's draft tokens (speculative decoding)
    sampling: list[bool] = field(default_factory=list)  # the chunk completes its prompt: its logits give a token
    is_decode: list[bool] = field(default_factory=list)
    flops: int = 0

    @property
    def sampled_seqs(self) -> list[Sequence]:
        return [c.seq for c, s in zip(self.chunks, self.sampling) if s]

    @property
    def sampled_drafts(self) -> list[list[int]]:
        return [d for d, s in zip(self.drafts, self.sampling) if s]


@dataclass
class StepTokens:
    prompt_tokens: int = 0  # prompts that got their first token this step
    generation_tokens: int = 0


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        self.config = config
        loaded = loaded or LoadedModel.load(config.model)
        self.model_config, weights, self.tokenizer = loaded.config, loaded.weights, loaded.tokenizer
        num_blocks = config.kv_cache_tokens // max(config.kv_block_size, 1)
        self.block_manager = BlockManager(
            num_blocks, config.kv_block_size, config.enable_prefix_caching, config.prefix_cache
        )
        self.runner = make_runner(
            self.model_config,
            weights,
            num_kv_blocks=num_blocks,
            kv_block_size=config.kv_block_size,
            runtime=config.runtime,
            dtype=config.dtype,
            threads=config.threads,
            device=config.device,
            cuda_graphs=config.cuda_graphs,
            few_rows_weights=config.speculative is not None,
        )
        self.scheduler = Scheduler(config.scheduler, self.block_manager)
        spec = config.speculative
        self.proposer = NgramProposer(spec) if spec else None
        self.metrics = EngineMetrics(
            config.served_model_name,
            spec.num_speculative_tokens if spec else 0,
            kv_transfer=config.kv_transfer_dir is not None,
        )
        self.guided = GuidedDecoding(self.tokenizer)
        self.kv_handoff = PromptKVHandoff(self.runner, self.scheduler, self.metrics)
        # A sequence must fit in the whole cache on its own, or preemption could never make room.
        self.max_model_len = min(self.model_config.context_length, num_blocks * config.kv_block_size)
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(self.model_config.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self._inbox: deque[tuple[str, object]] = deque()
        self._wakeup = threading.Event()  # set by each inbox item: a thread waiting for work goes on
        self.last_forward_s = 0.0
        self.step_trace = StepTrace() if config.step_trace else None
        c = self.model_config
        # weights counted by each runner from the matrices it holds (bytes would undercount int4/int8/bf16)
        self._flops_args = (self.runner.matmul_params, self.runner.lm_head_params, c.n_layers, c.n_heads * c.head_dim)

    # ---- requests -------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        export_kv_to: str | None = None,
        handoff: KVHandoff | None = None,
        handoff_timings: dict | None = None,
    ) -> None:
        """Thread-safe. Raises QueueFullError when max_waiting requests are already waiting, and
        ValueError for token ids outside the vocabulary (the server names the field first).

        Disaggregation: export_kv_to (a prefill worker's request) writes the prompt's KV there when the
        request finishes; handoff (a decode worker's) starts the request from a prefill worker's KV and
        first token, and its timings then report the prefill worker's phases (handoff_timings)."""
        vocab = self.model_config.vocab_size
        for name, ids in (("prompt", prompt_token_ids), ("stop_token_ids", params.stop_token_ids)):
            if any(not 0 <= t < vocab for t in ids):
                raise ValueError(f"{name}: token ids must lie in [0, {vocab})")
        if not prompt_token_ids:
            raise ValueError("prompt: must hold at least one token")
        if (export_kv_to or handoff) and self.config.kv_transfer_dir is None:
            raise ValueError(
                "kv_transfer_dir: a KV handoff needs the engine's transfer directory (serve --disaggregate)"
            )
        if len(self.scheduler.waiting) + len(self._inbox) >= self.config.scheduler.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.config.scheduler.max_waiting} requests)")
        seq = Sequence(request_id, list(prompt_token_ids), params)
        seq.export_kv_to, seq.handoff, seq.kv_transfer = export_kv_to, handoff, dict(handoff_timings or {})
        self._inbox.append(("add", seq))
        self._wakeup.set()

    def abort_request(self, request_id: str) -> None:
        """Thread-safe; frees the request's blocks before the next step."""
        self._inbox.append(("abort", request_id))
        self._wakeup.set()

    def reset_prefix_cache(self) -> None:
        """Thread-safe; empties the prefix cache of blocks no request holds, before the next step."""
        self._inbox.append(("reset_prefix_cache", None))
        self._wakeup.set()

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work()

    def wait_for_work(self, timeout_s: float) -> None:
        """Thread-safe; returns when something reaches the inbox (or wake() is called), or after timeout_s."""
        self._wakeup.wait(timeout=timeout_s)
        self._wakeup.clear()

    def wake(self) -> None:
        """Thread-safe; ends a wait_for_work at once (a thread stopping its loop)."""
        self._wakeup.set()

    def _drain_inbox(self) -> list[RequestOutput]:
        """Applies adds and aborts; returns the first outputs of handed-off requests (their first token) and
        those of requests refused here."""
        outputs = []
        while self._inbox:
            kind, item = self._inbox.popleft()
            if kind == "add":
                outputs += self._admit(item)
            elif kind == "reset_prefix_cache":
                self.block_manager.reset_prefix_cache()
            else:
                seq = self._seqs.pop(item, None)
                if seq is not None:
                    self.scheduler.finish(seq, "abort")
        return outputs

    def _admit(self, seq: Sequence) -> list[RequestOutput]:
        """A new request into the scheduler (or, handed off, straight to running): its outputs so far."""
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer)
        try:
            if seq.params.grammar is not None:
                self._start_grammar(seq)
            if seq.handoff is not None:
                self._seqs[seq.request_id] = seq
                return [self._admit_handoff(seq)]
            self.scheduler.add(seq)
        except (QueueFullError, GrammarError):  # queue refilled by preemptions; grammar checked by the server
            self._seqs.pop(seq.request_id, None)
            return [RequestOutput.aborted(seq)]
        self._seqs[seq.request_id] = seq
        return []

    # ---- one step: schedule, run, postprocess ---------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start_ns = time.perf_counter_ns()
        inbox_outputs = self._drain_inbox()  # handed-off requests' first tokens, refusals
        seen = (self.scheduler.num_preemptions, self.block_manager.prefix_cache_hits_tokens)
        if self.proposer:
            self._propose_drafts()
        chunks = self.scheduler.schedule()
        if not chunks:
            self._record_step()  # gauges still move after aborts
            return inbox_outputs
        batch = self._build_batch(chunks)
        logits = self._forward(batch)
        kv_positions_read = self.scheduler.postprocess(chunks)
        outputs, new_ids = self._sample(batch, logits)
        stats = self._emit_tokens(batch, new_ids, outputs)
        self._record_forward_step(batch, stats, kv_positions_read)
        if self.step_trace is not None:
            self._trace_step(batch, start_ns, seen, kv_positions_read)
        return inbox_outputs + outputs

    def _build_batch(self, chunks: list[ScheduledChunk]) -> StepBatch:
        """One pass over the scheduled chunks (it runs every step): each one's tokens, drafts, whether it samples."""
        batch = StepBatch(chunks)
        for c in chunks:
            seq, start = c.seq, c.seq.num_computed_tokens
            draft = seq.spec_token_ids[: c.num_draft_tokens] if seq.spec_token_ids else []
            known = seq.token_ids[start : start + c.num_new_tokens]
            batch.sampling.append(c.completes_prompt)
            batch.drafts.append(draft)
            batch.seq_chunks.append(
                SeqChunk(
                    token_ids=known + draft if draft else known,
                    start_pos=start,
                    block_table=seq.block_table,
                    need_logits=c.completes_prompt,
                    all_logits=bool(draft),
                )
            )
            batch.is_decode.append(c.num_new_tokens == 1 and seq.num_output_tokens > 0)
        batch.flops = step_flops(
            *self._flops_args, [(sc.start_pos, len(sc.token_ids)) for sc in batch.seq_chunks], len(batch.sampled_seqs)
        )
        return batch

    def _forward(self, batch: StepBatch):
        forward_start_s = time.perf_counter()
        logits = self.runner.forward(batch.seq_chunks)
        self.last_forward_s = time.perf_counter() - forward_start_s  # the rest of a step is engine overhead
        return logits

    def _sample(self, batch: StepBatch, logits) -> tuple[list[RequestOutput], list[list[int]]]:
        """The sampled rows' new tokens (a sequence with drafts: the accepted ones and one more), masked for
        stop tokens and grammars first; when that raises, the failed requests' outputs and no tokens."""
        seqs, drafts = batch.sampled_seqs, batch.sampled_drafts
        try:
            self._mask_logits(logits, seqs, drafts)
            new_ids = sample_with_drafts(logits, seqs, drafts)
            self.guided.accept(seqs, [ids[0] for ids in new_ids])
        except Exception as exc:
            return self._isolate_sampling_failure(exc, logits, batch), []
        return [], new_ids

    def _mask_logits(self, logits, seqs: list[Sequence], drafts: list[list[int]]) -> None:
        """A sequence with drafts owns 1 + len(draft) consecutive rows, the j-th after j more output tokens."""
        row_seqs = [seq for seq, d in zip(seqs, drafts) for _ in range(1 + len(d))]
        row_outputs = [seq.num_output_tokens + j for seq, d in zip(seqs, drafts) for j in range(1 + len(d))]
        mask_stop_tokens(logits, row_seqs, list(self.eos_token_ids), row_outputs)
        self.guided.mask_logits(logits, row_seqs)  # constrained sequences never have drafts

    def _emit_tokens(self, batch: StepBatch, new_ids: list[list[int]], outputs: list[RequestOutput]) -> StepTokens:
        """Each sampled sequence's new tokens, through stop checks, into outputs (appended); returns the
        step's prompt and generation token counts."""
        now = time.perf_counter()
        stats = StepTokens()
        for seq, draft, token_ids in zip(batch.sampled_seqs, batch.sampled_drafts, new_ids):
            if seq.first_token_s is None:
                seq.first_token_s = now
                stats.prompt_tokens += seq.num_prompt_tokens
                self.metrics.time_to_first_token.observe(now - seq.arrival_s)
            else:
                self.metrics.inter_token_latency.observe(now - seq.last_token_s)
            seq.last_token_s = now
            if draft:
                self.metrics.record_draft(len(draft), len(token_ids) - 1)
            try:
                out, num_tokens = self._emit_sequence(seq, draft, token_ids, now)
                stats.generation_tokens += num_tokens
                outputs.append(out)
            except Exception as exc:
                outputs.append(self._fail_sequence(seq, exc))
        return stats

    def _emit_sequence(self, seq: Sequence, draft: list[int], token_ids: list[int], now: float):
        """One sequence's tokens of this step as one output, and how many it emitted (a stop ends them early)."""
        outs = []
        for token_id in token_ids:
            seq.token_ids.append(token_id)
            outs.append(self._process_token(seq, token_id, now))
            if outs[-1].finished:
                break
        if draft and not outs[-1].finished:
            self.scheduler.accept_drafts(seq, len(token_ids) - 1)
        out = outs[0] if len(outs) == 1 else RequestOutput.merged(outs)
        if seq.grammar_matcher is not None:
            out = self._jump_forward(seq, out, now)
        return out, len(outs)

    def _record_forward_step(self, batch: StepBatch, stats: StepTokens, kv_positions_read: int) -> None:
        kv_bytes = kv_positions_read * self.runner.kv_bytes_per_token
        weight_bytes = max(self.runner.last_step_bytes_read - kv_bytes, 0)
        self._record_step(stats, weight_bytes=weight_bytes, kv_bytes=kv_bytes, flops=batch.flops)

    def _trace_step(self, batch: StepBatch, start_ns: int, seen: tuple[int, int], kv_positions_read: int) -> None:
        bm = self.block_manager
        step = StepRecord(
            start_ns=start_ns,
            end_ns=time.perf_counter_ns(),
            forward_ns=int(self.last_forward_s * 1e9),
            prefill_chunks=[c.num_new_tokens for c, d in zip(batch.chunks, batch.is_decode) if not d],
            decode_seqs=sum(batch.is_decode),
            kv_blocks_used=bm.num_blocks - bm.num_free_blocks,
            preemptions=self.scheduler.num_preemptions - seen[0],
            prefix_hit_tokens=bm.prefix_cache_hits_tokens - seen[1],
            bytes_read=self.runner.last_step_bytes_read,
            flops=batch.flops,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_positions_read=kv_positions_read,
            prefill_starts=[sc.start_pos for sc, d in zip(batch.seq_chunks, batch.is_decode) if not d],
        )
        self.step_trace.record(step)

    def _propose_drafts(self) -> None:
        """Drafts for the running sequences that decode next step (all others get none)."""
        for seq in self.scheduler.running:
            can_emit = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
            decoding = seq.num_tokens - seq.num_computed_tokens == 1
            drafting = decoding and can_emit > 1 and seq.grammar_matcher is None  # a grammar would have to mask drafts
            seq.spec_token_ids = self.proposer.propose(seq.token_ids, can_emit - 1) if drafting else []

    def _start_grammar(self, seq: Sequence) -> None:
        """The request's matcher; jump-forward appends what the grammar forces before the first
        sampled token, so it is prefilled with the prompt (at least one token is left to sample)."""
        seq.grammar_matcher = self.guided.matcher(seq.params.grammar)
        if self.config.enable_jump_forward:
            limit = min(seq.params.max_tokens, self.max_model_len - seq.num_tokens) - 1
            for token_id in self.guided.forced_tokens(seq, limit):
                seq.token_ids.append(token_id)
                seq.text += seq.detokenizer.feed(token_id)
                self.metrics.jump_forward_tokens.inc()

    def _jump_forward(self, seq: Sequence, out: RequestOutput, now: float) -> RequestOutput:
        """Append the tokens the grammar forces after this one; the next step computes their KV as
        one chunk. The first output also carries the tokens forced before the first sample."""
        if seq.first_token_s == now and seq.num_output_tokens > 1:
            out.new_token_ids = seq.token_ids[seq.num_prompt_tokens :]
        if out.finished or not self.config.enable_jump_forward:
            return out
        limit = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
        for token_id in self.guided.forced_tokens(seq, limit):
            seq.token_ids.append(token_id)
            self.metrics.jump_forward_tokens.inc()
            more = self._process_token(seq, token_id, now)
            more.new_token_ids, more.new_text = out.new_token_ids + more.new_token_ids, out.new_text + more.new_text
            out = more
            if out.finished:
                break
        return out

    # ---- disaggregation: a decode worker's request starts from a prefill worker's KV (kv_handoff.py) ----
    def _admit_handoff(self, seq: Sequence) -> RequestOutput:
        """The prompt's KV from the prefill worker goes into this cache, then the prefill worker's first token
        is processed here as if sampled here, so text, stop checks and finish are the colocated engine's."""
        handoff, seq.handoff = seq.handoff, None
        try:
            self.kv_handoff.admit(seq, handoff)
            return self._process_token(seq, handoff.first_token_id, seq.first_token_s)
        except QueueFullError:
            raise
        except Exception as exc:  # this request's handoff failed: only it ends
            self.kv_handoff.abandon(seq)
            return self._fail_sequence(seq, exc)

    # ---- failures: one request's fault ends only that request ---------------------------------
    def _fail_sequence(self, seq: Sequence, exc: Exception, traceback: bool = True) -> RequestOutput:
        log.error(
            "request %s finished with finish_reason 'error': %s: %s",
            seq.request_id,
            type(exc).__name__,
            exc,
            exc_info=exc if traceback else None,
        )
        if seq.status != SequenceStatus.FINISHED:
            self.scheduler.finish(seq, "error")
        self._seqs.pop(seq.request_id, None)
        return RequestOutput.failed(seq)

    def fail_all(self, exc: Exception) -> list[RequestOutput]:
        """A step failed outside any one request (forward pass, scheduler): every request ends with error."""
        log.error("engine step failed; finishing every request with finish_reason 'error'", exc_info=exc)
        outputs = [self._fail_sequence(seq, exc, traceback=False) for seq in list(self._seqs.values())]
        self._record_step()
        return outputs

    def _isolate_sampling_failure(self, exc: Exception, logits, batch: StepBatch) -> list[RequestOutput]:
        """The batched mask/sample raised. Fail the rows that raise alone (tried on copies, with
        their generators restored) and step the others back, so the next step recomputes their last
        chunk and samples again: sampling may have edited their logits in place. A sequence with
        drafts owns 1 + len(draft) consecutive rows."""
        outputs, sampled = [], [c for c, s in zip(batch.chunks, batch.sampling) if s]
        row = 0
        for c, draft in zip(sampled, batch.sampled_drafts):
            rows = slice(row, row + 1 + len(draft))
            row = rows.stop
            rng_state = c.seq.rng.bit_generator.state
            try:
                mask_stop_tokens(
                    logits[rows].copy(),
                    [c.seq] * (1 + len(draft)),
                    list(self.eos_token_ids),
                    [c.seq.num_output_tokens + j for j in range(1 + len(draft))],
                )
                sample_with_drafts(logits[rows].copy(), [c.seq], [draft])
            except Exception as row_exc:
                outputs.append(self._fail_sequence(c.seq, row_exc))
                continue
            c.seq.rng.bit_generator.state = rng_state
            self.scheduler.rewind(c, len(draft))
        if not outputs:  # no single row is at fault: the batch is, and each of its requests fails
            log.error("sampling failed for the whole batch", exc_info=exc)
            outputs = [self._fail_sequence(c.seq, exc, traceback=False) for c in sampled]
        return outputs

    def _record_step(
        self, tokens: StepTokens | None = None, *, weight_bytes: int = 0, kv_bytes: int = 0, flops: int = 0
    ) -> None:
        """The step's metrics; without tokens (no forward pass), only the gauges and running totals move."""
        bm, tokens = self.block_manager, tokens or StepTokens()
        self.metrics.record_step(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=bm.usage,
            queries_tokens=bm.prefix_cache_queries_tokens,
            hits_tokens=bm.prefix_cache_hits_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=tokens.prompt_tokens,
            generation_tokens=tokens.generation_tokens,
            weight_bytes=weight_bytes,
            kv_bytes=kv_bytes,
            flops=flops,
        )
        self.metrics.record_prefix_cache(
            self.scheduler.num_cached_prompt_tokens,
            bm.recomputed_prefill_tokens,
            bm.num_cached_blocks,
            bm.prefix_cache_evictions,
        )

    def _process_token(self, seq: Sequence, token_id: int, now: float) -> RequestOutput:
        p = seq.params
        finish_reason = stop_reason = None
        if token_id in p.stop_token_ids:
            finish_reason, stop_reason = "stop", token_id
        elif token_id in self.eos_token_ids and not p.ignore_eos:
            finish_reason = "stop"
        else:
            # Tokens that stop a request are not part of its text.
            old_len = len(seq.text)
            seq.text += seq.detokenizer.feed(token_id)
            hit = p.stop_strings.first_in(seq.text, old_len) if p.stop else None
            if hit is not None:
                cut, stop_reason = hit
                seq.text = seq.text[:cut]
                finish_reason = "stop"
        num_output_tokens = seq.num_output_tokens
        if finish_reason is None and (num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len):
            finish_reason = "length"
        finished = finish_reason is not None
        if finished and seq.export_kv_to is not None:
            self.kv_handoff.export(seq)
        if finished and not isinstance(stop_reason, str):  # a stop-string cut drops the rest anyway
            seq.text += seq.detokenizer.flush()
        # Hold back text that might be the start of a stop string until it is decided.
        hold = 0 if finished or not p.stop else p.longest_stop - 1
        release_to = max(seq.num_released_chars, len(seq.text) - hold)
        new_text = seq.text[seq.num_released_chars : release_to]
        seq.num_released_chars = release_to
        if finished:
            self.scheduler.finish(seq, finish_reason)
            seq.stop_reason = stop_reason
            self._seqs.pop(seq.request_id, None)
            self.metrics.record_finished(seq, now)
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=[token_id],
            new_text=new_text,
            finished=finished,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            timings=request_timings(seq) if finished else None,
        )

    # ---- synchronous use ------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """Run prompts to completion in this thread (tests, benchmarks); results in prompt order."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{time.perf_counter_ns()}-{i}" for i in range(len(prompts))]
        for request_id, prompt, p in zip(ids, prompts, params):
            self.add_request(request_id, prompt, p)
        results = {i: Completion() for i in ids}
        remaining = set(ids)
        while remaining:
            for out in self.step():
                r = results[out.request_id]
                r.token_ids += out.new_token_ids
                r.text += out.new_text
                if out.finished:
                    r.finish_reason, r.stop_reason, r.num_cached_tokens = (
                        out.finish_reason,
                        out.stop_reason,
                        out.num_cached_tokens,
                    )
                    remaining.discard(out.request_id)
        return [results[i] for i in ids]
