"""`copy_quantized_weights`: a GPT's quantization-aware full-sequence model carried onto
the `quantize_model` copy of its decoding step (what a QAT language model's int8 file holds)."""

import keras
import numpy as np
import pytest

from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.quantization import QuantizationRecipe
from keras_attn.quantization import calibrate_model
from keras_attn.quantization import copy_quantized_weights
from keras_attn.quantization import quantize_model
from keras_attn.quantization.quantized_weights import named_layers

# The decoding step's calibration is the export's (TFLite): on JAX the step copy's LM-head
# range comes out non-finite (noted in docs/export.md), so these run on TensorFlow.
pytestmark = pytest.mark.tensorflow

LENGTH, VOCABULARY = 10, 24


@pytest.fixture(scope="module")
def models():
    """A float GPT, its calibrated QAT copy with weights moved away from the float ones (as
    training moves them), token ids, and its step model's calibrated QAT copy."""
    keras.utils.set_random_seed(3)
    lm = GPTCausalLM(GPTBackbone(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2,
                                 hidden_dim=16, intermediate_dim=32, max_sequence_length=LENGTH))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCABULARY, (8, LENGTH)).astype("int32")
    batch = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    layout = QuantizationRecipe().layout()
    qat = quantize_model(lm, **layout)
    calibrate_model(qat, [batch])
    for weight in qat.trainable_weights:  # "QAT": 20 % noise on every trained weight
        value = keras.ops.convert_to_numpy(weight)
        weight.assign(value + 0.2 * value.std() * rng.normal(size=value.shape))
    step = lm.decoder_step_model(LENGTH)
    recorded, cache = [], np.zeros((len(ids), *step.input["cache"].shape[1:]), "float32")
    for index in range(LENGTH):
        inputs = {"token_ids": ids[:, index:index + 1],
                  "cache_update_index": np.full((len(ids),), index, "int32"), "cache": cache}
        recorded.append(inputs)
        cache = keras.ops.convert_to_numpy(step(inputs)["cache"])
    qstep = quantize_model(step, **layout)
    calibrate_model(qstep, recorded)
    return qat, qstep, ids


def _stepped_logits(qstep, ids):
    """`(B, T, V)` logits of `qstep` fed `ids` token by token."""
    cache = np.zeros((len(ids), *qstep.input["cache"].shape[1:]), "float32")
    logits = []
    for index in range(ids.shape[1]):
        out = qstep({"token_ids": ids[:, index:index + 1],
                     "cache_update_index": np.full((len(ids),), index, "int32"),
                     "cache": cache})
        cache = keras.ops.convert_to_numpy(out["cache"])
        logits.append(keras.ops.convert_to_numpy(out["logits"]))
    return np.stack(logits, axis=1)


def test_the_step_copy_computes_what_the_trained_sequence_model_computes(models):
    qat, qstep, ids = models
    full = keras.ops.convert_to_numpy(qat({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    before = np.abs(_stepped_logits(qstep, ids) - full).max()
    assert copy_quantized_weights(qat, qstep) == ["cache_input_quantizer"]
    after = np.abs(_stepped_logits(qstep, ids) - full).max()
    head = qat.get_layer("lm_head").output_quantizer
    logit_step = float(keras.ops.convert_to_numpy(head.max_value - head.min_value)) / 255
    # The step rounds its cache once more (its own input quantizer): a few logit steps.
    assert after <= 3 * logit_step, (after, logit_step)
    assert before > 10 * after  # the calibrated float weights were far from the trained ones
    for name in ("transformer_layer_1", "final_layer_norm", "embeddings"):
        for a, b in zip(qat.layers[2].get_layer(name).weights,  # the nested backbone
                        qstep.get_layer(name).weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                          keras.ops.convert_to_numpy(b))


def test_models_of_other_layouts_or_duplicate_names_are_refused(models):
    qat, _, _ = models
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, name="final_layer_norm")(inputs)
    other = quantize_model(keras.Model(inputs, hidden))
    with pytest.raises(ValueError, match="layer 'final_layer_norm': QuantizedLayerNormalization "
                                         r"with weights \[\(16,\), \(16,\)\] in gpt_causal_lm\w*, "
                                         "QuantizedDense with"):
        copy_quantized_weights(qat, other)
    inner = keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs), name="inner")
    outer = keras.Model(inputs, keras.layers.Dense(2, name="dense")(inner(inputs)))
    with pytest.raises(ValueError, match="two layers of .* are named 'dense'"):
        named_layers(outer)
