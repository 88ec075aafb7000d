"""End-to-end training runs: runners, strategies, accumulation, kill/resume, multi-worker.

Distributed runs need a fresh TensorFlow (logical CPU devices, TF_CONFIG), so they run in
subprocesses (`tests/training_run.py`). Weights are compared variable by variable:
- the same computation in another order (fit vs loop, 2 replicas vs 1, accumulation) may
  differ by float32 rounding, which compounds through Adam over the steps: the stated
  tolerance is 2e-5 absolute on weights of order 0.02-1;
- kill/resume and the two workers of one run are compared exactly.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import Trainer

pytestmark = pytest.mark.tensorflow

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "plot", "the",
         "was", "very", "not", "a", "story", "acting", "great", "awful", "fine", "dull"]
WEIGHT_TOLERANCE = 2e-5


def write_data(directory, n=96, seed=0):
    """A learnable toy sentiment set: the label is whether a positive word occurs."""
    rng = np.random.default_rng(seed)
    positive, negative = ["good", "great", "fine"], ["bad", "awful", "dull"]
    filler = ["the", "film", "plot", "was", "very", "a", "story", "acting"]
    rows = ["sentence\tlabel"]
    for i in range(n):
        label = i % 2
        words = list(rng.choice(filler, size=rng.integers(2, 9)))
        words.insert(int(rng.integers(0, len(words) + 1)),
                     str(rng.choice(positive if label else negative)))
        rows.append(" ".join(words) + f"\t{label}")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.tsv").write_text("\n".join(rows) + "\n")
    (directory / "dev.tsv").write_text("\n".join(rows[:33]) + "\n")
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return directory


def config_dict(directory, output_dir, dropout=0.1, **train):
    directory = pathlib.Path(directory)
    train_section = {"epochs": 2, "global_batch_size": 8, "learning_rate": 3e-3,
                     "warmup_ratio": 0.1, "log_every_steps": 1, "checkpoint_every_steps": 4,
                     "seed": 3, "deterministic": True}
    train_section.update(train)
    return {
        "task": "classification",
        "output_dir": str(output_dir),
        "data": {"train": str(directory / "train.tsv"), "dev": str(directory / "dev.tsv"),
                 "text_column": "sentence", "label_column": "label", "max_length": 16},
        "model": {"preset": "bert_tiny", "vocabulary": str(directory / "vocab.txt"),
                  "dropout": dropout,
                  "overrides": {"num_layers": 1, "hidden_dim": 16, "num_heads": 2,
                                "intermediate_dim": 32, "max_sequence_length": 16}},
        "train": train_section,
    }


def run_subprocess(tmp_path, name, config, env=None, kill_at_step=None, weights=True):
    spec = {"config": config, "kill_at_step": kill_at_step,
            "weights_out": str(tmp_path / f"{name}.npz") if weights else None}
    spec_path = tmp_path / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    environment.pop("TF_CONFIG", None) if not (env and "TF_CONFIG" in env) else None
    return subprocess.Popen(
        [sys.executable, "-m", "tests.training_run", str(spec_path)], cwd=REPO,
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(process, timeout=240):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def load_weights(path):
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def max_difference(a, b):
    assert len(a) == len(b)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def in_process(tmp_path, name, dropout=0.1, **train):
    data = write_data(tmp_path / "data")
    values = config_dict(data, tmp_path / name, dropout=dropout, **train)
    config = TrainingConfig.from_dict(values)
    trainer = Trainer(config)
    results = trainer.run()
    return [np.asarray(v.numpy()) for v in trainer.model.weights], results


def test_training_learns_and_writes_its_results(tmp_path):
    # 16 epochs: at 10, one seed in five of this toy run had not yet left chance level.
    weights, results = in_process(tmp_path, "run", epochs=16, learning_rate=1e-2)
    assert results["best_dev"]["accuracy"] >= 0.9  # the toy task is learnable
    output = tmp_path / "run"
    for name in ("model.keras", "metrics.json", "vocab.txt", "labels.txt", "config.json",
                 "best.weights.h5"):
        assert (output / name).is_file(), name
    metrics = json.loads((output / "metrics.json").read_text())
    assert [r["epoch"] for r in metrics["history"]] == list(range(1, 17))
    assert metrics["updates"] == 16 * 12  # 96 examples / 8 per update, 16 epochs
    assert list((output / "tensorboard").iterdir())
    # The saved model is the best epoch's and scores what metrics.json says.
    import keras

    from keras_attn.text.classification_reader import ClassificationReader

    model = keras.models.load_model(output / "model.keras")
    assert max_difference([np.asarray(v) for v in model.get_weights()], weights) == 0.0
    reader = ClassificationReader(tmp_path / "data" / "dev.tsv", text_column="sentence",
                                  label_column="label")
    from keras_attn.text.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(str(output / "vocab.txt"), sequence_length=16)
    examples = list(reader)
    x = tokenizer([e.text for e in examples])
    logits = model.predict({k: np.asarray(v) for k, v in x.items()}, verbose=0)
    accuracy = np.mean(logits.argmax(-1) == np.array([int(e.label) for e in examples]))
    assert accuracy == pytest.approx(results["best_dev"]["accuracy"])


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("runner", ["fit", "loop"])
def test_mixed_precision_learns_with_both_runners(tmp_path, policy, runner):
    import keras

    data = write_data(tmp_path / "data")
    config = TrainingConfig.from_dict(config_dict(
        data, tmp_path / "run", epochs=10, learning_rate=1e-2, mixed_precision=policy,
        runner=runner))
    trainer = Trainer(config)
    results = trainer.run()
    assert results["best_dev"]["accuracy"] >= 0.9
    compute_dtype = policy.split("_")[1]
    assert trainer.model.backbone.compute_dtype == compute_dtype
    assert all(v.dtype == "float32" for v in trainer.model.trainable_variables)
    # float16 needs loss scaling; bfloat16 has float32's exponent range and does not.
    optimizer = trainer.model.optimizer
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == (
        policy == "mixed_float16")
    # The process-wide policy is the caller's again.
    assert keras.config.dtype_policy().name == "float32"


def test_fit_and_loop_runners_train_the_same_weights(tmp_path):
    fit, _ = in_process(tmp_path, "fit", runner="fit")
    loop, _ = in_process(tmp_path, "loop", runner="loop")
    assert max_difference(fit, loop) < WEIGHT_TOLERANCE


def test_gradient_accumulation_equals_one_large_batch(tmp_path):
    # k micro-batches of b == one batch of k*b: same examples per update (no bucketing, so
    # update u holds positions [8u, 8u + 8) in both), no dropout (it would draw different
    # masks for different batch shapes).
    common = dict(bucket_by_length=False, epochs=2, dropout=0.0)
    large, _ = in_process(tmp_path, "large", global_batch_size=8, **common)
    for runner in ("fit", "loop"):
        accumulated, results = in_process(tmp_path, f"acc_{runner}", global_batch_size=4,
                                          gradient_accumulation_steps=2, runner=runner,
                                          **common)
        assert results["updates"] == 24
        assert max_difference(large, accumulated) < WEIGHT_TOLERANCE, runner


@pytest.mark.slow  # 10-30 s on 2 cores: the slow stage keeps make test within 15 min
def test_mirrored_two_replicas_equal_one_device(tmp_path):
    # Without dropout: each replica draws its own masks for its half of the batch, so with
    # dropout the two runs are different (equally valid) random draws.
    data = write_data(tmp_path / "data")
    one = run_subprocess(tmp_path, "one", config_dict(data, tmp_path / "one", dropout=0.0))
    config = config_dict(data, tmp_path / "two", dropout=0.0)
    config["distribute"] = {"strategy": "mirrored", "logical_cpu_devices": 2}
    two = run_subprocess(tmp_path, "two", config)
    for process in (one, two):
        code, output = finish(process)
        assert code == 0, output
    assert "MirroredStrategy over 2 local devices" in output
    assert max_difference(load_weights(tmp_path / "one.npz"),
                          load_weights(tmp_path / "two.npz")) < WEIGHT_TOLERANCE


@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_kill_and_resume_ends_with_the_same_weights(tmp_path):
    data = write_data(tmp_path / "data")
    finish_code, output = finish(run_subprocess(tmp_path, "straight",
                                                config_dict(data, tmp_path / "straight")))
    assert finish_code == 0, output
    config = config_dict(data, tmp_path / "killed", keep_checkpoints=3)
    code, output = finish(run_subprocess(tmp_path, "killed", config, kill_at_step=15))
    assert code == -9, output  # SIGKILL, mid-run
    checkpoints = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000004", "step-00000008", "step-00000012"], checkpoints
    # Damage the newest checkpoint: resuming must detect it and use the one before.
    state = tmp_path / "killed" / "checkpoints" / "step-00000012" / "state.npz"
    state.write_bytes(state.read_bytes()[:-100])
    code, output = finish(run_subprocess(tmp_path, "killed", config))
    assert code == 0, output
    assert "skipping unusable checkpoint" in output and "checksum mismatch" in output
    assert "resumed from checkpoint at step 8" in output
    assert max_difference(load_weights(tmp_path / "straight.npz"),
                          load_weights(tmp_path / "killed.npz")) == 0.0


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def two_worker_processes(tmp_path, config):
    """Starts `config` (a dict) on two local workers, `MultiWorkerMirroredStrategy` over a
    `TF_CONFIG` on localhost ports; their final weights go to `worker0.npz`, `worker1.npz`."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    config = {**config, "distribute": {"strategy": "multi_worker"}}
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": addresses},
                     "task": {"type": "worker", "index": index}}
        processes.append(run_subprocess(tmp_path, f"worker{index}", config,
                                        env={"TF_CONFIG": json.dumps(tf_config)}))
    return processes


