import keras
import numpy as np
import pytest

from keras_attn.export.tflite.tflite_export import TFLITE_VARIANTS
from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_float_ops import FLOAT_OPS
from keras_attn.export.tflite.tflite_runtime import default_signature_key
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantized_model import QuantizedModel

pytestmark = pytest.mark.tensorflow  # TFLite / SavedModel / tf-text: TensorFlow only

VOCAB, LENGTH = 60, 16
# The full-int8 model's only float op: the DEQUANTIZE of the logits (apps get float
# logits). Everything else, LayerNorm internals and the embeddings included, is int8.
ALLOWED_FLOAT_OPS_IN_INT8 = {"DEQUANTIZE"}


def batch(seed, size=4):
    rng = np.random.default_rng(seed)
    mask = np.ones((size, LENGTH), "int32")
    for b, length in enumerate(rng.integers(3, LENGTH + 1, size)):
        mask[b, length:] = 0
    return {
        "token_ids": (rng.integers(1, VOCAB, (size, LENGTH)) * mask).astype("int32"),
        "segment_ids": np.zeros((size, LENGTH), "int32"),
        "padding_mask": mask,
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    model = BertClassifier(backbone, num_classes=3)
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)  # trained-like logit scale
    qat = QuantizedModel.calibrated(model, [batch(seed) for seed in range(10, 14)])
    out = tmp_path_factory.mktemp("tflite")
    results = export_tflite(qat, str(out), sequence_length=LENGTH,
                            representative_data=[batch(seed) for seed in range(10, 14)])
    return model, qat, results


def test_every_variant_converts_with_a_static_signature(exported):
    _, _, results = exported
    assert set(results) == set(TFLITE_VARIANTS)
    for variant, result in results.items():
        assert result["input_shapes"] == [[1, LENGTH]] * 3, variant
        assert result["input_types"] == ["INT32"] * 3, variant
        assert result["output_types"] == ["FLOAT32"], variant
        assert result["custom_ops"] == [], variant
        assert not {"SHAPE", "PACK", "REDUCE_PROD"} & set(result["ops"]), variant


def test_fp32_matches_keras(exported):
    model, _, results = exported
    x = batch(1, size=6)
    reference = keras.ops.convert_to_numpy(model(x))
    for variant, tolerance in (("fp32", 1e-4), ("fp16", 5e-2), ("dynamic_int8", 0.5)):
        out = run_tflite(results[variant]["path"], x)
        assert np.abs(out - reference).max() <= tolerance, variant


def test_int8_is_integer_only_and_agrees_with_the_qat_model(exported):
    _, qat, results = exported
    report = results["int8"]
    assert set(report["non_int8_ops"]) == ALLOWED_FLOAT_OPS_IN_INT8
    assert report["non_int8_ops"]["DEQUANTIZE"] == 1
    assert set(results["int8_ptq"]["non_int8_ops"]) == ALLOWED_FLOAT_OPS_IN_INT8
    # The LayerNorm internals are fake-quantized too: without that (converter-calibrated
    # ranges) the agreement on this model was 0.88.
    assert int8_agreement(qat, report["path"]) >= 0.99


def int8_agreement(qat, path):
    x = batch(2, size=100)
    out = run_tflite(path, x)
    fake_quant = keras.ops.convert_to_numpy(qat(x))
    return (out.argmax(-1) == fake_quant.argmax(-1)).mean()


def test_op_report_reads_bytes_and_counts_ops(exported):
    _, _, results = exported
    path = results["fp32"]["path"]
    with open(path, "rb") as f:
        report = tflite_op_report(f.read())
    assert report["ops"] == results["fp32"]["ops"]
    # 2 blocks x (QKV, output, FF1, FF2) + pooler + logits, all FULLY_CONNECTED.
    assert report["ops"]["FULLY_CONNECTED"] == 10
    assert report["ops"]["BATCH_MATMUL"] == 4
    assert results["int8"]["ops"]["CONV_2D"] == 10  # per-channel int8 weights


