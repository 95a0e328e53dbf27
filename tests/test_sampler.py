"""Sampler: greedy, temperature, top_k, top_p, min_p, seeds, min_tokens masking."""

import numpy as np
import pytest

from native_engine.sampler import mask_stop_tokens, sample
from native_engine.sequence import SamplingParams, Sequence


def seq(**params):
    return Sequence("r", [1, 2, 3], SamplingParams(max_tokens=64, **params))


def logits_rows(n_rows, vocab=1000, seed=0):
    return np.random.default_rng(seed).standard_normal((n_rows, vocab)).astype(np.float32) * 3


def frequencies(logits_row, params, n_draws=4000):
    seqs = [seq(seed=None, **params) for _ in range(n_draws)]
    ids = sample(np.repeat(logits_row[None], n_draws, axis=0), seqs)
    return np.bincount(ids, minlength=logits_row.shape[0]) / n_draws


def test_greedy_rows_take_the_argmax_next_to_sampled_rows():
    logits = logits_rows(4)
    seqs = [seq(temperature=0.0), seq(temperature=1.0, seed=1), seq(temperature=0.0), seq(temperature=0.7, seed=2)]
    ids = sample(logits.copy(), seqs)
    assert ids[0] == logits[0].argmax() and ids[2] == logits[2].argmax()


def test_temperature_one_matches_softmax_frequencies():
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    freq = frequencies(row, dict(temperature=1.0))
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_top_k_keeps_only_the_k_best():
    row = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float32))
    freq = frequencies(row, dict(temperature=1.0, top_k=2))
    assert freq[2] == 0 and freq[3] == 0
    np.testing.assert_allclose(freq[:2], [4 / 7, 3 / 7], atol=0.04)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    freq = frequencies(row, dict(temperature=1.0, top_p=0.75))  # 0.5 + 0.3 reaches 0.75
    assert freq[2] == 0 and freq[3] == 0 and freq[1] > 0.25


def test_top_p_wider_than_the_candidate_set_is_still_exact():
    # A flat distribution over 2000 tokens: a 0.9 nucleus holds 1800 tokens, beyond 256 candidates.
    row = np.zeros(2000, dtype=np.float32)
    freq = frequencies(row, dict(temperature=1.0, top_p=0.9), n_draws=4000)
    assert (freq > 0).sum() > 1000


def test_min_p_drops_tokens_below_fraction_of_the_best():
    row = np.log(np.array([0.6, 0.3, 0.07, 0.03], dtype=np.float32))
    freq = frequencies(row, dict(temperature=1.0, min_p=0.2))  # cut below 0.12
    assert freq[2] == 0 and freq[3] == 0 and freq[1] > 0.2


def test_seeded_request_repeats_whatever_its_batch():
    logits = logits_rows(8, seed=3)
    alone = [sample(logits[:1].copy(), [seq(temperature=1.0, seed=42)])[0] for _ in range(3)]
    batch_seqs = [seq(temperature=1.0, seed=42)] + [seq(temperature=0.9, seed=i) for i in range(7)]
    in_batch = sample(logits.copy(), batch_seqs)[0]
    assert alone == [in_batch] * 3
    # Different seeds do differ (on a near-flat row, 8 seeds all landing on one token is ~impossible).
    flat = np.zeros((1, 1000), dtype=np.float32)
    assert len({sample(flat.copy(), [seq(temperature=1.0, seed=i)])[0] for i in range(8)}) > 1


def test_low_temperature_approaches_greedy():
    logits = logits_rows(16, seed=4)
    ids = sample(logits.copy(), [seq(temperature=1e-4, seed=i) for i in range(16)])
    np.testing.assert_array_equal(ids, logits.argmax(axis=1))


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = np.zeros((2, 10), dtype=np.float32)
    logits[:, 9] = 50.0  # EOS would win
    logits[:, 5] = 40.0  # a stop token next
    young = seq(temperature=0.0, min_tokens=2, stop_token_ids=[5])
    old = seq(temperature=0.0, min_tokens=2, stop_token_ids=[5])
    old.token_ids += [1, 1]
    mask_stop_tokens(logits, [young, old], eos_token_ids=[9])
    ids = sample(logits, [young, old])
    assert ids[0] not in (5, 9) and ids[1] == 9


@pytest.mark.parametrize(
    "field,value", [("temperature", -1.0), ("top_p", 0.0), ("min_p", 1.5), ("top_k", -2), ("max_tokens", 0)]
)
def test_bad_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_draw_spans_vocabulary_blocks_with_right_frequencies():
    row = np.full(2000, -np.inf, dtype=np.float32)
    picks = [3, 700, 1500, 1999]  # in different 512-token blocks, one at the very end
    row[picks] = np.log([0.1, 0.2, 0.3, 0.4])
    freq = frequencies(row, dict(temperature=1.0))
    np.testing.assert_allclose(freq[picks], [0.1, 0.2, 0.3, 0.4], atol=0.03)
    assert freq.sum() == pytest.approx(1.0)
