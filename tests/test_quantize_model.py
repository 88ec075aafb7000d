"""Tests of `keras_attn.quantization.quantize_model`: QAT of a functional or Sequential
Keras model, and its full-int8 file (`keras_attn.export.tflite.model_int8_tflite`)."""

import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.model_int8_tflite import export_model_int8_tflite
from keras_attn.layers import ActivationQuantizer
from keras_attn.layers import RelativeMultiHeadAttention
from keras_attn.layers import TokenAndPositionEmbedding
from keras_attn.layers import TransformerDecoderBlock
from keras_attn.layers import TransformerEncoderBlock
from keras_attn.layers import TransformerXLBlock
from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.models import GPTBackbone
from keras_attn.models import GPTCausalLM
from keras_attn.models import Seq2SeqTransformer
from keras_attn.models import TransformerXLLM
from keras_attn.models import XLNetBackbone
from keras_attn.models import XLNetClassifier
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch
from keras_attn.quantization import QuantizationRecipe
from keras_attn.quantization import dequantize_model
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.emissions_model import emissions_model
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.quantize_model import float_layers
from keras_attn.quantization.quantize_model import model_quantization_ops
from keras_attn.quantization.quantize_model import quantize_model
from tests.numpy_reference import numpy_rows

pytestmark = pytest.mark.tensorflow


def residual_model():
    """Dense + ReLU, dropout, a residual Add, LayerNorm, mean pooling and a Dense head."""
    inputs = keras.Input((6, 8), name="features")
    hidden = keras.layers.Dense(16, activation="relu", name="dense")(inputs)
    hidden = keras.layers.Dense(8, name="dense_1")(keras.layers.Dropout(0.1)(hidden))
    normed = keras.layers.LayerNormalization()(keras.layers.Add()([inputs, hidden]))
    pooled = keras.layers.GlobalAveragePooling1D()(normed)
    return keras.Model(inputs, keras.layers.Dense(3, name="dense_2")(pooled))


def assert_close_in_steps(outputs, expected, step):
    """The file's outputs against the QAT model's, in int8 steps of the output. Rounding
    twice (the LayerNorm's int8 parts, the bias) moves a few outputs by several steps:
    measured over 8 seeds of `trained`, the largest 3-10 steps, the mean 0.48-0.74 and
    87-96 % within one step; a wrong scale or zero point moves them all."""
    steps = np.abs(outputs - expected) / step
    assert steps.mean() <= 1.0 and np.mean(steps <= 1.01) >= 0.8, steps
    assert steps.max() <= 15, steps.max()


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)  # a module fixture runs before the per-test seed
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6, 8)).astype("float32")
    y = (x[:, :, 0].mean(-1) > 0).astype("int32") + (x[:, :, 1].mean(-1) > 0.3)
    model = residual_model()
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=20, batch_size=32, verbose=0)
    return model, x, y


def test_the_copy_holds_the_float_weights_and_leaves_the_model_alone(trained):
    model, x, _ = trained
    before = [w.copy() for w in model.get_weights()]
    qat = quantize_model(model)
    assert [type(layer).__name__ for layer in qat.layers if "quantizer" not in layer.name] == [
        "InputLayer", "QuantizedDense", "Dropout", "QuantizedDense", "Add",
        "QuantizedLayerNormalization", "GlobalAveragePooling1D", "QuantizedDense"]
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    np.testing.assert_array_equal(qat.get_layer("dense").kernel.numpy(),
                                  model.get_layer("dense").kernel.numpy())
    calibrate_model(qat, [x])
    assert all(float(q.initialized.numpy()) == 1.0 for q in activation_quantizers(qat))
    logits = keras.ops.convert_to_numpy(qat(x, training=False))
    reference = model.predict(x, verbose=0)
    scale = np.abs(reference).max()
    assert 0 < np.abs(logits - reference).max() < 0.1 * scale  # rounded, not far


def test_the_int8_file_is_full_integer_and_computes_what_qat_computes(trained, tmp_path):
    model, x, y = trained
    qat = quantize_model(model)
    calibrate_model(qat, [x[:48], x[48:]])
    report = export_model_int8_tflite(qat, tmp_path / "model_int8.tflite", [x[:32]])
    assert report["custom_ops"] == []
    assert report["non_int8_ops"] == {"QUANTIZE": 1, "DEQUANTIZE": 1}  # the edges only
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    outputs = np.concatenate([list(runner(features=x[i:i + 1]).values())[0] for i in range(len(x))])
    expected = keras.ops.convert_to_numpy(qat(x, training=False))
    assert_close_in_steps(outputs, expected,
                          float(qat.get_layer("dense_2").output_quantizer.step()))
    assert np.mean(outputs.argmax(-1) == expected.argmax(-1)) >= 0.9
    float_accuracy = np.mean(model.predict(x, verbose=0).argmax(-1) == y)
    assert np.mean(outputs.argmax(-1) == y) >= float_accuracy - 0.05


def test_qat_trains_with_fit_saves_and_loads(trained, tmp_path):
    model, x, y = trained
    qat = quantize_model(model)
    calibrate_model(qat, [x])
    qat.compile(keras.optimizers.Adam(1e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    kernel = qat.get_layer("dense").kernel.numpy().copy()
    qat.fit(x, y, epochs=1, batch_size=32, verbose=0)
    assert not np.array_equal(kernel, qat.get_layer("dense").kernel.numpy())
    qat.save(tmp_path / "qat.keras")
    loaded = keras.saving.load_model(tmp_path / "qat.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x, training=False)),
                               keras.ops.convert_to_numpy(qat(x, training=False)), atol=1e-6)
    assert loaded.get_layer("dense_1").input_producer == "dense/activation_quantizer"


class Doubling(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x


def test_a_sequential_model_and_a_layer_it_does_not_know():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), Doubling(name="twice"),
                              keras.layers.Dense(2)])
    with pytest.warns(UserWarning, match=r"keeps 1 layer\(s\) in float.*: twice"):
        qat = quantize_model(model)
    assert isinstance(qat.get_layer("twice"), Doubling)
    assert float_layers(qat) == ["twice"] and float_layers(model) == ["twice"]
    assert "twice_output_quantizer" not in [layer.name for layer in qat.layers]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="weight_quantization"):
        quantize_model(residual_model(), weight_quantization="per_row")
    with pytest.raises(ValueError, match="functional or Sequential"):
        quantize_model(keras.layers.Dense(2))
    with pytest.raises(ValueError, match="needs `float_residual=True`"):
        quantize_model(residual_model(), feedforward_float_channels=4)
    with pytest.raises(ValueError, match="feedforward_float_channels"):
        quantize_model(residual_model(), float_residual=True, feedforward_float_channels=-1)


