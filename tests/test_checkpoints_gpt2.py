"""`load_hf_gpt2` against transformers' own outputs for a tiny random GPT-2 (no PyTorch
here: the numbers were written by `tests/fixtures/make_gpt2_tiny_fixture.py`)."""

import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from keras_attn.checkpoints.hf_gpt2 import load_hf_gpt2
from keras_attn.models.gpt_backbone import GPT_PRESETS

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "gpt2_tiny"
REFERENCE = json.loads((FIXTURE / "reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lm():
    return load_hf_gpt2(str(FIXTURE))


def logits_of(lm):
    ids = np.array(REFERENCE["token_ids"], "int32")
    mask = np.array(REFERENCE["attention_mask"], "int32")
    return ops.convert_to_numpy(lm({"token_ids": ids, "padding_mask": mask})), mask


def test_fixture_is_the_gpt2_tiny_preset(lm):
    for key, value in GPT_PRESETS["gpt2_tiny"].items():
        assert getattr(lm.backbone, key) == value
    assert lm.backbone.activation == "gelu_approximate"


def test_logits_match_transformers(lm):
    got, mask = logits_of(lm)
    want = np.array(REFERENCE["logits"])
    real = mask.astype(bool)  # padded positions are not compared
    np.testing.assert_allclose(got[real], want[real], atol=1e-4)
    assert np.abs(want[real]).max() > 1.0  # the logits are far from uniform


@pytest.mark.parametrize("mode", ["eager", pytest.param("xla", marks=pytest.mark.tensorflow)])
def test_greedy_tokens_match_transformers_generate(lm, mode):
    prompts = np.array(REFERENCE["greedy_prompts"], "int32")

    def decode(prompts):
        return lm.generate(prompts, max_new_tokens=REFERENCE["greedy_new_tokens"])

    if mode == "xla":
        decode = tf.function(decode, jit_compile=True, autograph=False)
    got = decode(tf.constant(prompts))
    np.testing.assert_array_equal(ops.convert_to_numpy(got), REFERENCE["greedy_sequences"])


def test_beam_search_matches_transformers(lm):
    sequences, scores = lm.beam_search(
        np.array(REFERENCE["beam_prompt"], "int32"), REFERENCE["beam_new_tokens"],
        num_beams=REFERENCE["num_beams"], length_penalty=1.0,
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(sequences), REFERENCE["beam_sequences"])
    np.testing.assert_allclose(ops.convert_to_numpy(scores), REFERENCE["beam_scores"],
                               atol=1e-4)


def write_checkpoint(directory, tensors, config_updates=None):
    directory.mkdir(exist_ok=True)
    config = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
    config.update(config_updates or {})
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def fixture_tensors():
    return load_file(str(FIXTURE / "model.safetensors"))


def test_unprefixed_names_tied_head_and_old_buffers_load(lm, tmp_path):
    """GPT2Model-style names, an explicit lm_head equal to wte, and the `attn.bias` /
    `attn.masked_bias` buffers of older transformers versions."""
    tensors = {k[len("transformer."):]: v for k, v in fixture_tensors().items()}
    tensors["lm_head.weight"] = tensors["wte.weight"].copy()
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((32, 32), "uint8"))[None, None]
        tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, "float32")
    other = load_hf_gpt2(write_checkpoint(tmp_path / "ckpt", tensors))
    np.testing.assert_allclose(logits_of(other)[0], logits_of(lm)[0], atol=1e-6)


def test_missing_unknown_and_misshaped_tensors_are_all_listed(tmp_path):
    tensors = fixture_tensors()
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    tensors["transformer.h.0.attn.c_proj.weight"] = np.zeros((32, 33), "float32")
    tensors["transformer.h.0.adapter.weight"] = np.zeros((4,), "float32")
    tensors["score.weight"] = np.zeros((2, 32), "float32")
    with pytest.raises(ValueError) as error:
        load_hf_gpt2(write_checkpoint(tmp_path / "bad", tensors))
    message = str(error.value)
    assert "missing from the checkpoint: transformer.h.1.mlp.c_fc.bias" in message
    assert "transformer.h.0.adapter.weight" in message and "score.weight" in message
    assert "transformer.h.0.attn.c_proj.weight: checkpoint shape (32, 33)" in message
    assert "(32, 32)" in message


def test_non_causal_buffer_and_untied_head_are_rejected(tmp_path):
    tensors = fixture_tensors()
    tensors["transformer.h.0.attn.bias"] = np.ones((1, 1, 32, 32), "uint8")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1.0
    with pytest.raises(ValueError, match="(?s)not a lower-triangular.*lm_head.weight differs"):
        load_hf_gpt2(write_checkpoint(tmp_path / "bad", tensors))


@pytest.mark.parametrize(
    "updates, match",
    [
        (dict(model_type="bert"), "model_type='bert'"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=False"),
        (dict(activation_function="swish"), "activation_function='swish'"),
        (dict(n_embd=40), "wrong shape"),
    ],
)
def test_config_errors(tmp_path, updates, match):
    with pytest.raises(ValueError, match=match):
        load_hf_gpt2(write_checkpoint(tmp_path / "c", fixture_tensors(), updates))


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="checkpoint directory"):
        load_hf_gpt2(str(tmp_path / "nowhere"))
    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="No model.safetensors.*files=\\['config.json'\\]"):
        load_hf_gpt2(str(tmp_path))
