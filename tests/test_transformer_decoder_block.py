import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from tests.layer_test_case import run_layer_test
from tests.numpy_reference import mha_weights
from tests.numpy_reference import np_ffn
from tests.numpy_reference import np_gelu_tanh
from tests.numpy_reference import np_layer_norm
from tests.numpy_reference import np_mha
from tests.numpy_reference import np_relu
from tests.numpy_reference import randomize

B, T, S, D, H, FF = 2, 4, 5, 8, 2, 16
DK = D // H


# === numpy reference of the block, from the shared per-sublayer references ===


def np_decoder_block(block, x, enc, enc_mask, activation):
    """Causal self-attention, cross-attention (if `enc` is given), FFN; post- or pre-LN."""
    self_w = mha_weights(block.self_attention)
    cross_w = None if enc is None else mha_weights(block.cross_attention)
    lns = [block.self_attention_layer_norm, block.feedforward_layer_norm]
    if enc is not None:
        lns.insert(1, block.cross_attention_layer_norm)
    causal = np.tril(np.ones((x.shape[1], x.shape[1]), bool))  # (T, T)
    out = np.zeros_like(x, dtype="float64")
    for b in range(x.shape[0]):
        sublayers = [lambda h: np_mha(h, h, self_w, causal)]
        if enc is not None:
            e, m = enc[b].astype("float64"), np.broadcast_to(enc_mask[b], (x.shape[1],
                                                                           enc.shape[1]))
            sublayers.append(lambda h: np_mha(h, e, cross_w, m))
        sublayers.append(lambda h: np_ffn(h, block, activation))
        y = x[b].astype("float64")
        for sublayer, ln in zip(sublayers, lns):
            if block.norm_first:
                y = y + sublayer(np_layer_norm(y, ln))
            else:
                y = np_layer_norm(y + sublayer(y), ln)
        out[b] = y
    return out



def sequences(seed=0, encoder_lengths=(5, 3)):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D)).astype("float32")
    enc = rng.normal(size=(B, S, D)).astype("float32")
    enc_mask = np.arange(S)[None, :] < np.array(encoder_lengths)[:, None]  # (B, S)
    return x, enc, enc_mask


def make_block(with_encoder, seed=0, **kwargs):
    block = TransformerDecoderBlock(num_heads=H, intermediate_dim=FF, **kwargs)
    x, enc, _ = sequences()
    block(x, enc) if with_encoder else block(x)
    randomize(block, seed)
    return block


# === Numbers ===


def test_post_ln_encoder_decoder_matches_numpy_formula():
    x, enc, enc_mask = sequences()
    block = make_block(with_encoder=True)
    out = ops.convert_to_numpy(block(x, enc, encoder_padding_mask=enc_mask))
    np.testing.assert_allclose(
        out, np_decoder_block(block, x, enc, enc_mask, np_relu), atol=1e-5
    )


@pytest.mark.parametrize("with_encoder", [False, True])
def test_pre_ln_matches_numpy_formula(with_encoder):
    x, enc, enc_mask = sequences(1)
    block = make_block(
        with_encoder, seed=1, norm_first=True, fused_qkv=True,
        activation="gelu_approximate",
    )
    if with_encoder:
        out = block(x, enc, encoder_padding_mask=enc_mask)
        expected = np_decoder_block(block, x, enc, enc_mask, np_gelu_tanh)
    else:
        out = block(x)
        expected = np_decoder_block(block, x, None, None, np_gelu_tanh)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)


def test_sublayers_follow_the_encoder_sequence():
    x, enc, _ = sequences()
    decoder_only = TransformerDecoderBlock(num_heads=H, intermediate_dim=FF)
    decoder_only(x)
    assert decoder_only.cross_attention is None
    assert not any("cross_attention" in w.path for w in decoder_only.weights)
    seq2seq = TransformerDecoderBlock(num_heads=H, intermediate_dim=FF)
    seq2seq(x, enc)
    names = {w.path.split("/")[1] for w in seq2seq.weights}
    assert {"self_attention", "self_attention_layer_norm", "cross_attention",
            "cross_attention_layer_norm", "feedforward_intermediate_dense",
            "feedforward_output_dense", "feedforward_layer_norm"} == names


def test_attention_scores():
    x, enc, enc_mask = sequences()
    block = make_block(with_encoder=True)
    out, scores = block(x, enc, encoder_padding_mask=enc_mask, return_attention_scores=True)
    self_scores = ops.convert_to_numpy(scores["self_attention"])
    cross_scores = ops.convert_to_numpy(scores["cross_attention"])
    assert self_scores.shape == (B, H, T, T) and cross_scores.shape == (B, H, T, S)
    assert np.all(np.triu(self_scores, k=1) == 0.0)  # nothing above the diagonal
    assert np.all(cross_scores[1, :, :, 3:] == 0.0)  # padded encoder tokens
    np.testing.assert_allclose(cross_scores.sum(-1), 1.0, atol=1e-6)


