"""Task transformer_xl_lm: streams of consecutive segments, memory carried between batches
(equal to one long read), reset per epoch and at a resume, and the evaluations."""

import json

import keras
import numpy as np
import pytest

from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.models.transformer_xl_lm import TransformerXLLM
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from keras_attn.text.character_tokenizer import CharacterTokenizer
from keras_attn.training.tasks.causal_lm_task import read_character_text
from keras_attn.training.tasks.character_evaluation import segment_memory_nll
from keras_attn.training.tasks.character_evaluation import sliding_window_nll
from keras_attn.training.tasks.transformer_xl_task import MemoryCarryingLM
from keras_attn.training.tasks.transformer_xl_task import SegmentStream

pytestmark = pytest.mark.tensorflow

TEXT = "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind\n" * 6


def tiny_xl(memory_length=4):
    keras.utils.set_random_seed(0)
    return TransformerXLLM(vocabulary_size=9, num_layers=2, num_heads=2, hidden_dim=8,
                           intermediate_dim=16, memory_length=memory_length, dropout=0.0,
                           norm_first=True)


def config(tmp_path, task="transformer_xl_lm", **sections):
    (tmp_path / "train.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "dev.txt").write_text(TEXT[:90], encoding="utf-8")
    values = {
        "task": task, "output_dir": str(tmp_path / "run"),
        "data": {"train": str(tmp_path / "train.txt"), "dev": str(tmp_path / "dev.txt"),
                 "test": str(tmp_path / "dev.txt"), "max_length": 8},
        "model": {"preset": "transformer_xl_tiny" if task == "transformer_xl_lm" else
                  "gpt2_tiny", "tokenizer": "characters", "dropout": 0.0,
                  "overrides": {"num_layers": 2, "hidden_dim": 16, "num_heads": 2,
                                "intermediate_dim": 32}},
        "train": {"epochs": 2, "global_batch_size": 4, "learning_rate": 3e-3,
                  "log_every_steps": 1000, "checkpoint_every_steps": 10000},
    }
    for section, keys in sections.items():
        values[section].update(keys)
    return TrainingConfig.from_dict(values)


def test_batches_are_consecutive_segments_of_parallel_streams():
    stream_ids = np.arange(1, 42, dtype="int32")  # 41 ids: 2 streams of 20, 5 segments of 4
    examples = [{"token_ids": stream_ids[b * 20 + k * 4: b * 20 + (k + 1) * 4 + 1],
                 "segment": k} for k in range(5) for b in range(2)]

    def collate(batch):
        ids = np.stack([e["token_ids"] for e in batch])
        return ({"token_ids": ids[:, :-1],
                 "reset": np.array([e["segment"] == 0 for e in batch], "int32")},
                ids[:, 1:], np.ones((len(batch), 4), "float32"))

    stream = SegmentStream(examples, collate, global_batch_size=2)
    assert stream.steps_per_epoch == 5
    first, second = stream.batch(0)[0], stream.batch(1)[0]
    np.testing.assert_array_equal(first["token_ids"], [[1, 2, 3, 4], [21, 22, 23, 24]])
    np.testing.assert_array_equal(second["token_ids"], [[5, 6, 7, 8], [25, 26, 27, 28]])
    assert first["reset"].tolist() == [1, 1] and second["reset"].tolist() == [0, 0]
    assert stream.batch(5)[0]["reset"].tolist() == [1, 1]  # the next epoch starts empty
    # A resumed run reads from step 3: its first batch resets the memory.
    elements = list(stream.dataset(3, 5).as_numpy_iterator())
    assert [e[0]["reset"].tolist() for e in elements] == [[1, 1], [0, 0]]


def test_carried_memory_equals_one_long_read():
    lm = tiny_xl(memory_length=4)
    model = MemoryCarryingLM(lm, batch_size=2, memory_length=4)
    ids = np.random.default_rng(0).integers(1, 9, (2, 8)).astype("int32")
    # Training calls carry the memory: segment 2 sees segment 1.
    model({"token_ids": ids[:, :4], "reset": np.ones(2, "int32")}, training=True)
    second = model({"token_ids": ids[:, 4:], "reset": np.zeros(2, "int32")}, training=True)
    whole = lm.predict_segments(ids, segment_length=8, memory_length=0)  # one causal pass
    np.testing.assert_allclose(keras.ops.convert_to_numpy(second), whole[:, 4:], atol=1e-5)
    # A reset row reads no memory: as if the text started there.
    reset = model({"token_ids": ids[:, 4:], "reset": np.array([1, 0], "int32")},
                  training=False)
    alone = lm.predict_segments(ids[:, 4:], segment_length=4, memory_length=0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reset)[0], alone[0], atol=1e-5)


