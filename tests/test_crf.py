import itertools
import os
import tempfile

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.crf import CRF
from keras_attn.layers.crf import viterbi_decode
from tests.layer_test_case import run_layer_test

K = 3
T = 5
# One row per case: full, length 1, lengths 2-4, left padding, a hole, no real token.
MASK = np.array(
    [
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [1, 1, 0, 1, 1],
        [0, 0, 0, 0, 0],
    ],
    bool,
)
B = len(MASK)
RNG = np.random.default_rng(0)
EMISSIONS = RNG.normal(size=(B, T, K)).astype("float32")
TAGS = RNG.integers(0, K, size=(B, T)).astype("int32")
WEIGHTS = [  # transitions (K, K), start (K,), end (K,): the order of `layer.weights`
    RNG.normal(size=(K, K)).astype("float32"),
    RNG.normal(size=(K,)).astype("float32"),
    RNG.normal(size=(K,)).astype("float32"),
]
BACKEND = keras.backend.backend()
tensorflow_only = pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow export")


def make_crf(unroll=False, **kwargs):
    crf = CRF(K, unroll=unroll, **kwargs)
    crf.build((None, T, K))
    crf.set_weights(WEIGHTS)
    return crf


# --- Brute force over all K^n paths of the n real tokens, in float64 ---


def path_score(emissions, weights, tags, real):
    """s(y) = start[y_1] + sum_i E[t_i, y_i] + sum_{i>1} A[y_{i-1}, y_i] + end[y_n]."""
    transitions, start, end = (w.astype("float64") for w in weights)
    positions = np.flatnonzero(real)
    y = [tags[p] for p in positions]
    score = start[y[0]] + end[y[-1]]
    score += sum(emissions[p, y_p] for p, y_p in zip(positions, y))
    score += sum(transitions[a, b] for a, b in zip(y[:-1], y[1:]))
    return score


def all_paths(emissions, weights, real):
    """(paths (K^n, T) with 0 at masked positions, their scores (K^n,))."""
    positions = np.flatnonzero(real)
    paths, scores = [], []
    for choice in itertools.product(range(K), repeat=len(positions)):
        path = np.zeros(len(real), "int64")
        path[positions] = choice
        paths.append(path)
        scores.append(path_score(emissions, weights, path, real))
    return np.array(paths), np.array(scores)


def brute_force_viterbi(emissions, weights, mask):
    best = np.zeros(mask.shape, "int64")
    for b in range(len(mask)):
        if mask[b].any():
            paths, scores = all_paths(emissions[b], weights, mask[b])
            best[b] = paths[np.argmax(scores)]
    return best


def brute_force_log_likelihood(emissions, weights, tags, mask):
    """score(gold) - logsumexp over all paths; 0 for an empty sequence."""
    out = np.zeros(len(mask))
    for b in range(len(mask)):
        if mask[b].any():
            _, scores = all_paths(emissions[b], weights, mask[b])
            log_z = scores.max() + np.log(np.exp(scores - scores.max()).sum())
            out[b] = path_score(emissions[b], weights, tags[b], mask[b]) - log_z
    return out


def brute_force_marginals(emissions, weights, mask):
    """p(y_t = k | E), (B, T, K); zero at masked positions."""
    marginals = np.zeros(emissions.shape)
    for b in range(len(mask)):
        if mask[b].any():
            paths, scores = all_paths(emissions[b], weights, mask[b])
            p = np.exp(scores - scores.max())
            p /= p.sum()
            for path, p_path in zip(paths, p):
                marginals[b, np.arange(mask.shape[1]), path] += p_path
            marginals[b, ~mask[b]] = 0.0
    return marginals


def gradient(fn, x):
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x).numpy()
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.grad(fn)(x))
    pytest.skip(f"no gradient helper for backend {BACKEND}")


# --- Numbers ---


@pytest.mark.parametrize("unroll", [False, True])
def test_viterbi_equals_brute_force(unroll):
    crf = make_crf(unroll)
    decoded = ops.convert_to_numpy(crf(EMISSIONS, mask=MASK))
    assert decoded.dtype == np.int32
    np.testing.assert_array_equal(decoded, brute_force_viterbi(EMISSIONS, WEIGHTS, MASK))
    assert not decoded[~MASK].any()  # padding holds 0