# === Invariants ===


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_mask_never_leaks_future_tokens(norm_first):
    x, enc, _ = sequences(2)
    block = make_block(with_encoder=True, seed=2, norm_first=norm_first)
    base = ops.convert_to_numpy(block(x, enc))
    for t in range(T - 1):
        changed = x.copy()
        changed[:, t + 1:] = np.random.default_rng(t).normal(size=changed[:, t + 1:].shape)
        out = ops.convert_to_numpy(block(changed, enc))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)
        assert not np.allclose(out[:, t + 1:], base[:, t + 1:])


def test_encoder_padding_never_changes_outputs():
    x, enc, enc_mask = sequences(3)
    block = make_block(with_encoder=True, seed=3)
    base = ops.convert_to_numpy(block(x, enc, encoder_padding_mask=enc_mask))

    noisy = np.where(enc_mask[..., None], enc, 50.0).astype("float32")
    changed = ops.convert_to_numpy(block(x, noisy, encoder_padding_mask=enc_mask))
    np.testing.assert_allclose(changed, base, atol=1e-5)

    longer = np.concatenate([enc, np.full((B, 2, D), -3.0, "float32")], axis=1)
    longer_mask = np.concatenate([enc_mask, np.zeros((B, 2), bool)], axis=1)
    extended = ops.convert_to_numpy(block(x, longer, encoder_padding_mask=longer_mask))
    np.testing.assert_allclose(extended, base, atol=1e-5)


def test_decoder_padding_never_changes_unpadded_outputs():
    x, _, _ = sequences(4)
    block = make_block(with_encoder=False, seed=4)
    # Left padding: with a causal mask only a key mask keeps pads out of real tokens.
    padding_mask = np.array([[True] * T, [False, False, True, True]])
    base = ops.convert_to_numpy(block(x, decoder_padding_mask=padding_mask))
    noisy = np.where(padding_mask[..., None], x, 30.0).astype("float32")
    changed = ops.convert_to_numpy(block(noisy, decoder_padding_mask=padding_mask))
    np.testing.assert_allclose(changed[padding_mask], base[padding_mask], atol=1e-5)


# === Incremental decoding with key/value caches ===


def decode_step_by_step(block, x, enc=None, enc_mask=None, precompute_cross=True):
    cache = np.zeros((B, 2, T, H, DK), "float32")
    cross_cache = None
    if enc is not None and precompute_cross:
        cross_cache = block.compute_cross_attention_cache(enc)
        assert tuple(cross_cache.shape) == (B, 2, S, H, DK)
    steps = []
    for t in range(T):
        kwargs = {}
        if enc is not None:
            kwargs.update(encoder_padding_mask=enc_mask)
            if cross_cache is None:
                kwargs.update(encoder_sequence=enc)  # first step: the block projects it
            else:
                kwargs.update(cross_attention_cache=cross_cache)
        result = block(
            x[:, t:t + 1], self_attention_cache=cache,
            self_attention_cache_update_index=t, **kwargs,
        )
        if enc is None:
            out, cache = result  # decoder-only: no cross cache in the tuple
        else:
            out, cache, cross_cache = result
        steps.append(ops.convert_to_numpy(out))
    return np.concatenate(steps, axis=1)


@pytest.mark.parametrize("fused_qkv", [False, True])
@pytest.mark.parametrize("with_encoder", [False, True])
def test_cached_decoding_equals_full_decoding(fused_qkv, with_encoder):
    x, enc, enc_mask = sequences(5)
    block = make_block(with_encoder, seed=5, fused_qkv=fused_qkv, norm_first=fused_qkv)
    if with_encoder:
        full = block(x, enc, encoder_padding_mask=enc_mask)
        cached = decode_step_by_step(block, x, enc, enc_mask)
    else:
        full, cached = block(x), decode_step_by_step(block, x)
    np.testing.assert_allclose(cached, ops.convert_to_numpy(full), atol=1e-5)


def test_cross_cache_is_computed_from_the_encoder_on_the_first_step():
    x, enc, enc_mask = sequences(6)
    block = make_block(with_encoder=True, seed=6)
    full = ops.convert_to_numpy(block(x, enc, encoder_padding_mask=enc_mask))
    cached = decode_step_by_step(block, x, enc, enc_mask, precompute_cross=False)
    np.testing.assert_allclose(cached, full, atol=1e-5)