def two_workers_and_one_process(tmp_path, data, model=None, **train):
    """Trains one config on two local workers (run "multi": worker0/1.npz) and, with the
    loop runner, in one process (run "single": single.npz); the three outputs."""
    config = config_dict(data, tmp_path / "multi", dropout=0.0, **train)
    single = config_dict(data, tmp_path / "single", dropout=0.0, runner="loop", **train)
    if model is not None:
        config["model"] = single["model"] = model
    processes = two_worker_processes(tmp_path, config)
    processes.append(run_subprocess(tmp_path, "single", single))
    outputs = []
    for process in processes:
        code, output = finish(process, timeout=300)
        assert code == 0, output
        outputs.append(output)
    assert "MultiWorkerMirroredStrategy: 2 workers" in outputs[0]
    return outputs


@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_two_workers_on_localhost_train_one_model(tmp_path):
    data = write_data(tmp_path / "data")
    outputs = two_workers_and_one_process(tmp_path, data)
    assert "2 replicas x 4" in outputs[0]
    worker0 = load_weights(tmp_path / "worker0.npz")
    worker1 = load_weights(tmp_path / "worker1.npz")
    assert max_difference(worker0, worker1) == 0.0
    assert max_difference(worker0, load_weights(tmp_path / "single.npz")) < WEIGHT_TOLERANCE
    # Only the chief writes the run's files.
    assert (tmp_path / "multi" / "metrics.json").is_file()


