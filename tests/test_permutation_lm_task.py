"""`task: permutation_lm` (XLNet pretraining in `keras-attn train`) and fine-tuning its
encoder with the classification and NER tasks."""

import json

import keras
import numpy as np
import pytest

from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.models.xlnet_lm import XLNetLM
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from keras_attn.training.tasks.classification_task import ClassificationTask
from keras_attn.training.tasks.ner_task import NerTask
from keras_attn.training.tasks.permutation_lm_task import PermutationLMTask
from tests.test_classification_task import sentiment_rows
from tests.test_classification_task import write
from tests.test_trainer import WEIGHT_TOLERANCE
from tests.test_trainer import finish
from tests.test_trainer import load_weights
from tests.test_trainer import max_difference
from tests.test_trainer import run_subprocess
from tests.test_trainer import two_worker_processes

ENCODER = {"num_layers": 1, "hidden_dim": 32, "num_heads": 2, "intermediate_dim": 64}
WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


def lm_config(tmp_path, train_file, dev_file=None, epochs=1, **data):
    return TrainingConfig.from_dict({
        "task": "permutation_lm", "output_dir": str(tmp_path / "plm"),
        "data": {"train": train_file, "dev": dev_file, "max_length": 16, "mask_rate": 0.25,
                 **data},
        "model": {"preset": "xlnet_tiny", "vocabulary_size": 40, "dropout": 0.0,
                  "overrides": ENCODER},
        "train": {"epochs": epochs, "global_batch_size": 8, "learning_rate": 5e-3,
                  "warmup_ratio": 0.05, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000},
    })


@pytest.mark.slow
def test_permutation_lm_learns_and_its_dev_orders_are_reproducible(tmp_path):
    # A fixed cycle of 8 words: every token is predictable from its neighbours.
    lines = [" ".join(WORDS[k:] + WORDS[:k]) for k in range(8)] * 40
    train_file = write(tmp_path / "train.txt", lines)
    dev_file = write(tmp_path / "dev.txt", lines[:16])
    config = lm_config(tmp_path, train_file, dev_file, epochs=12)
    results = Trainer(config, log=lambda line: None).run()
    history = results["history"]
    assert history[-1]["dev"]["perplexity"] < history[0]["dev"]["perplexity"] / 2
    assert history[-1]["dev"]["token_accuracy"] > 0.6
    model = keras.saving.load_model(tmp_path / "plm" / "model.keras")
    assert isinstance(model, XLNetLM)
    # A fresh task draws the same dev orders (seeded by train.seed and block indices).
    task = PermutationLMTask(config, tmp_path / "plm")
    task.prepare()
    again = task.evaluate(lambda x: model.predict_on_batch(x), task.dev_examples, 8)
    metrics = json.loads((tmp_path / "plm" / "metrics.json").read_text())
    assert again["perplexity"] == pytest.approx(metrics["best_dev"]["perplexity"], rel=1e-4)


def test_bad_mask_rate_names_the_key(tmp_path):
    train_file = write(tmp_path / "train.txt", ["alpha beta"])
    task = PermutationLMTask(lm_config(tmp_path, train_file, mask_rate=1.0), tmp_path / "plm")
    with pytest.raises(ConfigError, match="data.mask_rate"):
        task.prepare()


