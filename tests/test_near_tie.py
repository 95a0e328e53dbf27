"""tests/helpers.py's near-tie check: outputs may part only where the decision was a near tie between the two
tokens they chose, so a real divergence still fails."""

import helpers
import numpy as np
import pytest
from helpers import assert_same_tokens_up_to_near_tie

from native_engine.llm_engine import EngineConfig, LLMEngine
from native_engine.sequence import SamplingParams


@pytest.fixture(scope="module")
def reference(tiny):
    prompt = tiny.tokenizer.encode("a request that decodes alone")
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    hot = SamplingParams(max_tokens=8, temperature=8.0, seed=7, ignore_eos=True)
    engine = LLMEngine(EngineConfig(kv_cache_tokens=1024), tiny)
    greedy_out, hot_out = engine.generate([prompt, prompt], [greedy, hot])
    return prompt, (greedy, greedy_out.token_ids), (hot, hot_out.token_ids)


def ranked_after(tiny, ids: list[int]) -> np.ndarray:
    return np.argsort(-helpers._logits_after(tiny, ids))


def test_equal_outputs_pass_and_report_no_parting(tiny, reference):
    prompt, (greedy, tokens), (hot, hot_tokens) = reference
    assert assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, list(tokens), tokens) is None
    assert assert_same_tokens_up_to_near_tie(tiny, prompt, hot, list(hot_tokens), hot_tokens) is None


def test_greedy_parting_at_a_clear_decision_fails(tiny, reference, monkeypatch):
    prompt, (greedy, tokens), _ = reference
    ranked = ranked_after(tiny, prompt + tokens[:3])
    assert ranked[0] == tokens[3]
    runner_up = tokens[:3] + [int(ranked[1])] + tokens[4:]
    with pytest.raises(AssertionError, match="not a near tie"):  # the tiny model's logits are far apart
        assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, runner_up, tokens)
    # with any gap allowed, the runner-up passes (at position 3) but a third choice never does
    monkeypatch.setattr(helpers, "NEAR_TIE_LOGIT_GAP", np.inf)
    assert assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, runner_up, tokens) == 3
    third = tokens[:3] + [int(ranked[2])] + tokens[4:]
    with pytest.raises(AssertionError, match="best two are"):
        assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, third, tokens)


def test_sampled_parting_away_from_the_draws_edge_fails(tiny, reference, monkeypatch):
    prompt, _, (hot, tokens) = reference
    neighbour = tokens[:2] + [tokens[2] + 1] + tokens[3:]
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_same_tokens_up_to_near_tie(tiny, prompt, hot, neighbour, tokens)
    monkeypatch.setattr(helpers, "NEAR_TIE_CDF_SHARE", np.inf)  # any distance allowed: only the edge is checked
    far = tokens[:2] + [tokens[2] + 5] + tokens[3:]  # tokens between them hold mass: no shared edge
    with pytest.raises(AssertionError, match="not a near tie"):
        assert_same_tokens_up_to_near_tie(tiny, prompt, hot, far, tokens)


def test_a_shorter_output_is_not_a_near_tie(tiny, reference):
    prompt, (greedy, tokens), _ = reference
    with pytest.raises(AssertionError, match="prefix"):
        assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, tokens[:5], tokens)
