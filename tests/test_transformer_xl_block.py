import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from tests.layer_test_case import assert_implicit_mask_matches_explicit
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
B, T, M, D, H, FF = 2, 4, 3, 8, 2, 16
X = RNG.normal(size=(B, T, D)).astype("float32")
MEMORY = RNG.normal(size=(B, M, D)).astype("float32")
PADDING = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)


def np_(v):
    return ops.convert_to_numpy(v).astype("float64")


def layer_norm(x, norm):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * np_(norm.gamma) + np_(norm.beta)


def relative_attention(attn, h, memory, causal):
    """Dai et al. (2019) §3.3 with R_{i-j} built for every (i, j) directly (no shift)."""
    h_tilde = h if memory is None else np.concatenate([memory, h], axis=1)  # (B, S, d)
    seg, keys, dim = h.shape[1], h_tilde.shape[1], h.shape[2]
    q = np.einsum("btd,dhk->bthk", h, np_(attn.query_dense.kernel)) + np_(attn.query_dense.bias)
    k = np.einsum("bsd,dhk->bshk", h_tilde, np_(attn.key_dense.kernel)) + np_(attn.key_dense.bias)
    v = np.einsum("bsd,dhk->bshk", h_tilde, np_(attn.value_dense.kernel)) + np_(
        attn.value_dense.bias)
    distance = (keys - seg) + np.arange(seg)[:, None] - np.arange(keys)[None, :]  # (T, S)
    inv_freq = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    angles = distance[..., None] * inv_freq  # (T, S, d/2)
    rel = np.concatenate([np.sin(angles), np.cos(angles)], -1)  # R_{i-j}: (T, S, d)
    wr = np.einsum("tsd,dhk->tshk", rel, np_(attn.position_dense.kernel))  # W_{k,R} R_{i-j}
    u, v_bias = np_(attn.content_bias), np_(attn.position_bias)
    scores = (
        np.einsum("bthk,bshk->bhts", q, k)  # (a)
        + np.einsum("bthk,tshk->bhts", q, wr)  # (b)
        + np.einsum("hk,bshk->bhs", u, k)[:, :, None, :]  # (c)
        + np.einsum("hk,tshk->hts", v_bias, wr)[None]  # (d)
    ) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(distance >= 0, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshk->bthk", probs, v)
    return np.einsum("bthk,hkd->btd", heads, np_(attn.output_dense.kernel)) + np_(
        attn.output_dense.bias)


def numpy_block(block, x, memory=None, causal=True):
    """Post-LN: o = LN(x + Attn(x, m)), h = LN(o + FFN(o)); pre-LN moves LN inside."""
    ln1, ln2 = block.self_attention_layer_norm, block.feedforward_layer_norm
    w1, b1 = np_(block.feedforward_intermediate_dense.kernel), np_(
        block.feedforward_intermediate_dense.bias)
    w2, b2 = np_(block.feedforward_output_dense.kernel), np_(block.feedforward_output_dense.bias)
    ffn = lambda z: np.maximum(z @ w1 + b1, 0.0) @ w2 + b2  # noqa: E731
    if block.norm_first:
        mem = None if memory is None else layer_norm(memory, ln1)
        o = x + relative_attention(block.self_attention, layer_norm(x, ln1), mem, causal)
        return o + ffn(layer_norm(o, ln2))
    o = layer_norm(x + relative_attention(block.self_attention, x, memory, causal), ln1)
    return layer_norm(o + ffn(o), ln2)


def random_block(seed=1, **kwargs):
    block = TransformerXLBlock(num_heads=H, intermediate_dim=FF, **kwargs)
    block(X, memory=MEMORY)
    rng = np.random.default_rng(seed)
    block.set_weights([0.5 * rng.normal(size=w.shape) for w in block.get_weights()])
    return block


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_memory", [False, True])
@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_equals_numpy_block(norm_first, with_memory, use_causal_mask):
    block = random_block(norm_first=norm_first)
    memory = MEMORY if with_memory else None
    out, _ = block(X, memory=memory, use_causal_mask=use_causal_mask)
    expected = numpy_block(block, X, memory, causal=use_causal_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-4)


def test_sublayer_names():
    block = random_block()
    names = {layer.name for layer in block._layers}
    assert {
        "self_attention", "self_attention_layer_norm", "feedforward_intermediate_dense",
        "feedforward_output_dense", "feedforward_layer_norm",
    } <= names


@pytest.mark.parametrize("norm_first", [False, True])
def test_segment_with_memory_equals_one_pass_over_concatenation(norm_first):
    """The recurrence of §3.2: relative positions make cached states reusable as is."""
    block = random_block(norm_first=norm_first)
    segment_1, segment_2 = X[:, :3], RNG.normal(size=(B, 5, D)).astype("float32")
    full, _ = block(np.concatenate([segment_1, segment_2], axis=1))
    out_1, memory = block(segment_1)
    out_2, _ = block(segment_2, memory=memory)
    np.testing.assert_allclose(ops.convert_to_numpy(out_1), full[:, :3], atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(out_2), full[:, 3:], atol=1e-5)


def run_segments(blocks, segments):
    """Segment-level recurrence: each layer caches its own inputs for the next segment."""
    memories = [None] * len(blocks)
    outputs = []
    for segment in segments:
        h = segment
        for n, block in enumerate(blocks):
            h, memories[n] = block(h, memory=memories[n])
        outputs.append(ops.convert_to_numpy(h))
    return np.concatenate(outputs, axis=1)


def test_two_layer_recurrence_equals_one_pass():
    """Layer 2's memory is layer 1's output on the previous segment (O(N x L) context)."""
    blocks = [random_block(seed=1), random_block(seed=2, norm_first=True)]
    segments = [RNG.normal(size=(B, 3, D)).astype("float32") for _ in range(3)]
    full = np.concatenate(segments, axis=1)
    for block in blocks:
        full, _ = block(full)
    full = ops.convert_to_numpy(full)
    # The default memory is one segment: segment 3 no longer sees segment 1, so only
    # the first two segments equal the full pass.
    recurrent = run_segments(blocks, segments)
    np.testing.assert_allclose(recurrent[:, :6], full[:, :6], atol=1e-5)
    assert not np.allclose(recurrent[:, 6:], full[:, 6:], atol=1e-3)
    # With two segments of memory, every position sees its whole past.
    long_blocks = []
    for block in blocks:
        long_block = TransformerXLBlock.from_config({**block.get_config(), "memory_length": 6})
        long_block(segments[0])
        long_block.set_weights(block.get_weights())
        long_blocks.append(long_block)
    np.testing.assert_allclose(run_segments(long_blocks, segments), full, atol=1e-5)


@pytest.mark.parametrize(
    "memory_length, with_memory, expected",
    [
        (None, True, lambda: X),
        (None, False, lambda: X),
        (5, True, lambda: np.concatenate([MEMORY, X], 1)[:, -5:]),
        (2, True, lambda: X[:, -2:]),
        (6, False, lambda: X),
    ],
)
def test_new_memory_is_the_latest_inputs(memory_length, with_memory, expected):
    block = TransformerXLBlock(num_heads=H, intermediate_dim=FF, memory_length=memory_length)
    _, new_memory = block(X, memory=MEMORY if with_memory else None)
    np.testing.assert_array_equal(ops.convert_to_numpy(new_memory), expected())


def test_new_memory_carries_no_gradient():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("uses tf.GradientTape")
    import tensorflow as tf

    block = random_block()
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        tape.watch(x)
        _, new_memory = block(x)
        loss = tf.reduce_sum(new_memory ** 2)
    grad = tape.gradient(loss, x)
    assert grad is None or not np.any(grad.numpy())


@pytest.mark.parametrize(
    "norm_first, activation", [(False, "gelu"), (True, "gelu_approximate")]
)
def test_layer_test_case(norm_first, activation):
    run_layer_test(
        TransformerXLBlock,
        {"num_heads": H, "intermediate_dim": FF, "memory_length": 3, "dropout": 0.1,
         "norm_first": norm_first, "activation": activation},
        {"inputs": X, "memory": MEMORY, "padding_mask": PADDING},
        expected_output_shape=(B, T, D),
    )


def test_layer_test_case_without_memory_bidirectional():
    run_layer_test(
        TransformerXLBlock,
        {"num_heads": H, "intermediate_dim": FF, "key_dim": 3},
        X,
        call_kwargs={"use_causal_mask": False},
        expected_output_shape=(B, T, D),
    )


def test_implicit_keras_mask_matches_padding_mask():
    block = random_block()
    assert_implicit_mask_matches_explicit(block, X, PADDING)
    assert_implicit_mask_matches_explicit(block, X, PADDING, {"memory": MEMORY})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"intermediate_dim": 2.5}, "intermediate_dim"),
        ({"key_dim": -1}, "key_dim"),
        ({"memory_length": 0}, "memory_length"),
        ({"dropout": 1.0}, "dropout"),
        ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerXLBlock(**{"num_heads": H, "intermediate_dim": FF, **kwargs})