# Slow (170 s of the default suite under load): the default suite keeps two workers training
# one float model (above) and QAT in one process (test_quantization_aware_training_*).
@pytest.mark.slow
def test_two_workers_train_one_quantization_aware_model(tmp_path):
    # QAT's calibration (channel sort, ranges) runs eagerly on each worker before the first
    # update; both must reach the same model, and the same as one process would.
    in_process(tmp_path, "float", dropout=0.0, epochs=4, learning_rate=1e-2)
    model = {"checkpoint": str(tmp_path / "float"), "quantization_aware": True,
             "float_residual": True, "feedforward_float_channels": 2, "dropout": 0.0}
    outputs = two_workers_and_one_process(tmp_path, tmp_path / "data", model, epochs=1,
                                          learning_rate=1e-3)
    assert all("QAT activation ranges calibrated" in output for output in outputs)
    worker0 = load_weights(tmp_path / "worker0.npz")
    # Every weight, the activation ranges included, is the same on both workers.
    assert max_difference(worker0, load_weights(tmp_path / "worker1.npz")) == 0.0
    import keras

    trained = keras.models.load_model(tmp_path / "multi" / "model.keras")
    single = load_weights(tmp_path / "single.npz")
    trainable = [v.trainable for v in trained.weights]
    assert len(trainable) == len(worker0)
    assert max_difference([w for w, t in zip(worker0, trainable) if t],
                          [w for w, t in zip(single, trainable) if t]) < WEIGHT_TOLERANCE
    # A range's update is the mean of the replicas' batch extremes, where one process takes
    # the extreme of the whole batch: with decay 0.999 over 12 steps they differ by < 1 %.
    for w, s, t in zip(worker0, single, trainable):
        if not t and w.dtype == np.float32:
            np.testing.assert_allclose(w, s, rtol=1e-2, atol=1e-6)
    order = layer_named(trained, "transformer_layer_0").feedforward_channel_order.numpy()
    assert (order != np.arange(order.size)).any()  # sorted, and the same everywhere (above)
    from keras_attn.quantization.model_queries import activation_quantizers

    assert all(float(q.initialized.numpy()) == 1.0 or q.fixed_range is not None
               for q in activation_quantizers(trained))