def test_evaluations_against_a_full_causal_pass():
    ids = np.random.default_rng(1).integers(1, 9, 30).astype("int32")
    lm = tiny_xl()
    logits = lm.predict_segments(ids[None, :-1], segment_length=29, memory_length=0)[0]
    log_z = np.logaddexp.reduce(logits.astype("float64"), -1)
    full = float((log_z - logits[np.arange(29), ids[1:]]).sum())
    nll, count, _ = segment_memory_nll(lm, ids, segment_length=5, memory_length=30)
    assert count == 29
    np.testing.assert_allclose(nll, full, rtol=1e-5)

    keras.utils.set_random_seed(0)
    gpt = GPTCausalLM(GPTBackbone(vocabulary_size=9, num_layers=1, num_heads=2, hidden_dim=8,
                                  intermediate_dim=16, max_sequence_length=6, dropout=0.0))
    nll, count, _ = sliding_window_nll(gpt, ids, context=6, batch_size=7)
    expected = 0.0
    for t in range(1, 30):  # character t read with the (at most) 6 before it
        window = ids[max(0, t - 6): t][None]
        out = keras.ops.convert_to_numpy(
            gpt({"token_ids": window, "padding_mask": np.ones_like(window)}))[0, -1]
        expected += float(np.logaddexp.reduce(out.astype("float64")) - out[ids[t]])
    assert count == 29
    np.testing.assert_allclose(nll, expected, rtol=1e-5)


@pytest.mark.slow
def test_trains_resumes_and_saves_the_plain_model(tmp_path):
    results = train(config(tmp_path, train={"max_steps": 3, "checkpoint_every_steps": 2}))
    assert results["test"]["bits_per_character"] > 0
    assert results["test"]["tokens"] == 90  # 90 characters and the final newline
    saved = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert isinstance(saved, TransformerXLLM)
    # Killed after step 2 (its checkpoint), resumed: the memory restarts empty at step 2.
    resumed = train(config(tmp_path, train={"max_steps": 5, "checkpoint_every_steps": 2}))
    assert resumed["history"][-1]["step"] == 5
    assert json.loads((tmp_path / "run" / "characters.json").read_text())["kind"] == \
        "characters"


@pytest.mark.slow
def test_character_causal_lm_with_auxiliary_losses(tmp_path):
    results = train(config(
        tmp_path, task="causal_lm",
        model={"intermediate_layer_losses": True, "future_targets": 1,
               "overrides": {"num_layers": 2, "hidden_dim": 16, "num_heads": 2,
                             "intermediate_dim": 32, "layer_position_embeddings": True}},
        train={"max_steps": 2}))
    assert results["test"]["bits_per_character"] == pytest.approx(
        results["test"]["loss"] / np.log(2))
    saved = keras.models.load_model(tmp_path / "run" / "model.keras")
    assert isinstance(saved, GPTCausalLM) and saved.backbone.layer_position_embeddings


def test_a_run_continues_quantization_aware_with_its_memory(tmp_path):
    """A float run continued with `model.quantization_aware`: the memory-carrying model
    wraps the LM's `quantize_model` copy (its blocks in their int8 layout, the memory read
    through their int8 matmul); the saved copy scores what the run reported."""
    float_results = train(config(tmp_path, train={"epochs": 3}))
    qat_config = config(tmp_path, model={"preset": None, "checkpoint": str(tmp_path / "run"),
                                         "quantization_aware": True, "overrides": {}},
                        train={"epochs": 1, "learning_rate": 1e-3})
    qat_config = TrainingConfig.from_dict({**qat_config.to_dict(),
                                           "output_dir": str(tmp_path / "qat")})
    results = train(qat_config)
    saved = keras.models.load_model(tmp_path / "qat" / "model.keras")
    assert not isinstance(saved, TransformerXLLM) and activation_quantizers(saved)
    assert all(layer.quantization is not None for layer in saved.layers
               if isinstance(layer, TransformerXLBlock)) and sum(
        isinstance(layer, TransformerXLBlock) for layer in saved.layers) == 2
    ids = CharacterTokenizer.load(tmp_path / "run" / "characters.json").encode(
        read_character_text(tmp_path / "dev.txt"))
    nll, count, _ = segment_memory_nll(saved, ids, 8, 8)
    assert results["test"]["perplexity"] == pytest.approx(np.exp(nll / count), rel=1e-4)
    assert results["test"]["perplexity"] < 1.2 * float_results["test"]["perplexity"]
    assert json.loads((tmp_path / "qat" / "lineage.json").read_text())["quantization"]
    # Calibrated on segments with the memory the float LM left (not on empty memories,
    # which give the memory input no range: the copy would start blind to its memory).
    memory = saved.get_layer("memory_input_quantizer")
    assert float(memory.max_value.numpy() - memory.min_value.numpy()) > 0.5


