import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.scored_attention import ScoredAttention
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
QUERY = RNG.normal(size=(2, 3, 4)).astype("float32")  # decoder states s_t, d_q = d_k
WIDE_QUERY = RNG.normal(size=(2, 3, 6)).astype("float32")  # d_q != d_k
VALUE = RNG.normal(size=(2, 5, 4)).astype("float32")  # encoder states h_i
KEY = RNG.normal(size=(2, 5, 4)).astype("float32")
NARROW_VALUE = RNG.normal(size=(2, 5, 3)).astype("float32")
PADDING = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
QUERY_PADDING = np.array([[1, 1, 0], [1, 1, 1]], bool)

SCORES = ["dot", "scaled_dot", "general", "additive", "cosine", "location"]
EXTRA_KWARGS = {"additive": {"units": 5}, "location": {"max_source_length": 7}}


def make_layer(score, **kwargs):
    return ScoredAttention(score=score, **{**EXTRA_KWARGS.get(score, {}), **kwargs})


def numpy_scored_attention(layer, query, value, key=None, padding=None):
    """alpha_t = softmax_i(score(s_t, h_i)), c_t = sum_i alpha_ti v_i, one (b, t) at a time."""
    key = value if key is None else key
    B, T, _ = query.shape
    S = value.shape[1]
    score = layer.score
    kernel = np.asarray(layer.kernel) if hasattr(layer, "kernel") else None
    context = np.zeros((B, T, value.shape[-1]))
    weights = np.zeros((B, T, S))
    for b in range(B):
        for t in range(T):
            s_t = query[b, t].astype("float64")
            e = np.zeros(S)
            if score == "location":
                e = (s_t @ kernel)[:S]  # softmax(W_a s_t): source contents play no part
            for i in range(S):
                h_i = key[b, i].astype("float64")
                if score == "dot":
                    e[i] = s_t @ h_i
                elif score == "scaled_dot":
                    e[i] = s_t @ h_i / np.sqrt(len(h_i))
                elif score == "general":
                    e[i] = s_t @ kernel @ h_i
                elif score == "additive":
                    v_a = np.asarray(layer.score_vector)
                    e[i] = v_a @ np.tanh(np.concatenate([s_t, h_i]) @ kernel)
                elif score == "cosine":
                    e[i] = s_t @ h_i / (np.linalg.norm(s_t) * np.linalg.norm(h_i))
            if padding is not None:
                e = np.where(padding[b], e, -np.inf)
            alpha = np.exp(e - e.max())
            alpha /= alpha.sum()
            weights[b, t] = alpha
            context[b, t] = sum(alpha[i] * value[b, i] for i in range(S))
    return context, weights


