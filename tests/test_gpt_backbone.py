import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.gpt_backbone import GPT_PRESETS
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_backbone import gpt_parameter_count
from tests.numpy_reference import mha_weights
from tests.numpy_reference import np_ffn
from tests.numpy_reference import np_gelu_tanh
from tests.numpy_reference import np_layer_norm
from tests.numpy_reference import np_mha

TINY = dict(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=12, dropout=0.0)


def tiny_backbone(seed=0, **overrides):
    backbone = GPTBackbone(**{**TINY, **overrides})
    rng = np.random.default_rng(seed)
    backbone.set_weights([rng.normal(scale=0.4, size=w.shape) for w in backbone.get_weights()])
    return backbone


def np_gpt(backbone, token_ids, padding_mask):
    """GPT-2 forward pass in numpy, from the backbone's weights (Radford et al., 2019)."""
    embeddings = backbone.get_layer("embeddings")
    wte = ops.convert_to_numpy(embeddings.token_embedding.embeddings).astype("float64")
    wpe = ops.convert_to_numpy(embeddings.position_embedding.embeddings).astype("float64")
    T = token_ids.shape[1]
    out = []
    for ids, mask in zip(token_ids, padding_mask):
        h = wte[ids] + wpe[:T]  # (T, H)
        allowed = np.tril(np.ones((T, T), bool)) & mask.astype(bool)[None, :]  # (T, T)
        for block in backbone.transformer_layers:
            a = np_layer_norm(h, block.self_attention_layer_norm)
            h = h + np_mha(a, a, mha_weights(block.self_attention), allowed)
            f = np_layer_norm(h, block.feedforward_layer_norm)
            h = h + np_ffn(f, block, np_gelu_tanh)
        out.append(np_layer_norm(h, backbone.get_layer("final_layer_norm")))
    return np.stack(out)


def test_matches_numpy_gpt2_forward():
    backbone = tiny_backbone()
    ids = np.array([[3, 9, 1, 27, 5, 0], [8, 8, 2, 0, 0, 0]], "int32")
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], "int32")
    got = ops.convert_to_numpy(backbone({"token_ids": ids, "padding_mask": mask}))
    want = np_gpt(backbone, ids, mask)
    np.testing.assert_allclose(got[0], want[0], atol=2e-5)
    np.testing.assert_allclose(got[1, :3], want[1, :3], atol=2e-5)


def test_causal_and_right_padding_leave_earlier_outputs_unchanged():
    backbone = tiny_backbone(seed=1)
    ids = np.array([[4, 7, 1, 2, 9]], "int32")
    base = ops.convert_to_numpy(backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    changed = ids.copy()
    changed[0, 3:] = [20, 21]
    masked = np.array([[1, 1, 1, 0, 0]], "int32")
    for other_ids, other_mask in ((changed, np.ones_like(ids)), (changed, masked)):
        out = ops.convert_to_numpy(
            backbone({"token_ids": other_ids, "padding_mask": other_mask})
        )
        np.testing.assert_allclose(out[:, :3], base[:, :3], atol=1e-6)
        assert np.abs(out[:, 3:] - base[:, 3:]).max() > 1e-3


def test_layer_names_and_pre_ln_blocks():
    backbone = tiny_backbone()
    names = [layer.name for layer in backbone.layers]
    for name in ("embeddings", "embeddings_dropout", "transformer_layer_0",
                 "transformer_layer_1", "final_layer_norm"):
        assert name in names
    block = backbone.transformer_layers[0]
    assert block.norm_first and block.self_attention.fused_qkv
    assert block.cross_attention is None
    assert backbone.token_embedding.embeddings.shape == (30, 8)


# === Parameter counts ===

# transformers' GPT2LMHeadModel.num_parameters() for the four released checkpoints.
PUBLISHED = {
    "gpt2_small": 124_439_808,
    "gpt2_medium": 354_823_168,
    "gpt2_large": 774_030_080,
    "gpt2_xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_formula_matches_published_gpt2(name):
    assert gpt_parameter_count(**GPT_PRESETS[name]) == PUBLISHED[name]


def test_formula_counts_the_built_model():
    for kwargs in (GPT_PRESETS["gpt2_tiny"], TINY,
                   dict(TINY, hidden_dim=12, num_heads=3, intermediate_dim=20)):
        sizes = {k: v for k, v in kwargs.items() if k != "dropout"}
        assert GPTBackbone(**kwargs).count_params() == gpt_parameter_count(**sizes)


@pytest.mark.slow
def test_gpt2_small_has_124m_parameters():
    # Building the 124M model takes ~15 s on a 2-core CPU, hence slow.
    assert GPTBackbone.from_preset("gpt2_small").count_params() == 124_439_808


# === Config and serialization ===


def test_config_round_trip_and_keras_save_load(tmp_path):
    backbone = tiny_backbone(seed=2)
    inputs = {"token_ids": np.array([[1, 2, 3, 4]], "int32"),
              "padding_mask": np.ones((1, 4), "int32")}
    want = ops.convert_to_numpy(backbone(inputs))
    clone = GPTBackbone.from_config(backbone.get_config())
    clone.set_weights(backbone.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(clone(inputs)), want, atol=1e-6)
    path = os.path.join(tmp_path, "gpt.keras")
    backbone.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GPTBackbone)
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(inputs)), want, atol=1e-6)


def test_from_preset_overrides_and_unknown_name():
    backbone = GPTBackbone.from_preset("gpt2_tiny", max_sequence_length=16)
    assert backbone.max_sequence_length == 16 and backbone.num_layers == 2
    with pytest.raises(ValueError, match="Unknown GPT preset.*gpt2_tiny.*name='gpt3'"):
        GPTBackbone.from_preset("gpt3")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(hidden_dim=10, num_heads=4), "divisible by `num_heads`.*hidden_dim=10"),
        (dict(num_layers=0), "num_layers=0"),
        (dict(dropout=1.0), "dropout=1.0"),
        (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon=0.0"),
        (dict(max_sequence_length=None), "max_sequence_length=None"),
    ],
)
def test_argument_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        GPTBackbone(**{**TINY, **overrides})
