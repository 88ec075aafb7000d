"""The run directory contract: what training writes, what every stage reads, and the errors
for a directory that lacks a file."""

import json
import logging

import pytest

from keras_attn.cli import main
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.runs import run_directory
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import Lineage
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import TokenizerSettings
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.inference.predictor import PredictorError
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.stages.quantize_stage import quantize_run
from keras_attn.stages.train_stage import Trainer
from tests.test_trainer import config_dict
from tests.test_trainer import write_data

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A float run and an uncased run continued from it with `model.lowercase: false`."""
    root = tmp_path_factory.mktemp("runs")
    data = write_data(root / "data")
    Trainer(TrainingConfig.from_dict(config_dict(data, root / "float", epochs=1))).run()
    values = config_dict(data, root / "continued", epochs=1)
    values["model"] = {"checkpoint": str(root / "float"), "lowercase": False}
    Trainer(TrainingConfig.from_dict(values)).run()
    return root


def test_training_writes_the_contract(runs):
    run = RunDirectory(runs / "float")
    for name in ("config.json", "tokenizer.json", "lineage.json", "vocab.txt", "labels.txt",
                 "model.keras", "metrics.json"):
        assert (run.path / name).is_file(), name
    assert run.task == "classification" and run.is_run()
    assert run.tokenizer_settings() == TokenizerSettings("wordpiece", True, 16)
    assert run.lineage() == Lineage()
    assert len(run.labels()) == 2
    assert run.metrics()["task"] == "classification"


def test_a_continued_run_records_the_tokenizer_in_effect_and_its_lineage(runs):
    continued = RunDirectory(runs / "continued")
    # The config asked for lowercase: false, but the model continues an uncased run.
    assert continued.config().model.lowercase is False
    assert continued.tokenizer_settings().lowercase is True
    assert continued.tokenizer().lowercase is True
    lineage = continued.lineage()
    assert lineage.source_kind == "run" and lineage.source_task == "classification"
    assert lineage.source == str((runs / "float").resolve())
    # Runs written before tokenizer.json / lineage.json: derived the same way.
    (continued.path / "tokenizer.json").unlink()
    (continued.path / "lineage.json").unlink()
    try:
        assert continued.tokenizer_settings().lowercase is True
        assert continued.lineage().source_task == "classification"
    finally:
        json.dump(dict(kind="wordpiece", lowercase=True, max_length=16),
                  open(continued.path / "tokenizer.json", "w"))


def test_the_recorded_config_is_read_once_per_instance(tmp_path, monkeypatch):
    reads = []
    original = run_directory._read_json
    monkeypatch.setattr(run_directory, "_read_json",
                        lambda path: reads.append(path.name) or original(path))
    values = config_dict("data", tmp_path, epochs=1)
    (tmp_path / "config.json").write_text(json.dumps(values))
    run = RunDirectory(tmp_path)
    assert (run.task, run.task, run.config().task) == ("classification",) * 3
    assert run.config().train.epochs == 1 and reads == ["config.json"]
    copy = run.recorded_config()
    copy["task"] = "ner"  # a copy: the cached dict is not edited
    assert run.task == "classification"
    # Writing a config replaces what was read; another instance reads the file anew.
    run.write_start(TrainingConfig.from_dict({**values, "task": "ner"}),
                    TokenizerSettings("wordpiece", True, 16), Lineage())
    assert run.task == "ner" and RunDirectory(tmp_path).task == "ner"
    assert reads == ["config.json"] * 3


def test_missing_files_name_the_command_that_writes_them(tmp_path, runs):
    run = RunDirectory(tmp_path)
    with pytest.raises(RunDirectoryError, match=r"config.json is missing \(exporting\): a run "
                                                r"directory gets it from `keras-attn train"):
        run.require("config.json", needed_for="exporting")
    with pytest.raises(RunDirectoryError, match="model.keras is missing: .*re-run it to "
                                                "resume from checkpoints/"):
        run.load_model()
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RunDirectoryError, match=r"config.json is damaged: not a JSON file "
                                                r"written by .*remade by `keras-attn train"):
        run.config()
    # A file cut short (a killed writer of an older version, a disk error) names itself.
    (tmp_path / "model.keras").write_bytes((runs / "float" / "model.keras").read_bytes()[:900])
    with pytest.raises(RunDirectoryError, match=r"model.keras is damaged or not a Keras model "
                                                r"\(.*\): it is remade by `a finished keras-attn"):
        run.load_model()
    # Every reading stage reports it the same way.
    with pytest.raises(PredictorError, match="labels.txt is missing"):
        copy = tmp_path / "copy"
        copy.mkdir()
        for name in ("config.json", "vocab.txt", "model.keras"):
            (copy / name).write_bytes((runs / "float" / name).read_bytes())
        load_predictor(copy)


def test_quantize_stage_makes_a_qat_run_and_reuses_it(runs, tmp_path):
    recipe = QuantizationRecipe(feedforward_float_channels=2, calibration_examples=16)
    lines = []
    qat = quantize_run(runs / "float", tmp_path / "qat", recipe, log=lines.append)
    assert any("calibrated on 16 training examples" in line for line in lines)
    model = qat.load_model()
    assert model_layout(model) == {"float_residual": True, "feedforward_float_channels": 2}
    assert all(float(q.initialized.numpy()) == 1.0 or q.fixed_range is not None
               for q in activation_quantizers(model))
    # The ops the budget moved to float, kept for the export to rebuild the same model.
    metrics = qat.metrics()
    assert metrics["float_ops"] == metrics["quantization_budget"]["float_ops"]
    assert qat.lineage().quantization == recipe.to_dict()
    assert qat.lineage().source == str((runs / "float").resolve())
    assert qat.tokenizer_settings() == RunDirectory(runs / "float").tokenizer_settings()
    assert qat.config().model.quantization_aware
    # Finished with the same recipe: reused; with another: an error, never silently mixed.
    again = []
    quantize_run(runs / "float", tmp_path / "qat", recipe, log=again.append)
    assert again == [f"QAT model: reusing {tmp_path / 'qat'} ({recipe.describe()})"]
    with pytest.raises(RunDirectoryError, match="made with another recipe"):
        quantize_run(runs / "float", tmp_path / "qat", QuantizationRecipe.all_int8())
    with pytest.raises(RunDirectoryError, match="is already a QAT run"):
        quantize_run(tmp_path / "qat", tmp_path / "qat2")


def test_quantize_command(runs, tmp_path, capsys):
    output = tmp_path / "qat_cli"
    assert main(["quantize", str(runs / "float"), "--output-dir", str(output),
                 "--calibration-examples", "8", "--all-int8"]) == 0
    out = capsys.readouterr().out
    assert "every activation int8 (--all-int8)" in out and f"--qat-run {output}" in out
    assert RunDirectory(output).lineage().quantization == QuantizationRecipe.all_int8(
        calibration_examples=8).to_dict()
    assert main(["quantize", str(tmp_path / "nothing")]) == 2
    assert "keras-attn quantize: error:" in capsys.readouterr().err
    assert main(["quantize", str(runs / "float"), "--all-int8",
                 "--feedforward-float-channels", "4"]) == 2
    assert "needs `float_residual=True`" in capsys.readouterr().err


class WarningLines(logging.Handler):
    """The messages of the WARNING records a logger hands it."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_export_of_a_run_logs_no_third_party_warnings(runs, tmp_path, capsys):
    """The main job's output is ours: no tf.function retracing warning (one trace scores
    every artifact and the golden vectors) and no onnxruntime pre-processing advice."""
    handler = WarningLines()
    loggers = [logging.getLogger(), logging.getLogger("tensorflow")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        assert main(["export", str(runs / "float"), "--output-dir", str(tmp_path / "export"),
                     "--latency-runs", "1", "--latency-threads", "1", "--golden-examples",
                     "16", "--no-text-tflite", "--calibration-examples", "8"]) == 0
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    captured = capsys.readouterr()
    noise = [line for line in handler.lines + (captured.out + captured.err).splitlines()
             if "retracing" in line or "pre-processing before quantization" in line]
    assert noise == []
    report = json.loads((tmp_path / "export" / "export_report.json").read_text())
    assert report["quantization"] == QuantizationRecipe(calibration_examples=8).to_dict()


def test_examples_of_a_split_equal_the_training_tasks(runs):
    """`RunDirectory.examples` (what quantize and export read) tokenizes a split exactly as
    the run's training task does, at the run's length or another one."""
    from keras_attn.training.tasks import make_task

    run = RunDirectory(runs / "float")
    task = make_task(run.config(), run.path, write_files=False)
    task.prepare()
    examples = run.examples("dev")
    assert len(examples) == len(task.dev_examples)
    for ours, theirs in zip(examples, task.dev_examples):
        assert ours["token_ids"].tolist() == theirs["token_ids"].tolist()
        assert ours["label"] == theirs["label"]
    short = run.examples("dev", sequence_length=6)
    assert max(len(e["token_ids"]) for e in short) == 6
    # A calibration sample is the task's sample, tokenized alone.
    sample = run.examples("train", sample=5)
    assert [e["token_ids"].tolist() for e in sample] == \
        [e["token_ids"].tolist() for e in task.calibration_sample(5)]
    assert run.texts("dev", 2) == [e.text for e in task._reader(task.config.data.dev)][:2]
    # Held out from that sample: the other training examples, in file order.
    rest = run.examples("train", beside_sample=5)
    every = [e["token_ids"].tolist() for e in task.train_examples]
    picked = [e["token_ids"].tolist() for e in task.calibration_sample(5)]
    assert len(rest) == len(every) - 5
    assert [e["token_ids"].tolist() for e in rest] == [ids for ids in every
                                                       if ids not in picked]
    assert run.examples("train", beside_sample=len(every)) == []
    assert len(run.examples("train", sample=3, beside_sample=5)) == 3


def test_the_length_rule(runs):
    run = RunDirectory(runs / "float")
    assert run.sequence_length() == 16  # the run's max_length
    assert run.sequence_length(12, limit=16) == 12
    with pytest.raises(RunDirectoryError, match=r"sequence_length=32 exceeds the "
                                                r"max_sequence_length=16 of the model \(.*\): "
                                                r"use --sequence-length 16 or less"):
        run.sequence_length(32, limit=16)
    with pytest.raises(RunDirectoryError, match="names no data.test"):
        run.examples("test")