def test_heads_must_divide_width_without_key_dim():
    with pytest.raises(ValueError, match="num_heads=3"):
        TransformerXLBlock(num_heads=3, intermediate_dim=FF)(X)


# === Int8 layout (`quantization`) ===


def with_layout(block, **settings):
    """A copy of the float `block` with the int8 layout `settings`, holding its weights."""
    quantized = TransformerXLBlock.from_config({**block.get_config(), "quantization": settings})
    quantized(X, memory=MEMORY)
    targets = {v.path.split("/", 1)[1]: v for v in quantized.weights}
    for variable in block.weights:
        targets[variable.path.split("/", 1)[1]].assign(variable)
    return quantized


def calibrated(block, memory):
    """`block` (with its layout) with ranges set as `calibrate_model` sets them: the
    running min/max of one inference call on `X` and `memory`."""
    for quantizer in block.int8_quantizers():
        quantizer.calibrating = True
    block(X, memory=memory)
    for quantizer in block.int8_quantizers():
        quantizer.calibrating = False
    return block


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_memory", [False, True])
@pytest.mark.parametrize("use_causal_mask", [True, False])
def test_the_int8_layout_without_rounding_is_the_float_block(norm_first, with_memory,
                                                             use_causal_mask):
    """`quantization={"quantize": False}` runs the layout's graph unrounded: one fused Q/K/V
    matmul on the segment's rows and one on the memory's, the relative terms (u, v,
    W_{k,R} R, the shift) in float beside them, the mask over memory and segment. It is
    the numpy reference of §3.3 and the float block (random weights, u and v included;
    with padding), and its next memory is the float block's; the config comes back."""
    block = random_block(norm_first=norm_first)
    layout = with_layout(block, quantize=False)
    memory = MEMORY if with_memory else None
    out, _ = layout(X, memory=memory, use_causal_mask=use_causal_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out),
                               numpy_block(block, X, memory, causal=use_causal_mask), atol=1e-4)
    expected, expected_memory = block(X, memory=memory, padding_mask=PADDING,
                                      use_causal_mask=use_causal_mask)
    got, got_memory = layout(X, memory=memory, padding_mask=PADDING,
                             use_causal_mask=use_causal_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(expected),
                               atol=1e-5)
    np.testing.assert_array_equal(ops.convert_to_numpy(got_memory),
                                  ops.convert_to_numpy(expected_memory))
    again = TransformerXLBlock.from_config(layout.get_config())
    assert again.quantization == layout.int8_layout_config()
    assert again.get_config() == layout.get_config()


