"""The file reading and the tensor report shared by the checkpoint importers: sharded and
single safetensors files against the arrays written, and every file error naming the file."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from keras_attn.checkpoints.checkpoint_files import raise_for_problems
from keras_attn.checkpoints.checkpoint_files import read_hf_config
from keras_attn.checkpoints.checkpoint_files import read_json_config
from keras_attn.checkpoints.checkpoint_files import read_safetensors
from keras_attn.checkpoints.checkpoint_files import shape_mismatch
from keras_attn.checkpoints.checkpoint_files import tensor_problems

TENSORS = {
    "a.weight": np.arange(6, dtype="float32").reshape(2, 3),
    "b.bias": np.array([1.5, -2.0], "float32"),
    "c.ids": np.arange(4, dtype="int64")[None],
}


def assert_same_tensors(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name, array in expected.items():
        assert actual[name].dtype == array.dtype
        np.testing.assert_array_equal(actual[name], array)


def test_single_and_sharded_safetensors_read_back_exactly(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    assert_same_tensors(read_safetensors(str(tmp_path)), TENSORS)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"a.weight": TENSORS["a.weight"]}, str(sharded / "model-00001-of-00002.safetensors"))
    save_file({k: TENSORS[k] for k in ("b.bias", "c.ids")},
              str(sharded / "model-00002-of-00002.safetensors"))
    weight_map = {"a.weight": "model-00001-of-00002.safetensors",
                  "b.bias": "model-00002-of-00002.safetensors",
                  "c.ids": "model-00002-of-00002.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_same_tensors(read_safetensors(str(sharded)), TENSORS)
    os.remove(sharded / "model-00002-of-00002.safetensors")
    with pytest.raises(ValueError, match=r"shard model-00002-of-00002\.safetensors listed in "
                       r".*model\.safetensors\.index\.json.*incomplete"):
        read_safetensors(str(sharded))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match="weight_map.*Received: weight_map=None"):
        read_safetensors(str(sharded))


def test_missing_and_corrupt_safetensors_name_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"No model\.safetensors.*safe_serialization.*"
                       r"files=\['config\.json'\]"):
        read_safetensors(str(tmp_path))
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:40])  # an interrupted download
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors "
                       r"file.*truncated.*size=40 bytes"):
        read_safetensors(str(tmp_path))


def test_json_config_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "vocab_size": 30,\n  "hidden_size": \n}\n')
    with pytest.raises(ValueError, match=r"config\.json:4:1: not valid JSON.*"
                       r"Received: config_path="):
        read_json_config(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config\.json must hold a JSON object.*list"):
        read_json_config(str(path))
    path.write_text('{"vocab_size": 30}')
    assert read_hf_config(str(tmp_path)) == ({"vocab_size": 30}, str(path))
    with pytest.raises(ValueError, match=r"HF checkpoint directory \(config\.json, "
                       r"model\.safetensors\)\. Received: directory="):
        read_hf_config(str(tmp_path / "nowhere"))
    os.remove(path)
    with pytest.raises(ValueError, match=r"No config\.json.*files=\[\]"):
        read_hf_config(str(tmp_path))


def test_tensor_report_lists_every_problem_in_one_error():
    problems = tensor_problems(
        missing=["x.weight", "y.bias"], unused=[f"extra.{i}" for i in range(45)],
        mismatched=[shape_mismatch("z.weight", (3, 4), (4, 4))],
        unused_hint="; skip them", config_file="config.json",
    )
    assert problems[0] == ("2 weight(s) the model needs are missing from the checkpoint: "
                           "x.weight, y.bias")
    assert problems[1].startswith("45 checkpoint tensor(s) map to no weight of the model: "
                                  "extra.0, extra.1")
    assert problems[1].endswith("extra.39 (and 5 more); skip them")
    assert problems[2] == ("1 tensor(s) have the wrong shape: z.weight: checkpoint shape "
                           "(3, 4), the config implies (4, 4) (check that config.json "
                           "belongs to these weights)")
    with pytest.raises(ValueError, match=r"^Cannot import ckpt into Model: 2 weight.*"
                       r"\. 45 checkpoint.*\. 1 tensor.*\. Received: skip=\(\)$"):
        raise_for_problems(problems, source="ckpt", target="Model", received="skip=()")
    raise_for_problems([], source="ckpt", target="Model", received="")  # nothing to report
