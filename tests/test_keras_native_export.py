"""Keras' own `model.export(format="litert" | "onnx")` on every keras-attn model family: the
files run on LiteRT and onnxruntime and give the Keras outputs (float32 path tolerance), and
the ONNX graph has only ONNX operators (the exact GELU is written with `erf`)."""

import logging
import warnings

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_attn import models

pytestmark = pytest.mark.tensorflow

V, B, T, M, P = 30, 2, 6, 4, 2  # vocabulary, batch, length, memory length, predicted
SIZES = dict(vocabulary_size=V, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
ATOL = 1e-4  # one block of float32 kernels: XNNPACK / onnxruntime against TensorFlow


def bert():
    return models.BertBackbone(**SIZES, max_sequence_length=16)


def xlnet(**kwargs):
    return models.XLNetBackbone(**SIZES, **kwargs)


FAMILIES = {
    "bert_classifier": lambda: models.BertClassifier(bert(), num_classes=3),
    "bert_token_classifier": lambda: models.BertTokenClassifier(bert(), num_labels=4),
    "bert_crf_tagger": lambda: models.BertTokenClassifier(bert(), num_labels=4, use_crf=True),
    "bert_masked_lm": lambda: models.BertMaskedLM(bert()),
    "gpt_causal_lm": lambda: models.GPTCausalLM(
        models.GPTBackbone(**SIZES, max_sequence_length=16)),
    "seq2seq_transformer": lambda: models.Seq2SeqTransformer(**SIZES),
    "transformer_xl_lm": lambda: models.TransformerXLLM(**SIZES, memory_length=M),
    "xlnet_classifier": lambda: models.XLNetClassifier(xlnet(), num_classes=3),
    "xlnet_token_classifier": lambda: models.XLNetTokenClassifier(xlnet(), num_classes=3),
    "xlnet_lm": lambda: models.XLNetLM(xlnet(two_stream=True)),
}
# One family per backbone (and the CRF's ONNX refusal) in `make test`; all in the slow stage.
DEFAULT_FAMILIES = ("bert_crf_tagger", "gpt_causal_lm", "xlnet_lm")
FAMILY_PARAMS = [pytest.param(family, marks=() if family in DEFAULT_FAMILIES else pytest.mark.slow)
                 for family in sorted(FAMILIES)]


def sample_inputs(model, seed=0):
    """Valid inputs for each of the model's named inputs (right-padded second row)."""
    rng = np.random.default_rng(seed)
    padding = (np.arange(T)[None, :] < np.array([[T], [T - 2]])).astype("int32")  # (B, T)
    by_name = {
        "token_ids": rng.integers(1, V, (B, T)) * padding,
        "segment_ids": (np.arange(T)[None, :] >= T // 2) * padding,
        "padding_mask": padding,
        "label_mask": padding,
        "mask_positions": np.array([[1, 3]] * B),
        "memory": rng.normal(size=(B, 1, M, 8)),
        "memory_padding_mask": np.ones((B, M)),
        "permutation_mask": np.broadcast_to(np.triu(np.ones((T, T)), 1), (B, T, T)),
        "target_mapping": np.broadcast_to(np.eye(T)[-P:], (B, P, T)),
    }
    x = {}
    for tensor in model.inputs:
        name = tensor.name.removeprefix("encoder_").removeprefix("decoder_")
        x[tensor.name] = np.asarray(by_name[name]).astype(tensor.dtype)
    return x


def litert_outputs(path, x):
    """The signature's outputs in Keras' flattened order: `output_<i>` for one tensor,
    the dict keys (sorted, as `keras.tree.flatten`) for dict outputs."""
    out = Interpreter(path).get_signature_runner()(**x)
    if "output_0" in out:
        return [out[f"output_{i}"] for i in range(len(out))]
    return [out[name] for name in sorted(out)]


def onnx_outputs(path, x):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x[i.name] for i in session.get_inputs()})


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_model_export_litert_and_onnx_give_the_keras_outputs(family, tmp_path, caplog):
    keras.utils.set_random_seed(0)
    model = FAMILIES[family]()
    x = sample_inputs(model)
    expected = keras.tree.flatten(model.predict(x, verbose=0))  # dict outputs: sorted keys
    litert = str(tmp_path / "model.tflite")
    model.export(litert, format="litert", verbose=False)
    for got, want in zip(litert_outputs(litert, x), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    if family == "bert_crf_tagger":
        with pytest.raises(ValueError, match="XlaDynamicUpdateSlice.*keras-attn export"):
            model.export(str(tmp_path / "model.onnx"), format="onnx")
        return
    path = str(tmp_path / "model.onnx")
    with caplog.at_level(logging.ERROR, logger="tf2onnx"):
        model.export(path, format="onnx", verbose=False)
    assert "is not supported" not in caplog.text
    domains = {node.domain for node in onnx.load(path).graph.node}
    assert domains <= {"", "ai.onnx"}, domains  # ONNX operators only, no TF leftovers
    for got, want in zip(onnx_outputs(path, x), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_model_quantize_int8_without_a_warning_storm(family):
    keras.utils.set_random_seed(0)
    model = FAMILIES[family]()
    x = sample_inputs(model)
    expected = keras.tree.flatten(model.predict(x, verbose=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    # numpy 2's `__array__(copy=...)` deprecation comes from inside TensorFlow: not ours.
    ours = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    assert len(ours) <= 1, ours  # at most the one summary of weights left float
    assert all("keeps the weight matrices" in message for message in ours)
    kernels = [w for w in model.weights if w.path.endswith("/kernel")]
    assert kernels and all(keras.backend.standardize_dtype(w.dtype) == "int8" for w in kernels)
    for got, want in zip(keras.tree.flatten(model.predict(x, verbose=0)), expected, strict=True):
        if np.issubdtype(np.asarray(want).dtype, np.floating):
            # int8 weights with per-channel scales: within 5 % of the output's range.
            assert np.abs(got - want).max() <= 0.05 * np.abs(want).max() + 1e-3