@pytest.mark.parametrize("seed", range(5))
def test_viterbi_equals_brute_force_random_weights(seed):
    rng = np.random.default_rng(100 + seed)
    length = int(rng.integers(1, 6))
    emissions = rng.normal(size=(4, length, K)).astype("float32") * 2
    weights = [rng.normal(size=s).astype("float32") * 2 for s in ((K, K), (K,), (K,))]
    mask = np.arange(length)[None] < rng.integers(1, length + 1, size=(4, 1))
    mask[0] = True
    decoded = viterbi_decode(emissions, *weights, mask=mask)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(decoded), brute_force_viterbi(emissions, weights, mask)
    )


def test_viterbi_without_mask_equals_full_mask():
    crf = make_crf()
    np.testing.assert_array_equal(
        ops.convert_to_numpy(crf(EMISSIONS)),
        brute_force_viterbi(EMISSIONS, WEIGHTS, np.ones((B, T), bool)),
    )


def test_viterbi_ties_go_to_lowest_tag():
    decoded = viterbi_decode(np.zeros((1, 3, K)), np.zeros((K, K)), np.zeros(K), np.zeros(K))
    np.testing.assert_array_equal(ops.convert_to_numpy(decoded), [[0, 0, 0]])


def test_transitions_override_emissions():
    # Per-token argmax says 0, 0; A[0, 0] = -10 forbids 0 -> 0, so the path is 0, 1.
    emissions = np.array([[[2.0, 1.0, -5.0], [2.0, 1.5, -5.0]]], "float32")
    transitions = np.zeros((K, K), "float32")
    transitions[0, 0] = -10.0
    decoded = viterbi_decode(emissions, transitions, np.zeros(K), np.zeros(K))
    np.testing.assert_array_equal(ops.convert_to_numpy(decoded), [[0, 1]])


@pytest.mark.parametrize("unroll", [False, True])
def test_log_likelihood_equals_brute_force(unroll):
    crf = make_crf(unroll)
    log_likelihood = ops.convert_to_numpy(crf.log_likelihood(EMISSIONS, TAGS, mask=MASK))
    assert log_likelihood.dtype == np.float32
    expected = brute_force_log_likelihood(EMISSIONS, WEIGHTS, TAGS, MASK)
    np.testing.assert_allclose(log_likelihood, expected, atol=1e-5, rtol=1e-5)
    assert expected[-1] == 0.0 and (expected[:-1] < 0).all()


def test_log_likelihood_ignores_tags_at_masked_positions():
    crf = make_crf()
    other_tags = np.where(MASK, TAGS, (TAGS + 1) % K)
    np.testing.assert_allclose(
        ops.convert_to_numpy(crf.log_likelihood(EMISSIONS, other_tags, mask=MASK)),
        ops.convert_to_numpy(crf.log_likelihood(EMISSIONS, TAGS, mask=MASK)),
        atol=1e-6,
    )


def test_probabilities_of_all_paths_sum_to_one():
    crf = make_crf()
    real = np.array([[1, 1, 1, 0, 0]], bool)
    paths = np.array([p + (0, 0) for p in itertools.product(range(K), repeat=3)], "int32")
    emissions = np.repeat(EMISSIONS[:1], len(paths), axis=0)
    masks = np.repeat(real, len(paths), axis=0)
    log_p = ops.convert_to_numpy(crf.log_likelihood(emissions, paths, mask=masks))
    np.testing.assert_allclose(np.exp(log_p).sum(), 1.0, atol=1e-5)


@pytest.mark.parametrize("unroll", [False, True])
def test_gradient_is_gold_minus_marginals(unroll):
    # d log p(y | E) / dE[t, k] = 1[y_t = k] - p(y_t = k | E) on real tokens, 0 elsewhere.
    crf = make_crf(unroll)
    grad = gradient(lambda e: ops.sum(crf.log_likelihood(e, TAGS, mask=MASK)), EMISSIONS)
    assert np.all(np.isfinite(grad))
    gold = np.eye(K)[TAGS] * MASK[..., None]
    expected = gold - brute_force_marginals(EMISSIONS, WEIGHTS, MASK)
    np.testing.assert_allclose(grad, expected, atol=1e-5)


