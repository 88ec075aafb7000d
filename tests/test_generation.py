"""Decoding utilities against numpy references, brute-force search and sampling statistics.

The "model" in these tests is a lookup table: the next-token logits are a fixed random
row chosen by the WHOLE prefix, read from a token-buffer cache `(B, S_max)`. Any mistake
in cache indexing or in the beam reordering of the cache changes the prefix the table
sees, so it changes the result.
"""

import itertools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_attn.generation import beam_search
from keras_attn.generation import generate
from keras_attn.generation import process_logits
from keras_attn.generation import sample_from_logits
from keras_attn.generation import scale_by_temperature
from keras_attn.generation import top_k_filter
from keras_attn.generation import top_p_filter

V = 4


class TableModel:
    """Logits = table[code(prefix)], the prefix read back from a token-buffer cache."""

    def __init__(self, vocab=V, max_length=6, seed=0, scale=2.0):
        self.vocab, self.max_length = vocab, max_length
        rng = np.random.default_rng(seed)
        # code(prefix) = sum_j (tok_j + 1) * (V + 1) ** j, unique over all prefixes.
        self.table = (rng.normal(size=((vocab + 1) ** max_length, vocab)) * scale).astype(
            "float32"
        )
        self.powers = np.array([(vocab + 1) ** j for j in range(max_length)], "int32")
        self.calls = []

    def empty_cache(self, batch):
        return {"tokens": ops.zeros((batch, self.max_length), "int32")}

    def __call__(self, token_ids, cache, index):
        self.calls.append(tuple(token_ids.shape))
        buffer = ops.slice_update(cache["tokens"], (0, index), ops.cast(token_ids, "int32"))
        length = index + ops.shape(token_ids)[1]
        filled = ops.arange(self.max_length, dtype="int32")[None, :] < length  # (1, S_max)
        code = ops.sum(ops.where(filled, (buffer + 1) * self.powers, 0), axis=-1)  # (B,)
        return ops.take(ops.convert_to_tensor(self.table), code, axis=0), {"tokens": buffer}

    def np_logits(self, prefix):
        code = sum((t + 1) * (self.vocab + 1) ** j for j, t in enumerate(prefix))
        return self.table[code].astype("float64")


def np_log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def np_softmax(z):
    e = np.exp(z - z[np.isfinite(z)].max())
    return e / e.sum()


# === Logit processors on explicit logits ===

LOGITS = np.array([[2.0, -1.0, 0.5, 3.0, 0.0, 1.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]], "float32")


def test_temperature_renormalizes_like_numpy():
    for t in (0.5, 1.0, 2.5):
        got = ops.convert_to_numpy(ops.softmax(scale_by_temperature(LOGITS, t)))
        want = np.stack([np_softmax(row / t) for row in LOGITS.astype("float64")])
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 3, 6, 10])
def test_top_k_keeps_the_k_largest_and_renormalizes(k):
    got = ops.convert_to_numpy(top_k_filter(LOGITS, k))
    for row, out in zip(LOGITS.astype("float64"), got):
        keep = np.zeros(row.shape, bool)
        keep[np.argsort(-row)[:k]] = True
        assert (np.isfinite(out) == keep).all()
        want = np.where(keep, np.exp(row), 0.0)
        np.testing.assert_allclose(np_softmax(out.astype("float64")), want / want.sum(),
                                   atol=1e-6)


def np_top_p_keep(row, p):
    """Smallest set of most likely tokens with mass >= p (written from the definition)."""
    probs = np_softmax(row)
    order = np.argsort(-probs)
    keep = np.zeros(row.shape, bool)
    mass = 0.0
    for i in order:
        keep[i] = True
        mass += probs[i]
        if mass >= p:
            break
    return keep


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8, 0.95, 1.0])
def test_top_p_keeps_the_nucleus_and_renormalizes(p):
    got = ops.convert_to_numpy(top_p_filter(LOGITS, p))
    for row, out in zip(LOGITS.astype("float64"), got):
        keep = np_top_p_keep(row, p)
        assert (np.isfinite(out) == keep).all(), (p, row, out)
        want = np.where(keep, np.exp(row), 0.0)
        np.testing.assert_allclose(np_softmax(out.astype("float64")), want / want.sum(),
                                   atol=1e-6)


