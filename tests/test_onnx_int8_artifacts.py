"""The static int8 ONNX files: `model_int8.onnx` (the calibrated twin as QDQ,
`export_onnx_qdq`) computes the twin's int8 function with its int8 weights, and onnxruntime
runs it with int8 kernels; `model_int8_ptq.onnx` (onnxruntime's static calibration,
`quantize_onnx_static`) stays near the float model; an export writes, scores and times
both."""

import collections
import json

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_qdq_export import export_onnx_qdq
from keras_attn.export.onnx.onnx_runner import OnnxRunner
from keras_attn.export.onnx.onnx_static_quantization import quantize_onnx_static
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantized_model import QuantizedModel
from tests.exported_runs import classification_run

pytestmark = pytest.mark.tensorflow

VOCAB, LENGTH = 60, 16
# Output codes the QDQ file's logits may differ from the twin's. Both compute the same
# int8 function; they differ only where a value falls within float rounding of a code
# boundary of some quantizer (onnxruntime rounds ties to even, TF's FakeQuant up, and the
# two sum in other orders), which moves that code by one step and the logits by about one
# step. On these tiny models the file gives the twin's logits exactly (measured 0.0); two
# steps leave room for two such flips. On MiniLM (6 blocks, 384 wide) flips compound to
# max |dlogit| ~0.8, as much as the twin moves under another TF kernel set (docs/export.md).
QDQ_LOGIT_STEPS = 2.0


def batch(seed, size=4, length=LENGTH):
    rng = np.random.default_rng(seed)
    mask = np.ones((size, length), "int32")
    for b, real in enumerate(rng.integers(3, length + 1, size)):
        mask[b, real:] = 0
    return {"token_ids": (rng.integers(1, VOCAB, (size, length)) * mask).astype("int32"),
            "segment_ids": np.zeros((size, length), "int32"), "padding_mask": mask}


def classifier(seed=0):
    keras.utils.set_random_seed(seed)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    model = BertClassifier(backbone, num_classes=3)
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)  # trained-like logit scale
    return model


def calibrated_twin(model, **kwargs):
    return QuantizedModel.calibrated(model, [batch(seed) for seed in range(10, 14)], **kwargs)


def initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def runtime_ops(path):
    """Op histogram of the graph onnxruntime runs (all optimizations, CPU)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(path) + ".optimized"
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(
        options.optimized_model_filepath).graph.node)


@pytest.fixture(scope="module")
def per_channel(tmp_path_factory):
    qat = calibrated_twin(classifier())
    path = tmp_path_factory.mktemp("qdq") / "model_int8.onnx"
    return qat, path, export_onnx_qdq(qat, path)


def logit_step(qat):
    return float(qat.model.get_layer("logits").output_quantizer.step().numpy())


@pytest.mark.parametrize("weight_quantization", ["per_channel", "per_tensor"])
def test_qdq_file_computes_the_twins_logits(per_channel, tmp_path, weight_quantization):
    if weight_quantization == "per_channel":
        qat, path, _ = per_channel
    else:
        qat = calibrated_twin(classifier(), weight_quantization="per_tensor")
        path = tmp_path / "model_int8.onnx"
        export_onnx_qdq(qat, path)
    runner = OnnxRunner(str(path), threads=1)
    for shape in ((6, LENGTH), (3, 9)):  # dynamic batch and sequence axes
        x = batch(1, *shape)
        reference = keras.ops.convert_to_numpy(qat(x))
        out = runner(x)
        assert out.shape == reference.shape
        assert np.abs(out - reference).max() <= QDQ_LOGIT_STEPS * logit_step(qat)
        assert (out.argmax(-1) == reference.argmax(-1)).all()
    # The twin's quantization is not a no-op at this scale: the float model differs more.
    float_logits = keras.ops.convert_to_numpy(qat.float_model()(x))
    assert np.abs(float_logits - reference).max() > QDQ_LOGIT_STEPS * logit_step(qat)


def test_qdq_file_stores_the_twins_int8_weights(per_channel):
    qat, path, info = per_channel
    nodes = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    assert nodes["QuantizeLinear"] > 0 and nodes["DequantizeLinear"] > 0
    stored = {name: value for name, value in initializers(path).items()
              if value.dtype == np.int8 and value.ndim >= 2}
    # 2 blocks x 4 kernels, the pooler, the logits, 3 embedding tables.
    assert info["int8_weights"] == len(stored) == 13
    assert not [name for name, value in initializers(path).items()
                if value.dtype == np.float32 and value.ndim >= 2]
    # The logits kernel, as the twin fake-quantizes it: per channel, s_c = max|W_c| / 127.
    kernel = qat.model.get_layer("logits").kernel.numpy()  # (16, 3)
    scale = np.abs(kernel).max(axis=0) / 127
    found = [value for value in stored.values() if value.shape == (16, 3)]
    assert len(found) == 1 and np.array_equal(found[0], np.round(kernel / scale))
    # onnxruntime runs int8 kernels for every weight matmul (the twin's 1x1 convolutions
    # are MatMuls in the file).
    ops = runtime_ops(path)
    assert ops["QLinearMatMul"] + ops["MatMulIntegerToFloat"] == 10 and not ops["Conv"]


def test_weights_the_twin_keeps_in_float_stay_float(tmp_path):
    qat = calibrated_twin(classifier(), float_residual=True, feedforward_float_channels=4)
    path = tmp_path / "model_int8.onnx"
    info = export_onnx_qdq(qat, path)
    float_kernels = [v.shape for v in initializers(path).values()
                     if v.dtype == np.float32 and v.ndim == 2]
    # Each block's 4 float channels: up-projection (16, 4) and down-projection (4, 16).
    assert sorted(float_kernels) == [(4, 16)] * 2 + [(16, 4)] * 2
    assert info["int8_weights"] == 13
    x = batch(2, 6)
    reference = keras.ops.convert_to_numpy(qat(x))
    assert np.abs(OnnxRunner(str(path))(x) - reference).max() <= \
        QDQ_LOGIT_STEPS * logit_step(qat)


def test_xlnet_classifier_exports_with_its_sinusoid_frequencies_float(tmp_path):
    """XLNet's relative sinusoids multiply positions by a `(1, d/2)` constant of
    frequencies: one value per output column, it lies on a per-column int8 grid of its own
    and was once taken for a quantized kernel (8 stored, 7 in the twin: refused)."""
    keras.utils.set_random_seed(4)
    model = XLNetClassifier(XLNetBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                          hidden_dim=16, intermediate_dim=32), num_classes=3)
    model.get_layer("logits").kernel.assign(model.get_layer("logits").kernel.numpy() * 50)
    qat = calibrated_twin(model, float_residual=True, feedforward_float_channels=0)
    path = tmp_path / "model_int8.onnx"
    assert export_onnx_qdq(qat, path)["int8_weights"] == 7  # embedding + 4 block + 2 head
    x = batch(2, 6)
    reference = keras.ops.convert_to_numpy(qat(x))
    assert np.abs(OnnxRunner(str(path))(x) - reference).max() <= \
        QDQ_LOGIT_STEPS * logit_step(qat)
    frequencies = [v for v in initializers(path).values() if v.shape == (1, 8)]
    assert frequencies and all(v.dtype == np.float32 for v in frequencies)


def test_crf_tagger_exports_its_emissions(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    tagger = BertTokenClassifier(backbone, num_labels=4, use_crf=True)
    logits = tagger.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)
    qat = calibrated_twin(tagger)
    path = tmp_path / "model_int8.onnx"
    info = export_onnx_qdq(qat, path)
    assert info["input_names"] == ["token_ids", "segment_ids", "padding_mask"]
    assert info["output_names"] == ["logits"]
    x = batch(3, 5)
    emissions = keras.ops.convert_to_numpy(
        qat({**x, "label_mask": x["padding_mask"]})["logits"])
    assert np.abs(OnnxRunner(str(path))(x) - emissions).max() <= \
        QDQ_LOGIT_STEPS * logit_step(qat)


def test_ptq_file_runs_near_the_float_model(tmp_path):
    model = classifier()
    src = export_onnx(model, tmp_path / "model.onnx")["path"]
    dst = quantize_onnx_static(src, tmp_path / "model_int8_ptq.onnx",
                               [batch(seed) for seed in range(10, 14)])
    assert any(v.dtype == np.int8 and v.ndim == 2 for v in initializers(dst).values())
    x = batch(1, 6)
    reference = keras.ops.convert_to_numpy(model(x))
    error = np.abs(OnnxRunner(dst)(x) - reference).max()
    # Int8 error, not garbage: well below the logits' own spread.
    assert 0 < error < 0.25 * (reference.max() - reference.min())


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="calibrated quantization-aware model"):
        export_onnx_qdq(classifier(), tmp_path / "a.onnx")
    with pytest.raises(ValueError, match="calibrate"):
        export_onnx_qdq(quantize_model(classifier()), tmp_path / "a.onnx")
    with pytest.raises(ValueError, match="batches=\\[\\]"):
        src = export_onnx(classifier(), tmp_path / "model.onnx")["path"]
        quantize_onnx_static(src, tmp_path / "b.onnx", [])


def test_export_writes_scores_and_times_both_files(tmp_path):
    _, export_dir = classification_run(tmp_path)
    report = json.loads((export_dir / "export_report.json").read_text())
    rows = {row["artifact"]: row for row in report["artifacts"]}
    qat_row = rows["QAT model (Keras, fake int8)"]
    for name in ("model_int8.onnx", "model_int8_ptq.onnx"):
        assert (export_dir / name).is_file()
        assert rows[name]["latency"] and rows[name]["metric"] is not None
    # The QDQ file gives the twin's metric (the same int8 function).
    assert rows["model_int8.onnx"]["metric"] == pytest.approx(qat_row["metric"], abs=0.13)
    card = json.loads((export_dir / "model_card.json").read_text())
    entries = {entry["file"]: entry for entry in card["artifacts"]}
    assert entries["model_int8.onnx"]["precision"] == "int8"
    assert entries["model_int8_ptq.onnx"]["precision"] == "int8_ptq"
