import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from tests.layer_test_case import assert_implicit_mask_matches_explicit
from tests.layer_test_case import run_layer_test
from tests.numpy_reference import mha_weights
from tests.numpy_reference import np_ffn
from tests.numpy_reference import np_gelu_tanh
from tests.numpy_reference import np_layer_norm
from tests.numpy_reference import np_mha
from tests.numpy_reference import np_relu
from tests.numpy_reference import randomize

B, T, D, H, FF = 2, 4, 8, 2, 16


# === numpy reference of the block, from the shared per-sublayer references ===


def np_encoder_block(block, x, mask, activation):
    """Post-LN: y = LN(x + SA(x)); z = LN(y + FFN(y)). Pre-LN: y = x + SA(LN(x)); ..."""
    w = mha_weights(block.self_attention)
    sa_ln, ff_ln = block.self_attention_layer_norm, block.feedforward_layer_norm
    out = np.zeros_like(x, dtype="float64")
    for b in range(x.shape[0]):
        xb = x[b].astype("float64")
        if block.norm_first:
            h = np_layer_norm(xb, sa_ln)
            y = xb + np_mha(h, h, w, mask[b])
            out[b] = y + np_ffn(np_layer_norm(y, ff_ln), block, activation)
        else:
            y = np_layer_norm(xb + np_mha(xb, xb, w, mask[b]), sa_ln)
            out[b] = np_layer_norm(y + np_ffn(y, block, activation), ff_ln)
    return out



def padded_inputs(seed=0, lengths=(4, 2)):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D)).astype("float32")
    padding_mask = np.arange(T)[None, :] < np.array(lengths)[:, None]  # (B, T)
    return x, padding_mask


# === Numbers ===


def test_post_ln_matches_numpy_formula():
    x, padding_mask = padded_inputs()
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)
    block(x)
    randomize(block)
    out = ops.convert_to_numpy(block(x, padding_mask=padding_mask))
    mask = np.repeat(padding_mask[:, None, :], T, axis=1)  # (B, T, S): keys only
    np.testing.assert_allclose(out, np_encoder_block(block, x, mask, np_relu), atol=1e-5)


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_pre_ln_matches_numpy_formula(fused_qkv):
    x, padding_mask = padded_inputs(1)
    block = TransformerEncoderBlock(
        num_heads=H, intermediate_dim=FF, norm_first=True, fused_qkv=fused_qkv,
        activation="gelu_approximate", layer_norm_epsilon=1e-3,
    )
    block(x)
    randomize(block, 1)
    out = ops.convert_to_numpy(block(x, padding_mask=padding_mask, use_causal_mask=True))
    mask = padding_mask[:, None, :] & np.tril(np.ones((T, T), bool))[None]  # (B, T, S)
    np.testing.assert_allclose(
        out, np_encoder_block(block, x, mask, np_gelu_tanh), atol=1e-5
    )


def test_post_ln_output_is_normalized_and_pre_ln_is_not():
    x = np.random.default_rng(2).normal(size=(B, T, D)).astype("float32") * 5.0
    post = ops.convert_to_numpy(TransformerEncoderBlock(H, FF)(x))
    pre = ops.convert_to_numpy(TransformerEncoderBlock(H, FF, norm_first=True)(x))
    # LN with gamma=1, beta=0 at init: every post-LN position has zero mean, unit variance.
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(post.var(-1), 1.0, atol=1e-3)
    assert np.abs(pre.var(-1) - 1.0).max() > 1.0  # the residual stream is left unscaled


def test_attention_scores_respect_the_padding_mask():
    x, padding_mask = padded_inputs()
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)
    out, scores = block(x, padding_mask=padding_mask, return_attention_scores=True)
    scores = ops.convert_to_numpy(scores)
    assert out.shape == (B, T, D) and scores.shape == (B, H, T, T)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    assert np.all(scores[1, :, :, 2:] == 0.0)  # example 1 has two real tokens