def test_processors_compose_in_hf_order():
    # T first changes the probabilities top-p sees: with T=0.5 the top two tokens of row 0
    # already hold > 0.9 of the mass, at T=1 they do not.
    got = ops.convert_to_numpy(process_logits(LOGITS, temperature=0.5, top_k=4, top_p=0.9))
    for row, out in zip(LOGITS.astype("float64"), got):
        z = row / 0.5
        keep = np.zeros(row.shape, bool)
        keep[np.argsort(-z)[:4]] = True
        z = np.where(keep, z, -np.inf)
        keep = keep & np_top_p_keep(z, 0.9)
        assert (np.isfinite(out) == keep).all()
        np.testing.assert_allclose(out[keep], z[keep], rtol=1e-6)
    assert np.isfinite(got[0]).sum() == 2


def test_sample_from_logits_inverts_the_cdf():
    with np.errstate(divide="ignore"):
        logits = np.log(np.array([[0.2, 0.0, 0.3, 0.5]] * 5, "float32"))
    u = np.array([0.0, 0.19, 0.21, 0.49, 0.999999], "float32")
    got = ops.convert_to_numpy(sample_from_logits(logits, u))
    np.testing.assert_array_equal(got, [0, 0, 2, 2, 3])  # token 1 (p=0) never drawn


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampler="beam"), "sampler"),
        (dict(temperature=0.5), "no effect on greedy"),
        (dict(sampler="sample", temperature=0.0), "temperature"),
        (dict(sampler="sample", top_k=0), "top_k"),
        (dict(sampler="sample", top_p=1.5), "top_p"),
        (dict(stop_token_ids=(-1,)), "stop_token_ids"),
        (dict(pad_token_id=-2), "pad_token_id"),
    ],
)
def test_generate_argument_errors(kwargs, match):
    model = TableModel()
    with pytest.raises(ValueError, match=match):
        generate(model, np.zeros((1, 1), "int32"), model.empty_cache(1), 2, **kwargs)


def test_shape_errors():
    model = TableModel()
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, np.zeros((1, 1), "int32"), model.empty_cache(1), -1)
    with pytest.raises(ValueError, match="prompt.shape"):
        generate(model, np.zeros((3,), "int32"), model.empty_cache(1), 2)
    with pytest.raises(ValueError, match="prompt.dtype"):
        generate(model, np.zeros((1, 2), "float32"), model.empty_cache(1), 2)
    with pytest.raises(ValueError, match="num_beams"):
        beam_search(model, np.zeros((1, 1), "int32"), model.empty_cache(1), 2, num_beams=0)


# === Greedy ===


def np_greedy(model, prompt, steps, stop=(), pad=0):
    """Argmax loop recomputing the logits of the full prefix at every step."""
    out = []
    for row in prompt:
        seq, done = list(row), False
        for _ in range(steps):
            token = pad if done else int(np.argmax(model.np_logits(seq)))
            done = done or token in stop
            seq.append(token)
        out.append(seq)
    return np.array(out)


def test_greedy_equals_full_prefix_argmax_loop():
    model = TableModel(max_length=6)
    prompt = np.array([[1, 2], [3, 0], [0, 0]], "int32")
    got = ops.convert_to_numpy(generate(model, prompt, model.empty_cache(3), 4))
    np.testing.assert_array_equal(got, np_greedy(model, prompt, 4))
    if keras.backend.backend() == "tensorflow":
        # One prefill call with the whole prompt, then one (B, 1) call per further token.
        # (Counted eagerly; JAX's while_loop traces the body once instead.)
        assert model.calls == [(3, 2), (3, 1), (3, 1), (3, 1)]


def test_greedy_stop_tokens_and_pad():
    model = TableModel(max_length=6, seed=6)
    prompt = np.array([[1], [2], [3], [0]], "int32")
    free = np_greedy(model, prompt, 5)
    stop = (int(free[0, 2]),)  # row 0 stops at its second new token, row 3 at its first
    assert free[0, 1] != stop[0] and free[3, 1] == stop[0] and stop[0] not in free[2, 1:]
    want = np_greedy(model, prompt, 5, stop=stop, pad=7)
    got = ops.convert_to_numpy(
        generate(model, prompt, model.empty_cache(4), 5, stop_token_ids=stop, pad_token_id=7)
    )
    np.testing.assert_array_equal(got, want)
    assert got[0, 2] == stop[0] and (got[0, 3:] == 7).all() and (got[3, 2:] == 7).all()


def test_greedy_stops_calling_the_model_once_every_row_stopped():
    model = TableModel(max_length=6, seed=1)
    prompt = np.array([[1], [2], [3], [0]], "int32")
    got = ops.convert_to_numpy(
        generate(model, prompt, model.empty_cache(4), 5, stop_token_ids=(2,))
    )
    np.testing.assert_array_equal(got, np_greedy(model, prompt, 5, stop=(2,)))
    assert (got[:, 2] == 2).all() and (got[:, 3:] == 0).all()
    assert model.calls == [(4, 1), (4, 1)]  # prefill, then the step that chose token 2