def test_cached_prefill_then_steps():
    x, enc, _ = sequences(7)
    block = make_block(with_encoder=True, seed=7)
    full = ops.convert_to_numpy(block(x, enc))
    cache = np.zeros((B, 2, T, H, DK), "float32")
    prefix, cache, cross = block(
        x[:, :2], enc, self_attention_cache=cache, self_attention_cache_update_index=0
    )
    steps = [ops.convert_to_numpy(prefix)]
    for t in range(2, T):
        out, cache, cross = block(
            x[:, t:t + 1], self_attention_cache=cache, self_attention_cache_update_index=t,
            cross_attention_cache=cross,
        )
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_cached_step_runs_in_a_compiled_function():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function export check")
    import tensorflow as tf

    x, enc, _ = sequences(8)
    block = make_block(with_encoder=True, seed=8)
    full = ops.convert_to_numpy(block(x, enc))
    spec = tf.TensorSpec
    step = tf.function(
        lambda token, cache, cross, index: block(
            token, self_attention_cache=cache, self_attention_cache_update_index=index,
            cross_attention_cache=cross,
        ),
        input_signature=[spec((B, 1, D)), spec((B, 2, T, H, DK)), spec((B, 2, S, H, DK)),
                         spec((), tf.int32)],
    )
    cache = tf.zeros((B, 2, T, H, DK))
    cross = block.compute_cross_attention_cache(enc)
    steps = []
    for t in range(T):
        out, cache, cross = step(x[:, t:t + 1], cache, cross, tf.constant(t))
        steps.append(out.numpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


# === Keras implicit masks ===


def test_implicit_masks_match_explicit_padding_masks():
    x, enc, enc_mask = sequences(9)
    block = make_block(with_encoder=True, seed=9)
    enc = np.where(enc_mask[..., None], enc, 0.0).astype("float32")
    implicit_enc = keras.layers.Masking(0.0)(enc)
    explicit = ops.convert_to_numpy(block(x, enc, encoder_padding_mask=enc_mask))
    np.testing.assert_allclose(
        ops.convert_to_numpy(block(x, implicit_enc)), explicit, atol=1e-5
    )

    decoder_only = make_block(with_encoder=False, seed=9)
    dec_mask = np.array([[True] * T, [False, True, True, True]])
    x = np.where(dec_mask[..., None], x, 0.0).astype("float32")
    explicit = ops.convert_to_numpy(decoder_only(x, decoder_padding_mask=dec_mask))
    implicit = ops.convert_to_numpy(decoder_only(keras.layers.Masking(0.0)(x)))
    np.testing.assert_allclose(implicit[dec_mask], explicit[dec_mask], atol=1e-5)


# === Shared layer checks ===


def test_layer_decoder_only():
    x, _, _ = sequences()
    run_layer_test(
        TransformerDecoderBlock,
        {"num_heads": H, "intermediate_dim": FF, "norm_first": True,
         "activation": "gelu_approximate", "dropout": 0.1},
        x,
        expected_output_shape=(B, T, D),
    )


def test_layer_with_encoder():
    x, enc, enc_mask = sequences()
    run_layer_test(
        TransformerDecoderBlock,
        {"num_heads": H, "intermediate_dim": FF, "fused_qkv": True},
        {"decoder_sequence": x, "encoder_sequence": enc, "encoder_padding_mask": enc_mask},
        expected_output_shape=(B, T, D),
    )


# === Errors ===


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0}, "Received: num_heads=0"),
        ({"intermediate_dim": -1}, "Received: intermediate_dim=-1"),
        ({"dropout": 1.0}, "Received: dropout=1.0"),
        ({"attention_dropout": -0.5}, "attention_dropout"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerDecoderBlock(**{"num_heads": H, "intermediate_dim": FF, **kwargs})


def test_model_size_not_divisible_by_heads():
    block = TransformerDecoderBlock(num_heads=3, intermediate_dim=FF)
    with pytest.raises(ValueError, match="Received: d_model=8, num_heads=3"):
        block(np.ones((B, T, D), "float32"))


def test_encoder_and_cache_misuse():
    x, enc, _ = sequences()
    decoder_only = make_block(with_encoder=False)
    with pytest.raises(ValueError, match="decoder-only"):
        decoder_only(x, enc)
    with pytest.raises(ValueError, match="decoder-only"):
        decoder_only.compute_cross_attention_cache(enc)
    seq2seq = make_block(with_encoder=True)
    with pytest.raises(ValueError, match="cross_attention_cache=None"):
        seq2seq(x)
    with pytest.raises(ValueError, match="self_attention_cache_update_index"):
        seq2seq(x, enc, self_attention_cache=np.zeros((B, 2, T, H, DK), "float32"))