def test_explicit_key_dim_allows_indivisible_model_size():
    x = np.ones((B, T, 10), "float32")
    block = TransformerEncoderBlock(num_heads=3, intermediate_dim=FF, key_dim=4)
    assert block(x).shape == (B, T, 10)
    assert block.self_attention.query_dense.kernel.shape == (10, 3, 4)


def test_dropout_only_in_training():
    x, _ = padded_inputs()
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF, dropout=0.5)
    first, second = (ops.convert_to_numpy(block(x)) for _ in range(2))
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(ops.convert_to_numpy(block(x, training=True)), first)
    assert block.self_attention.dropout == 0.5  # attention_dropout defaults to dropout
    assert TransformerEncoderBlock(H, FF, dropout=0.5, attention_dropout=0.0).get_config()[
        "attention_dropout"] == 0.0


# === Invariants ===


def test_padding_never_changes_unpadded_outputs():
    x, padding_mask = padded_inputs(3)
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)
    block(x)
    randomize(block, 3)
    base = ops.convert_to_numpy(block(x, padding_mask=padding_mask))

    # Other values in the padded slots.
    noisy = np.where(padding_mask[..., None], x, 100.0 * np.random.default_rng(4).normal(
        size=x.shape)).astype("float32")
    changed = ops.convert_to_numpy(block(noisy, padding_mask=padding_mask))
    np.testing.assert_allclose(changed[padding_mask], base[padding_mask], atol=1e-5)

    # More padding at the end.
    longer = np.concatenate([x, np.full((B, 3, D), 7.0, "float32")], axis=1)
    longer_mask = np.concatenate([padding_mask, np.zeros((B, 3), bool)], axis=1)
    extended = ops.convert_to_numpy(block(longer, padding_mask=longer_mask))[:, :T]
    np.testing.assert_allclose(extended[padding_mask], base[padding_mask], atol=1e-5)


def test_causal_mask_never_leaks_future_tokens():
    x, _ = padded_inputs(5)
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF, norm_first=True)
    base = ops.convert_to_numpy(block(x, use_causal_mask=True))
    for t in range(T - 1):
        changed = x.copy()
        changed[:, t + 1:] = np.random.default_rng(t).normal(size=changed[:, t + 1:].shape)
        out = ops.convert_to_numpy(block(changed, use_causal_mask=True))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_implicit_mask_matches_explicit(norm_first):
    x, padding_mask = padded_inputs(6)
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF, norm_first=norm_first)
    assert_implicit_mask_matches_explicit(block, x, padding_mask)
    # With another tensor argument Keras fills `inputs_mask` instead of `mask`.
    attention_mask = np.ones((B, T, T), bool)
    assert_implicit_mask_matches_explicit(
        block, x, padding_mask, {"attention_mask": attention_mask}
    )


def test_output_keeps_the_keras_mask():
    x, padding_mask = padded_inputs(7)
    x = np.where(padding_mask[..., None], x, 0.0).astype("float32")
    inputs = keras.Input((T, D))
    masked = keras.layers.Masking(0.0)(inputs)
    outputs = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)(masked)
    pooled = keras.layers.GlobalAveragePooling1D()(outputs)  # averages real steps only
    model = keras.Model(inputs, [outputs, pooled])
    out, mean = model(x)
    expected = [ops.convert_to_numpy(out)[b][padding_mask[b]].mean(0) for b in range(B)]
    np.testing.assert_allclose(ops.convert_to_numpy(mean), np.stack(expected), atol=1e-5)


# === Shared layer checks ===


def test_layer_post_ln():
    x, _ = padded_inputs()
    run_layer_test(
        TransformerEncoderBlock,
        {"num_heads": H, "intermediate_dim": FF, "dropout": 0.1},
        x,
        expected_output_shape=(B, T, D),
    )


