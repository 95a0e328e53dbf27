"""Which grammar library for constrained decoding: llguidance vs outlines-core on SmolLM2's vocabulary.

For each schema of scenarios/schemas/structured.jsonl (and one regex) both libraries walk the same
valid output, token by token (our tokenizer's tokens of it), and we time what an engine pays:
  - build: the library's view of the 49k-token vocabulary (once per engine);
  - compile: schema -> matcher (once per request);
  - mask: the allowed-token bitmask before each token (every step of every constrained request);
  - forced: how many tokens the library can hand over without sampling (jump-forward). llguidance
    has compute_ff_tokens(); outlines-core has no such call, so the count is the steps whose mask
    allows exactly one token.
It also checks schema coverage: a value outside minimum/maximum must be refused.

    pip install outlines-core   # only for this comparison; the engine uses llguidance
    python -m benchmarks.guided_libs [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import llguidance as llg
import llguidance.numpy as llg_np
import numpy as np
import outlines_core as oc

from native_engine.guided import JSON_SEPARATORS, llg_tokenizer
from native_engine.model_files import resolve_model
from native_engine.tokenizer import Tokenizer

SCHEMAS = Path(__file__).resolve().parents[1] / "scenarios" / "schemas" / "structured.jsonl"
EXAMPLES = {  # one valid output per schema, written as json.dumps writes it (", " and ": ")
    "person": {"name": "Ada Lovelace", "age": 36, "is_student": False},
    "review": {"summary": "Great noodles, slow service.", "grade": "B", "tags": ["noodles", "cozy"]},
    "weather": {"city": "Seoul", "unit": "celsius", "temperature": 21, "conditions": "cloudy"},
    "order": {
        "order_id": 1042,
        "items": [{"sku": "ABC-123", "quantity": 2}, {"sku": "XYZ-900", "quantity": 1}],
        "express": True,
    },
    "event": {
        "title": "Night at the Opera",
        "venue": {"city": "Vienna", "capacity": 1700},
        "price_usd": 85,
        "sold_out": False,
    },
}
OUT_OF_RANGE = ("person", '{"name": "Bob", "age": 500, "is_student": true}')  # age maximum is 120
REGEX = (r"\(\d{3}\) \d{3}-\d{4}", "(555) 010-4477")


def timed(fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


def walk_llguidance(lt, grammar: str, tokens: list[int], vocab: int, repeat: int) -> dict:
    compile_s, mask_s, forced = [], [], 0
    bitmask = llg_np.allocate_token_bitmask(1, vocab)
    for r in range(repeat):
        m, dt = timed(llg.LLMatcher, lt, grammar)
        compile_s.append(dt)
        assert not m.is_error(), m.get_error()
        for t in tokens:
            _, dt = timed(llg_np.fill_next_token_bitmask, m, bitmask)
            mask_s.append(dt)
            if r == 0 and m.compute_ff_tokens():
                forced += 1
            assert m.consume_token(t), (t, m.get_error())
    return {"compile_ms": 1e3 * float(np.median(compile_s)), "mask_us": mask_s, "forced_steps": forced}


def walk_outlines(vocabulary, regex: str, tokens: list[int], repeat: int) -> dict:
    index, dt = timed(oc.Index, regex, vocabulary)
    compile_s, mask_s, forced = [dt], [], 0
    mask = np.full((1, (vocabulary_size + 31) // 32), -1, dtype=np.int32)
    for r in range(repeat):
        guide = oc.Guide(index)
        for t in tokens:
            _, dt = timed(guide.write_mask_into, mask.ctypes.data, mask.size, mask.itemsize)
            mask_s.append(dt)
            if r == 0 and len(guide.get_tokens()) == 1:
                forced += 1
            guide.advance(t, return_tokens=False)
    return {"compile_ms": 1e3 * compile_s[0], "mask_us": mask_s, "forced_steps": forced}


def outlines_accepts(vocabulary, regex: str, tokens: list[int]) -> bool:
    guide = oc.Guide(oc.Index(regex, vocabulary))
    return guide.accepts_tokens(tokens)


def main() -> None:
    global vocabulary_size
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tok = Tokenizer.from_gguf(resolve_model("smollm2"))
    vocabulary_size = tok.vocab_size
    lt, build_llg_s = timed(llg_tokenizer, tok)
    by_bytes: dict[bytes, list[int]] = {}
    for i in range(tok.vocab_size):
        if i not in tok.special_token_ids:
            by_bytes.setdefault(tok.token_bytes(i), []).append(i)
    vocabulary, build_oc_s = timed(oc.Vocabulary, tok.eos_token_id, by_bytes)
    print(f"load: {os.getloadavg()[0]:.2f} (1-min) on {os.cpu_count()} cores; vocabulary {tok.vocab_size} tokens")
    print(f"vocabulary build: llguidance {build_llg_s * 1e3:.0f} ms, outlines-core {build_oc_s * 1e3:.0f} ms\n")

    cases = []
    for line in SCHEMAS.read_text().splitlines():
        row = json.loads(line)
        text = json.dumps(EXAMPLES[row["name"]])
        cases.append(
            (
                row["name"],
                text,
                llg.LLMatcher.grammar_from_json_schema(row["schema"], overrides=JSON_SEPARATORS),
                oc.json_schema.build_regex_from_schema(json.dumps(row["schema"])),
            )
        )
    cases.append(("regex", REGEX[1], llg.LLMatcher.grammar_from_regex(REGEX[0]), REGEX[0]))

    print(
        f"{'case':8} {'tokens':>6} | {'compile ms':>17} | {'mask us p50':>17} | {'mask us p99':>17} | "
        f"{'forced steps':>13}"
    )
    print(f"{'':8} {'':>6} | {'llg':>8} {'oc':>8} | {'llg':>8} {'oc':>8} | {'llg':>8} {'oc':>8} | {'llg':>6} {'oc':>6}")
    all_llg, all_oc = [], []
    for name, text, grammar, regex in cases:
        tokens = tok.encode(text)
        a = walk_llguidance(lt, grammar, tokens, tok.vocab_size, args.repeat)
        b = walk_outlines(vocabulary, regex, tokens, args.repeat)
        all_llg += a["mask_us"]
        all_oc += b["mask_us"]
        pa, pb = (np.percentile(np.array(x["mask_us"]) * 1e6, [50, 99]) for x in (a, b))
        print(
            f"{name:8} {len(tokens):6} | {a['compile_ms']:8.2f} {b['compile_ms']:8.1f} | {pa[0]:8.1f} {pb[0]:8.1f} | "
            f"{pa[1]:8.1f} {pb[1]:8.1f} | {a['forced_steps']:6} {b['forced_steps']:6}"
        )
    print(
        f"{'all':8} {'':6} | {'':17} | {np.median(all_llg) * 1e6:8.1f} {np.median(all_oc) * 1e6:8.1f} | "
        f"{np.percentile(all_llg, 99) * 1e6:8.1f} {np.percentile(all_oc, 99) * 1e6:8.1f} |"
    )
    print(
        f"mean mask cost per token: llguidance {np.mean(all_llg) * 1e6:.1f} us, "
        f"outlines-core {np.mean(all_oc) * 1e6:.1f} us"
    )

    name, text = OUT_OF_RANGE
    row = next(json.loads(x) for x in SCHEMAS.read_text().splitlines() if json.loads(x)["name"] == name)
    m = llg.LLMatcher(lt, llg.LLMatcher.grammar_from_json_schema(row["schema"], overrides=JSON_SEPARATORS))
    tokens = tok.encode(text)
    llg_accepts = m.try_consume_tokens(tokens) == len(tokens)
    oc_accepts = outlines_accepts(vocabulary, oc.json_schema.build_regex_from_schema(json.dumps(row["schema"])), tokens)
    print(
        f"\nschema coverage, {text} against {name} (age maximum 120): "
        f"llguidance accepts {llg_accepts}, "
        f"outlines-core accepts {oc_accepts}"
    )


if __name__ == "__main__":
    main()
