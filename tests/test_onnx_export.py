"""ONNX export (tf2onnx) and onnxruntime: the ONNX graphs compute the Keras models' logits
at any batch size and sequence length, the exact GELU converts (checked against
math.erf), dynamic int8 agrees with float, and bad input fails with clear errors."""

import math
import os

import keras
import numpy as np
import onnx
import pytest

from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_metadata import embed_onnx_metadata
from keras_attn.export.onnx.onnx_metadata import onnx_settings
from keras_attn.export.onnx.onnx_quantization import quantize_onnx_dynamic
from keras_attn.export.onnx.onnx_runner import OnnxRunner
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from tests.tolerances import float32_path_atol
from tests.tolerances import kernel_gain

pytestmark = pytest.mark.tensorflow

V = 60
# (batch, sequence) pairs fed to one exported file: the axes are dynamic.
SHAPES = ((2, 5), (5, 11))


def backbone(activation="gelu", vocabulary_size=V, hidden_dim=16, num_layers=1):
    return BertBackbone(vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=2,
                        hidden_dim=hidden_dim, intermediate_dim=2 * hidden_dim,
                        max_sequence_length=16, activation=activation)


def spread_weights(model, seed=0, stddev=0.3):
    """Random weights large enough that the logits spread over several units and the
    GELU inputs reach |x| ~ 3, where exact and tanh GELU differ by ~1e-3 (BERT's 0.02
    initializer leaves every logit within ~0.1 of the others)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0.0, stddev, weight.shape).astype("float32"))
    return model


def path_atol(model):
    """ONNX Runtime vs Keras run other kernels (tests/tolerances.py): one block of 6
    reductions plus the embedding norm and the pooler, sums of up to the intermediate size
    (32), magnified by the output kernel."""
    return float32_path_atol(1.0, reduction=32, depth=6 + 2,
                             gain=kernel_gain(model.get_layer("logits").kernel.numpy()))


def batch(batch_size, length, seed=0, vocabulary_size=V):
    """Token ids with right padding: row i has length - i % 3 real tokens."""
    rng = np.random.default_rng(seed)
    real = length - np.arange(batch_size) % 3  # (B,)
    padding_mask = (np.arange(length)[None, :] < real[:, None]).astype("int32")  # (B, T)
    token_ids = rng.integers(1, vocabulary_size, (batch_size, length)) * padding_mask
    segment_ids = (np.arange(length)[None, :] >= real[:, None] // 2) * padding_mask
    return {"token_ids": token_ids.astype("int32"), "segment_ids": segment_ids.astype("int32"),
            "padding_mask": padding_mask}


def check_graph(path, output_dims):
    model_proto = onnx.load(path)
    onnx.checker.check_model(model_proto, full_check=True)
    assert [i.name for i in model_proto.graph.input] == ["token_ids", "segment_ids",
                                                         "padding_mask"]
    for value in model_proto.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT32
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    (output,) = model_proto.graph.output
    assert output.name == "logits"
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == output_dims
    assert {o.domain: o.version for o in model_proto.opset_import}[""] == 17
    ops = {node.op_type for node in model_proto.graph.node}
    assert "Erfc" not in ops
    return ops


# === Float export ===


@pytest.mark.parametrize("activation", ["gelu", "gelu_approximate"])
def test_classifier_matches_keras_at_two_shapes(activation, tmp_path):
    model = spread_weights(BertClassifier(backbone(activation), num_classes=3))
    path = str(tmp_path / "model.onnx")
    info = export_onnx(model, path)
    assert info == {"path": path, "input_names": ["token_ids", "segment_ids", "padding_mask"],
                    "output_names": ["logits"], "opset": 17, "removed_inputs": []}
    ops = check_graph(path, ["batch", 3])
    assert ("Erf" in ops) == (activation == "gelu")
    runner = OnnxRunner(path, threads=1)
    for batch_size, length in SHAPES:
        x = batch(batch_size, length)
        expected = model.predict(x, verbose=0)  # (B, 3)
        got = runner(x)
        assert got.shape == (batch_size, 3)
        assert np.abs(expected).max() > 1.0  # logits that are not all ~0
        np.testing.assert_allclose(got, expected, atol=path_atol(model), rtol=0)
    # Padding is masked in the ONNX graph too: a row padded to 11 tokens has the logits
    # of the same tokens without padding.
    x = batch(5, 11)
    real = int(x["padding_mask"][2].sum())
    short = {key: value[2:3, :real] for key, value in x.items()}
    np.testing.assert_allclose(runner(short), runner(x)[2:3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("activation", ["gelu", "gelu_approximate"])
def test_token_classifier_matches_keras_at_two_shapes(activation, tmp_path):
    model = spread_weights(BertTokenClassifier(backbone(activation), num_labels=5), seed=1)
    path = str(tmp_path / "tagger.onnx")
    export_onnx(model, path)
    check_graph(path, ["batch", "sequence", 5])
    runner = OnnxRunner(path)
    for batch_size, length in SHAPES:
        x = batch(batch_size, length, seed=batch_size)
        expected = model.predict(x, verbose=0)  # (B, T, 5)
        got = runner(x)
        assert got.shape == (batch_size, length, 5)
        np.testing.assert_allclose(got, expected, atol=path_atol(model), rtol=0)


def test_crf_tagger_exports_its_emissions_without_label_mask(tmp_path):
    model = spread_weights(BertTokenClassifier(backbone(), num_labels=4, use_crf=True), seed=2)
    path = str(tmp_path / "crf.onnx")
    info = export_onnx(model, path)
    assert info["removed_inputs"] == ["label_mask"]
    assert info["output_names"] == ["logits"]
    check_graph(path, ["batch", "sequence", 4])
    x = batch(3, 7)
    expected = model.predict({**x, "label_mask": x["padding_mask"]}, verbose=0)["logits"]
    np.testing.assert_allclose(OnnxRunner(path)(x), expected, atol=path_atol(model), rtol=0)


def test_exact_gelu_converts_to_erf_against_math_erf(tmp_path):
    # keras.activations.gelu on TensorFlow is 0.5 x erfc(-x / sqrt(2)); the export writes
    # erfc as 1 - Erf. Reference: math.erf in float64.
    inputs = {"x": keras.Input(shape=(None,), dtype="float32", name="x")}
    model = keras.Model(inputs, keras.activations.gelu(inputs["x"]))
    path = str(tmp_path / "gelu.onnx")
    export_onnx(model, path)
    x = np.linspace(-9.0, 9.0, 3601, dtype="float32").reshape(1, -1)  # (1, 3601)
    exact = np.array([[0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x[0]]])
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    got = OnnxRunner(path)({"x": x})
    assert np.abs(got - exact).max() <= 1e-6
    assert np.abs(tanh_form - exact).max() > 1e-4  # the test can tell the two forms apart
    assert np.abs(got - model.predict({"x": x}, verbose=0)).max() <= 1e-6


def test_dict_output_model_exports_selected_outputs(tmp_path):
    inputs = {"token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
              "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask")}
    embedded = keras.layers.Embedding(V, 4, name="embedding")(inputs["token_ids"])  # (B, T, 4)
    mask = keras.ops.cast(inputs["padding_mask"], "float32")[:, :, None]  # (B, T, 1)
    model = keras.Model(inputs, {"tokens": embedded * mask,
                                 "pooled": keras.ops.sum(embedded * mask, axis=1)})
    path = str(tmp_path / "two.onnx")
    info = export_onnx(model, path, outputs=["pooled"])
    assert info["output_names"] == ["pooled"]
    x = {"token_ids": np.array([[3, 4, 5, 0]]), "padding_mask": np.array([[1, 1, 1, 0]])}
    table = keras.ops.convert_to_numpy(model.get_layer("embedding").embeddings)  # (V, 4)
    np.testing.assert_allclose(OnnxRunner(path)(x), table[[3, 4, 5]].sum(0)[None], atol=1e-6)
    both = export_onnx(model, str(tmp_path / "both.onnx"))
    outputs = OnnxRunner(both["path"])(x)
    assert sorted(outputs) == ["pooled", "tokens"]
    assert [d.dim_param or d.dim_value for d in onnx.load(both["path"]).graph.output[
        both["output_names"].index("tokens")].type.tensor_type.shape.dim] == [
            "batch", "sequence", 4]


# === Dynamic int8 ===


def weight_bytes(model_proto):
    return sum(onnx.numpy_helper.to_array(tensor).nbytes
               for tensor in model_proto.graph.initializer)


def test_dynamic_int8_agrees_with_float_and_is_smaller(tmp_path):
    vocabulary_size = 2000
    model = BertClassifier(backbone(vocabulary_size=vocabulary_size, hidden_dim=32,
                                    num_layers=2), num_classes=3)
    spread_weights(model, seed=3, stddev=0.1)
    src = export_onnx(model, str(tmp_path / "model.onnx"))["path"]
    dst = quantize_onnx_dynamic(src, str(tmp_path / "model_int8.onnx"))
    quantized = onnx.load(dst)
    quantized_ops = [node.op_type for node in quantized.graph.node]
    # Every weight matmul is integer: layer 1 fused Q/K/V, O, FF1, FF2; layer 2 (the last,
    # computed for the [CLS] query only) Q, K, V, O, FF1, FF2; pooler and logits. The float
    # MatMuls left are the 2 x 2 attention products of activations.
    assert quantized_ops.count("MatMulInteger") == 12, quantized_ops
    assert quantized_ops.count("MatMul") == 4 and "Gemm" not in quantized_ops
    # Weights in bytes: int8 tables and kernels, float biases and norms (in a model this
    # small the node names and shapes weigh more than the weights; MiniLM: see docs).
    assert weight_bytes(quantized) < 0.3 * weight_bytes(onnx.load(src))
    x = batch(200, 12, seed=4, vocabulary_size=vocabulary_size)
    expected = model.predict(x, verbose=0)  # (200, 3)
    got = OnnxRunner(dst)(x)
    agreement = (got.argmax(-1) == expected.argmax(-1)).mean()
    assert agreement >= 0.95, agreement
    # int8 is an approximation: close to the float logits, not equal to them.
    error = np.abs(got - expected).max()
    assert 1e-4 < error < 0.1 * np.abs(expected).max(), error


# === Errors ===


@pytest.fixture(scope="module")
def classifier_file(tmp_path_factory):
    keras.utils.set_random_seed(5)
    model = BertClassifier(backbone(), num_classes=2)
    path = str(tmp_path_factory.mktemp("onnx") / "model.onnx")
    export_onnx(model, path)
    return path


def test_runner_rejects_bad_inputs(classifier_file):
    runner = OnnxRunner(classifier_file)
    x = batch(2, 4)
    with pytest.raises(ValueError, match=r"Unknown input name\(s\) \['tokens'\]"):
        runner({**x, "tokens": x["token_ids"]})
    with pytest.raises(ValueError, match=r"Missing input\(s\) \['segment_ids'\]"):
        runner({k: v for k, v in x.items() if k != "segment_ids"})
    with pytest.raises(ValueError, match="'token_ids' must hold int32.*dtype float32"):
        runner({**x, "token_ids": x["token_ids"].astype("float32")})
    with pytest.raises(ValueError, match="'padding_mask' has values that do not fit"):
        runner({**x, "padding_mask": np.full((2, 4), 2 ** 40)})
    with pytest.raises(ValueError, match="'segment_ids' must have rank 2"):
        runner({**x, "segment_ids": np.zeros(4, "int32")})
    with pytest.raises(ValueError, match="takes a dict"):
        runner(list(x.values()))
    # numpy's default int64 ids are converted (they fit), as Keras accepts them.
    wide = {k: v.astype("int64") for k, v in x.items()}
    np.testing.assert_array_equal(runner(wide), runner(x))


def test_runner_rejects_bad_arguments(classifier_file, tmp_path):
    with pytest.raises(ValueError, match="threads"):
        OnnxRunner(classifier_file, threads=0)
    with pytest.raises(ValueError, match="existing ONNX file"):
        OnnxRunner(str(tmp_path / "missing.onnx"))


def test_quantize_rejects_bad_arguments(classifier_file, tmp_path):
    with pytest.raises(ValueError, match="`dst` must differ from `src`"):
        quantize_onnx_dynamic(classifier_file, classifier_file)
    with pytest.raises(ValueError, match="`src` must be an existing ONNX file"):
        quantize_onnx_dynamic(str(tmp_path / "missing.onnx"), str(tmp_path / "out.onnx"))
    with pytest.raises(ValueError, match="`per_channel` must be a bool. Received: per_channel=1"):
        quantize_onnx_dynamic(classifier_file, str(tmp_path / "out.onnx"), per_channel=1)


def test_export_rejects_bad_arguments(tmp_path):
    model = BertClassifier(backbone(), num_classes=2)
    path = str(tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="opset.*Received: opset=13"):
        export_onnx(model, path, opset=13)
    with pytest.raises(ValueError, match="directory of `path` does not exist"):
        export_onnx(model, str(tmp_path / "nowhere" / "m.onnx"))
    with pytest.raises(ValueError, match="single output.*Received: outputs"):
        export_onnx(model, path, outputs=["logits"])
    with pytest.raises(ValueError, match="keras.Model"):
        export_onnx(lambda x: x, path)
    ids = keras.Input((4,), dtype="int32")
    positional = keras.Model(ids, keras.layers.Embedding(9, 2)(ids))
    with pytest.raises(ValueError, match="dict of named inputs.*Received: model.input=<Keras"):
        export_onnx(positional, path)
    with pytest.raises(ValueError, match="dict of named inputs.*Received: model.input=None"):
        export_onnx(keras.Sequential([keras.layers.Dense(2)]), path)
    tagger = BertTokenClassifier(backbone(), num_labels=3, use_crf=True)
    with pytest.raises(ValueError, match=r"outputs the model does not have: \['emissions'\]"):
        export_onnx(tagger, path, outputs=["emissions"])
    keras.config.set_dtype_policy("mixed_float16")
    half = BertClassifier(backbone(), num_classes=2)
    keras.config.set_dtype_policy("float32")
    with pytest.raises(ValueError, match="float32 models.*float16"):
        export_onnx(half, path)
    assert not os.path.exists(path)


class LogGamma(keras.layers.Layer):
    """A layer with an op tf2onnx has no conversion for (TF `Lgamma`)."""

    def call(self, x):
        import tensorflow as tf

        return tf.math.lgamma(x)


def test_export_names_the_op_tf2onnx_cannot_convert(tmp_path):
    inputs = {"x": keras.Input(shape=(None,), dtype="float32", name="x")}
    model = keras.Model(inputs, LogGamma(name="log_gamma")(inputs["x"] + 1.0))
    path = str(tmp_path / "lgamma.onnx")
    with pytest.raises(ValueError, match="log_gamma.*'Lgamma'.*not an ONNX operator"):
        export_onnx(model, path)
    assert not os.path.exists(path)


# === Self-describing files (issue 23) ===


def test_metadata_props_carry_card_vocabulary_and_labels(classifier_file, tmp_path):
    card = {"task": "classification", "labels": ["neg", "pos"], "sequence_length": 16,
            "tokenizer": {"lowercase": True, "strip_accents": True, "vocabulary_size": 3}}
    vocabulary, labels = ["[PAD]", "[UNK]", "café"], ["neg", "pos"]
    path = str(tmp_path / "model.onnx")
    with open(classifier_file, "rb") as source, open(path, "wb") as copy:
        copy.write(source.read())
    x = batch(2, 4)
    before = OnnxRunner(path)(x)
    assert onnx_settings(OnnxRunner(path).session, path) is None
    assert embed_onnx_metadata(path, card, vocabulary, labels) == path
    settings = onnx_settings(OnnxRunner(path).session, path)
    assert (settings.card, settings.vocabulary, settings.labels) == (card, vocabulary, labels)
    props = {entry.key: entry.value for entry in onnx.load(path).metadata_props}
    assert props["keras_attn.model_class"] == "BertClassifier"  # export_onnx's entries kept
    assert props["vocab.txt"] == "[PAD]\n[UNK]\ncafé\n" and props["labels.txt"] == "neg\npos\n"
    np.testing.assert_array_equal(OnnxRunner(path)(x), before)
    first = os.path.getmtime(path), open(path, "rb").read()
    embed_onnx_metadata(path, card, vocabulary, labels)  # the same entries: file untouched
    assert (os.path.getmtime(path), open(path, "rb").read()) == first
    embed_onnx_metadata(path, dict(card, labels=["a", "b"]), vocabulary, ["a", "b"])
    assert onnx_settings(OnnxRunner(path).session, path).labels == ["a", "b"]
    assert sum(entry.key == "labels.txt" for entry in onnx.load(path).metadata_props) == 1
    quantized = quantize_onnx_dynamic(path, str(tmp_path / "model_int8.onnx"))
    embed_onnx_metadata(quantized, card, vocabulary, labels)
    assert onnx_settings(OnnxRunner(quantized).session, quantized).card == card