def test_the_rounded_layout_reads_the_memory_through_its_int8_matmul_and_stays_causal():
    """Rounded (all-int8, the input rounded by the block): the output is on its int8 grid
    and near the float block's; the memory's rows go through the Q/K/V matmul and its
    quantizer (a wider memory widens the Q/K/V range) and change every output; a later
    token of the segment changes no earlier output."""
    block = random_block()
    quantized = calibrated(with_layout(block, quantize_input=True), MEMORY)
    out = ops.convert_to_numpy(quantized(X, memory=MEMORY)[0])
    step = float(quantized.output_quantizer().step())
    codes = (out - out.min()) / step
    np.testing.assert_allclose(codes, np.round(codes), atol=2e-3)
    assert len(np.unique(np.round(codes))) > 20
    error = np.abs(out - ops.convert_to_numpy(block(X, memory=MEMORY)[0]))
    assert 0 < error.mean() < 0.03, error.mean()  # measured 0.0074 (0.7 of a step)
    qkv_range = float(quantized.quantizers["qkv_quantizer"].max_value.numpy())
    widened = calibrated(with_layout(block, quantize_input=True), 10.0 * MEMORY)
    # Measured: 4.1 -> 42.9.
    assert float(widened.quantizers["qkv_quantizer"].max_value.numpy()) > 5 * qkv_range
    other_memory = ops.convert_to_numpy(quantized(X, memory=MEMORY + 1.0)[0])
    assert (np.abs(other_memory - out).max(-1) > step).all()  # measured: 7 steps or more
    changed = X.copy()
    changed[:, 2:] += 1.0
    later = ops.convert_to_numpy(quantized(changed, memory=MEMORY)[0])
    np.testing.assert_array_equal(later[:, :2], out[:, :2])
    assert not np.allclose(later[:, 2:], out[:, 2:])


@pytest.mark.parametrize("kwargs, match", [
    ({"quantization": {"float_residuals": True}}, "Unknown int8 layout setting"),
    ({"quantization": {}, "key_dim": 3}, "key_dim \\* num_heads"),
    ({"quantization": {"quantize_input": True}, "norm_first": True}, "residual stream"),
])
def test_int8_layout_errors_name_the_setting(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerXLBlock(num_heads=H, intermediate_dim=FF, **kwargs)(X)
