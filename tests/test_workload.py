"""Plans: determinism, exact prompt lengths with the real SmolLM2 tokenizer, each workload kind,
and token counting through a real /tokenize server on 127.0.0.1."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import ApproximateTokenizer, LocalTokenizer, ServerTokenizer, resolve_tokenizer
from harness.scenario.workload import build_schedule


@pytest.fixture(scope="module")
def smollm2():
    return LocalTokenizer("smollm2")


def scenario(
    workload: dict,
    load: dict | None = None,
    seed: int = 0,
    api: str = "completions",
    url: str = "http://127.0.0.1:9",
    model: str = "smollm2",
) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": url, "api": api, "model": model},
            "workload": workload,
            "seed": seed,
            "load": load or {"arrival": "poisson", "rate": 4.0, "num_requests": 12, "warmup_requests": 2},
        }
    )


def fingerprint(plan):
    return [
        (r.prompt, r.prompt_tokens, r.output_tokens, r.intended_offset_s, r.session_id, r.think_time_s)
        for r in plan.requests
    ]


RANDOM = {
    "kind": "random",
    "input_tokens": {"dist": "lognormal", "mean": 60, "std": 30, "min": 5, "max": 200},
    "output_tokens": {"dist": "uniform", "min": 4, "max": 40},
}


def test_same_seed_same_plan_other_seed_other_plan(smollm2):
    first = build_schedule(scenario(RANDOM, seed=5), smollm2)
    assert fingerprint(first) == fingerprint(build_schedule(scenario(RANDOM, seed=5), smollm2))
    other = build_schedule(scenario(RANDOM, seed=6), smollm2)
    assert all(a.prompt != b.prompt for a, b in zip(first.requests, other.requests))
    assert [r.intended_offset_s for r in first.requests][1:] != [r.intended_offset_s for r in other.requests][1:]


def test_random_prompts_hit_the_drawn_length_exactly_with_smollm2(smollm2):
    plan = build_schedule(scenario({**RANDOM, "input_tokens": 64}), smollm2)
    assert plan.token_count_method == "local_tokenizer"
    assert all(r.prompt_tokens == 64 == len(smollm2.encode(r.prompt)) for r in plan.requests)
    varied = build_schedule(scenario(RANDOM), smollm2)
    counts = [r.prompt_tokens for r in varied.requests]
    assert all(counts[i] == len(smollm2.encode(r.prompt)) for i, r in enumerate(varied.requests))
    assert min(counts) >= 5 and max(counts) <= 200 and len(set(counts)) > 6
    assert all(4 <= r.output_tokens <= 40 for r in varied.requests)


def test_prompts_use_no_control_tokens(smollm2):
    plan = build_schedule(scenario({"kind": "random", "input_tokens": 300, "output_tokens": 4}), smollm2)
    ids = {i for r in plan.requests for i in smollm2.encode(r.prompt)}
    assert not ids & smollm2.tokenizer.special_token_ids


def test_shared_prefix_groups_share_their_first_tokens_exactly(smollm2):
    workload = {"kind": "shared_prefix", "num_groups": 3, "prefix_tokens": 40, "input_tokens": 10, "output_tokens": 4}
    plan = build_schedule(scenario(workload), smollm2)
    encoded = [smollm2.encode(r.prompt) for r in plan.requests]
    assert all(len(ids) == r.prompt_tokens == 50 for ids, r in zip(encoded, plan.requests))
    for i, ids in enumerate(encoded):  # round robin: request i belongs to group i % 3
        assert ids[:40] == encoded[i % 3][:40]
        assert ids[40:] != encoded[i % 3][40:] or i < 3
    assert len({tuple(ids[:40]) for ids in encoded[:3]}) == 3  # three different group prefixes


def test_multi_turn_sessions(smollm2):
    workload = {
        "kind": "multi_turn",
        "turns": 3,
        "input_tokens": 12,
        "output_tokens": 6,
        "think_time_s": {"dist": "uniform", "min": 0.5, "max": 2.0},
    }
    load = {"arrival": "poisson", "rate": 1.0, "num_requests": 10, "warmup_requests": 2}
    plan = build_schedule(scenario(workload, load, api="chat"), smollm2)
    warmups = [r for r in plan.requests if r.is_warmup]
    measured = [r for r in plan.requests if not r.is_warmup]
    assert len(warmups) == 3 and {r.session_id for r in warmups} == {0}  # 2 warm-ups round up to a session
    assert len(measured) == 10 and [r.turn_index for r in measured] == [0, 1, 2] * 3 + [0]
    for r in plan.requests:
        assert (r.intended_offset_s is None) == (r.turn_index > 0)
        assert (0.5 <= r.think_time_s <= 2.0) if r.turn_index > 0 else r.think_time_s == 0.0
        assert r.prompt_tokens == 12 and r.messages is None
    starts = [r.intended_offset_s for r in plan.requests if r.turn_index == 0]
    assert starts == sorted(starts) and len(set(r.session_id for r in plan.requests)) == 5


def test_jsonl_file_rows_cycle_and_keep_their_lengths(tmp_path, smollm2):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "Explain KV caching.", "output_tokens": 20}\n\n{"prompt": "Hi"}\n')
    plan = build_schedule(scenario({"kind": "file", "path": str(rows), "output_tokens": 7}), smollm2)
    assert [r.prompt for r in plan.requests[:4]] == ["Explain KV caching.", "Hi"] * 2
    assert [r.output_tokens for r in plan.requests[:2]] == [20, 7]
    assert plan.requests[0].prompt_tokens == len(smollm2.encode("Explain KV caching."))


def test_chat_message_rows_need_the_chat_api(tmp_path, smollm2):
    rows = tmp_path / "chat.jsonl"
    rows.write_text(
        json.dumps(
            {"messages": [{"role": "system", "content": "Be short."}, {"role": "user", "content": "What is a token?"}]}
        )
        + "\n"
    )
    with pytest.raises(ScenarioError, match="messages rows; they need a backend.api that sends messages: chat, resp"):
        build_schedule(scenario({"kind": "file", "path": str(rows)}), smollm2)
    # the APIs that carry a conversation take the same rows: Anthropic's puts the system turn in its own field
    for api in ("responses", "anthropic_messages"):
        plan = build_schedule(scenario({"kind": "file", "path": str(rows)}, api=api), smollm2)
        assert plan.requests[0].messages[0] == {"role": "system", "content": "Be short."}
    plan = build_schedule(scenario({"kind": "file", "path": str(rows)}, api="chat"), smollm2)
    assert plan.requests[0].messages[1]["content"] == "What is a token?" and plan.requests[0].prompt is None
    assert plan.requests[0].prompt_tokens == len(smollm2.encode("Be short.")) + len(smollm2.encode("What is a token?"))


@pytest.mark.parametrize(
    "line, expected",
    [
        ('{"prompt": "ok"}\n{"prompt": 3}\n', 'line 2: needs "prompt": a string'),
        ('{"prompt": "ok"}\n{"prompt": "a", "output_tokens": -1}\n', "line 2 field 'output_tokens': -1 is not valid"),
        ('{"prompt": "ok"\n', "line 1 column 16: not valid JSON"),
    ],
)
def test_bad_jsonl_rows_name_file_and_line(tmp_path, line, expected):
    rows = tmp_path / "bad.jsonl"
    rows.write_text(line)
    with pytest.raises(ScenarioError) as caught:
        build_schedule(scenario({"kind": "file", "path": str(rows)}), ApproximateTokenizer())
    assert str(rows) in str(caught.value) and expected in str(caught.value)


def test_sharegpt_takes_first_human_turn_and_answer_length_and_counts_skips(tmp_path, smollm2):
    answer = "A token is a piece of text that the model reads as one unit."
    entries = [
        {
            "conversations": [
                {"from": "system", "value": "x"},
                {"from": "human", "value": "What is a token?"},
                {"from": "gpt", "value": answer},
            ]
        },
        {"conversations": [{"from": "human", "value": "no answer"}]},
        {"id": "no conversations"},
        "not even an object",
    ]
    path = tmp_path / "share.json"
    path.write_text(json.dumps(entries))
    plan = build_schedule(scenario({"kind": "file", "path": str(path)}), smollm2)
    assert {r.prompt for r in plan.requests} == {"What is a token?"}
    assert plan.requests[0].output_tokens == len(smollm2.encode(answer))
    assert plan.warnings == [f"workload.path: skipped 3 malformed entries of {path}"]


class TokenizeServer:
    """A real HTTP server speaking vLLM's /tokenize and /detokenize, backed by SmolLM2 plus a BOS id."""

    BOS = 1

    def __init__(self, tokenizer):
        self.calls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.calls += 1
                if self.path == "/tokenize":
                    tokens = [owner.BOS] + tokenizer.encode(body["prompt"])
                    reply = {"tokens": tokens, "count": len(tokens), "max_model_len": 8192}
                elif self.path == "/detokenize":
                    reply = {"prompt": tokenizer.decode([t for t in body["tokens"] if t != owner.BOS])}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_server_tokenize_is_preferred_and_counts_its_bos_with_bounded_calls(smollm2):
    with TokenizeServer(smollm2.tokenizer) as server:
        source = resolve_tokenizer(scenario(RANDOM, url=server.url))
        assert isinstance(source, ServerTokenizer) and source.added_tokens == 1
        plan = build_schedule(scenario({**RANDOM, "input_tokens": 48}, url=server.url), source)
        assert plan.token_count_method == "server_tokenize"
        assert all(r.prompt_tokens == 48 and len(smollm2.encode(r.prompt)) == 47 for r in plan.requests)
        # probe + empty text + one call for all the words + one per prompt; no detokenize round trips
        assert server.calls <= 3 + len(plan.requests)