def test_generate_with_zero_new_tokens_returns_the_prompt():
    model = TableModel()
    prompt = np.array([[1, 2]], "int32")
    np.testing.assert_array_equal(
        ops.convert_to_numpy(generate(model, prompt, model.empty_cache(1), 0)), prompt
    )
    assert model.calls == []


# === Beam search ===


def np_brute_force(model, prompt_row, steps, length_penalty, stop):
    """Best score over every possible continuation (ending at its first stop token)."""
    best = (-math.inf, None)
    seen = set()
    for continuation in itertools.product(range(model.vocab), repeat=steps):
        generated = []
        for token in continuation:
            generated.append(token)
            if token in stop:
                break
        if tuple(generated) in seen:
            continue
        seen.add(tuple(generated))
        prefix, total = list(prompt_row), 0.0
        for token in generated:
            total += np_log_softmax(model.np_logits(prefix))[token]
            prefix.append(token)
        score = total / len(generated) ** length_penalty
        if score > best[0]:
            best = (score, generated)
    return best


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -0.5])
@pytest.mark.parametrize("stop", [(), (2,)])
def test_exhaustive_beam_search_equals_brute_force(length_penalty, stop):
    model = TableModel(vocab=V, max_length=4, seed=11, scale=1.5)
    prompt = np.array([[1], [3], [0]], "int32")
    steps = 3
    sequences, scores = beam_search(
        model, prompt, model.empty_cache(3), steps, num_beams=V ** (steps - 1),
        length_penalty=length_penalty, stop_token_ids=stop, pad_token_id=0,
    )
    sequences, scores = ops.convert_to_numpy(sequences), ops.convert_to_numpy(scores)
    for b, row in enumerate(prompt):
        want_score, generated = np_brute_force(model, row, steps, length_penalty, stop)
        want = list(row) + generated + [0] * (steps - len(generated))
        np.testing.assert_array_equal(sequences[b], want)
        np.testing.assert_allclose(scores[b], want_score, rtol=1e-5)


def test_stop_token_and_length_penalty_change_the_winner():
    """The cases above are not vacuous: the stop token and the penalty matter."""
    model = TableModel(vocab=V, max_length=4, seed=11, scale=1.5)
    winners = {
        (lp, stop): tuple(np_brute_force(model, [1], 3, lp, stop)[1])
        for lp in (0.0, 2.0) for stop in ((), (2,))
    }
    assert len(set(winners.values())) > 1
    assert any(len(w) < 3 for w in winners.values())


def np_beam_search(model, prompt_row, steps, beams, length_penalty, stop):
    """Reference beam search over python lists (same definition, no early stop)."""
    live = [(0.0, list(prompt_row))]
    best = (-math.inf, None)
    for step in range(steps):
        candidates = []
        for total, seq in live:
            logp = np_log_softmax(model.np_logits(seq))
            for token in range(model.vocab):
                candidates.append((total + logp[token], seq + [token]))
        for total, seq in candidates:
            if seq[-1] in stop or step == steps - 1:
                score = total / (step + 1) ** length_penalty
                if score > best[0]:
                    best = (score, seq)
        live = sorted(
            [c for c in candidates if c[1][-1] not in stop], key=lambda c: -c[0]
        )[:beams]
    return best


@pytest.mark.parametrize("beams", [2, 3])
def test_narrow_beam_search_equals_reference(beams):
    model = TableModel(vocab=5, max_length=5, seed=5)
    prompt = np.array([[1], [4]], "int32")
    sequences, scores = beam_search(
        model, prompt, model.empty_cache(2), 4, num_beams=beams, length_penalty=1.0,
        stop_token_ids=(0,), pad_token_id=0,
    )
    for b, row in enumerate(prompt):
        want_score, seq = np_beam_search(model, row, 4, beams, 1.0, (0,))
        seq = seq + [0] * (5 - len(seq))
        np.testing.assert_array_equal(ops.convert_to_numpy(sequences)[b], seq)
        np.testing.assert_allclose(ops.convert_to_numpy(scores)[b], want_score, rtol=1e-5)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_with_one_beam_is_greedy(length_penalty):
    model = TableModel(max_length=6, seed=2)
    prompt = np.array([[1, 2], [3, 3]], "int32")
    sequences, _ = beam_search(model, prompt, model.empty_cache(2), 4, num_beams=1,
                               length_penalty=length_penalty)
    greedy = generate(model, prompt, model.empty_cache(2), 4)
    np.testing.assert_array_equal(ops.convert_to_numpy(sequences), ops.convert_to_numpy(greedy))