def test_errors(exported, tmp_path):
    model, qat, _ = exported
    with pytest.raises(ValueError, match=f"sequence_length={LENGTH + 1} exceeds the "
                                         f"max_sequence_length={LENGTH} of the model"):
        export_tflite(model, str(tmp_path), variants=["fp32"], sequence_length=LENGTH + 1)
    with pytest.raises(ValueError, match="representative_data"):
        export_tflite(model, str(tmp_path), variants=["int8_ptq"], sequence_length=LENGTH)
    with pytest.raises(ValueError, match="int8_ptq"):
        export_tflite(model, str(tmp_path), variants=["int8"], sequence_length=LENGTH)
    with pytest.raises(ValueError, match="variants"):
        export_tflite(model, str(tmp_path), variants=["int4"], sequence_length=LENGTH)
    with pytest.raises(ValueError, match="calibrate"):
        export_tflite(quantize_model(model), str(tmp_path), variants=["int8"],
                      sequence_length=LENGTH, representative_data=[batch(0)])
    with pytest.raises(ValueError, match=r"shape \(B, 16\)"):
        export_tflite(qat, str(tmp_path), variants=["int8"], sequence_length=LENGTH,
                      representative_data=[batch(0) | {"token_ids": np.zeros((1, 5))}])


# Float ops of a `float_residual=True` int8 model: the residual ADDs and the LayerNorms
# (MEAN, SUB, MUL, RSQRT, ADD), entered through QUANTIZE/DEQUANTIZE.
# With `float_residual`: the residual sums and LayerNorms in float, and the ops XNNPACK has
# no int8 kernel for (`tflite_float_ops.FLOAT_OPS`: attention products, softmax, mask,
# GELU, the pooler tanh) between a DEQUANTIZE and a QUANTIZE; the weight matmuls
# (FULLY_CONNECTED, CONV_2D) stay int8.
FLOAT_RESIDUAL_OPS = {"ADD", "MEAN", "SUB", "MUL", "RSQRT", "QUANTIZE", "DEQUANTIZE",
                      *FLOAT_OPS}


def test_float_residual_keeps_outlier_dimensions_and_every_weight_matmul_int8(tmp_path):
    """A residual stream with an outlier dimension (as in BERT, Bondarenko et al., 2021):
    all-int8 rounds the other dimensions coarsely; `float_residual=True` keeps the residual
    sums and LayerNorms in float and every weight matmul in int8, and lands much closer to the
    float model."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    model = BertClassifier(backbone, num_classes=3)
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)
    outlier = backbone.get_layer("embeddings_layer_norm")
    gamma = outlier.gamma.numpy()
    gamma[0] = 60.0  # one residual dimension ~60x the others, carried by every block
    outlier.gamma.assign(gamma)
    calibration = [batch(seed) for seed in range(10, 14)]
    x = batch(2, size=100)
    reference = keras.ops.convert_to_numpy(model(x))
    errors = {}
    for float_residual in (False, True):
        qat = QuantizedModel.calibrated(model, calibration, float_residual=float_residual)
        result = export_tflite(qat, str(tmp_path / str(float_residual)), variants=["int8"],
                               sequence_length=LENGTH, representative_data=calibration)["int8"]
        out = run_tflite(result["path"], x)
        errors[float_residual] = np.abs(out - reference).max()
        if float_residual:
            assert set(result["non_int8_ops"]) <= FLOAT_RESIDUAL_OPS, result["non_int8_ops"]
            assert result["non_int8_ops"]["QUANTIZE"] >= 1 + 2 * 2  # embeddings + 2 per block
            assert result["non_int8_ops"]["BATCH_MATMUL"] == 2 * 2  # Q K^T and P V per block
            assert "FULLY_CONNECTED" not in result["non_int8_ops"]
            fake_quant = keras.ops.convert_to_numpy(qat(x))
            assert (out.argmax(-1) == fake_quant.argmax(-1)).mean() >= 0.99
            assert np.abs(out - fake_quant).max() < 0.1 * np.abs(fake_quant).max()
    assert errors[True] < 0.5 * errors[False], errors


@pytest.mark.parametrize("head", ["classification", "token_classification"])
def test_the_calibrated_model_computes_what_its_int8_file_computes(tmp_path, head):
    """The default recipe's Keras model, ranges frozen, equals its `model_int8.tflite`
    rounding point for rounding point: float attention, GELU and tanh where the file has
    them, the residual sums reading the float LayerNorm outputs, int32 biases. What is left
    is the runtime's own requantization rounding (LiteRT rounds twice, XNNPACK in float):
    an output one step off near a tie, a few steps after it runs through the blocks.
    Measured on this model before the twin followed the file: 4 steps median, 24-28 at
    most, tags agreeing on 99.55 %; now 0-2 median, 1-4 at most, all agreeing."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    model = (BertClassifier(backbone, num_classes=3) if head == "classification"
             else BertTokenClassifier(backbone, num_labels=5))
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)  # trained-like logit scale
    layer_norm = backbone.get_layer("embeddings_layer_norm")
    gamma = layer_norm.gamma.numpy()
    gamma[0] = 60.0  # an outlier dimension in the residual stream, as in BERT
    layer_norm.gamma.assign(gamma)
    calibration = [batch(seed, size=16) for seed in range(10, 14)]
    qat = QuantizedModel.calibrated(model, calibration, float_residual=True,
                                    feedforward_float_channels=2)
    path = export_tflite(qat, str(tmp_path), variants=["int8"], sequence_length=LENGTH,
                         representative_data=calibration)["int8"]["path"]
    x = batch(3, size=1000)  # SST-2 dev-sized (872)
    qat.freeze_ranges()
    twin = keras.ops.convert_to_numpy(qat(x))
    out = run_tflite(path, x)
    if head == "token_classification":  # the real tokens
        twin, out = twin[x["padding_mask"] == 1], out[x["padding_mask"] == 1]
    steps = np.abs(out - twin).max(-1) / qat.model.get_layer("logits").output_quantizer.step()
    assert np.median(steps) <= 2.01 and steps.max() <= 6.01, (np.median(steps), steps.max())
    np.testing.assert_array_equal(out.argmax(-1), twin.argmax(-1))
    assert np.abs(twin).max() > 100 * qat.model.get_layer("logits").output_quantizer.step()


