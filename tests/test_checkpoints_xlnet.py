"""`load_hf_xlnet` against transformers' PyTorch `XLNetLMHeadModel` (committed fixture,
made by `tests/fixtures/make_xlnet_tiny_fixture.py`)."""

import json
import os

import numpy as np
import pytest

from keras_attn.checkpoints.hf_xlnet import load_hf_xlnet
from keras_attn.models.xlnet_backbone import XLNetBackbone

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


def _copy(tmp_path, config_changes=None, extra=None, drop=()):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    directory = tmp_path / "checkpoint"
    directory.mkdir()
    config = json.loads(open(os.path.join(FIXTURE, "config.json")).read())
    config.update(config_changes or {})
    (directory / "config.json").write_text(json.dumps(config))
    tensors = {k: v for k, v in load_file(os.path.join(FIXTURE, "model.safetensors")).items()
               if k not in drop}
    tensors.update(extra or {})
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def test_unused_missing_and_misshaped_tensors_are_listed_together(tmp_path):
    directory = _copy(
        tmp_path, extra={"sequence_summary.summary.weight": np.zeros((16, 16), "float32"),
                         "transformer.layer.0.rel_attn.r_s_bias": np.zeros((3, 8), "float32")},
        drop=("transformer.mask_emb",))
    with pytest.raises(ValueError) as error:
        load_hf_xlnet(directory)
    message = str(error.value)
    for part in ("missing from the checkpoint: transformer.mask_emb",
                 "map to no weight of the model: sequence_summary.summary.weight",
                 "transformer.layer.0.rel_attn.r_s_bias: checkpoint shape (3, 8)"):
        assert part in message, message
    # Left out on purpose, the head is no error (the rest still is).
    with pytest.raises(ValueError, match="mask_emb") as error:
        load_hf_xlnet(directory, skip=("sequence_summary.",))
    assert "sequence_summary.summary.weight" not in str(error.value)


def test_a_backbone_without_the_lm_head_needs_it_skipped(tmp_path):
    with pytest.raises(ValueError, match="lm_loss.bias"):
        load_hf_xlnet(FIXTURE, two_stream=False)
    backbone = load_hf_xlnet(FIXTURE, two_stream=False, skip=("lm_loss.", "transformer.mask_emb"))
    assert isinstance(backbone, XLNetBackbone) and not backbone.two_stream


@pytest.mark.parametrize("change, key", [
    ({"model_type": "bert"}, "model_type"), ({"attn_type": "uni"}, "attn_type"),
    ({"bi_data": True}, "bi_data"), ({"ff_activation": "swish"}, "ff_activation")])
def test_unsupported_configs_name_the_key(tmp_path, change, key):
    with pytest.raises(ValueError, match=f"Received: {key}="):
        load_hf_xlnet(_copy(tmp_path, config_changes=change))


def test_untied_output_is_an_error(tmp_path):
    directory = _copy(tmp_path, extra={"lm_loss.weight": np.ones((50, 16), "float32")})
    with pytest.raises(ValueError, match="lm_loss.weight differs"):
        load_hf_xlnet(directory)
