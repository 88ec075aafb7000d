"""`load_hf_xlnet` against transformers' PyTorch `XLNetLMHeadModel` (committed fixture,
made by `tests/fixtures/make_xlnet_tiny_fixture.py`)."""

import os

import numpy as np
import pytest

from keras_attn.checkpoints.hf_xlnet import load_hf_xlnet

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "xlnet_tiny")


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(os.path.join(FIXTURE, "reference.npz")))


@pytest.fixture(scope="module")
def model():
    return load_hf_xlnet(FIXTURE)


def _inputs(reference, segment, memory):
    return {
        "token_ids": reference[f"input_ids_{segment}"],
        "segment_ids": reference[f"token_type_ids_{segment}"],
        "padding_mask": np.ones_like(reference[f"input_ids_{segment}"]),
        # transformers: 1 = may NOT see; ours: 1 = may see.
        "permutation_mask": 1 - reference[f"perm_mask_{segment}"],
        "target_mapping": reference[f"target_mapping_{segment}"],
        "memory": memory,
    }


def test_two_segments_with_memory_match_transformers(model, reference):
    backbone = model.backbone
    batch = reference["input_ids_0"].shape[0]
    memory = np.zeros((batch, backbone.num_layers, 0, backbone.hidden_dim), "float32")
    for segment in range(2):
        inputs = _inputs(reference, segment, memory)
        states = backbone.predict_on_batch(inputs)
        out = model.predict_on_batch(inputs)
        np.testing.assert_allclose(
            states["sequence_output"], reference[f"content_{segment}"][-1], atol=1e-4)
        np.testing.assert_allclose(
            states["query_output"], reference[f"query_{segment}"][-1], atol=1e-4)
        np.testing.assert_allclose(out["logits"], reference[f"logits_{segment}"], atol=1e-4)
        np.testing.assert_allclose(
            out["memory"], reference[f"mems_{segment}"].transpose(1, 0, 2, 3), atol=1e-4)
        memory = out["memory"]
    assert memory.shape[2] == 8  # mem_len: the newest 8 of the 12 states read
