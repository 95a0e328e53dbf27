"""The engine stepping in a thread of its own, bridged to an asyncio loop: requests in, per-request streams out.

An asyncio server stays responsive while numpy works (BLAS releases the GIL) because the steps run in
this thread; each step's outputs go back to the loop in one `call_soon_threadsafe`, and the RequestStream
from `open_stream()` yields them per request. Requests and aborts reach the engine through its inbox
(LLMEngine.add_request, abort_request) and are applied between steps, so the scheduler and block manager
are only touched by this thread.
"""

from __future__ import annotations

import asyncio
import threading

from native_engine.llm_engine import LLMEngine
from native_engine.request_output import RequestOutput
from native_engine.scheduler import QueueFullError
from native_engine.sequence import SamplingParams

# The idle thread's longest sleep: a request, an abort or stop() wakes it at once, so this only bounds
# how long a missed wake-up could go unnoticed.
IDLE_WAIT_S = 0.5


class EngineThread:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._queues: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._running = True
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._running = False
        self.engine.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while self._running:
            if not self.engine.has_work():
                self.engine.wait_for_work(IDLE_WAIT_S)
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # outside any one request (forward pass, scheduler): all fail
                outputs = self.engine.fail_all(exc)
            if outputs:
                self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def open_stream(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, **handoff
    ) -> RequestStream:
        """Start a request whose outputs arrive on the event loop; raises QueueFullError at once.
        `handoff`: add_request's disaggregation arguments (export_kv_to, handoff, handoff_timings).

        Always close() the stream (try/finally): an unfinished one is aborted and its blocks freed.
        """
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            self.engine.add_request(request_id, prompt_token_ids, params, **handoff)
        except QueueFullError:
            self._queues.pop(request_id, None)
            raise
        return RequestStream(self, request_id, queue)

    def close_stream(self, request_id: str, abort: bool) -> None:
        self._queues.pop(request_id, None)
        if abort:
            self.engine.abort_request(request_id)


class RequestStream:
    """Async iterator over one request's outputs (on the event loop that started the engine thread)."""

    def __init__(self, engine_thread: EngineThread, request_id: str, queue: asyncio.Queue):
        self.engine_thread, self.request_id, self._queue = engine_thread, request_id, queue
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self._queue.get()
        self.finished = out.finished
        return out

    def close(self) -> None:
        abort = not self.finished
        self.finished = True
        self.engine_thread.close_stream(self.request_id, abort)