def test_an_embedding_table_is_stored_as_the_qat_model_rounds_it(tmp_path):
    """Token ids in: the table is rounded to one symmetric int8 scale in QAT and in the
    file (GATHER on int8), whose logits stay within a few steps of the QAT model's."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 40, (128, 8)).astype("int32")
    y = (ids == 7).any(-1).astype("int32") + (ids == 11).any(-1)
    inputs = keras.Input((8,), dtype="int32", name="token_ids")
    rows = keras.layers.Embedding(40, 16, name="embedding")(inputs)
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.GlobalAveragePooling1D()(rows))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ids, y, epochs=30, batch_size=32, verbose=0)
    qat = quantize_model(model)
    table = model.get_layer("embedding").embeddings.numpy()
    np.testing.assert_array_equal(qat.get_layer("embedding").embeddings.numpy(), table)
    looked_up = keras.ops.convert_to_numpy(qat.get_layer("embedding")(ids[:4]))
    np.testing.assert_allclose(looked_up, numpy_rows(table, ids[:4]), atol=1e-6)
    assert not np.allclose(looked_up, table[ids[:4]], atol=1e-4)  # it did round
    calibrate_model(qat, [ids[:64], ids[64:]])
    report = export_model_int8_tflite(qat, tmp_path / "model_int8.tflite", [ids[:32]])
    assert report["non_int8_ops"] == {"DEQUANTIZE": 1}  # ids in, int8 to the logits
    assert report["float_layers"] == []
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    outputs = np.concatenate([list(runner(token_ids=ids[i:i + 1]).values())[0]
                              for i in range(len(ids))])
    expected = keras.ops.convert_to_numpy(qat(ids, training=False))
    assert_close_in_steps(outputs, expected, float(qat.get_layer("head").output_quantizer.step()))
    float_accuracy = np.mean(model.predict(ids, verbose=0).argmax(-1) == y)
    assert float_accuracy >= 0.9 and np.mean(outputs.argmax(-1) == y) >= float_accuracy - 0.05


def readme_model(length=12):
    """The README's "Using the layers" model, small: token, segment and position
    embeddings, two post-LN encoder blocks, a Dense head on the first position."""
    token_ids = keras.Input((length,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((length,), dtype="int32", name="segment_ids")
    x = TokenAndPositionEmbedding(vocabulary_size=50, sequence_length=length,
                                  embedding_dim=32, num_segments=2, mask_zero=True)(
        token_ids, segment_ids=segment_ids)
    for _ in range(2):
        x = TransformerEncoderBlock(num_heads=4, intermediate_dim=64,
                                    activation="gelu_approximate")(x)
    logits = keras.layers.Dense(2, name="head")(x[:, 0])
    return keras.Model([token_ids, segment_ids], logits)


@pytest.fixture(scope="module")
def readme_trained():
    """`readme_model` fit to "does token 7 occur before the padding" (ids 1-49, lengths
    4-12, the first token a [CLS]-like 1)."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 50, (384, 12)).astype("int32")
    ids[:, 0] = 1
    ids[np.arange(12)[None] >= rng.integers(4, 13, 384)[:, None]] = 0
    y = (ids == 7).any(-1).astype("int32")
    inputs = [ids, np.zeros_like(ids)]
    model = readme_model()
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(inputs, y, epochs=12, batch_size=32, verbose=0)
    return model, inputs, y


def file_outputs(path, batch, rows=None):
    """The first output of the TFLite file at `path` on the first `rows` (default: all)
    examples of `batch` (a dict, or the README model's `[token ids, segment ids]`), one
    example per call (the file's batch is 1)."""
    if not isinstance(batch, dict):
        batch = dict(zip(("token_ids", "segment_ids"), batch))
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    rows = len(next(iter(batch.values()))) if rows is None else rows
    return np.concatenate([list(runner(**{k: v[i:i + 1] for k, v in batch.items()})
                                .values())[0] for i in range(rows)])


@pytest.mark.parametrize("float_residual", [False, True])
def test_the_readme_model_becomes_an_int8_file_of_its_own_layers(readme_trained, tmp_path,
                                                                  float_residual):
    """The README's layers get their int8 layout (the same classes, a `quantization`
    setting, the float weights); the file has builtin ops only, int8 from the ids to the
    logits (with `float_residual`, the recipe's float residual stream and the ops XNNPACK
    runs in float), its logits within a few steps of the QAT model's, its accuracy the
    float model's."""
    model, inputs, y = readme_trained
    qat = quantize_model(model, float_residual=float_residual)
    blocks = [layer for layer in qat.layers if isinstance(layer, TransformerEncoderBlock)]
    assert [block.quantization["float_residual"] for block in blocks] == [float_residual] * 2
    assert float_layers(qat) == []
    if float_residual:  # each block reads the float stream and rounds what its matmuls read
        assert [block.quantization["quantize_input"] for block in blocks] == [True, True]
    else:  # each block reads the int8 output of the layer before
        assert [block.quantization["input_producer"] for block in blocks] == [
            qat.layers[2].quantizers["output_quantizer"].path,
            blocks[0].quantizers["feedforward_layer_norm_quantizer"].path]
    calibrate_model(qat, [[ids[i:i + 64] for ids in inputs] for i in range(0, 256, 64)])
    report = export_model_int8_tflite(qat, tmp_path / "model_int8.tflite",
                                      [[ids[:32] for ids in inputs]])
    assert not report["custom_ops"]
    int8 = {"CONV_2D", "GATHER", "SPLIT", "TRANSPOSE", "RESHAPE", "STRIDED_SLICE"}
    assert not int8 & set(report["non_int8_ops"]), report["non_int8_ops"]
    if not float_residual:
        assert report["non_int8_ops"] == {"DEQUANTIZE": 1}
    else:
        assert {"ADD", "SOFTMAX", "GELU"} <= set(report["non_int8_ops"])
    outputs = file_outputs(report["path"], inputs)
    expected = keras.ops.convert_to_numpy(qat(inputs, training=False))
    step = float(qat.get_layer("head").output_quantizer.step())
    steps = np.abs(outputs - expected).max(-1) / step  # per example
    # Measured over 6 seeds of the fixture: all-int8 median 1, max 2-5 steps; float
    # residual median 0-1, max 1-2; a wrong scale or a missed rounding moves them all.
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    float_accuracy = np.mean(model.predict(inputs, verbose=0).argmax(-1) == y)
    assert float_accuracy >= 0.9
    assert np.mean(outputs.argmax(-1) == y) >= float_accuracy - 0.02