def test_float_feedforward_channels_convert_to_small_float_matmuls(tmp_path):
    """`feedforward_float_channels=k`: per block, the k float channels become two float
    matmuls and a float GELU beside the int8 ones; the TFLite model follows its Keras
    QAT model."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=LENGTH)
    model = BertClassifier(backbone, num_classes=3)
    dense = backbone.get_layer("transformer_layer_0").feedforward_intermediate_dense
    kernel = dense.kernel.numpy()
    kernel[:, 5] *= 20.0  # one wide feed-forward channel
    dense.kernel.assign(kernel)
    calibration = [batch(seed) for seed in range(10, 14)]
    qat = QuantizedModel.calibrated(model, calibration, float_residual=True,
                                    feedforward_float_channels=2)
    result = export_tflite(qat, str(tmp_path), variants=["int8"], sequence_length=LENGTH,
                           representative_data=calibration)["int8"]
    non_int8 = result["non_int8_ops"]
    assert set(non_int8) <= FLOAT_RESIDUAL_OPS | {"FULLY_CONNECTED", "GELU"}, non_int8
    # GELU: the float channels' and the int8 channels' (run in float, see FLOAT_RESIDUAL_OPS).
    assert non_int8["FULLY_CONNECTED"] == 2 * 2 and non_int8["GELU"] == 2 * 2, non_int8
    x = batch(2, size=100)
    out = run_tflite(result["path"], x)
    fake_quant = keras.ops.convert_to_numpy(qat(x))
    assert (out.argmax(-1) == fake_quant.argmax(-1)).mean() >= 0.99
    assert np.abs(out - fake_quant).max() < 0.1 * np.abs(fake_quant).max()


def test_default_signature_key_is_serving_default_or_the_only_one():
    class Signatures:  # what default_signature_key reads of a LiteRT Interpreter
        def __init__(self, keys):
            self.keys = keys

        def get_signature_list(self):
            return {key: {"inputs": [], "outputs": []} for key in self.keys}

    assert default_signature_key(Signatures(["tokens_16", "serving_default"])) == \
        "serving_default"
    assert default_signature_key(Signatures(["serve"])) == "serve"
    for keys in (["a", "b"], []):
        with pytest.raises(ValueError, match="none is 'serving_default'"):
            default_signature_key(Signatures(keys))
