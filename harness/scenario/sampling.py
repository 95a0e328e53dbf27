"""What every request asks the engine to sample with: `workload.sampling` (docs/quality.md).

Greedy (temperature 0) unless the scenario says otherwise, as vLLM's and SGLang's benchmark clients send:
then two runs on the same prompts can be compared answer for answer (harness/metrics/output_agreement.py). Before this
the harness sent no sampling field at all, so each engine sampled at its own default (1.0 for vLLM and the
native engine) and no two runs' answers could be compared.

Each backend puts the fields where its engine reads them (Backend.sampling_fields): top level for the
OpenAI-compatible servers, `sampling_params` for SGLang's /generate, `options` for Ollama, `repeat_penalty`
for llama.cpp; a field an engine does not read is refused when the scenario is loaded.
`seed`: request i is sent seed + i, so every request has its own reproducible draws and two runs of the same
scenario draw the same ones request for request (equal prompts in one run do not share their draws).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.results.schema import Sampling

MAX_SEED = 2**31 - 1  # engines keep request seeds in 32- or 64-bit integers; seed + index must fit both
GREEDY_NOTE = (
    "temperature 0 (greedy) unless workload.sampling sets it, as vLLM's and SGLang's benchmark clients send; "
    "the other fields are left to the engine's defaults unless set"
)


class SamplingConfig(BaseModel):
    """workload.sampling. None: the field is not sent (the engine's default applies)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    temperature: float = Field(default=0.0, ge=0, le=100, description="(0 is greedy)")
    top_p: float | None = Field(default=None, gt=0, le=1, description="(a share of the probability mass)")
    top_k: int | None = Field(default=None, ge=1, le=1_000_000, description="tokens")
    min_p: float | None = Field(default=None, ge=0, le=1, description="(relative to the best token)")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="(request i is sent seed + i)")
    repetition_penalty: float | None = Field(default=None, gt=0, le=2, description="(1 is none)")
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def fields(self) -> dict:
        """The fields sent, as a plain dict (the seed is the base: request_sampling adds each request's index)."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


def request_sampling(fields: dict, index: int) -> dict:
    """What request `index` is sent: the scenario's fields with its own seed."""
    if fields.get("seed") is None:
        return fields
    return {**fields, "seed": (fields["seed"] + index) % (MAX_SEED + 1)}


def sampling_info(sampling: SamplingConfig) -> Sampling:
    """run.json's `sampling`: the fields sent, whether the run was greedy, and where the default comes from."""
    return Sampling(fields=sampling.fields(), greedy=sampling.greedy, default=GREEDY_NOTE)