def test_a_trained_run_can_be_continued_with_its_vocabulary_and_labels(tmp_path):
    first, results = in_process(tmp_path, "first", epochs=10, learning_rate=1e-2)
    data = tmp_path / "data"
    values = config_dict(data, tmp_path / "second", epochs=1, learning_rate=1e-12,
                         weight_decay=0.0)
    values["model"] = {"checkpoint": str(tmp_path / "first")}  # no preset, no vocabulary
    trainer = Trainer(TrainingConfig.from_dict(values))
    continued = trainer.run()
    # A vanishing learning rate: the continued model is the first run's, scored the same.
    second = [np.asarray(v.numpy()) for v in trainer.model.weights]
    assert max_difference(first, second) < 1e-9
    assert continued["best_dev"]["accuracy"] == results["best_dev"]["accuracy"]
    for name in ("vocab.txt", "labels.txt"):
        assert (tmp_path / "second" / name).read_text() == (tmp_path / "first" / name).read_text()


def test_continuing_a_run_of_another_task_is_a_config_error(tmp_path):
    from keras_attn.runs.config_schema import ConfigError

    in_process(tmp_path, "first", epochs=1)
    conll = tmp_path / "train.conll"
    conll.write_text("the O\nfilm O\n\ngood B-X\n")
    values = config_dict(tmp_path / "data", tmp_path / "ner", epochs=1)
    values["task"] = "ner"
    values["data"] = {"train": str(conll), "max_length": 16}
    values["model"] = {"checkpoint": str(tmp_path / "first")}
    with pytest.raises(ConfigError, match="is a run of task 'classification'; task 'ner' "
                                          "cannot continue it"):
        Trainer(TrainingConfig.from_dict(values)).run()


@pytest.mark.slow  # 10-30 s on 2 cores: the slow stage keeps make test within 15 min
def layer_named(model, name):
    """The layer `name` of `model`, nested models included."""
    (layer,) = [layer for layer in model._flatten_layers(include_self=False)
                if layer.name == name]
    return layer


def test_quantization_aware_training_continues_a_float_run(tmp_path):
    import keras

    from keras_attn.quantization.model_queries import activation_quantizers
    from keras_attn.quantization.model_queries import model_layout
    from keras_attn.runs.config_schema import ConfigError
    from keras_attn.runs.run_directory import RunDirectory

    _, float_results = in_process(tmp_path, "float", epochs=10, learning_rate=1e-2)
    values = config_dict(tmp_path / "data", tmp_path / "qat", epochs=2, learning_rate=1e-3)
    values["model"] = {"checkpoint": str(tmp_path / "float"), "quantization_aware": True}
    lines = []
    trainer = Trainer(TrainingConfig.from_dict(values), log=lines.append)
    results = trainer.run()
    assert any("quantization-aware training" in line for line in lines)
    quantizers = activation_quantizers(trainer.model)
    assert any(q.quantize for q in quantizers)
    # Ranges learned in training.
    assert all(float(q.initialized.numpy()) == 1.0 or q.fixed_range is not None
               for q in quantizers)
    # The int8 simulation keeps the float run's accuracy on this easy task.
    assert results["best_dev"]["accuracy"] >= float_results["best_dev"]["accuracy"] - 0.05
    reloaded = keras.models.load_model(tmp_path / "qat" / "model.keras")
    # The layout defaults are the measured best recipe, recorded in the run's lineage.
    assert model_layout(reloaded) == {"float_residual": True, "feedforward_float_channels": 4}
    lineage = RunDirectory(tmp_path / "qat").lineage()
    assert lineage.source_kind == "run" and lineage.source_task == "classification"
    assert lineage.quantization["float_residual"] and lineage.quantization["qat_epochs"] == 2

    # `model.float_residual`: the residual sums and LayerNorm internals stay float.
    values = config_dict(tmp_path / "data", tmp_path / "qat_float", epochs=2, learning_rate=1e-3)
    values["model"] = {"checkpoint": str(tmp_path / "float"), "quantization_aware": True,
                       "float_residual": True, "feedforward_float_channels": 2}
    results = Trainer(TrainingConfig.from_dict(values), log=lines.append).run()
    assert results["best_dev"]["accuracy"] >= float_results["best_dev"]["accuracy"] - 0.05
    reloaded = keras.models.load_model(tmp_path / "qat_float" / "model.keras")
    assert model_layout(reloaded) == {"float_residual": True, "feedforward_float_channels": 2}
    # The calibration before the first update sorted the feed-forward channels.
    block = layer_named(reloaded, "transformer_layer_0")
    order = block.feedforward_channel_order.numpy()
    assert sorted(order) == list(range(block.intermediate_dim))
    assert (order != np.arange(block.intermediate_dim)).any()
    floats = {q.name for q in activation_quantizers(reloaded) if not q.quantize}
    assert "feedforward_residual_quantizer" in floats and "qkv_quantizer" not in floats

    # Continuing that QAT run with another quantizer layout is an error, not ignored.
    values = config_dict(tmp_path / "data", tmp_path / "qat_more", epochs=1, learning_rate=1e-3)
    values["model"] = {"checkpoint": str(tmp_path / "qat_float"), "quantization_aware": True,
                       "float_residual": True, "feedforward_float_channels": 4}
    with pytest.raises(ConfigError, match=r"qat_float is a QAT run with "
                                          r"feedforward_float_channels=2, but "
                                          r"model\.feedforward_float_channels is 4: set "
                                          r"model\.feedforward_float_channels: 2"):
        Trainer(TrainingConfig.from_dict(values), log=lines.append).run()
    values["model"].update(float_residual=False, feedforward_float_channels=0)
    with pytest.raises(ConfigError, match=r"float_residual=True, but model\.float_residual is "
                                          r"False: set model\.float_residual: true"):
        Trainer(TrainingConfig.from_dict(values), log=lines.append).run()
    # With the run's own layout it continues, keeping the sorted channel order.
    values["model"].update(float_residual=True, feedforward_float_channels=2)
    Trainer(TrainingConfig.from_dict(values), log=lines.append).run()
    continued = keras.models.load_model(tmp_path / "qat_more" / "model.keras")
    block = layer_named(continued, "transformer_layer_0")
    np.testing.assert_array_equal(block.feedforward_channel_order.numpy(), order)


