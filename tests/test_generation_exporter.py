"""`keras-attn export` of a character language model run and `keras-attn predict` on its
files: the fp32 file's logits are the Keras model's (checked against the model's full
pass), its greedy and seeded top-k tokens are `GPTCausalLM.generate`'s, the report's
perplexities are NumPy's of the model's logits, the CLI streams what it returns."""

import json

import keras
import numpy as np
import pytest

from keras_attn import cli
from keras_attn.export.tflite.generation_file import GenerationFile
from keras_attn.export.tflite.generation_file import file_generator
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages import generation_exporter
from keras_attn.stages.train_stage import Trainer
from keras_attn.text_generation import GenerationError
from keras_attn.text_generation import TextGenerator

pytestmark = pytest.mark.tensorflow  # training, LiteRT

WORDS = "to be or not that is the question whether tis nobler in the mind".split()
LENGTH = 32


def rotations(count):
    return "".join(" ".join(WORDS[i % len(WORDS):] + WORDS[:i % len(WORDS)]) + "\n"
                   for i in range(count))


def toy_run(folder):
    """Trains a 2-layer character GPT of width 32 on rotations of one line (2 epochs,
    seconds) in `folder/run`; returns the run directory (also the web tests' toy export:
    apps/web_demo/tools/make_test_exports.py)."""
    (folder / "train.txt").write_text(rotations(200), encoding="utf-8")
    (folder / "dev.txt").write_text(rotations(40), encoding="utf-8")
    config = TrainingConfig.from_dict({
        "task": "causal_lm", "output_dir": str(folder / "run"),
        "data": {"train": str(folder / "train.txt"), "dev": str(folder / "dev.txt"),
                 "max_length": LENGTH},
        "model": {"preset": "gpt2_tiny", "tokenizer": "characters", "dropout": 0.0,
                  "overrides": {"num_layers": 2, "num_heads": 2, "hidden_dim": 32,
                                "intermediate_dim": 64, "layer_position_embeddings": True}},
        "train": {"epochs": 2, "global_batch_size": 16, "learning_rate": 1e-2,
                  "warmup_ratio": 0.05, "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 100000},
    }, source="test_generation_exporter")
    Trainer(config).run()
    return folder / "run"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`(run directory, export directory, report)` of `toy_run`."""
    folder = tmp_path_factory.mktemp("generation")
    run = toy_run(folder)
    export = folder / "export"
    assert cli.main(["export", str(run), "--output-dir", str(export)]) == 0
    report = json.loads((export / "export_report.json").read_text(encoding="utf-8"))
    return run, export, report


def test_fp32_file_gives_the_models_logits(exported):
    run, export, _ = exported
    model = keras.saving.load_model(run / "model.keras")
    runtime = GenerationFile(export / "generation_fp32.tflite")
    ids = runtime.codec.encode("whether tis nobler in the mind to")[:LENGTH]
    full = keras.ops.convert_to_numpy(model({"token_ids": ids[None],
                                             "padding_mask": np.ones((1, len(ids)))}))[0]
    np.testing.assert_allclose(runtime.sequence_logits(ids), full, atol=1e-4)
    assert runtime.max_length == LENGTH and runtime.card["tokenizer"] == "characters"


@pytest.mark.parametrize("sampling", [{}, {"sampler": "sample", "top_k": 4, "seed": 3},
                                      {"sampler": "sample", "temperature": 2.0, "seed": 5}])
def test_fp32_file_generates_the_models_tokens(exported, sampling):
    run, export, _ = exported
    model = keras.saving.load_model(run / "model.keras")
    generator = file_generator(export / "generation_fp32.tflite")
    prompt = generator.codec.encode("not that is")
    expected = keras.ops.convert_to_numpy(model.generate(prompt[None], 20, **sampling))[0]
    assert generator.generate_ids(prompt, 20, **sampling) == expected[len(prompt):].tolist()


def test_report_perplexities_are_the_models(exported):
    run, export, report = exported
    model = keras.saving.load_model(run / "model.keras")
    codec = file_generator(export / "generation_fp32.tflite").codec
    stream = codec.encode((run.parent / "dev.txt").read_text(encoding="utf-8"))
    blocks = [stream[i:i + LENGTH + 1] for i in range(0, len(stream) - LENGTH, LENGTH)]
    blocks = blocks[:report["blocks"]]
    inputs = np.stack([b[:-1] for b in blocks])
    logits = keras.ops.convert_to_numpy(model({"token_ids": inputs,
                                               "padding_mask": np.ones_like(inputs)}))
    logits = logits.astype("float64")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = np.stack([b[1:] for b in blocks])
    nll = -np.take_along_axis(log_probs, targets[..., None], -1).mean()
    rows = {row["artifact"]: row for row in report["artifacts"]}
    assert rows["keras"]["perplexity"] == pytest.approx(np.exp(nll), rel=1e-5)
    assert rows["keras"]["bits_per_character"] == pytest.approx(nll / np.log(2), rel=1e-5)
    assert rows["fp32"]["perplexity"] == pytest.approx(rows["keras"]["perplexity"], rel=1e-4)
    assert rows["fp32"]["same_as_keras_greedy"] == rows["fp32"]["same_as_keras_sampled"] == 1
    assert rows["fp32"]["prefix_as_keras_greedy"] == rows["fp32"]["prefix_as_keras_sampled"] == 1
    for row in rows.values():  # a continuation equal to Keras' is a whole common prefix
        assert row.get("prefix_as_keras_greedy", 1) >= row.get("same_as_keras_greedy", 0)
    assert rows["int8"]["perplexity"] == pytest.approx(rows["keras"]["perplexity"], rel=0.05)
    expected = "int8" if rows["int8"]["perplexity"] <= rows["keras"]["perplexity"] * \
        generation_exporter.INT8_PERPLEXITY_RATIO else "fp32"
    card = json.loads((export / "model_card.json").read_text(encoding="utf-8"))
    assert card["default_file"] == report["default_file"] == f"generation_{expected}.tflite"
    assert sorted(card["artifacts"]) == [f"generation_{v}.tflite"
                                         for v in ("dynamic_int8", "fp32", "int8")]


def test_files_are_builtins_only_and_int8_runs_int8_ops(exported):
    _, export, report = exported
    for row in report["artifacts"][1:]:
        assert not tflite_op_report(export / row["file"])["custom_ops"], row["file"]
    int8 = tflite_op_report(export / "generation_int8.tflite")
    assert sum(int8["ops"].values()) - sum(int8["non_int8_ops"].values()) >= 4
    sizes = {row["artifact"]: row["size_bytes"] for row in report["artifacts"][1:]}
    assert sizes["dynamic_int8"] < 0.8 * sizes["fp32"]


def test_predict_streams_the_continuation_of_each_prompt(exported, capsys):
    run, export, _ = exported
    expected = TextGenerator.from_run(run).generate("to be", 12, sampler="sample", top_k=3,
                                                    seed=2)
    assert cli.main(["predict", str(run), "to be", "or not", "--max-new-tokens", "12",
                     "--top-k", "3", "--seed", "2"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[0] == "to be" + expected and lines[1] == "" and lines[2].startswith("or not")
    assert cli.main(["predict", str(export / "generation_fp32.tflite"), "to be",
                     "--max-new-tokens", "12", "--top-k", "3", "--seed", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"prompt": "to be", "text": expected}


def test_prompts_that_do_not_fit_are_refused_before_any_output(exported, capsys):
    _, export, _ = exported
    assert cli.main(["predict", str(export), "x" * LENGTH]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "shorten the prompt" in captured.err
    assert cli.main(["predict", str(export), "to", "--max-new-tokens", str(LENGTH)]) == 2
    assert f"ask for at most {LENGTH - 2}" in capsys.readouterr().err
    with pytest.raises(GenerationError, match="not a language model file"):
        GenerationFile(export / "model_card.json")


def _qat_config(run, output_dir, **model):
    return TrainingConfig.from_dict({
        "task": "causal_lm", "output_dir": str(output_dir),
        "data": {"train": str(run.parent / "train.txt"), "dev": str(run.parent / "dev.txt"),
                 "max_length": LENGTH},
        "model": {"checkpoint": str(run), "tokenizer": "characters", "dropout": 0.0,
                  "quantization_aware": True, **model},
        "train": {"epochs": 1, "global_batch_size": 16, "learning_rate": 1e-3,
                  "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 100000},
    }, source="test_generation_exporter")


@pytest.fixture(scope="module")
def qat_exported(exported):
    """`(QAT run, its export, report)`: `toy_run` continued quantization-aware for an
    epoch, the QAT run itself exported (its float run is the source)."""
    run, export, _ = exported
    qat = run.parent / "qat"
    Trainer(_qat_config(run, qat)).run()
    qat_export = run.parent / "qat_export"
    assert cli.main(["export", str(qat), "--output-dir", str(qat_export)]) == 0
    report = json.loads((qat_export / "export_report.json").read_text(encoding="utf-8"))
    return qat, qat_export, report


def test_a_quantization_aware_run_exports_its_own_weights_and_ranges(exported, qat_exported):
    run, _, float_report = exported
    qat, qat_export, report = qat_exported
    assert (report["source_run"], report["qat_run"]) == (str(run), str(qat))
    model = keras.saving.load_model(qat / "model.keras")  # as the trainer saved it
    codec = file_generator(qat_export / "generation_int8.tflite").codec
    stream = codec.encode((run.parent / "dev.txt").read_text(encoding="utf-8"))
    blocks = np.stack([stream[i:i + LENGTH + 1] for i in range(0, len(stream) - LENGTH,
                                                                 LENGTH)][:report["blocks"]])
    logits = keras.ops.convert_to_numpy(model({"token_ids": blocks[:, :-1],
                                               "padding_mask": np.ones_like(blocks[:, :-1])}))
    log_probs = logits - np.logaddexp.reduce(logits.astype("float64"), -1, keepdims=True)
    nll = -np.take_along_axis(log_probs, blocks[:, 1:, None], -1).mean()
    rows = {row["artifact"]: row for row in report["artifacts"]}
    assert rows["keras_qat"]["perplexity"] == pytest.approx(np.exp(nll), rel=1e-5)
    assert rows["keras"] == float_report["artifacts"][0]
    # The saved QAT model learned (its head's table is the trained one): no worse than float.
    assert rows["keras_qat"]["perplexity"] < 1.1 * rows["keras"]["perplexity"]
    # The int8 file is the QAT model (its cache rounded once more): a few int8 logit steps.
    head = model.get_layer("lm_head").output_quantizer
    logit_step = float(keras.ops.convert_to_numpy(head.max_value - head.min_value)) / 255
    file_logits = GenerationFile(qat_export / "generation_int8.tflite").sequence_logits(
        blocks[0, :-1])
    difference = np.abs(file_logits - logits[0]) / logit_step
    assert difference.max() <= 6 and difference.mean() <= 1, (
        difference.max(), difference.mean())
    assert rows["int8"]["perplexity"] == pytest.approx(rows["keras_qat"]["perplexity"],
                                                       rel=0.01)
    assert "Keras QAT model" in (qat_export / "export_report.md").read_text(encoding="utf-8")


def test_quantization_aware_language_model_runs_refuse_what_they_cannot_do(
        exported, qat_exported, tmp_path, capsys):
    run, _, _ = exported
    qat, _, _ = qat_exported
    with pytest.raises(ConfigError, match="is a quantization-aware run: its loaded LM head"):
        Trainer(_qat_config(qat, tmp_path / "again")).run()
    with pytest.raises(ConfigError, match="was trained with model.tokenizer: characters"):
        Trainer(_qat_config(run, tmp_path / "bytes", tokenizer="bytes")).run()
    assert cli.main(["export", str(run), "--qat-run", str(run),
                     "--output-dir", str(tmp_path / "export")]) == 2
    assert "is not a quantization-aware causal_lm run" in capsys.readouterr().err
    assert cli.main(["predict", str(qat), "to be"]) == 2
    assert "export it with `keras-attn export" in capsys.readouterr().err