def test_a_layer_without_an_int8_layout_stays_float_and_is_named():
    """A bare relative attention layer has no int8 layout: kept float, in the warning; the
    pre-LN encoder block, the decoder block with cross-attention and the Transformer-XL
    block (with a memory) beside it are quantized."""
    decoder_in, encoder_out = keras.Input((6, 16)), keras.Input((5, 16))
    memory = keras.Input((4, 16))
    x = TransformerEncoderBlock(2, 32, norm_first=True, name="pre_ln")(decoder_in)
    x = TransformerDecoderBlock(2, 32, name="cross")(x, encoder_out)
    x = TransformerXLBlock(2, 32, name="xl")(x, memory=memory)[0]  # (outputs, next memory)
    x = RelativeMultiHeadAttention(2, 8, name="relative")(x)
    model = keras.Model([decoder_in, encoder_out, memory], keras.layers.Dense(2)(x))
    with pytest.warns(UserWarning, match="relative"):
        qat = quantize_model(model)
    assert float_layers(qat) == ["relative"]
    for name in ("pre_ln", "cross", "xl"):
        assert qat.get_layer(name).quantization is not None
    assert "xl/qkv" in model_quantization_ops(qat)


@pytest.fixture(scope="module")
def bert_trained():
    """A small `BertClassifier` (a task model around a nested `BertBackbone`) fit to "does
    token 7 occur", with BERT's three named inputs."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 60, (384, 12)).astype("int32")
    ids[:, 0] = 1
    mask = (np.arange(12)[None] < rng.integers(4, 13, 384)[:, None]).astype("int32")
    ids *= mask
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    y = (ids == 7).any(-1).astype("int32")
    backbone = BertBackbone(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=32,
                            intermediate_dim=64, max_sequence_length=16, dropout=0.0)
    model = BertClassifier(backbone, num_classes=2, dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(inputs, y, epochs=10, batch_size=32, verbose=0)
    return model, inputs, y


@pytest.mark.parametrize("float_residual, float_channels", [(False, 0), (True, 0), (True, 4)])
def test_a_bert_classifier_and_its_nested_backbone_become_one_int8_file(
        bert_trained, tmp_path, float_residual, float_channels):
    """A task model is quantized through its nested backbone (its embeddings, LayerNorm,
    blocks and pooler); the file of the dynamic-length model, at a given length, is
    builtins-only, within a few steps of the QAT model and as accurate as the float model."""
    model, inputs, y = bert_trained
    qat = quantize_model(model, float_residual=float_residual,
                         feedforward_float_channels=float_channels)
    assert float_layers(qat) == []
    batches = [{k: v[i:i + 64] for k, v in inputs.items()} for i in range(0, 256, 64)]
    calibrate_model(qat, batches)
    report = export_model_int8_tflite(qat, tmp_path / "model_int8.tflite", batches[:1],
                                      sequence_length=12)
    assert not report["custom_ops"] and "CONV_2D" not in report["non_int8_ops"]
    if not float_residual:
        assert report["non_int8_ops"] == {"DEQUANTIZE": 1}
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    outputs = np.concatenate([list(runner(**{k: v[i:i + 1] for k, v in inputs.items()})
                                   .values())[0] for i in range(len(y))])
    expected = keras.ops.convert_to_numpy(qat(inputs, training=False))
    step = float(qat.get_layer("logits").output_quantizer.step())
    steps = np.abs(outputs - expected).max(-1) / step
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    float_accuracy = np.mean(model.predict(inputs, verbose=0).argmax(-1) == y)
    assert float_accuracy >= 0.9
    assert np.mean(outputs.argmax(-1) == y) >= float_accuracy - 0.02
    # Measured: the file 1 step from the QAT model at most (median 1 all-int8, 0 with the
    # float residual), accuracy 1.0 throughout.
    backbone = next(layer for layer in qat.layers if isinstance(layer, keras.Model))
    for i in range(2) if float_channels else ():
        order = keras.ops.convert_to_numpy(
            backbone.get_layer(f"transformer_layer_{i}").feedforward_channel_order)
        assert sorted(order) == list(range(order.size))  # a permutation
        # The float channels (stored last) are the widest up-projection outputs of the
        # float model's block on the calibration batches (measured: the same 4 channels;
        # block 0's 4th and 5th widest 0.1 % apart, hence the 1 % slack).
        width = _intermediate_widths(model, f"transformer_layer_{i}", batches)
        kept = order[-float_channels:]
        assert width[kept].min() >= 0.99 * np.sort(width)[-float_channels], (
            sorted(kept), np.argsort(width)[-float_channels:])


def _intermediate_widths(model, block_name, batches):
    """max - min of each channel of the float `block_name`'s `W_1 x + b_1` over `batches`
    (every position), read from its `feedforward_intermediate_dense`."""
    backbone = next(layer for layer in model.layers if isinstance(layer, keras.Model))
    dense = backbone.get_layer(block_name).feedforward_intermediate_dense
    seen, call = [], dense.call
    dense.call = lambda x, **kwargs: seen.append(call(x, **kwargs)) or seen[-1]
    try:
        for batch in batches:
            model(batch, training=False)
    finally:
        del dense.call
    h = np.concatenate([keras.ops.convert_to_numpy(value).reshape(-1, value.shape[-1])
                        for value in seen])
    return h.max(0) - h.min(0)


@pytest.fixture(scope="module")
def gpt_trained():
    """A small `GPTCausalLM` (pre-LN, causal, decoder-only blocks, the LM head tied to the
    token table) fit to "the next token is this one plus one"."""
    keras.utils.set_random_seed(0)
    model = GPTCausalLM(GPTBackbone(vocabulary_size=40, num_layers=2, num_heads=2,
                                    hidden_dim=32, intermediate_dim=64,
                                    max_sequence_length=16, dropout=0.0))
    starts = np.random.default_rng(0).integers(1, 40, 512)
    sequences = ((starts[:, None] + np.arange(13)[None]) % 39 + 1).astype("int32")
    x = {"token_ids": sequences[:, :12], "padding_mask": np.ones((512, 12), "int32")}
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, sequences[:, 1:], epochs=6, batch_size=32, verbose=0)
    return model, x, sequences[:, 1:]


def calibrated_file(model, x, path, length, float_residual):
    """`(QAT copy, its int8 file's report)`: `model` quantized, calibrated on the first 256
    examples of `x` and written to `path` at `length`, checked builtins-only (all-int8: int8
    from the inputs to the outputs)."""
    qat = quantize_model(model, float_residual=float_residual)
    assert float_layers(qat) == []
    batches = [{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)]
    calibrate_model(qat, batches)
    report = export_model_int8_tflite(qat, path, batches[:1], sequence_length=length)
    assert not report["custom_ops"] and "CONV_2D" not in report["non_int8_ops"]
    if not float_residual:
        assert report["non_int8_ops"] == {"DEQUANTIZE": 1}
    return qat, report


@pytest.mark.parametrize("float_residual", [False, True])
def test_a_gpt_forward_pass_becomes_an_int8_file(gpt_trained, tmp_path, float_residual):
    """GPT's pre-LN, causal blocks have their int8 layout too, and its tied head reads the
    QAT copy's int8 token table: the LM's file is builtins-only (all-int8: int8 from the ids
    to the logits), within a few steps of the QAT model, and predicts the next token as the
    float model does. Measured: all-int8 median 2, max 4 steps; float residual median 0,
    max 2; accuracy 1.0."""
    model, x, y = gpt_trained
    qat, report = calibrated_file(model, x, tmp_path / "lm_int8.tflite", 12, float_residual)
    backbone = next(layer for layer in qat.layers if isinstance(layer, keras.Model))
    assert qat.get_layer("lm_head").embedding() is backbone.get_layer(
        "embeddings").token_embedding
    rows = 64
    outputs = file_outputs(report["path"], x, rows)
    expected = keras.ops.convert_to_numpy(qat({k: v[:rows] for k, v in x.items()},
                                              training=False))
    step = float(qat.get_layer("lm_head").output_quantizer.step())
    steps = np.abs(outputs - expected).max(-1) / step  # per position
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    float_predictions = model.predict({k: v[:rows] for k, v in x.items()}, verbose=0)
    float_accuracy = np.mean(float_predictions.argmax(-1) == y[:rows])
    assert float_accuracy >= 0.9
    assert np.mean(outputs.argmax(-1) == y[:rows]) >= float_accuracy - 0.02


@pytest.fixture(scope="module")
def seq2seq_trained():
    """A small `Seq2SeqTransformer` (post-LN encoder and decoder blocks with
    cross-attention, one `ReversibleEmbedding` for both sides and the logits, sinusoids)
    fit to copy its source (ids 3-23, lengths 3-8) and end with EOS 2."""
    keras.utils.set_random_seed(0)
    model = Seq2SeqTransformer(vocabulary_size=24, num_layers=2, num_heads=2, hidden_dim=32,
                               intermediate_dim=64, dropout=0.0)
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 9, 512)
    source = rng.integers(3, 24, (512, 10)) * (np.arange(10)[None] < lengths[:, None])
    target = source.copy()
    target[np.arange(512), lengths] = 2  # EOS
    x, y = make_teacher_forcing_batch(source, target, bos_token_id=1)
    x = {name: keras.ops.convert_to_numpy(value).astype("int32") for name, value in x.items()}
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, keras.ops.convert_to_numpy(y), sample_weight=x["decoder_padding_mask"],
              epochs=20, batch_size=32, verbose=0)
    return model, x, keras.ops.convert_to_numpy(y), target


@pytest.mark.slow  # two conversions and 64 x 2 LiteRT runs
@pytest.mark.parametrize("float_residual", [False, True])
def test_a_translation_transformer_becomes_an_int8_file(seq2seq_trained, tmp_path,
                                                        float_residual):
    """The encoder-decoder Transformer (its teacher-forced forward pass): cross-attention
    blocks, the tied `ReversibleEmbedding` (lookups and logits) and the `sqrt(d)` scaling
    and sinusoid sum of its functional graph all get their int8 layout (no layer left
    float); the file is builtins-only (all-int8: int8 from the ids to the logits), its
    logits within a few steps of the QAT model's, its next-token accuracy the float
    model's. Measured: all-int8 median 4, 95th percentile 9, max 39 steps; float
    residual median 2, max 7."""
    model, x, y, _ = seq2seq_trained
    assert "decoder_layer_1/cross_key_value" in model_quantization_ops(model)
    qat, report = calibrated_file(model, x, tmp_path / "translator_int8.tflite", 10,
                                  float_residual)
    rows = 64
    outputs = file_outputs(report["path"], x, rows)
    expected = keras.ops.convert_to_numpy(qat({k: v[:rows] for k, v in x.items()}))
    step = float(qat.get_layer("token_embedding_output_quantizer_2").step())  # the logits'
    real = x["decoder_padding_mask"][:rows].astype(bool)
    steps = np.abs(outputs - expected).max(-1)[real] / step  # per real position
    # Differences of a step or two where a block's output is rounded grow through the
    # four blocks (two plain encoder blocks on float inputs: median 1 step after one, 3
    # after two): the logits' scale is a generic check, a wrong scale or zero point
    # moves every logit by far more.
    assert np.median(steps) <= 6.01 and np.percentile(steps, 95) <= 16.01, (
        np.median(steps), np.percentile(steps, 95))
    float_accuracy = np.mean(model.predict({k: v[:rows] for k, v in x.items()}, verbose=0)
                             .argmax(-1)[real] == y[:rows][real])
    assert float_accuracy >= 0.9
    assert np.mean(outputs.argmax(-1)[real] == y[:rows][real]) >= float_accuracy - 0.02


def test_representative_inputs_of_another_shape_or_kind_are_refused(tmp_path):
    """The file's examples are checked against its inputs before the conversion: another
    length, or float values for integer ids, is an error naming the input (NumPy's int64
    ids are taken as int32: the translation test's encoder examples)."""
    ids = keras.Input((8,), dtype="int32", name="token_ids")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(ids))
    qat = quantize_model(keras.Model(ids, keras.layers.Dense(2)(pooled)))
    with pytest.raises(ValueError, match=r"'token_ids'.*shape \(6,\).*takes \(8,\)"):
        export_model_int8_tflite(qat, tmp_path / "m.tflite", [np.ones((2, 6), "int32")])
    with pytest.raises(ValueError, match="float64 values.*int32 input 'token_ids'"):
        export_model_int8_tflite(qat, tmp_path / "m.tflite", [np.full((2, 8), 1.5)])