@pytest.mark.tensorflow  # counts eager calls; JAX's while_loop traces the body once
def test_beam_search_prefills_once_per_batch_item():
    model = TableModel(max_length=6)
    beam_search(model, np.array([[1, 2]], "int32"), model.empty_cache(1), 3, num_beams=3)
    assert model.calls == [(1, 2), (3, 1), (3, 1)]


# === Sampling ===


def test_sampling_is_deterministic_given_a_seed():
    model = TableModel(max_length=6, scale=0.5)
    prompt = np.zeros((16, 1), "int32")

    def run(seed):
        return ops.convert_to_numpy(
            generate(model, prompt, model.empty_cache(16), 5, sampler="sample", seed=seed)
        )

    np.testing.assert_array_equal(run(7), run(7))
    assert (run(7) != run(8)).any()


def draw_first_tokens(logits_row, n, **kwargs):
    """n independent one-token samples from a fixed distribution (one batch row each)."""
    table = ops.convert_to_tensor(np.tile(logits_row[None], (n, 1)).astype("float32"))

    def fixed(token_ids, cache, index):
        return table, cache

    tokens = generate(fixed, np.zeros((n, 1), "int32"), (), 1, sampler="sample", **kwargs)
    return ops.convert_to_numpy(tokens)[:, 1]


def test_top_k_sampling_statistics():
    row = np.array([1.0, 0.2, 2.0, -0.5, 1.5, 0.0])
    n = 20000
    tokens = draw_first_tokens(row, n, top_k=3, seed=1)
    allowed = np.argsort(-row)[:3]
    assert set(np.unique(tokens)) <= set(allowed.tolist())
    want = np.exp(row[allowed]) / np.exp(row[allowed]).sum()
    freq = np.array([(tokens == t).mean() for t in allowed])
    # 5 standard deviations of a binomial proportion.
    np.testing.assert_allclose(freq, want, atol=5 * np.sqrt(0.25 / n))


def test_top_p_sampling_statistics_and_temperature():
    row = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))
    n = 20000
    tokens = draw_first_tokens(row, n, top_p=0.8, temperature=1.0, seed=2)
    keep = np_top_p_keep(row, 0.8)  # {1, 3, 4}: 0.4 + 0.3 + 0.15 >= 0.8
    assert set(np.unique(tokens)) == set(np.flatnonzero(keep).tolist())
    want = np.where(keep, np.exp(row), 0) / np.exp(row[keep]).sum()
    freq = np.bincount(tokens, minlength=5) / n
    np.testing.assert_allclose(freq, want, atol=5 * np.sqrt(0.25 / n))
    hot = draw_first_tokens(row, n, temperature=2.0, seed=3)
    want = np_softmax(row / 2.0)
    np.testing.assert_allclose(np.bincount(hot, minlength=5) / n, want,
                               atol=5 * np.sqrt(0.25 / n))


# === Tracing ===


@pytest.mark.tensorflow
@pytest.mark.parametrize("jit_compile", [False, True])
def test_generate_and_beam_search_trace_under_tf_function(jit_compile):
    model = TableModel(max_length=6, seed=4)
    prompt = np.array([[1, 2], [0, 3]], "int32")
    stop = (1,)

    def run(prompt):
        greedy = generate(model, prompt, model.empty_cache(2), 4, stop_token_ids=stop)
        sampled = generate(model, prompt, model.empty_cache(2), 4, sampler="sample",
                           seed=5, top_k=3, top_p=0.9, temperature=0.7)
        beams, scores = beam_search(model, prompt, model.empty_cache(2), 4, num_beams=3,
                                    stop_token_ids=stop)
        return greedy, sampled, beams, scores

    eager = [ops.convert_to_numpy(x) for x in run(prompt)]
    traced_run = tf.function(run, jit_compile=jit_compile)
    traced = [ops.convert_to_numpy(x) for x in traced_run(tf.constant(prompt))]
    np.testing.assert_array_equal(traced[0], eager[0])
    np.testing.assert_array_equal(traced[2], eager[2])
    np.testing.assert_allclose(traced[3], eager[3], rtol=1e-6)
    if jit_compile:
        # XLA's stateless RNG kernel draws another (equally seeded) stream than TF's, so
        # compiled sampling is deterministic but not token-for-token equal to eager.
        again = ops.convert_to_numpy(traced_run(tf.constant(prompt))[1])
        np.testing.assert_array_equal(traced[1], again)
    else:
        np.testing.assert_array_equal(traced[1], eager[1])
