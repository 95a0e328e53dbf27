"""Write tests/fixtures/reference_greedy.json: greedy continuations from an independent implementation.

The reference is Hugging Face transformers running the same SmolLM2 GGUF dequantized to fp32
(its own GGUF reader, tokenizer conversion, Llama code and RoPE). It needs torch, transformers
and accelerate, which the engine and its tests do not:

    python -m venv --system-site-packages /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0 transformers accelerate
    /tmp/refenv/bin/python benchmarks/make_reference.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from native_engine.model_files import resolve_model

PROMPTS = [
    {"kind": "text", "text": "The capital of France is"},
    {"kind": "text", "text": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'},
    {"kind": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"kind": "chat", "messages": [{"role": "user", "content": "Write a short poem about the ocean."}]},
    {
        "kind": "text",
        "text": (
            "Large language model serving engines batch many requests together. The key ideas are "
            "continuous batching, which admits new requests at every step, and paged attention, which "
            "stores the key-value cache in fixed-size blocks so that memory is not wasted. Prefix caching "
            "lets requests that share a system prompt reuse the same blocks. In summary,"
        ),
    },
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/reference_greedy.json")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    gguf_path = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as folder:
        # from_pretrained wants a folder and a file name inside it
        shutil.copy(gguf_path, Path(folder) / gguf_path.name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_path.name, dtype=torch.float32)
    model.eval()

    cases = []
    for prompt in PROMPTS:
        if prompt["kind"] == "chat":
            text = tokenizer.apply_chat_template(prompt["messages"], tokenize=False, add_generation_prompt=True)
        else:
            text = prompt["text"]
        prompt_ids = tokenizer(text, add_special_tokens=False).input_ids
        ids, margins = greedy(model, prompt_ids, args.new_tokens)
        cases.append(
            {
                **prompt,
                "prompt_text": text,
                "prompt_ids": prompt_ids,
                "greedy_ids": ids,
                "top2_logit_margins": margins,
                "greedy_text": tokenizer.decode(ids),
            }
        )
        print(f"{text[-40:]!r} -> {tokenizer.decode(ids)!r}")

    fixture = {
        "tool": "transformers (AutoModelForCausalLM.from_pretrained with gguf_file, dtype float32, CPU)",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "model_file": gguf_path.name,
        "model_sha256": hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
        "new_tokens": args.new_tokens,
        "decoding": "greedy argmax, no stop tokens",
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


def greedy(model, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """Argmax decoding with the model's KV cache; margins = top-1 minus top-2 logit per step."""
    import torch

    ids, margins, past = [], [], None
    step_input = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(new_tokens):
            out = model(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            top2 = torch.topk(out.logits[0, -1], 2)
            ids.append(int(top2.indices[0]))
            margins.append(round(float(top2.values[0] - top2.values[1]), 5))
            step_input = torch.tensor([[ids[-1]]])
    return ids, margins


if __name__ == "__main__":
    main()