@pytest.mark.parametrize("span", [1, 4])
def test_span_length_groups_the_predicted_positions_in_spans(tmp_path, span):
    train_file = write(tmp_path / "train.txt", [" ".join(WORDS * 2)] * 8)
    config = lm_config(tmp_path, train_file, mask_rate=0.25, span_length=span)
    task = PermutationLMTask(config, tmp_path / "plm")
    task.prepare()
    x, labels, weights = task.collate(task.train_examples[:4])
    length = x["token_ids"].shape[1]
    assert length == 16 and labels.shape == (4, 4) and weights.min() == 1.0
    targets = x["target_mapping"].argmax(-1)  # (B, P) positions of the targets, in order
    for row in targets:  # the P = 4 targets, in order
        if span == 4:  # one whole span of 4 consecutive positions, left to right
            assert row[0] % 4 == 0 and list(row) == list(range(row[0], row[0] + 4))
    spans = [sorted(set(row // 4)) for row in targets]
    if span == 1:  # token-level orders scatter the targets over several spans
        assert any(len(s) > 1 for s in spans)
    np.testing.assert_array_equal(labels, np.take_along_axis(x["token_ids"], targets, 1))


def test_span_length_is_checked_by_the_config(tmp_path):
    train_file = write(tmp_path / "train.txt", ["alpha beta"])
    with pytest.raises(ConfigError, match="span_length"):
        lm_config(tmp_path, train_file, span_length=0)


@pytest.mark.slow
def test_classification_and_ner_fine_tune_a_permutation_lm_encoder(tmp_path):
    train_file = write(tmp_path / "train.tsv", ["sentence\tlabel"] + sentiment_rows(96, 0))
    dev_file = write(tmp_path / "dev.tsv", ["sentence\tlabel"] + sentiment_rows(32, 1))
    plm = TrainingConfig.from_dict({
        **lm_config(tmp_path, train_file).to_dict(),
        "data": {"train": train_file, "max_length": 16, "mask_rate": 0.25}})
    Trainer(plm, log=lambda line: None).run()
    pretrained = keras.saving.load_model(tmp_path / "plm" / "model.keras").backbone
    config = TrainingConfig.from_dict({
        "task": "classification", "output_dir": str(tmp_path / "run"),
        "data": {"train": train_file, "dev": dev_file, "text_column": "sentence",
                 "label_column": "label", "max_length": 16},
        "model": {"checkpoint": str(tmp_path / "plm"), "dropout": 0.0},
        "train": {"epochs": 10, "global_batch_size": 8, "learning_rate": 1e-2,
                  "warmup_ratio": 0.1, "log_every_steps": 1000, "checkpoint_every_steps": 10000},
    })
    task = ClassificationTask(config, tmp_path / "run")
    task.prepare()
    assert task.tokenizer.get_vocabulary() == (
        tmp_path / "plm" / "vocab.txt").read_text().splitlines()
    model = task.build_model()
    assert isinstance(model, XLNetClassifier) and not model.backbone.two_stream
    theirs = {w.path: w.numpy() for w in pretrained.weights}
    for mine in model.backbone.weights:
        np.testing.assert_array_equal(mine.numpy(), theirs[mine.path])
    results = Trainer(config, log=lambda line: None).run()
    assert results["history"][-1]["dev"]["accuracy"] > 0.8
    ner = NerTask(TrainingConfig.from_dict({**config.to_dict(), "task": "ner"}), tmp_path / "n")
    assert ner.pretraining_run().path == tmp_path / "plm"
    _quantization_aware_run_exports(config, tmp_path)


def _quantization_aware_run_exports(config, tmp_path):
    """The XLNet classifier run continues quantization-aware (XLNet's blocks in their int8
    layout) and `keras-attn export` takes the two runs: every artifact written, the int8
    file within the budget of the float model on dev (measured: 0.875 = float, agreement
    1.0), the float files and the text-in SavedModel equal to Keras."""
    values = config.to_dict()
    values.update(output_dir=str(tmp_path / "qat"))
    values["model"].update(checkpoint=str(tmp_path / "run"), quantization_aware=True)
    values["train"].update(epochs=2, learning_rate=1e-4)
    Trainer(TrainingConfig.from_dict(values), log=lambda line: None).run()
    assert activation_quantizers(keras.saving.load_model(tmp_path / "qat" / "model.keras"))
    report = export_run(tmp_path / "run", tmp_path / "export", ExportOptions(
        qat_run=str(tmp_path / "qat"), latency_runs=1, latency_threads=(1,),
        golden_examples=0, length_buckets=False))
    for name in ("model_int8.tflite", "model_text.tflite", "saved_model/saved_model.pb",
                 "model_dynamic_int8.onnx", "model_int8.onnx"):
        assert (tmp_path / "export" / name).is_file(), name
    table = {row["artifact"]: row for row in report["artifacts"]}
    reference = table["model.keras (float, Keras)"]["metric"]
    assert reference > 0.8
    for name in ("model_fp32.tflite", "model.onnx", "saved_model/ (predict_ids)"):
        assert table[name]["agreement"] == 1.0 and table[name]["metric"] == reference, name
    assert table["model_int8.tflite"]["metric"] >= reference - 0.1
    assert table["model_int8.onnx"]["metric"] == table["model_int8.tflite"]["metric"]


# --- Distribution strategies and resume -------------------------------------------------
# The orders are drawn on the host, in `collate`, from numpy seeded by `train.seed` and the
# block's index; the replicas read row slices of the collated global batch. So an
# example's order is the same under any strategy, batching or resume, and two replicas (or
# two workers) train the weights of one device up to float32 rounding (`WEIGHT_TOLERANCE`).


def run_config(tmp_path, name):
    """A tiny run's config dict: 2 epochs of 18 full blocks of 16 tokens (3 steps of 8),
    no dev set, deterministic ops, a progress line every step (`kill_at_step` reads it) and
    a checkpoint every 2 steps."""
    lines = [" ".join(WORDS[k:] + WORDS[:k]) for k in range(8)] * 4  # 9 tokens a line
    train_file = write(tmp_path / "train.txt", lines)
    values = lm_config(tmp_path, train_file, epochs=2).to_dict()
    values["output_dir"] = str(tmp_path / name)
    values["train"].update(log_every_steps=1, checkpoint_every_steps=2, seed=5,
                           deterministic=True)
    return values


def test_each_block_draws_its_order_whatever_its_batch_or_replica(tmp_path):
    config = TrainingConfig.from_dict(run_config(tmp_path, "unused"))
    task = PermutationLMTask(config, tmp_path / "unused")
    task.prepare()
    assert task.lengths(task.train_examples) == [16] * 18
    stream = task.batch_stream(8, seed=5, accumulation_steps=1, bucket_by_length=True)
    x, labels, _ = stream.batch(1)
    # What two replicas read of step 1 (the loop runner's shards): rows [0, 4) and [4, 8).
    halves = list(stream.dataset(1, 2, num_shards=2, shards=(0, 1)).as_numpy_iterator())
    for half, (part, part_labels, _) in enumerate(halves):
        rows = slice(4 * half, 4 * half + 4)
        np.testing.assert_array_equal(part["permutation_mask"], x["permutation_mask"][rows])
        np.testing.assert_array_equal(part_labels, labels[rows])
    # A block collated alone (any other batch or split) draws the order it drew here.
    for row, index in enumerate(stream.indices(1)):
        alone, _, _ = task.collate([task.train_examples[index]])
        np.testing.assert_array_equal(alone["permutation_mask"][0], x["permutation_mask"][row])
        np.testing.assert_array_equal(alone["target_mapping"][0], x["target_mapping"][row])
    # Blocks with the same tokens (the corpus repeats) draw different orders.
    assert len({m.tobytes() for m in x["permutation_mask"]}) == 8


@pytest.fixture(scope="module")
def one_device_weights(tmp_path_factory):
    """The final weights of `run_config` trained on one device (`fit`), uninterrupted."""
    tmp_path = tmp_path_factory.mktemp("one_device")
    code, output = finish(run_subprocess(tmp_path, "one", run_config(tmp_path, "one")))
    assert code == 0, output
    return load_weights(tmp_path / "one.npz")


@pytest.mark.tensorflow
@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_mirrored_two_replicas_train_the_weights_of_one_device(tmp_path, one_device_weights):
    values = run_config(tmp_path, "two")
    values["distribute"] = {"strategy": "mirrored", "logical_cpu_devices": 2}
    code, output = finish(run_subprocess(tmp_path, "two", values))
    assert code == 0, output
    assert "MirroredStrategy over 2 local devices" in output and "2 replicas x 4" in output
    assert max_difference(one_device_weights,
                          load_weights(tmp_path / "two.npz")) < WEIGHT_TOLERANCE


@pytest.mark.slow
@pytest.mark.tensorflow
def test_two_workers_train_the_weights_of_one_device(tmp_path, one_device_weights):
    processes = two_worker_processes(tmp_path, run_config(tmp_path, "multi"))
    results = [finish(process, timeout=300) for process in processes]
    assert [code for code, _ in results] == [0, 0], "\n".join(
        output[-3000:] for _, output in results)
    assert "MultiWorkerMirroredStrategy: 2 workers" in results[0][1]
    assert "runner: loop" in results[0][1]
    worker0, worker1 = (load_weights(tmp_path / f"worker{i}.npz") for i in range(2))
    assert max_difference(worker0, worker1) == 0.0
    assert max_difference(worker0, one_device_weights) < WEIGHT_TOLERANCE


@pytest.mark.tensorflow
@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_kill_and_resume_ends_with_the_weights_of_an_uninterrupted_run(tmp_path,
                                                                        one_device_weights):
    # 6 steps, checkpoints at 2, 3 (the end of epoch 1) and 4; killed in step 5 it resumes
    # at step 4, in the second epoch, and draws the orders of steps 5 and 6 again.
    values = run_config(tmp_path, "killed")
    code, output = finish(run_subprocess(tmp_path, "killed", values, kill_at_step=5))
    assert code == -9, output  # SIGKILL, mid-run
    checkpoints = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000002", "step-00000003", "step-00000004"], checkpoints
    code, output = finish(run_subprocess(tmp_path, "killed", values))
    assert code == 0, output
    assert "resumed from checkpoint at step 4" in output
    assert max_difference(one_device_weights, load_weights(tmp_path / "killed.npz")) == 0.0
