"""`share_quantization_parameters`: the same model, each quantization table stored once."""

import tempfile

import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from tensorflow.lite.python import schema_py_generated as schema

from keras_attn.export.tflite.tflite_sharing import BUFFER_ALIGNMENT
from keras_attn.export.tflite.tflite_sharing import pack_model
from keras_attn.export.tflite.tflite_sharing import share_quantization_parameters

pytestmark = pytest.mark.tensorflow  # TFLite: TensorFlow only

LENGTHS = (4, 8)


def two_signature_model(optimize):
    """A `.tflite` with a (64, 64) kernel used by two signatures of lengths 4 and 8, as a
    bucketed file uses its weights (dynamic int8: per-channel scales in each subgraph)."""
    kernel = tf.constant(np.random.default_rng(0).normal(size=(64, 64)).astype("float32"))
    signatures = {}
    for length in LENGTHS:
        @tf.function(input_signature=[tf.TensorSpec((1, length, 64), tf.float32, name="x")])
        def serve(x):
            return {"y": tf.nn.relu(tf.matmul(x, kernel))}
        signatures[f"tokens_{length}"] = serve.get_concrete_function()
    with tempfile.TemporaryDirectory() as directory:
        tf.saved_model.save(tf.Module(), directory, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        converter.optimizations = [tf.lite.Optimize.DEFAULT] if optimize else []
        return converter.convert()


@pytest.fixture(scope="module")
def dynamic_int8():
    return two_signature_model(optimize=True)


def unpacked(content):
    return schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(bytearray(content), 0))


def assert_same(a, b, where="model"):
    """Recursive equality of two unpacked flatbuffers (`schema.ModelT`)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), where)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__"):
        assert type(a) is type(b), where
        for name in vars(a):
            if not name.startswith("_"):
                assert_same(getattr(a, name), getattr(b, name), f"{where}.{name}")
    else:
        assert a == b, (where, a, b)


def scale_tables(content):
    """File positions of the per-channel quantization tables, per subgraph."""
    model = schema.Model.GetRootAsModel(bytearray(content), 0)
    positions = []
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        tables = [graph.Tensors(t).Quantization() for t in range(graph.TensorsLength())]
        positions.append({q._tab.Pos for q in tables if q is not None and q.ScaleLength() > 1})
    return positions


def test_the_shared_model_unpacks_to_the_same_model(dynamic_int8):
    shared = share_quantization_parameters(dynamic_int8)
    assert_same(unpacked(dynamic_int8), unpacked(shared))


def test_the_weight_scales_are_stored_once(dynamic_int8):
    before, after = scale_tables(dynamic_int8), scale_tables(share_quantization_parameters(
        dynamic_int8))
    assert len(before[0]) == 1 and before[0] != before[1]  # the converter: one per subgraph
    assert len(after[0]) == 1 and after[0] == after[1]
    # 64 channels of a float32 scale and an int64 zero point, once less.
    assert len(dynamic_int8) - len(share_quantization_parameters(dynamic_int8)) >= 64 * 12


def test_the_shared_model_computes_the_same_outputs_bit_for_bit(dynamic_int8):
    x = np.random.default_rng(1).normal(size=(1, 8, 64)).astype("float32")
    original = Interpreter(model_content=dynamic_int8)
    shared = Interpreter(model_content=share_quantization_parameters(dynamic_int8))
    for length in LENGTHS:
        key = f"tokens_{length}"
        np.testing.assert_array_equal(
            shared.get_signature_runner(key)(x=x[:, :length])["y"],
            original.get_signature_runner(key)(x=x[:, :length])["y"])


def test_constant_buffers_stay_aligned():
    content = share_quantization_parameters(two_signature_model(optimize=False))
    model = schema.Model.GetRootAsModel(bytearray(content), 0)
    starts = [model.Buffers(b)._tab.Vector(model.Buffers(b)._tab.Offset(4))
              for b in range(model.BuffersLength()) if model.Buffers(b).DataLength()]
    assert len(starts) >= 1  # the float kernel
    assert all(start % BUFFER_ALIGNMENT == 0 for start in starts), starts


def test_pack_model_leaves_the_model_unchanged(dynamic_int8):
    """`embed_metadata` writes the model it unpacked with `pack_model`: the same bytes as
    `share_quantization_parameters`, and the `ModelT` is not rewritten."""
    model = unpacked(dynamic_int8)
    buffers = model.buffers
    scales = [tensor.quantization for tensor in model.subgraphs[1].tensors]
    assert pack_model(model) == share_quantization_parameters(dynamic_int8)
    assert model.buffers is buffers
    assert [tensor.quantization for tensor in model.subgraphs[1].tensors] == scales
    assert_same(model, unpacked(dynamic_int8))
