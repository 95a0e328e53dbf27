"""How far apart the same token's logits land when only the step's shape changes: one sequence decoding alone
against the same sequence decoding beside 1, 2 and 7 others (numpy runtime, fp32). This bounds the near ties
the tests allow (tests/helpers.py NEAR_TIE_LOGIT_GAP). Compare BLAS kernels by running it under each:

    python benchmarks/logit_noise.py
    OPENBLAS_CORETYPE=Haswell python benchmarks/logit_noise.py      # also Zen, SkylakeX
"""

import tempfile
from pathlib import Path

import numpy as np

from native_engine.llm_engine import LoadedModel
from native_engine.model_runner import ModelRunner, SeqChunk
from native_engine.tiny_gguf import write_tiny_llama_gguf

BLOCK_SIZE = 16


def decode_logits(loaded: LoadedModel, contexts: list[list[int]]) -> np.ndarray:
    """Prefill every context but its last token, then decode that token for all of them in one step."""
    per_seq = -(-len(contexts[0]) // BLOCK_SIZE)
    runner = ModelRunner(loaded.config, loaded.weights, num_kv_blocks=per_seq * len(contexts), kv_block_size=BLOCK_SIZE)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(contexts))]
    runner.forward([SeqChunk(ids[:-1], 0, t, True) for ids, t in zip(contexts, tables)])
    return runner.forward([SeqChunk(ids[-1:], len(ids) - 1, t, True) for ids, t in zip(contexts, tables)])


def largest_shape_difference(loaded: LoadedModel, context_tokens: int = 40) -> float:
    rng = np.random.default_rng(0)
    contexts = [rng.integers(0, loaded.config.vocab_size, context_tokens).tolist() for _ in range(8)]
    alone = decode_logits(loaded, contexts[:1])[0]
    return max(float(np.abs(decode_logits(loaded, contexts[:n])[0] - alone).max()) for n in (2, 3, 8))


def main() -> None:
    tiny_path = write_tiny_llama_gguf(Path(tempfile.mkdtemp()) / "tiny.gguf", seed=0, tokenizer="smollm2")
    for name, model in (("tiny", str(tiny_path)), ("smollm2", "smollm2")):
        print(
            f"{name}: largest |logit alone - logit batched| = {largest_shape_difference(LoadedModel.load(model)):.2e}"
        )


if __name__ == "__main__":
    main()