def query_for(score):
    return QUERY if score in ("dot", "scaled_dot", "cosine") else WIDE_QUERY


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "padding_mask"])
@pytest.mark.parametrize("score", SCORES)
def test_equals_numpy_formula(score, padded):
    layer = make_layer(score)
    query = query_for(score)
    padding = PADDING if padded else None
    context, weights = layer(query, VALUE, padding_mask=padding, return_attention_scores=True)
    expected_context, expected_weights = numpy_scored_attention(
        layer, query, VALUE, padding=padding
    )
    np.testing.assert_allclose(ops.convert_to_numpy(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(context), expected_context, atol=1e-5)


@pytest.mark.parametrize("score", SCORES)
def test_separate_key_and_value(score):
    layer = make_layer(score)
    query = query_for(score)
    context = layer(query, NARROW_VALUE, key=KEY, padding_mask=PADDING)
    expected, _ = numpy_scored_attention(layer, query, NARROW_VALUE, key=KEY, padding=PADDING)
    assert context.shape == (2, 3, 3)
    np.testing.assert_allclose(ops.convert_to_numpy(context), expected, atol=1e-5)


@pytest.mark.parametrize("score", ["dot", "scaled_dot"])
def test_dot_scores_equal_keras_attention(score):
    # keras.layers.Attention(use_scale=False) is exactly s_t^T h_i; scaling the query by
    # 1/sqrt(n) gives the scaled version. Its query mask zeroes padded query rows, as ours.
    scale = 1.0 / np.sqrt(KEY.shape[-1]) if score == "scaled_dot" else 1.0
    reference = keras.layers.Attention(use_scale=False)
    expected = reference(
        [QUERY * scale, NARROW_VALUE, KEY], mask=[QUERY_PADDING, PADDING]
    )
    keras_mask = {"query_mask": QUERY_PADDING, "value_mask": PADDING}
    actual = ScoredAttention(score=score)(QUERY, NARROW_VALUE, key=KEY, **keras_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(actual), expected, atol=1e-5)
    unmasked = reference([QUERY * scale, NARROW_VALUE, KEY])
    actual = ScoredAttention(score=score)(QUERY, NARROW_VALUE, key=KEY)
    np.testing.assert_allclose(ops.convert_to_numpy(actual), unmasked, atol=1e-5)


def test_explicit_attention_mask_and_fully_masked_query():
    mask = RNG.random((2, 3, 5)) > 0.4
    mask[:, :, 0] = True
    mask[1, 2] = False  # a query that may see nothing gets a zero context, not NaN
    layer = ScoredAttention(score="general")
    context, weights = layer(WIDE_QUERY, VALUE, attention_mask=mask, return_attention_scores=True)
    context, weights = ops.convert_to_numpy(context), ops.convert_to_numpy(weights)
    np.testing.assert_allclose(weights[~mask], 0.0)
    np.testing.assert_allclose(context[1, 2], 0.0)
    np.testing.assert_allclose(weights[mask.any(-1)].sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("score", SCORES)
def test_keras_implicit_masks_match_explicit(score):
    layer = make_layer(score)
    query = query_for(score)
    masked_query = keras.layers.Masking(0.0)(np.where(QUERY_PADDING[..., None], query, 0.0))
    masked_value = keras.layers.Masking(0.0)(np.where(PADDING[..., None], VALUE, 0.0))
    implicit = layer(masked_query, masked_value)
    explicit = layer(
        np.where(QUERY_PADDING[..., None], query, 0.0).astype("float32"),
        np.where(PADDING[..., None], VALUE, 0.0).astype("float32"),
        padding_mask=PADDING,
    )
    implicit_np = ops.convert_to_numpy(implicit)
    np.testing.assert_allclose(
        implicit_np[QUERY_PADDING], ops.convert_to_numpy(explicit)[QUERY_PADDING], atol=1e-5
    )
    np.testing.assert_allclose(implicit_np[~QUERY_PADDING], 0.0)
    # The query's mask is carried to the output.
    assert layer.compute_mask(masked_query, QUERY_PADDING) is QUERY_PADDING


def test_self_attention_with_every_score_is_a_convex_combination():
    x = VALUE
    for score in SCORES:
        _, weights = make_layer(score)(x, x, return_attention_scores=True)
        weights = ops.convert_to_numpy(weights)
        assert weights.shape == (2, 5, 5)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
        assert (weights >= 0).all()


def test_location_score_uses_only_the_first_source_columns():
    layer = make_layer("location")  # W_a has max_source_length=7 columns
    actual = layer(WIDE_QUERY, VALUE[:, :2])
    expected, _ = numpy_scored_attention(layer, WIDE_QUERY, VALUE[:, :2])
    np.testing.assert_allclose(ops.convert_to_numpy(actual), expected, atol=1e-5)
    assert layer.kernel.shape == (6, 7)


@pytest.mark.parametrize("score", SCORES)
def test_shared_layer_checks(score):
    run_layer_test(
        ScoredAttention,
        {"score": score, **EXTRA_KWARGS.get(score, {})},
        {"query": query_for(score), "value": VALUE, "padding_mask": PADDING},
        expected_output_shape=(2, 3, 4),
    )


def test_shared_layer_checks_with_dropout_and_separate_key():
    run_layer_test(
        ScoredAttention,
        {"score": "additive", "dropout": 0.1, "seed": 3},
        {"query": WIDE_QUERY, "value": NARROW_VALUE, "key": KEY},
        expected_output_shape=(2, 3, 3),
    )


def test_rnn_encoder_decoder_with_additive_attention_learns_to_copy():
    vocab, length, width = 6, 5, 16
    rng = np.random.default_rng(1)
    source = rng.integers(1, vocab, size=(256, length))
    # Teacher forcing: the decoder reads <start>=0 then the previous target token.
    decoder_input = np.concatenate([np.zeros((256, 1), int), source[:, :-1]], axis=1)

    source_in = keras.Input((length,), dtype="int32")
    target_in = keras.Input((length,), dtype="int32")
    encoder_states = keras.layers.LSTM(width, return_sequences=True)(
        keras.layers.Embedding(vocab, width)(source_in)
    )  # (B, S, width), the h_i
    decoder_states = keras.layers.LSTM(width, return_sequences=True)(
        keras.layers.Embedding(vocab, width)(target_in)
    )  # (B, T, width), the s_t
    context = ScoredAttention(score="additive", units=width)(decoder_states, encoder_states)
    features = keras.layers.Concatenate()([decoder_states, context])
    logits = keras.layers.Dense(vocab)(features)
    model = keras.Model([source_in, target_in], logits)
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = model.evaluate([source, decoder_input], source, verbose=0)
    model.fit([source, decoder_input], source, batch_size=32, epochs=5, verbose=0)  # 40 steps
    after = model.evaluate([source, decoder_input], source, verbose=0)
    assert after < 0.6 * before, (before, after)


def test_errors():
    with pytest.raises(ValueError, match="Received: score='bahdanau'"):
        ScoredAttention(score="bahdanau")
    with pytest.raises(ValueError, match="same last dimension"):
        ScoredAttention(score="dot")(WIDE_QUERY, VALUE)
    with pytest.raises(ValueError, match="Received: max_source_length=None"):
        ScoredAttention(score="location")
    with pytest.raises(ValueError, match="source is longer"):
        ScoredAttention(score="location", max_source_length=4)(QUERY, VALUE)
    layer = ScoredAttention(score="location", max_source_length=5)
    layer(QUERY, VALUE)
    with pytest.raises(ValueError, match="source is longer"):
        layer(QUERY, np.concatenate([VALUE, VALUE], axis=1))
    with pytest.raises(ValueError, match="Received: units=4, score='dot'"):
        ScoredAttention(score="dot", units=4)
    with pytest.raises(ValueError, match="Received: units=0"):
        ScoredAttention(score="additive", units=0)
    with pytest.raises(ValueError, match="Received: max_source_length=8, score='general'"):
        ScoredAttention(score="general", max_source_length=8)
    with pytest.raises(ValueError, match="Received: dropout=1.0"):
        ScoredAttention(dropout=1.0)