def test_quantization_aware_training_starts_from_calibrated_ranges(tmp_path):
    import keras

    from keras_attn.quantization.calibration import calibrate_model
    from keras_attn.quantization.model_queries import activation_quantizers
    from keras_attn.quantization.quantize_model import quantize_model
    from keras_attn.runs.quantization_recipe import QuantizationRecipe
    from keras_attn.training.tasks import make_task

    in_process(tmp_path, "float", epochs=2)
    values = config_dict(tmp_path / "data", tmp_path / "qat", max_steps=1)
    # All-int8: every LayerNorm statistic has a learned range to compare.
    values["model"] = {"checkpoint": str(tmp_path / "float"), "quantization_aware": True,
                       "float_residual": False, "feedforward_float_channels": 0}
    trainer = Trainer(TrainingConfig.from_dict(values))
    trainer.run()

    # Reference: the float model calibrated on its own, on the same training examples.
    task = make_task(TrainingConfig.from_dict(values), tmp_path / "unused", lambda m: None,
                     write_files=False)
    task.prepare()
    reference = quantize_model(keras.models.load_model(tmp_path / "float" / "model.keras"))
    examples = task.calibration_sample(QuantizationRecipe().calibration_examples)
    calibrate_model(reference, [task.collate(examples[i: i + 8])[0]
                                for i in range(0, len(examples), 8)])
    batches = task.input_batches(QuantizationRecipe().calibration_examples)
    assert sum(len(x["token_ids"]) for x in batches) == len(examples)
    for name, value in task.collate(examples[8:16])[0].items():
        np.testing.assert_array_equal(batches[1][name], value)
    # One update moves an EMA range (decay 0.999) by 0.1 % of the training batch's distance
    # from it; the LayerNorm means (a range of ~0.01) moved by 2 %, the rest by < 0.03 %.
    # Ranges started from the first training batch (dropout on, 8 examples) are off by more.
    learned = [q for q in activation_quantizers(trainer.model) if q.fixed_range is None]
    expected = [q for q in activation_quantizers(reference) if q.fixed_range is None]
    assert len(learned) == len(expected) > 10
    for got, want in zip(learned, expected):
        width = float(want.max_value.numpy() - want.min_value.numpy())
        for name in ("min_value", "max_value"):
            difference = float(getattr(got, name).numpy()) - float(getattr(want, name).numpy())
            assert abs(difference) <= 0.03 * width + 1e-6, (got.path, name, difference / width)


