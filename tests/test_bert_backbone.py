"""BertBackbone: numbers against a numpy BERT, published parameter counts, padding
invariance, serialization and SavedModel export."""

import math
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.bert_backbone import BERT_PRESETS
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import bert_parameter_count
from tests.numpy_reference import mha_weights
from tests.numpy_reference import np_ffn
from tests.numpy_reference import np_layer_norm
from tests.numpy_reference import np_mha
from tests.tolerances import float32_path_atol

# transformers' BertModel (with pooler) for bert-base-uncased and bert-large-uncased:
# sum(p.numel() for p in BertModel(config).parameters()).
HF_BERT_BASE_PARAMETERS = 109_482_240
HF_BERT_LARGE_PARAMETERS = 335_141_888

TINY = dict(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=12)


def tiny_inputs(batch=2, length=6, seed=0):
    rng = np.random.default_rng(seed)
    padding = np.ones((batch, length), "int32")
    padding[1, length - 2:] = 0
    return {
        "token_ids": (rng.integers(1, 40, (batch, length)) * padding).astype("int32"),
        "segment_ids": np.concatenate(
            [np.zeros((batch, length // 2)), np.ones((batch, length - length // 2))], 1
        ).astype("int32"),
        "padding_mask": padding,
    }


def randomized_backbone(seed=0, **kwargs):
    model = BertBackbone(**{**TINY, "dropout": 0.0, **kwargs})
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(scale=0.5, size=w.shape) for w in model.get_weights()])
    return model


def np_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def numpy_bert(model, inputs):
    """BERT from the paper's formulas, reading only the model's weights."""
    def w(layer, name):
        return ops.convert_to_numpy(getattr(layer, name)).astype("float64")

    embeddings = model.get_layer("embeddings")
    ids, segments = inputs["token_ids"], inputs["segment_ids"]
    length = ids.shape[1]
    x = (w(embeddings.token_embedding, "embeddings")[ids]
         + w(embeddings.segment_embedding, "embeddings")[segments]
         + w(embeddings.position_embedding, "embeddings")[:length])
    x = np_layer_norm(x, model.get_layer("embeddings_layer_norm"))
    outputs = []
    for b in range(len(ids)):
        h = x[b]
        keys = inputs["padding_mask"][b].astype(bool)
        mask = np.broadcast_to(keys[None, :], (length, length))
        for block in model.transformer_layers:
            h = np_layer_norm(h + np_mha(h, h, mha_weights(block.self_attention), mask),
                              block.self_attention_layer_norm)
            h = np_layer_norm(h + np_ffn(h, block, np_gelu), block.feedforward_layer_norm)
        outputs.append(h)
    sequence = np.stack(outputs)
    pooler = model.get_layer("pooled_dense")
    pooled = np.tanh(sequence[:, 0] @ w(pooler, "kernel") + w(pooler, "bias"))
    return sequence, pooled


def hf_formula_parameter_count(V, L, H, F, P=512, S=2):
    # Written from BertModel's modules: embeddings (word, position, token type, LayerNorm);
    # per layer Q, K, V, attention output dense, LayerNorm, intermediate dense, output
    # dense, LayerNorm; pooler dense.
    embeddings = V * H + P * H + S * H + 2 * H
    attention = 3 * (H * H + H) + (H * H + H) + 2 * H
    feedforward = (H * F + F) + (F * H + H) + 2 * H
    return embeddings + L * (attention + feedforward) + (H * H + H)


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_matches_numpy_bert(fused_qkv):
    model = randomized_backbone(fused_qkv=fused_qkv)
    inputs = tiny_inputs()
    out = model(inputs)
    sequence, pooled = numpy_bert(model, inputs)
    np.testing.assert_allclose(ops.convert_to_numpy(out["sequence_output"]), sequence,
                               atol=2e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(out["pooled_output"]), pooled, atol=2e-5)


def test_padding_does_not_change_real_tokens():
    model = randomized_backbone()
    inputs = tiny_inputs()
    short = {k: v[1:, :4] for k, v in inputs.items()}  # row 1 without its 2 pads
    padded = ops.convert_to_numpy(model(inputs)["sequence_output"])[1, :4]
    unpadded = ops.convert_to_numpy(model(short)["sequence_output"])[0]
    np.testing.assert_allclose(padded, unpadded, atol=1e-5)
    # Changing a padded token id changes nothing either.
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["token_ids"][1, -1] = 7
    np.testing.assert_allclose(
        ops.convert_to_numpy(model(changed)["sequence_output"])[1, :4], padded, atol=1e-6)


def test_segment_ids_matter():
    model = randomized_backbone()
    inputs = tiny_inputs()
    swapped = dict(inputs, segment_ids=1 - inputs["segment_ids"])
    a = ops.convert_to_numpy(model(inputs)["sequence_output"])
    b = ops.convert_to_numpy(model(swapped)["sequence_output"])
    assert np.abs(a - b).max() > 1e-2


@pytest.mark.parametrize("name", sorted(BERT_PRESETS))
def test_preset_formula_matches_independent_count(name):
    config = BERT_PRESETS[name]
    assert config["vocabulary_size"] == 30522
    expected = hf_formula_parameter_count(
        config["vocabulary_size"], config["num_layers"], config["hidden_dim"],
        config["intermediate_dim"], config["max_sequence_length"], config["num_segments"])
    assert bert_parameter_count(**config) == expected


def test_presets_have_published_sizes():
    sizes = {n: (c["num_layers"], c["hidden_dim"], c["num_heads"], c["intermediate_dim"])
             for n, c in BERT_PRESETS.items()}
    assert sizes["bert_tiny"] == (2, 128, 2, 512)
    assert sizes["bert_mini"] == (4, 256, 4, 1024)
    assert sizes["bert_small"] == (4, 512, 8, 2048)
    assert sizes["bert_base"] == (12, 768, 12, 3072)
    assert sizes["bert_large"] == (24, 1024, 16, 4096)
    assert sizes["minilm_l6_h384"] == (6, 384, 12, 1536)
    assert bert_parameter_count(**BERT_PRESETS["bert_large"]) == HF_BERT_LARGE_PARAMETERS


def test_bert_base_parameter_count():
    model = BertBackbone.from_preset("bert_base")
    count = model.count_params()
    assert count == hf_formula_parameter_count(30522, 12, 768, 3072)
    assert count == HF_BERT_BASE_PARAMETERS  # hence within 1 % of it, exactly
    assert abs(count - 110e6) / 110e6 < 0.01  # "BERT-base, 110M parameters" (the paper)


def test_small_preset_builds_with_formula_count():
    model = BertBackbone.from_preset("bert_tiny", max_sequence_length=64)
    assert model.count_params() == bert_parameter_count(
        **{**BERT_PRESETS["bert_tiny"], "max_sequence_length": 64})


@pytest.mark.slow
def test_bert_large_parameter_count():
    model = BertBackbone.from_preset("bert_large")
    assert model.count_params() == HF_BERT_LARGE_PARAMETERS
    assert abs(model.count_params() - 340e6) / 340e6 < 0.02  # "BERT-large, 340M"


def test_config_round_trip_and_keras_save(tmp_path):
    model = randomized_backbone(fused_qkv=False)
    config = model.get_config()
    clone = BertBackbone.from_config(config)
    assert clone.get_config() == config
    inputs = tiny_inputs()
    expected = model.predict(inputs, verbose=0)
    path = os.path.join(tmp_path, "bert.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded, BertBackbone) and not loaded.fused_qkv
    got = loaded.predict(inputs, verbose=0)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(got[key], expected[key])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="SavedModel export of a Keras model needs the TensorFlow backend")
def test_saved_model_export(tmp_path):
    import tensorflow as tf

    model = randomized_backbone()
    inputs = tiny_inputs()
    expected = model.predict(inputs, verbose=0)
    path = os.path.join(tmp_path, "saved_model")
    model.export(path, format="tf_saved_model", verbose=0)
    reloaded = tf.saved_model.load(path)
    got = reloaded.serve({k: tf.constant(v) for k, v in inputs.items()})
    for key in ("sequence_output", "pooled_output"):
        # Graph vs Keras predict, other kernels (tests/tolerances.py): 2 blocks of 6
        # reductions plus the embedding norm and the pooler, sums of at most 16 terms.
        atol = float32_path_atol(expected[key], reduction=16, depth=2 * 6 + 2)
        np.testing.assert_allclose(got[key].numpy(), expected[key], atol=atol)


def test_mixed_precision_keeps_float32_weights():
    model = BertBackbone(**TINY, dtype="mixed_float16")
    out = model(tiny_inputs())
    assert keras.backend.standardize_dtype(out["sequence_output"].dtype) == "float16"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in model.weights)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(hidden_dim=10, num_heads=4), "hidden_dim.*divisible.*num_heads"),
        (dict(num_layers=0), "num_layers"),
        (dict(dropout=1.0), "dropout"),
        (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon"),
        (dict(num_segments=0), "num_segments"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BertBackbone(**{**TINY, **kwargs})


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown BERT preset.*bert_base.*name='bert_huge'"):
        BertBackbone.from_preset("bert_huge")