def test_without_a_server_smollm2_uses_the_local_tokenizer_and_others_approximate():
    closed_port_url = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback
    assert resolve_tokenizer(scenario(RANDOM, url=closed_port_url)).method == "local_tokenizer"
    approximate = resolve_tokenizer(scenario(RANDOM, url=closed_port_url, model="meta-llama/Llama-3-8B"))
    assert approximate.method == "approximate"
    plan = build_schedule(scenario({**RANDOM, "input_tokens": 30}, model="x"), approximate)
    assert all(r.prompt_tokens == 30 == len(r.prompt.split()) for r in plan.requests)


class _CountingTokenizer(LocalTokenizer):
    """SmolLM2's tokenizer, counting the texts it really encodes."""

    def __init__(self):
        super().__init__("smollm2")
        self.encoded = 0

    def _encode(self, text):
        self.encoded += 1
        return super()._encode(text)


class _TrailingEosWords(ApproximateTokenizer):
    """A word per token and an end-of-text id after every encoding: joined words do not re-encode to themselves
    followed by nothing, so prompts must be encoded to be counted."""

    def _encode(self, text):
        return [hash(w) % 10_000 + 1 for w in text.split()] + [0]


def test_a_prompt_of_word_tokens_is_counted_without_encoding_it():
    import numpy as np

    from harness.scenario.prompts import PromptBuilder

    tokenizer = _CountingTokenizer()
    builder = PromptBuilder(tokenizer)
    after_discovery = tokenizer.encoded
    text, count = builder.random_text(np.random.default_rng(0), 300, prefix_ids=builder.word_ids[:5])
    assert tokenizer.encoded == after_discovery  # known, not asked
    assert count == 300 and LocalTokenizer("smollm2").encode(text) == tokenizer.encode(text)  # and exact
    assert tokenizer.encoded == after_discovery  # the ids were remembered with the text

    other = _TrailingEosWords()
    text, count = PromptBuilder(other).random_text(np.random.default_rng(0), 50)
    assert count == len(other.encode(text)) == 50  # counted by encoding: the fallback