def test_quantization_aware_training_from_fresh_weights_is_warned(tmp_path):
    """QAT is a fine-tuning: from fresh weights it stayed at chance (docs/export.md), so a
    run without `model.checkpoint` says so; a continued run does not."""
    values = config_dict(write_data(tmp_path / "data"), tmp_path / "qat", max_steps=1)
    values["model"].update(quantization_aware=True)
    logs = []
    Trainer(TrainingConfig.from_dict(values), log=logs.append).run()
    warned = [line for line in logs if line.startswith("warning: quantization-aware")]
    assert len(warned) == 1 and "then continue its run" in warned[0]
    values.update(output_dir=str(tmp_path / "again"))
    values["model"].update(checkpoint=str(tmp_path / "qat"))
    values["model"].pop("preset", None)
    logs.clear()
    Trainer(TrainingConfig.from_dict(values), log=logs.append).run()
    assert not [line for line in logs if line.startswith("warning: quantization-aware")]


def test_float_feedforward_channels_need_a_float_residual(tmp_path):
    from keras_attn.runs.config_schema import ConfigError

    values = config_dict(tmp_path / "data", tmp_path / "qat")
    values["model"].update(float_residual=False, quantization_aware=True,
                           feedforward_float_channels=4)
    with pytest.raises(ConfigError, match=r"model\.feedforward_float_channels.*"
                                          r"model\.float_residual: true"):
        TrainingConfig.from_dict(values)


def dev_accuracy(tmp_path, model):
    """The toy dev set's accuracy of `model`, computed here (the independent reference)."""
    from keras_attn.text.classification_reader import ClassificationReader
    from keras_attn.text.tokenizer import WordPieceTokenizer

    examples = list(ClassificationReader(tmp_path / "data" / "dev.tsv", text_column="sentence",
                                         label_column="label"))
    x = WordPieceTokenizer(str(tmp_path / "run" / "vocab.txt"), sequence_length=16)(
        [e.text for e in examples])
    logits = model.predict({k: np.asarray(v) for k, v in x.items()}, verbose=0)
    return np.mean(logits.argmax(-1) == np.array([int(e.label) for e in examples]))


def test_checkpoint_averaging_keeps_the_last_epochs_and_uses_the_better(tmp_path):
    import keras

    # 12 updates an epoch, a checkpoint every 4 and only the newest kept: the last two
    # epoch ends are kept for averaging anyway.
    best_weights, results = in_process(tmp_path, "run", epochs=4, learning_rate=1e-2,
                                       keep_checkpoints=1, average_checkpoints=2)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000036", "step-00000048"]
    record = results["checkpoint_average"]
    assert record["epochs"] == [3, 4]
    # The reference: the two checkpoints' model arrays averaged with numpy, in the order of
    # the model's variables.
    arrays = []
    for name in ("step-00000036", "step-00000048"):
        meta = json.loads((checkpoints / name / "meta.json").read_text())
        with np.load(checkpoints / name / "state.npz") as state:
            arrays.append([state[f"{i:05d}"] for i, v in enumerate(meta["variables"])
                           if v["owner"] == "model"])
    averaged = [(a + b) / 2 if a.dtype.kind == "f" else b for a, b in zip(*arrays)]
    model = keras.models.load_model(tmp_path / "run" / "model.keras")
    shipped = [np.array(v.numpy()) for v in model.weights]
    for variable, value in zip(model.variables, averaged, strict=True):
        variable.assign(value)
    assert record["dev"]["accuracy"] == pytest.approx(dev_accuracy(tmp_path, model))
    assert record["used"] == (record["dev"]["accuracy"] > results["best_dev"]["accuracy"])
    expected = [np.array(v.numpy()) for v in model.weights] if record["used"] else best_weights
    assert max_difference(shipped, expected) < 1e-6


def test_a_time_budget_stops_before_an_epoch_that_would_end_past_it(tmp_path):
    _, results = in_process(tmp_path, "run", epochs=3, time_budget_minutes=1e-6)
    assert len(results["history"]) == 1 and results["stopped_for_time"]
    record = results["history"][0]
    assert record["train_seconds"] > 0 and record["eval_seconds"] > 0
    assert record["tokens"] > 0
    assert results["train_seconds"] == pytest.approx(record["train_seconds"], abs=0.11)