@pytest.mark.parametrize("task, model, match", [
    ("classification", {"tokenizer": "characters"}, "model.tokenizer: characters"),
    ("transformer_xl_lm", {"future_targets": 1}, "auxiliary losses of task 'causal_lm'"),
])
def test_config_errors(tmp_path, task, model, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, task=task, model=model)


@pytest.mark.slow
def test_mirrored_replicas_carry_their_own_streams(tmp_path):
    # Each replica keeps the memory of the rows (streams) it reads; without dropout two
    # replicas train the same weights as one device reading all four streams.
    from tests.test_trainer import WEIGHT_TOLERANCE
    from tests.test_trainer import finish
    from tests.test_trainer import load_weights
    from tests.test_trainer import run_subprocess

    values = config(tmp_path, train={"max_steps": 6, "deterministic": True}).to_dict()
    one = run_subprocess(tmp_path, "one", {**values, "output_dir": str(tmp_path / "one")})
    two = run_subprocess(tmp_path, "two", {**values, "output_dir": str(tmp_path / "two"),
                                           "distribute": {"strategy": "mirrored",
                                                          "logical_cpu_devices": 2}})
    for process in (one, two):
        code, output = finish(process)
        assert code == 0, output
    assert "MirroredStrategy over 2 local devices" in output
    single, mirrored = load_weights(tmp_path / "one.npz"), load_weights(tmp_path / "two.npz")
    assert len(single) == len(mirrored)
    memories = [i for i, (a, b) in enumerate(zip(single, mirrored)) if a.shape != b.shape]
    assert len(memories) == 2  # the memory and its mask: 4 rows on one device, 2 per replica
    assert max(float(np.abs(a - b).max()) for i, (a, b) in enumerate(zip(single, mirrored))
               if i not in memories) < WEIGHT_TOLERANCE


@pytest.mark.slow
def test_two_workers_carry_their_own_streams(tmp_path):
    # MultiWorkerMirroredStrategy (the loop runner): both workers end with the same weights,
    # and they equal one process reading all four streams.
    from tests.test_trainer import WEIGHT_TOLERANCE
    from tests.test_trainer import finish
    from tests.test_trainer import free_ports
    from tests.test_trainer import load_weights
    from tests.test_trainer import run_subprocess

    values = config(tmp_path, train={"max_steps": 4, "deterministic": True,
                                     "runner": "loop"}).to_dict()
    values["data"].update(dev=None, test=None)
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = [run_subprocess(tmp_path, "single",
                                {**values, "output_dir": str(tmp_path / "single")})]
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(run_subprocess(
            tmp_path, f"worker{index}", {**values, "output_dir": str(tmp_path / "multi"),
                                         "distribute": {"strategy": "multi_worker"}},
            env={"TF_CONFIG": json.dumps(tf_config)}))
    results = [finish(process, timeout=300) for process in processes]
    assert [code for code, _ in results] == [0, 0, 0], "\n".join(
        output[-3000:] for _, output in results)
    single, *workers_weights = (load_weights(tmp_path / f"{name}.npz")
                                for name in ("single", "worker0", "worker1"))
    trained = [i for i, (a, b) in enumerate(zip(single, workers_weights[0]))
               if a.shape == b.shape]
    assert len(trained) == len(single) - 2  # all but the per-replica memory and mask
    for i in trained:
        np.testing.assert_array_equal(workers_weights[0][i], workers_weights[1][i])
        assert float(np.abs(single[i] - workers_weights[0][i]).max()) < WEIGHT_TOLERANCE