def greedy_translations(step, encoder_outputs, encoder_padding_mask, max_length):
    """Greedy decoding with a `decoder_step_model`-shaped callable (BOS 1): the tokens
    `(B, max_length)` and each step's inputs."""
    rows = len(encoder_outputs)
    cache = np.zeros((rows, 2, 2, max_length, 2, 16), "float32")
    token, tokens, step_inputs = np.ones((rows, 1), "int32"), [], []
    for index in range(max_length):
        inputs = {"decoder_token_ids": token,
                  "cache_update_index": np.full((rows,), index, "int32"),
                  "self_attention_cache": cache, "encoder_outputs": encoder_outputs,
                  "encoder_padding_mask": encoder_padding_mask}
        step_inputs.append(inputs)
        outputs = step(inputs)
        cache = np.asarray(outputs["self_attention_cache"])
        token = np.asarray(outputs["logits"]).argmax(-1)[:, None].astype("int32")
        tokens.append(token)
    return np.concatenate(tokens, axis=1), step_inputs


@pytest.mark.slow  # two conversions and 64 greedy decodings on LiteRT
def test_translation_runs_as_an_int8_encoder_and_an_int8_decoding_step(seq2seq_trained,
                                                                      tmp_path):
    """On-device translation's two files: `encoder_model()` all-int8, and one decoding
    step with the self-attention cache in and out (`decoder_step_model`), its weight
    matmuls int8 (the cache's update and the attention over it stay float: TFLite's
    DYNAMIC_UPDATE_SLICE is not quantized by the converter). Greedy decoding on LiteRT
    with the two files gives the QAT models' tokens (measured 97.8 %) and copies as many
    sources exactly as the float model (measured 0.83 against 0.75)."""
    model, x, _, target = seq2seq_trained
    length, rows = 10, 64
    source = {"encoder_token_ids": x["encoder_token_ids"],
              "encoder_padding_mask": x["encoder_padding_mask"]}
    encoder, step = quantize_model(model.encoder_model()), quantize_model(
        model.decoder_step_model(max_length=length))
    calibrate_model(encoder, [{k: v[i:i + 64] for k, v in source.items()}
                              for i in range(0, 256, 64)])
    float_outputs = keras.ops.convert_to_numpy(
        model.encoder_model()({k: v[:rows] for k, v in source.items()}))
    float_tokens, step_inputs = greedy_translations(
        model.decoder_step_model(max_length=length), float_outputs,
        source["encoder_padding_mask"][:rows], length)
    calibrate_model(step, step_inputs)
    encoder_file = export_model_int8_tflite(
        encoder, tmp_path / "encoder_int8.tflite",
        [{k: v[i:i + 1].astype("int64") for k, v in source.items()} for i in range(16)],
        sequence_length=length)
    step_file = export_model_int8_tflite(
        step, tmp_path / "decoder_step_int8.tflite",
        [{k: v[i:i + 1] for k, v in inputs.items()} for inputs in step_inputs for i in (0, 1)],
        sequence_length=length)
    assert encoder_file["non_int8_ops"] == {"DEQUANTIZE": 1}
    assert not step_file["custom_ops"]
    assert {"FULLY_CONNECTED", "CONV_2D", "GATHER", "SOFTMAX"}.isdisjoint(
        step_file["non_int8_ops"])  # the weight matmuls, lookups and softmax are int8
    step_runner = Interpreter(model_path=step_file["path"]).get_signature_runner()

    def file_step(inputs):
        outputs = [step_runner(**{k: v[i:i + 1] for k, v in inputs.items()})
                   for i in range(rows)]
        return {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}

    file_tokens, _ = greedy_translations(file_step, file_outputs(encoder_file["path"],
                                                                source, rows),
                                         source["encoder_padding_mask"][:rows], length)
    qat_tokens, _ = greedy_translations(
        step, keras.ops.convert_to_numpy(encoder({k: v[:rows] for k, v in source.items()})),
        source["encoder_padding_mask"][:rows], length)
    assert np.mean(file_tokens == qat_tokens) >= 0.9

    def copied(tokens):  # the source and EOS, exactly
        ends = source["encoder_padding_mask"][:rows].sum(-1) + 1
        return np.mean([np.array_equal(tokens[i, :ends[i]], target[i, :ends[i]])
                        for i in range(rows)])

    assert copied(float_tokens) >= 0.6
    assert copied(file_tokens) >= copied(float_tokens) - 0.1