def test_weight_gradients_are_gold_minus_expected_counts():
    crf = make_crf()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = -ops.mean(crf.log_likelihood(EMISSIONS, TAGS, mask=MASK))
        grads = [g.numpy() for g in tape.gradient(loss, crf.trainable_variables)]
    elif BACKEND == "jax":
        import jax

        def loss_fn(values):
            # The loss the layer adds when given tags.
            _, _, losses = crf.stateless_call(
                values, [], EMISSIONS, mask=MASK, tags=TAGS, return_losses=True
            )
            return losses[0]

        values = [v.value for v in crf.trainable_variables]
        grads = [np.asarray(g) for g in jax.grad(loss_fn)(values)]
    else:
        pytest.skip(f"no gradient helper for backend {BACKEND}")
    # d(-mean log p)/dA[i, j] = -(gold count of i -> j - expected count) / B; likewise for
    # the first tag (start) and the last tag (end).
    expected = [np.zeros((K, K)), np.zeros(K), np.zeros(K)]
    for b in range(B):
        if not MASK[b].any():
            continue
        paths, scores = all_paths(EMISSIONS[b], WEIGHTS, MASK[b])
        p = np.exp(scores - scores.max())
        p /= p.sum()
        positions = np.flatnonzero(MASK[b])
        for path, weight in [(TAGS[b], -1.0)] + list(zip(paths, p)):
            y = path[positions]
            np.add.at(expected[0], (y[:-1], y[1:]), weight)
            expected[1][y[0]] += weight
            expected[2][y[-1]] += weight
    assert len(grads) == 3
    for got, want in zip(grads, expected):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want / B, atol=1e-5)


# --- Keras integration ---


def test_run_layer_test():
    decoded = run_layer_test(
        CRF,
        {"num_tags": K, "transitions_initializer": "random_normal"},
        EMISSIONS,
        expected_output_shape=(B, T),
        run_fit=False,
    )
    assert decoded.dtype == np.int32


def test_run_layer_test_with_mask_and_unroll():
    decoded = run_layer_test(
        CRF,
        {"num_tags": K, "transitions_initializer": "random_normal", "unroll": True},
        {"emissions": EMISSIONS, "mask": MASK},
        expected_output_shape=(B, T),
        run_fit=False,
    )
    assert not decoded[~MASK].any()


def test_implicit_keras_mask_is_used():
    crf = make_crf()
    zeroed = np.where(MASK[..., None], EMISSIONS, 0.0).astype("float32")
    masked = keras.layers.Masking(mask_value=0.0)(zeroed)
    implicit = crf(masked)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(implicit), ops.convert_to_numpy(crf(zeroed, mask=MASK))
    )
    # The mask is passed on to the decoded path.
    np.testing.assert_array_equal(ops.convert_to_numpy(crf.compute_mask(masked, mask=MASK)), MASK)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_decodes_the_same_path(policy):
    rng = np.random.default_rng(3)
    gold = rng.integers(0, K, size=(B, T))
    # A clear margin: the gold tag leads by 3 at each token, the rest is small noise.
    emissions = (3.0 * np.eye(K)[gold] + 0.1 * rng.normal(size=(B, T, K))).astype("float32")
    weights = [0.3 * w for w in WEIGHTS]
    full = CRF(K)
    half = CRF(K, dtype=policy)
    for layer in (full, half):
        layer.build((None, T, K))
        layer.set_weights(weights)
        assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in layer.weights)
    decoded_full = ops.convert_to_numpy(full(emissions, mask=MASK))
    np.testing.assert_array_equal(ops.convert_to_numpy(half(emissions, mask=MASK)), decoded_full)
    np.testing.assert_array_equal(decoded_full, np.where(MASK, gold, 0))
    half_emissions = ops.cast(emissions, policy.split("_")[1])
    log_p_half = half.log_likelihood(half_emissions, gold, mask=MASK)
    assert keras.backend.standardize_dtype(log_p_half.dtype) == "float32"
    np.testing.assert_allclose(
        ops.convert_to_numpy(log_p_half),
        ops.convert_to_numpy(full.log_likelihood(emissions, gold, mask=MASK)),
        atol=0.05,
    )


