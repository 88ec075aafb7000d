import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_float_ops import run_in_float
from keras_attn.export.tflite.tflite_float_ops import xnnpack_partitions

pytestmark = pytest.mark.tensorflow  # TFLite: TensorFlow only

# Ranges [-128 s, 127 s]: zero is a code, so FakeQuant needs no nudging.
SCORE_RANGE, VALUE_RANGE = (-6.0, 6.0 * 127 / 128), (-2.0, 2.0 * 127 / 128)
PROBABILITY_RANGE = (0.0, 255.0 / 256.0)


def fake_quant(x, value_range):
    return tf.quantization.fake_quant_with_min_max_args(x, *value_range)


def int8_model(function, shapes):
    """An int8 `.tflite` of `function` with its FakeQuant ranges, converted like the export's
    float-residual int8 file (no representative data: only fake-quantized tensors are int8)."""
    specs = [tf.TensorSpec(shape, tf.float32) for shape in shapes]
    concrete = tf.function(function, input_signature=specs).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return converter.convert()


def run(content, *inputs):
    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    for detail, value in zip(interpreter.get_input_details(), inputs):
        interpreter.set_tensor(detail["index"], value)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def grid(x, value_range):
    """NumPy FakeQuant with `value_range` (one whose zero is a code)."""
    low, high = value_range
    step = (high - low) / 255.0
    return np.round((np.clip(x, low, high) - low) / step) * step + low


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def float_ops(content):
    return tflite_op_report(content)["non_int8_ops"]


@pytest.fixture(scope="module")
def attention_inputs():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(1, 5, 2, 4)).astype("float32") for _ in range(3)]


def heads(x):
    """`(B, T, n, d)` -> `(B, n, T, d)` after int8 rounding: as in `EncoderInt8Layout`, the
    attention reads int8 tensors that an int8 op (here TRANSPOSE) made."""
    return tf.transpose(fake_quant(x, VALUE_RANGE), (0, 2, 1, 3))


def attention(query, key, value):
    """softmax(Q K^T) V with the fake quantization of `EncoderInt8Layout` (float mask aside)."""
    query, key, value = (heads(x) for x in (query, key, value))
    scores = fake_quant(tf.matmul(query, key, transpose_b=True), SCORE_RANGE)
    probabilities = fake_quant(tf.nn.softmax(scores, -1), PROBABILITY_RANGE)
    return fake_quant(tf.matmul(probabilities, value), VALUE_RANGE)


def test_attention_runs_in_float_between_its_int8_inputs_and_output(attention_inputs):
    content = int8_model(attention, [(1, 5, 2, 4)] * 3)
    assert {"BATCH_MATMUL", "SOFTMAX"}.isdisjoint(float_ops(content))  # int8 kernels
    rewritten = run_in_float(content)
    ops = float_ops(rewritten)
    assert ops["BATCH_MATMUL"] == 2 and ops["SOFTMAX"] == 1, ops
    # Q, K, V dequantized once each; the scores and probabilities never go back to int8:
    # one QUANTIZE per input and one for the output.
    assert ops["DEQUANTIZE"] == 3 + 1 and ops["QUANTIZE"] == 3 + 1, ops

    query, key, value = (grid(x, VALUE_RANGE).transpose(0, 2, 1, 3) for x in attention_inputs)
    expected = grid(softmax(query @ key.swapaxes(-1, -2)) @ value, VALUE_RANGE)
    out = run(rewritten, *attention_inputs)
    step = (VALUE_RANGE[1] - VALUE_RANGE[0]) / 255.0
    # Float summation order may move a value across a rounding boundary: at most one step.
    assert np.abs(out - expected).max() <= step * 1.001
    assert np.mean(np.abs(out - expected) < 1e-6) > 0.95
    # The int8 kernels are farther from the float computation (scores and probabilities
    # rounded to int8, a fixed-point softmax).
    reference = softmax(query @ key.swapaxes(-1, -2)) @ value
    assert (np.abs(out - reference).mean()
            < np.abs(run(content, *attention_inputs) - reference).mean())


def test_a_constant_int8_input_becomes_the_same_float_constant():
    keep = np.array([True, True, True, False, False])

    def masked(scores):
        # The padding mask of `ActivationQuantizer(stats_mask=...)`: masked keys set to the
        # bottom of the score range, a constant.
        scores = tf.where(keep, scores, SCORE_RANGE[0] * tf.ones_like(scores))
        return fake_quant(tf.nn.softmax(fake_quant(scores, SCORE_RANGE), -1),
                          PROBABILITY_RANGE)

    x = np.random.default_rng(1).normal(size=(1, 2, 5, 5)).astype("float32")
    content = int8_model(lambda s: masked(fake_quant(s, SCORE_RANGE)), [x.shape])
    rewritten = run_in_float(content)
    ops = float_ops(rewritten)
    assert {"SELECT_V2", "SOFTMAX"} <= set(ops)
    # The model's input is quantized only to be read in float by SELECT_V2, and the select's
    # output only to be read by SOFTMAX: both round trips go, and the output is rounded once.
    assert ops["QUANTIZE"] == ops["DEQUANTIZE"] == 1, ops
    expected = grid(softmax(np.where(keep, x, SCORE_RANGE[0])), PROBABILITY_RANGE)
    out = run(rewritten, x)
    assert np.abs(out - expected).max() <= (1 / 256) * 1.001
    assert np.mean(np.abs(out - expected) < 1e-6) > 0.95


def test_the_rewritten_bert_block_is_one_xnnpack_graph_like_fp32(attention_inputs):
    """The point of the rewrite: XNNPACK takes every op it takes in the fp32 graph."""
    def block(query, key, value):
        return tf.nn.gelu(attention(query, key, value), approximate=False)

    def with_activation(query, key, value):
        return fake_quant(tf.nn.gelu(attention(query, key, value)), VALUE_RANGE)

    content = int8_model(with_activation, [(1, 5, 2, 4)] * 3)
    specs = [tf.TensorSpec((1, 5, 2, 4), tf.float32)] * 3
    fp32 = tf.lite.TFLiteConverter.from_concrete_functions(
        [tf.function(block, input_signature=specs).get_concrete_function()]).convert()

    partitions = xnnpack_partitions
    assert partitions(content) > partitions(fp32)  # int8 GELU, SOFTMAX, BATCH_MATMUL: builtin
    assert partitions(run_in_float(content)) == partitions(fp32) == 1


def test_ops_not_asked_for_and_float_models_are_left_alone(attention_inputs):
    content = int8_model(attention, [(1, 5, 2, 4)] * 3)
    only_softmax = float_ops(run_in_float(content, op_names=("SOFTMAX",)))
    assert "SOFTMAX" in only_softmax and "BATCH_MATMUL" not in only_softmax
    fp32 = tf.lite.TFLiteConverter.from_concrete_functions([
        tf.function(lambda x: tf.nn.softmax(x), input_signature=[
            tf.TensorSpec((1, 4), tf.float32)]).get_concrete_function()]).convert()
    x = attention_inputs[0][0, :1, 0]
    assert tflite_op_report(run_in_float(fp32))["ops"] == tflite_op_report(fp32)["ops"]
    np.testing.assert_array_equal(run(run_in_float(fp32), x), run(fp32, x))


def test_an_unknown_op_name_is_refused():
    with pytest.raises(ValueError, match="'SOFTMAXX' is not a TFLite builtin operator name"):
        run_in_float(b"", op_names=("SOFTMAXX",))