def test_layer_pre_ln_fused_gelu_approximate():
    x, padding_mask = padded_inputs()
    out = run_layer_test(
        TransformerEncoderBlock,
        {"num_heads": H, "intermediate_dim": FF, "norm_first": True, "fused_qkv": True,
         "activation": "gelu_approximate"},
        {"inputs": x, "padding_mask": padding_mask},
        call_kwargs={"use_causal_mask": True},
        expected_output_shape=(B, T, D),
    )
    assert np.all(np.isfinite(out))


def test_activation_config():
    block = TransformerEncoderBlock(H, FF, activation="gelu_approximate")
    assert block.get_config()["activation"] == "gelu_approximate"
    assert TransformerEncoderBlock(H, FF, activation="gelu").get_config()["activation"] == "gelu"
    clone = TransformerEncoderBlock.from_config(
        TransformerEncoderBlock(H, FF, activation=keras.activations.silu).get_config()
    )
    assert clone.activation is keras.activations.silu


# === Errors ===


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": -2}, "Received: num_heads=-2"),
        ({"intermediate_dim": 0}, "Received: intermediate_dim=0"),
        ({"key_dim": 0}, "key_dim"),
        ({"dropout": 1.0}, "Received: dropout=1.0"),
        ({"dropout": -0.1}, "dropout"),
        ({"attention_dropout": 1.5}, "Received: attention_dropout=1.5"),
        ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon"),
        ({"activation": "no_such_activation"}, "no_such_activation"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerEncoderBlock(**{"num_heads": H, "intermediate_dim": FF, **kwargs})


def test_model_size_not_divisible_by_heads():
    block = TransformerEncoderBlock(num_heads=3, intermediate_dim=FF)
    with pytest.raises(ValueError, match="Received: d_model=8, num_heads=3"):
        block(np.ones((B, T, D), "float32"))


# === query_length: only the first q rows as queries ===


@pytest.mark.parametrize("norm_first, fused_qkv", [(False, True), (False, False), (True, True)])
def test_query_length_equals_the_first_rows_of_the_full_output(norm_first, fused_qkv):
    x, padding_mask = padded_inputs(seed=3)
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF, norm_first=norm_first,
                                    fused_qkv=fused_qkv)
    block(x)
    randomize(block)
    rng = np.random.default_rng(4)
    attention_mask = rng.random((B, T, T)) > 0.3
    attention_mask[:, :, 0] = True  # every query sees at least one real key
    bias = rng.normal(size=(1, H, T, T)).astype("float32")
    full, full_scores = block(x, padding_mask=padding_mask, attention_mask=attention_mask,
                              attention_bias=bias, return_attention_scores=True)
    for q in (1, 3):
        out, scores = block(x, padding_mask=padding_mask, attention_mask=attention_mask,
                            attention_bias=bias, return_attention_scores=True, query_length=q)
        assert tuple(out.shape) == (B, q, D)
        np.testing.assert_allclose(ops.convert_to_numpy(out),
                                   ops.convert_to_numpy(full)[:, :q], atol=1e-5)
        np.testing.assert_allclose(ops.convert_to_numpy(scores),
                                   ops.convert_to_numpy(full_scores)[:, :, :q], atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"query_length": 0}, "query_length=0"),
    ({"query_length": 1.0}, "query_length=1.0"),
    ({"query_length": True}, "query_length=True"),
    ({"query_length": 1, "use_causal_mask": True}, "use_causal_mask=True"),
    ({"query_length": T + 1}, rf"at most the sequence length T={T}.*query_length={T + 1}"),
])
def test_query_length_errors(kwargs, match):
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)
    with pytest.raises(ValueError, match=match):
        block(np.zeros((B, T, D), "float32"), **kwargs)


def test_query_length_refuses_an_implicit_keras_mask():
    block = TransformerEncoderBlock(num_heads=H, intermediate_dim=FF)
    embedded = keras.layers.Embedding(10, D, mask_zero=True)(np.array([[1, 2, 0, 0]]))
    with pytest.raises(ValueError, match="pass `padding_mask` instead"):
        block(embedded, query_length=1)