def _bio_data():
    """Runs of entity words (ids 1-4) between other words (ids 5-9), tagged O=0, B=1, I=2.

    The same entity word is B after an O and I inside a run: a per-token classifier cannot
    tell them apart, the CRF's transitions (O -> B, B -> I, I -> I) can.
    """
    rng = np.random.default_rng(7)
    batch, length = 16, 8
    is_entity = rng.random((batch, length)) < 0.5
    entity_words = rng.integers(1, 5, (batch, length))
    other_words = rng.integers(5, 10, (batch, length))
    tokens = np.where(is_entity, entity_words, other_words)
    after_entity = np.concatenate([np.zeros((batch, 1), bool), is_entity[:, :-1]], axis=1)
    tags = np.where(is_entity, np.where(after_entity, 2, 1), 0)
    lengths = rng.integers(3, length + 1, size=batch)
    real = np.arange(length)[None] < lengths[:, None]
    tokens = np.where(real, tokens, 0).astype("int32")  # right padding, id 0
    return tokens, np.where(real, tags, 0).astype("int32"), real


def test_fit_lowers_the_nll_and_decodes_the_training_labels():
    tokens, tags, real = _bio_data()
    length = tokens.shape[1]
    token_ids = keras.Input((length,), dtype="int32", name="token_ids")
    gold_tags = keras.Input((length,), dtype="int32", name="tags")
    # No context at all in the emissions: only the transitions can separate B from I.
    x = keras.layers.Embedding(10, 8, mask_zero=True)(token_ids)  # Keras mask: id != 0
    emissions = keras.layers.Dense(K, name="emissions")(x)  # (B, T, K)
    crf = CRF(K)
    trainer = keras.Model([token_ids, gold_tags], crf(emissions, tags=gold_tags))
    tagger = keras.Model(token_ids, crf(emissions))
    trainer.compile(optimizer=keras.optimizers.Adam(0.1))

    # The loss is exactly the batch mean of -log_likelihood, on the real tokens only.
    emission_model = keras.Model(token_ids, emissions)

    def nll():
        scores = emission_model.predict(tokens, verbose=0)
        return -ops.convert_to_numpy(crf.log_likelihood(scores, tags, mask=real)).mean()

    np.testing.assert_allclose(trainer.evaluate([tokens, tags], verbose=0), nll(), rtol=1e-5)

    history = trainer.fit([tokens, tags], epochs=80, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.diff(losses[:20]) < 0), losses[:20]
    assert losses[-1] < 0.02 * losses[0], losses[::10]
    np.testing.assert_allclose(trainer.evaluate([tokens, tags], verbose=0), nll(), rtol=1e-4)

    decoded = tagger.predict(tokens, verbose=0)
    np.testing.assert_array_equal(decoded, tags)
    per_token = np.where(real, emission_model.predict(tokens, verbose=0).argmax(-1), 0)
    assert np.mean(per_token[real] == tags[real]) < 0.9  # the emissions alone fall short

    transitions = ops.convert_to_numpy(crf.transitions)
    assert transitions[0, 1] > transitions[0, 2]  # O -> B beats O -> I
    assert transitions[1, 2] > transitions[1, 1]  # B -> I beats B -> B

    # The trained tagger survives `.keras` save / load.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tagger.keras")
        tagger.save(path)
        reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(reloaded.predict(tokens, verbose=0), decoded)


def test_tags_and_implicit_mask_together():
    # With two tensor arguments Keras passes the mask as `emissions_mask`: still used.
    crf = make_crf()
    zeroed = np.where(MASK[..., None], EMISSIONS, 0.0).astype("float32")
    masked = keras.layers.Masking(mask_value=0.0)(zeroed)
    decoded = crf(masked, tags=TAGS)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(decoded), brute_force_viterbi(zeroed, WEIGHTS, MASK)
    )
    expected = -brute_force_log_likelihood(zeroed, WEIGHTS, TAGS, MASK).mean()
    (eager_loss,) = crf.losses  # kept until the next call
    np.testing.assert_allclose(ops.convert_to_numpy(eager_loss), expected, rtol=1e-5)
    model_input = keras.Input((T, K))
    gold = keras.Input((T,), dtype="int32")
    model = keras.Model([model_input, gold], crf(keras.layers.Masking(0.0)(model_input), tags=gold))
    model.compile(optimizer="sgd")
    np.testing.assert_allclose(model.evaluate([zeroed, TAGS], verbose=0), expected, rtol=1e-5)