@pytest.mark.parametrize("float_residual, min_cosine", [(False, 0.98), (True, 0.999)])
def test_a_mean_pooled_sentence_embedder_keeps_its_direction(tmp_path, float_residual,
                                                             min_cosine):
    """A sentence embedder (BERT, the mean of the real tokens' outputs): its int8 file's
    vectors point where the float model's do (measured cosine: all-int8 min 0.998, float
    residual min 0.9999) and stay within a few steps of the QAT model; padding is left
    out of the mean in the file too."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=32,
                            intermediate_dim=64, max_sequence_length=16, dropout=0.0)
    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    mean = keras.layers.GlobalAveragePooling1D(name="mean")(
        backbone(inputs)["sequence_output"], mask=keras.ops.cast(inputs["padding_mask"], bool))
    model = keras.Model(inputs, mean)
    rng = np.random.default_rng(0)
    mask = (np.arange(12)[None] < rng.integers(4, 13, 128)[:, None]).astype("int32")
    x = {"token_ids": rng.integers(2, 60, (128, 12)).astype("int32") * mask,
         "segment_ids": np.zeros((128, 12), "int32"), "padding_mask": mask}
    qat = quantize_model(model, float_residual=float_residual)
    calibrate_model(qat, [{k: v[i:i + 32] for k, v in x.items()} for i in range(0, 128, 32)])
    report = export_model_int8_tflite(qat, tmp_path / "embedder_int8.tflite",
                                      [{k: v[:32] for k, v in x.items()}], sequence_length=12)
    assert not report["custom_ops"] and "CONV_2D" not in report["non_int8_ops"]
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    vectors = np.concatenate([list(runner(**{k: v[i:i + 1] for k, v in x.items()})
                                   .values())[0] for i in range(64)])
    float_vectors = model.predict({k: v[:64] for k, v in x.items()}, verbose=0)
    cosine = (vectors * float_vectors).sum(-1) / (
        np.linalg.norm(vectors, axis=-1) * np.linalg.norm(float_vectors, axis=-1))
    assert cosine.min() >= min_cosine, cosine.min()
    expected = keras.ops.convert_to_numpy(qat({k: v[:64] for k, v in x.items()}))
    step = float(qat.get_layer("mean_output_quantizer").step())
    steps = np.abs(vectors - expected).max(-1) / step  # per sentence
    # All-int8 measured median 1, max 18 steps: the masked mean's MUL, SUM and DIV are
    # int8 ops the converter calibrates (QAT rounds only their output); float residual:
    # they run in float, 0 steps.
    assert np.median(steps) <= 2.01 and steps.max() <= 24.01, (np.median(steps), steps.max())
    # The mean is over the real tokens: padding ids do not move a file's vector.
    shortest = int(np.argmin(mask.sum(-1)))
    row = {k: v[shortest:shortest + 1].copy() for k, v in x.items()}
    first = list(runner(**row).values())[0]
    assert (row["padding_mask"] == 0).sum() >= 4
    row["token_ids"][row["padding_mask"] == 0] = 5
    np.testing.assert_array_equal(list(runner(**row).values())[0], first)


def test_float_ops_keep_the_ops_a_budget_names_in_float(bert_trained, tmp_path):
    """`float_ops` (an int8 budget's choices) by the names `model_quantization_ops` lists:
    a block matmul and the head stay float (in the QAT model and in the file), the rest
    int8; an unknown name is refused with the model's names."""
    model, inputs, _ = bert_trained
    ops_ = model_quantization_ops(model)
    assert ops_[0] == "embeddings" and ops_[-2:] == ["pooled_dense", "logits"]
    assert ops_[1:5] == [f"transformer_layer_0/{m}" for m in (
        "qkv", "attention_output", "intermediate", "feedforward_output")]
    qat = quantize_model(model, float_residual=True,
                         float_ops=["transformer_layer_1/intermediate", "logits"])
    backbone = next(layer for layer in qat.layers if isinstance(layer, keras.Model))
    assert backbone.get_layer("transformer_layer_1").float_matmuls == ("intermediate",)
    assert backbone.get_layer("transformer_layer_0").float_matmuls == ()
    assert not qat.get_layer("logits").quantize
    batches = [{k: v[i:i + 64] for k, v in inputs.items()} for i in range(0, 128, 64)]
    calibrate_model(qat, batches)
    report = export_model_int8_tflite(qat, tmp_path / "model.tflite", batches[:1],
                                      sequence_length=12)
    # The two float matmuls: FULLY_CONNECTED in float; every other matmul int8.
    assert report["non_int8_ops"].get("FULLY_CONNECTED") == 2, report["non_int8_ops"]
    assert "CONV_2D" not in report["non_int8_ops"] and report["ops"]["CONV_2D"] == 10 - 2
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    outputs = np.concatenate([list(runner(**{k: v[i:i + 1] for k, v in inputs.items()})
                                   .values())[0] for i in range(32)])
    expected = keras.ops.convert_to_numpy(qat({k: v[:32] for k, v in inputs.items()}))
    assert np.abs(outputs - expected).max() <= 0.05 * np.abs(expected).max()
    with pytest.raises(ValueError, match="`float_ops` names an op the model does not have"):
        quantize_model(model, float_residual=True, float_ops=["transformer_layer_9/qkv"])
    with pytest.raises(ValueError, match="needs `float_residual=True`"):
        quantize_model(model, float_ops=["logits"])


MIRRORED_QAT = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
from keras_attn.layers import TokenAndPositionEmbedding, TransformerEncoderBlock
from keras_attn.quantization import calibrate_model, quantize_model


def build():
    keras.utils.set_random_seed(0)
    ids = keras.Input((8,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(30, 8, 16)(ids)
    x = TransformerEncoderBlock(2, 32)(x)
    return keras.Model(ids, keras.layers.Dense(2)(x[:, 0]))


rng = np.random.default_rng(0)
data = rng.integers(1, 30, (64, 8)).astype("int32")
labels = (data == 7).any(-1).astype("int32")
weights = {}
for name, strategy in (("one", tf.distribute.OneDeviceStrategy("/cpu:0")),
                       ("mirrored", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    with strategy.scope():
        qat = quantize_model(build())
        calibrate_model(qat, [data[:32]])
        qat.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [np.asarray(w) for w in qat.trainable_weights]
    qat.fit(data, labels, epochs=2, batch_size=16, shuffle=False, verbose=0)
    weights[name] = [np.asarray(w) for w in qat.trainable_weights]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(before, weights[name]))
    print(name, strategy.num_replicas_in_sync)
difference = max(float(np.abs(a - b).max()) for a, b in zip(*weights.values()))
print(f"DIFF {difference} MOVED {moved}")
"""


@pytest.mark.slow  # a fresh process (two logical CPUs are set before TensorFlow starts)
def test_qat_fits_under_a_mirrored_strategy_as_on_one_device(tmp_path):
    """A `quantize_model` copy built in a `MirroredStrategy` scope trains with `fit` over two
    replicas to the weights of one device (the ranges are averaged over the replicas):
    measured 0.0013 apart after training moved them by 2.2."""
    script = tmp_path / "mirrored_qat.py"
    script.write_text(textwrap.dedent(MIRRORED_QAT))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mirrored 2" in result.stdout
    difference, moved = (float(value) for value in
                         result.stdout.split("DIFF ")[1].split(" MOVED "))
    assert moved > 0.5 and difference < 0.01, (difference, moved)


@pytest.fixture(scope="module")
def xlnet_trained():
    """A small `XLNetClassifier` (relative attention over two segments, the last real
    token's summary) fit to "does token 7 occur"."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 60, (384, 12)).astype("int32")
    mask = (np.arange(12)[None] < rng.integers(4, 13, 384)[:, None]).astype("int32")
    ids *= mask
    segments = ((np.arange(12)[None] >= rng.integers(2, 8, 384)[:, None]) & (mask > 0))
    inputs = {"token_ids": ids, "segment_ids": segments.astype("int32"), "padding_mask": mask}
    y = (ids == 7).any(-1).astype("int32")
    backbone = XLNetBackbone(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=32,
                             intermediate_dim=64, dropout=0.0)
    model = XLNetClassifier(backbone, num_classes=2, dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(inputs, y, epochs=10, batch_size=32, verbose=0)
    return model, inputs, y


@pytest.mark.parametrize("float_residual", [False, True])
def test_an_xlnet_classifier_becomes_an_int8_file(xlnet_trained, tmp_path, float_residual):
    """XLNet's blocks have their int8 layout (the relative position and segment terms in
    float beside the int8 matmuls): the classifier's file is builtins-only, within a few
    steps of the QAT model and as accurate as the float model. Measured: all-int8 median 1,
    max 2 steps; float residual median 0, max 1; accuracy 1.0."""
    model, inputs, y = xlnet_trained
    qat, report = calibrated_file(model, inputs, tmp_path / "xlnet_int8.tflite", 12,
                                  float_residual)
    rows = 128
    outputs = file_outputs(report["path"], inputs, rows)
    expected = keras.ops.convert_to_numpy(
        qat({k: v[:rows] for k, v in inputs.items()}, training=False))
    step = float(qat.get_layer("logits").output_quantizer.step())
    steps = np.abs(outputs - expected).max(-1) / step
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    float_accuracy = np.mean(model.predict(inputs, verbose=0).argmax(-1) == y)
    assert float_accuracy >= 0.9
    assert np.mean(outputs.argmax(-1) == y[:rows]) >= float_accuracy - 0.02


@pytest.fixture(scope="module")
def transformer_xl_trained():
    """A small `TransformerXLLM` (post-LN, relative attention over a memory of one segment
    of 8 tokens) fit to streams that repeat a random 8-token period: from the second
    segment on, the next token is in the memory. Returns the model, its second segments
    with the memory it left after the first, their next tokens and the third segments."""
    keras.utils.set_random_seed(0)
    length = 8
    period = np.random.default_rng(0).integers(1, 40, (512, length))
    streams = np.tile(period, (1, 4))[:, :3 * length + 1].astype("int32")
    model = TransformerXLLM(vocabulary_size=40, num_layers=2, num_heads=2, hidden_dim=32,
                            intermediate_dim=64, memory_length=length, dropout=0.0)
    model.compile(keras.optimizers.Adam(3e-3), loss={
        "logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    for _ in range(15):
        for i in range(0, 384, 32):
            model.train_on_segments(streams[i:i + 32], length)
    first = model.predict_on_batch({"token_ids": streams[:, :length],
                                    **model.initial_memory(len(streams))})
    x = {"token_ids": streams[:, length:2 * length], "memory": first["memory"],
         "memory_padding_mask": first["memory_padding_mask"]}
    return model, x, streams[:, length + 1:2 * length + 1], streams[:, 2 * length:]


@pytest.mark.parametrize("float_residual", [
    pytest.param(False, marks=pytest.mark.slow),  # the converter calibrates: 13 s
    True])
def test_a_transformer_xl_lm_with_its_memory_becomes_an_int8_file(
        transformer_xl_trained, tmp_path, float_residual):
    """Transformer-XL's blocks have their int8 layout (the memory's rows through the int8
    Q/K/V matmul, the relative terms in float beside it, causal over memory and segment):
    the LM, its memory an input and an output of length 8 (the file's fixed length, as
    the segment's), becomes a builtins-only file (all-int8: int8 from the ids and the
    QUANTIZE of the memory to the two float outputs) whose logits are within a few steps
    of the QAT model's and whose memory output is the QAT model's, which the file reads
    back for the next segment as accurately as the float model does. Measured (held-out
    streams): logits all-int8 median 4, 95th percentile 8, max 30 steps (as the
    translation Transformer's, the other tied `ReversibleEmbedding` head), float residual
    median 2, p95 4, max 6 (max 17 when the memory the blocks return is not the input
    their Q/K/V matmul reads: the file then rounds the residual stream for it); memory
    mean 0.41 / 0.17 steps; accuracy within 1 %."""
    model, x, y, third = transformer_xl_trained
    qat = quantize_model(model, float_residual=float_residual)
    assert float_layers(qat) == []
    batches = [{k: v[i:i + 64] for k, v in x.items()} for i in range(0, 256, 64)]
    calibrate_model(qat, batches)
    report = export_model_int8_tflite(qat, tmp_path / "xl_int8.tflite", batches[:1],
                                      sequence_length=8)
    assert not report["custom_ops"] and "CONV_2D" not in report["non_int8_ops"]
    if not float_residual:
        assert report["non_int8_ops"] == {"DEQUANTIZE": 2, "QUANTIZE": 1}
    runner = Interpreter(model_path=report["path"]).get_signature_runner()
    held = {k: v[384:448] for k, v in x.items()}  # streams the model was not fit to
    outputs = [runner(**{k: v[i:i + 1] for k, v in held.items()}) for i in range(64)]
    got = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
    expected = {k: keras.ops.convert_to_numpy(v) for k, v in qat(held, training=False).items()}
    step = float(qat.get_layer("token_embedding_output_quantizer_1").step())  # the logits'
    steps = (np.abs(got["logits"] - expected["logits"]).max(-1) / step).ravel()
    if float_residual:  # as GPT's: the memory the file returns rounded only where QAT does
        assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())
    else:  # as the translation Transformer's (a steps' difference grows through the blocks)
        assert np.median(steps) <= 6.01 and np.percentile(steps, 95) <= 16.01, (
            np.median(steps), np.percentile(steps, 95))
    memory_steps = np.abs(got["memory"] - expected["memory"]) / float(
        qat.get_layer("memory_update_output_quantizer").step())
    assert memory_steps.mean() <= 1.0 and np.percentile(memory_steps, 99) <= 6.01, (
        memory_steps.mean(), np.percentile(memory_steps, 99))
    np.testing.assert_array_equal(got["memory_padding_mask"], np.ones((64, 8)))
    float_outputs = model.predict(held, verbose=0)
    float_accuracy = np.mean(float_outputs["logits"].argmax(-1) == y[384:448])
    assert float_accuracy >= 0.9
    assert np.mean(got["logits"].argmax(-1) == y[384:448]) >= float_accuracy - 0.02
    # The third segments, each read with the memory the file returned.
    next_segment = {"token_ids": third[384:448, :8], "memory": got["memory"],
                    "memory_padding_mask": got["memory_padding_mask"]}
    logits = np.concatenate([runner(**{k: v[i:i + 1] for k, v in next_segment.items()})[
        "logits"] for i in range(64)])
    float_logits = model.predict({**next_segment, "memory": float_outputs["memory"]},
                                 verbose=0)["logits"]
    labels = third[384:448, 1:9]
    float_accuracy = np.mean(float_logits.argmax(-1) == labels)
    assert float_accuracy >= 0.9
    assert np.mean(logits.argmax(-1) == labels) >= float_accuracy - 0.02


def test_a_gpt_with_position_embeddings_per_block_is_quantized_whole(tmp_path):
    """`GPTBackbone(layer_position_embeddings=True)` adds a `PositionEmbedding` before each
    block: its rows are rounded where the int8 file stores them (a constant the ADD
    reads in int8), as `SinusoidalPositionEncoding`'s; nothing is left float or warned
    about, and the file computes what the QAT model computes. Measured (untrained): median
    1, max 4 steps."""
    keras.utils.set_random_seed(0)
    model = GPTCausalLM(GPTBackbone(vocabulary_size=40, num_layers=2, num_heads=2,
                                    hidden_dim=32, intermediate_dim=64,
                                    max_sequence_length=16, dropout=0.0,
                                    layer_position_embeddings=True))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="quantize_model keeps")
        qat = quantize_model(model)
    assert float_layers(qat) == []
    backbone = next(layer for layer in qat.layers if isinstance(layer, keras.Model))
    quantizer = backbone.get_layer("layer_position_embedding_0_output_quantizer")
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.integers(1, 40, (64, 12)).astype("int32"),
         "padding_mask": np.ones((64, 12), "int32")}
    calibrate_model(qat, [x])
    table = keras.ops.convert_to_numpy(
        model.backbone.get_layer("layer_position_embedding_0").embeddings)[:12]
    assert float(quantizer.max_value.numpy()) == pytest.approx(max(table.max(), 0.0))
    report = export_model_int8_tflite(qat, tmp_path / "gpt_int8.tflite", [x],
                                      sequence_length=12)
    assert report["non_int8_ops"] == {"DEQUANTIZE": 1}
    outputs = file_outputs(report["path"], x, 16)
    expected = keras.ops.convert_to_numpy(qat({k: v[:16] for k, v in x.items()},
                                              training=False))
    steps = np.abs(outputs - expected).max(-1) / float(
        qat.get_layer("lm_head").output_quantizer.step())
    assert np.median(steps) <= 2.01 and steps.max() <= 8.01, (np.median(steps), steps.max())


@pytest.mark.parametrize("fixture", ["bert_trained", "gpt_trained", "readme_trained",
                                     "xlnet_trained"])
def test_the_float_model_comes_back_exactly(fixture, request):
    """`dequantize_model` of a copy (calibrated with the default recipe: the float channels
    permuted) is the float model again: the same classes, weights and outputs; a tied head
    stays tied. After QAT, it holds the fine-tuned weights."""
    model, inputs, _ = request.getfixturevalue(fixture)
    qat = quantize_model(model, **QuantizationRecipe().layout())
    batches = [keras.tree.map_structure(lambda v: v[:64], inputs)]
    calibrate_model(qat, batches)
    float_again = dequantize_model(qat)
    assert float_layers(float_again) == []  # all of it known, nothing quantized
    assert not [layer for layer in float_again._flatten_layers()
                if isinstance(layer, ActivationQuantizer)]
    for old, new in zip(model.weights, float_again.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(new),
                                      keras.ops.convert_to_numpy(old), err_msg=old.path)
    np.testing.assert_allclose(float_again.predict(batches[0], verbose=0),
                               model.predict(batches[0], verbose=0), atol=1e-5)
    if fixture == "gpt_trained":
        backbone = next(layer for layer in float_again.layers if isinstance(layer, keras.Model))
        assert float_again.get_layer("lm_head").embedding() is backbone.get_layer(
            "embeddings").token_embedding
    if fixture == "readme_trained":  # QAT moves the weights; the float model follows
        y = request.getfixturevalue(fixture)[2]
        qat.compile(keras.optimizers.Adam(1e-3),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        qat.fit(inputs, y, epochs=1, batch_size=64, verbose=0)
        head = dequantize_model(qat).get_layer("head")
        np.testing.assert_array_equal(head.kernel.numpy(), qat.get_layer("head").kernel.numpy())
        assert not np.array_equal(head.kernel.numpy(), model.get_layer("head").kernel.numpy())


def test_a_crf_is_decoded_outside_and_its_file_holds_the_emissions(recwarn):
    """A CRF tagger's CRF stays float without a warning (it decodes outside the file), and
    `emissions_model` is the network up to its emissions, without `label_mask`."""
    backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
                            intermediate_dim=16, max_sequence_length=8)
    tagger = BertTokenClassifier(backbone, num_labels=3, use_crf=True)
    qat = quantize_model(tagger, float_residual=True)
    assert float_layers(qat) == [] and not [w for w in recwarn if "float" in str(w.message)]
    x = {"token_ids": np.array([[2, 5, 9, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
         "padding_mask": np.array([[1, 1, 1, 0]])}
    calibrate_model(qat, [{**x, "label_mask": np.array([[0, 1, 1, 0]])}])
    emissions = emissions_model(qat)
    assert sorted(emissions.input) == ["padding_mask", "segment_ids", "token_ids"]
    out = qat({**x, "label_mask": np.array([[0, 1, 1, 0]])}, training=False)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(emissions(x, training=False)),
                                  keras.ops.convert_to_numpy(out["logits"]))
    np.testing.assert_array_equal(qat.get_layer("crf").transitions.numpy(),
                                  tagger.get_layer("crf").transitions.numpy())
    without_crf = quantize_model(readme_model())
    assert emissions_model(without_crf) is without_crf
