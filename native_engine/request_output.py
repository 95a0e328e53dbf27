"""What a request gets back: a RequestOutput per step that gave it tokens (streamed), a Completion when run whole."""

from __future__ import annotations

from dataclasses import dataclass, field

from native_engine.sequence import Sequence


@dataclass(kw_only=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"; None while unfinished
    stop_reason: int | str | None  # the stop token id or stop string that finished it
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    timings: dict | None = None  # on the finished output: where the request's time went (llm_engine.request_timings)

    @classmethod
    def aborted(cls, seq: Sequence) -> RequestOutput:
        """The request was refused after it was taken (its queue refilled, its grammar failed): no tokens."""
        return cls._ended(seq, "abort", num_output_tokens=0, num_cached_tokens=0)

    @classmethod
    def failed(cls, seq: Sequence) -> RequestOutput:
        """The request ended with an error (its own, or its step's): no more tokens; usage counts what it had."""
        return cls._ended(
            seq, "error", num_output_tokens=seq.num_output_tokens, num_cached_tokens=seq.num_cached_tokens
        )

    @classmethod
    def _ended(
        cls, seq: Sequence, finish_reason: str, *, num_output_tokens: int, num_cached_tokens: int
    ) -> RequestOutput:
        return cls(
            request_id=seq.request_id,
            new_token_ids=[],
            new_text="",
            finished=True,
            finish_reason=finish_reason,
            stop_reason=None,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=num_output_tokens,
            num_cached_tokens=num_cached_tokens,
        )

    @classmethod
    def merged(cls, outs: list[RequestOutput]) -> RequestOutput:
        """Several tokens of one sequence from one step (accepted drafts) as one output, as vLLM streams them."""
        last = outs[-1]
        return cls(
            request_id=last.request_id,
            new_token_ids=[t for o in outs for t in o.new_token_ids],
            new_text="".join(o.new_text for o in outs),
            finished=last.finished,
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            num_prompt_tokens=last.num_prompt_tokens,
            num_output_tokens=last.num_output_tokens,
            num_cached_tokens=last.num_cached_tokens,
            timings=last.timings,
        )

    @classmethod
    def unfinished(cls) -> RequestOutput:
        """An output in the middle of a stream, of no request in particular (the server's event template)."""
        return cls(
            request_id="",
            new_token_ids=[],
            new_text="",
            finished=False,
            finish_reason=None,
            stop_reason=None,
            num_prompt_tokens=0,
            num_output_tokens=0,
            num_cached_tokens=0,
        )


@dataclass(kw_only=True)
class Completion:
    """A request run to its end in the caller's thread (LLMEngine.generate), its outputs joined."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