# --- Export ---


@tensorflow_only
def test_dynamic_length_under_tf_function():
    import tensorflow as tf

    crf = make_crf()
    decode = tf.function(
        lambda e, m: crf(e, mask=m),
        input_signature=[tf.TensorSpec((None, None, K)), tf.TensorSpec((None, None), tf.bool)],
    )
    for length in (1, 3, 5):
        np.testing.assert_array_equal(
            decode(EMISSIONS[:, :length], MASK[:, :length]).numpy(),
            brute_force_viterbi(EMISSIONS[:, :length], WEIGHTS, MASK[:, :length]),
        )
    unrolled = tf.function(
        lambda e: viterbi_decode(e, *WEIGHTS, unroll=True),
        input_signature=[tf.TensorSpec((None, None, K))],
    )
    with pytest.raises(ValueError, match="unroll=True.*static.*None"):
        unrolled.get_concrete_function()


def _tflite_interpreter(model_content):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_content)
    interpreter.allocate_tensors()
    return interpreter


@tensorflow_only
@pytest.mark.parametrize("unroll", [False, True])
def test_savedmodel_and_builtins_only_tflite(unroll, tmp_path):
    import tensorflow as tf

    features = keras.Input(batch_shape=(1, T, 4), name="features")
    mask = keras.Input(batch_shape=(1, T), dtype="bool", name="mask")
    emissions = keras.layers.Dense(K, kernel_initializer="random_normal")(features)
    crf = CRF(K, transitions_initializer="random_normal", unroll=unroll)
    model = keras.Model([features, mask], crf(emissions, mask=mask))
    model.export(str(tmp_path), format="tf_saved_model", verbose=False)

    rng = np.random.default_rng(11)
    cases = [(rng.normal(size=(1, T, 4)).astype("float32"), row[None]) for row in MASK]
    expected = [ops.convert_to_numpy(model([f, m])) for f, m in cases]

    reloaded = tf.saved_model.load(str(tmp_path))
    for (f, m), want in zip(cases, expected):
        np.testing.assert_array_equal(reloaded.serve([f, m]).numpy(), want)

    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    interpreter = _tflite_interpreter(converter.convert())
    inputs = {d["dtype"]: d["index"] for d in interpreter.get_input_details()}
    output = interpreter.get_output_details()[0]["index"]
    for (f, m), want in zip(cases, expected):
        interpreter.set_tensor(inputs[np.float32], f)
        interpreter.set_tensor(inputs[np.bool_], m)
        interpreter.invoke()
        np.testing.assert_array_equal(interpreter.get_tensor(output), want)


# --- Errors ---


@pytest.mark.parametrize("num_tags", [0, -2, 2.5, True, None])
def test_num_tags_must_be_positive_int(num_tags):
    with pytest.raises(ValueError, match=r"`num_tags` must be a positive integer.*Received"):
        CRF(num_tags)


def test_unroll_must_be_bool():
    with pytest.raises(ValueError, match="`unroll` must be a bool. Received: unroll='yes'"):
        CRF(K, unroll="yes")


def test_emissions_last_dim_must_be_num_tags():
    with pytest.raises(ValueError, match=r"num_tags=3.*Dense\(3\).*emissions.shape=\(8, 5, 4\)"):
        CRF(K)(np.zeros((B, T, 4), "float32"))
    crf = make_crf()
    with pytest.raises(ValueError, match=r"emissions.shape=\(8, 5\)"):
        crf.log_likelihood(np.zeros((B, T), "float32"), TAGS)


def test_tags_shape_must_match_emissions():
    crf = make_crf()
    with pytest.raises(ValueError, match=r"`tags`.*\(8, 5\).*Received: tags.shape=\(8, 4\)"):
        crf.log_likelihood(EMISSIONS, TAGS[:, :4])
    with pytest.raises(ValueError, match=r"Received: tags.shape=\(8, 5, 1\)"):
        crf(EMISSIONS, tags=TAGS[..., None])


def test_unroll_needs_a_static_length():
    with pytest.raises(ValueError, match=r"unroll=True.*emissions.shape=\(None, None, 3\)"):
        CRF(K, unroll=True)(keras.Input((None, K)))
