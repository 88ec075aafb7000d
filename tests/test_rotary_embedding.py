import math

import numpy as np
import pytest
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.rotary_embedding import RotaryEmbedding
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)


def reference_rope(x, base=10000.0, start=0, scaling_factor=1.0):
    """Rotates each pair (i, i + d/2) of x (B, T, ..., d) by the 2x2 matrix R(m theta_i)."""
    x = np.asarray(x, "float64")
    d = x.shape[-1]
    half = d // 2
    out = np.empty_like(x)
    for t in range(x.shape[1]):
        m = (start + t) / scaling_factor
        for i in range(half):
            theta = base ** (-2 * i / d)
            c, s = math.cos(m * theta), math.sin(m * theta)
            rotation = np.array([[c, -s], [s, c]])
            pair = np.stack([x[:, t, ..., i], x[:, t, ..., i + half]], axis=-1)  # (B, .., 2)
            rotated = pair @ rotation.T
            out[:, t, ..., i], out[:, t, ..., i + half] = rotated[..., 0], rotated[..., 1]
    return out


def test_equals_explicit_rotation_matrices_rank4():
    x = RNG.normal(size=(2, 6, 3, 8)).astype("float32")  # (B, T, H, d)
    out = ops.convert_to_numpy(RotaryEmbedding()(x))
    np.testing.assert_allclose(out, reference_rope(x), atol=1e-5)


def test_equals_explicit_rotation_matrices_rank3_and_base():
    x = RNG.normal(size=(2, 5, 6)).astype("float32")  # (B, T, d)
    out = ops.convert_to_numpy(RotaryEmbedding(max_wavelength=100)(x))
    np.testing.assert_allclose(out, reference_rope(x, base=100.0), atol=1e-5)


def test_position_zero_is_identity_and_norm_is_preserved():
    x = RNG.normal(size=(1, 7, 2, 8)).astype("float32")
    out = ops.convert_to_numpy(RotaryEmbedding()(x))
    np.testing.assert_allclose(out[:, 0], x[:, 0], atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-5)


def test_dot_product_depends_only_on_relative_position():
    # <RoPE(q, m), RoPE(k, n)> = q^T R(n - m) k: equal for (m, n) and (m + s, n + s).
    rope = RotaryEmbedding()
    q = RNG.normal(size=(8,)).astype("float32")
    k = RNG.normal(size=(8,)).astype("float32")

    def score(m, n):
        rq = ops.convert_to_numpy(rope(q[None, None, None], start_index=m))[0, 0, 0]
        rk = ops.convert_to_numpy(rope(k[None, None, None], start_index=n))[0, 0, 0]
        return float(rq @ rk)

    for m, n in [(0, 3), (5, 2), (4, 4)]:
        for shift in (1, 7, 30):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert abs(score(0, 3) - score(0, 1)) > 1e-3  # and it does depend on m - n


def test_start_index_equals_slice_of_longer_sequence():
    x = RNG.normal(size=(2, 9, 2, 4)).astype("float32")
    full = ops.convert_to_numpy(RotaryEmbedding()(x))
    for k in (1, 6):
        part = RotaryEmbedding()(x[:, k:k + 3], start_index=k)
        np.testing.assert_allclose(ops.convert_to_numpy(part), full[:, k:k + 3], atol=1e-6)
    part = RotaryEmbedding()(x[:, 4:5], start_index=ops.convert_to_tensor(4, "int32"))
    np.testing.assert_allclose(ops.convert_to_numpy(part), full[:, 4:5], atol=1e-6)
    np.testing.assert_allclose(
        ops.convert_to_numpy(RotaryEmbedding()(x[:, :3], start_index=5)),
        reference_rope(x[:, :3], start=5), atol=1e-5,
    )


def test_scaling_factor_divides_positions():
    x = RNG.normal(size=(1, 8, 1, 4)).astype("float32")
    out = ops.convert_to_numpy(RotaryEmbedding(scaling_factor=4.0)(x, start_index=2))
    np.testing.assert_allclose(out, reference_rope(x, start=2, scaling_factor=4.0), atol=1e-5)
    # Position 4 with factor 4 is rotated like position 1 without.
    a = ops.convert_to_numpy(RotaryEmbedding(scaling_factor=4.0)(x[:, :1], start_index=4))
    b = ops.convert_to_numpy(RotaryEmbedding()(x[:, :1], start_index=1))
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_wavelength=1"):
        RotaryEmbedding(max_wavelength=1)
    with pytest.raises(ValueError, match="scaling_factor=0.5"):
        RotaryEmbedding(scaling_factor=0.5)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding()(np.zeros((1, 2, 5), "float32"))


def test_layer_test_case():
    x = RNG.normal(size=(2, 4, 2, 8)).astype("float32")
    out = run_layer_test(
        RotaryEmbedding, {"max_wavelength": 10000, "scaling_factor": 2.0}, x,
        expected_output_shape=(2, 4, 2, 8), run_fit=False,
    )
    np.testing.assert_allclose(out, reference_rope(x, scaling_factor=2.0), atol=1e-5)


def test_multi_head_attention_kv_cache_decoding_equals_full_causal():
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    mha = MultiHeadAttention(num_heads=2, key_dim=4, rotary_max_wavelength=10000)
    full = ops.convert_to_numpy(mha(x, use_causal_mask=True))
    cache = ops.zeros((2, 2, 6, 2, 4))  # (B, 2, T, H, dk)
    steps = []
    for t in range(6):
        out, cache = mha(x[:, t:t + 1], cache=cache, cache_update_index=t,
                         use_causal_mask=True)
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
    # The rotation is really applied: without it the outputs differ.
    plain = MultiHeadAttention(num_heads=2, key_dim=4)
    plain(x)
    plain.set_weights(mha.get_weights())
    assert np.max(np.abs(ops.convert_to_numpy(plain(x, use_causal_mask=True)) - full)) > 1e-4
