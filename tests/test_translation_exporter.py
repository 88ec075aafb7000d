"""`keras-attn export` of a translation run: the translation files decode with the Keras
model's own search code (the same tokens from the fp32 file), self-describing, scored."""

import json

import keras
import numpy as np
import pytest

from keras_attn import cli
from keras_attn.export.onnx.translation_onnx import TranslationOnnx
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.export.tflite.translation_file import TranslationFile
from keras_attn.export.tflite.translation_file import TranslationFileError
from keras_attn.export.tflite.translation_file import runtime_translator
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import Trainer
from keras_attn.stages.train_stage import train
from keras_attn.stages.translation_exporter import INT8_BLEU_BUDGET
from keras_attn.stages.translation_exporter import TranslationExportError
from keras_attn.stages.translation_exporter import export_translation_run
from keras_attn.training.tasks.task import pad_stack
from keras_attn.translation import Translator
from keras_attn.translation_qat import QATTranslation
from tests import scripts
from tests.test_seq2seq_task import make_config
from tests.test_seq2seq_task import toy_pairs
from tests.test_seq2seq_task import write_parallel

pytestmark = pytest.mark.tensorflow  # TFLite and ONNX conversion

VARIANTS = ("fp32", "dynamic_int8", "int8")
ONNX_FILES = ["translation_decoder_step.onnx", "translation_decoder_step_dynamic_int8.onnx",
              "translation_encoder.onnx", "translation_encoder_dynamic_int8.onnx"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A toy English -> German run (the seq2seq task's) and its export directory."""
    folder = tmp_path_factory.mktemp("translation_export")
    dev_pairs = toy_pairs(12, seed=1)
    config = make_config(folder, write_parallel(folder, "train", toy_pairs(320, seed=0)),
                         write_parallel(folder, "dev", dev_pairs), epochs=8)
    train(config)
    run = folder / "run"
    assert cli.main(["export", str(run)]) == 0
    return run, run / "export", dev_pairs


def test_the_files_are_scored_and_the_fp32_file_translates_as_keras(exported):
    """The report scores every file on the dev split with the run's 3 beams: the fp32
    file gives the Keras model's translations exactly (its BLEU equal), the int8 files
    stay near it; builtin ops only, batch 1, the card and vocabulary embedded. The ONNX
    encoder + decoder-step pairs (fp32 and dynamic int8) translate too."""
    run, export, dev_pairs = exported
    report = json.loads((export / "export_report.json").read_text())
    rows = {row["artifact"]: row for row in report["artifacts"]}
    assert report["examples"] == len(dev_pairs) and report["num_beams"] == 3
    assert rows["keras"]["bleu"] > 60  # the toy is learned
    assert rows["fp32"]["same_as_keras"] == 1.0
    assert rows["fp32"]["bleu"] == pytest.approx(rows["keras"]["bleu"], abs=1e-9)
    assert rows["onnx_fp32"]["same_as_keras"] == 1.0
    assert rows["onnx_fp32"]["file"] == "translation_encoder.onnx + " \
        "translation_decoder_step.onnx"
    for variant in ("dynamic_int8", "int8", "onnx_dynamic_int8"):
        assert rows[variant]["bleu"] >= rows["keras"]["bleu"] - 10, rows[variant]
    card = json.loads((export / "model_card.json").read_text())
    int8_default = rows["int8"]["bleu"] >= rows["keras"]["bleu"] - INT8_BLEU_BUDGET
    assert card["default_file"] == ("translation_int8.tflite" if int8_default
                                    else "translation_fp32.tflite")
    assert card["artifacts"] == sorted([f"translation_{v}.tflite" for v in VARIANTS]
                                       + ONNX_FILES)
    for variant in VARIANTS:
        path = export / f"translation_{variant}.tflite"
        assert rows[variant]["size_bytes"] == path.stat().st_size
        assert not tflite_op_report(path)["custom_ops"]
        files = associated_files(path)
        assert json.loads(files["model_card.json"])["target_max_length"] == 16
        assert files["vocab.txt"].decode().splitlines() == \
            (run / "vocab.txt").read_text().splitlines()
        assert "| `translation_" + variant in (export / "export_report.md").read_text()
    assert rows["int8"]["size_bytes"] < rows["fp32"]["size_bytes"]
    # The report translated one sentence at a time: its 3 beams in one call per step.
    file = TranslationFile(export / "translation_fp32.tflite")
    assert sorted(file.interpreter.get_signature_list()) == [
        "decode_step_16", "decode_step_16_beams_3", "encode_16"]


@pytest.mark.parametrize("runtime, name", [(TranslationFile, "translation_fp32.tflite"),
                                           (TranslationOnnx, "translation_encoder.onnx")])
@pytest.mark.parametrize("beams", [1, 3])
def test_the_fp32_files_decode_the_keras_tokens(exported, beams, runtime, name):
    """`TranslationFile` and `TranslationOnnx` are decoded by `EncoderDecoderDecoding`
    (the Keras model's `greedy_decode` / `beam_search`): on the fp32 files the tokens and
    beam scores are the Keras model's, for every dev source (batch of 12, padded)."""
    run, export, dev_pairs = exported
    keras_translator = Translator.from_run(run)
    sources = keras_translator.source_ids([s for s, _ in dev_pairs])
    ids = np.zeros((len(sources), max(map(len, sources))), "int32")
    for row, source in enumerate(sources):
        ids[row, :len(source)] = source
    settings = dict(bos_token_id=keras_translator.bos_token_id,
                    eos_token_id=keras_translator.eos_token_id, max_new_tokens=16)
    file = runtime(export / name)
    if beams == 1:
        expected = keras_translator.model.greedy_decode(ids, ids > 0, **settings)
        tokens = file.greedy_decode(ids, ids > 0, **settings)
    else:
        expected, expected_scores = keras_translator.model.beam_search(
            ids, ids > 0, num_beams=beams, **settings)
        tokens, scores = file.beam_search(ids, ids > 0, num_beams=beams, **settings)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(scores),
                                   keras.ops.convert_to_numpy(expected_scores), atol=1e-4)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens),
                                  keras.ops.convert_to_numpy(expected))
    if beams > 1:  # one sentence: its beams in one call of decode_step_16_beams_3
        for row in range(len(ids)):
            tokens, _ = file.beam_search(ids[row:row + 1], ids[row:row + 1] > 0,
                                         num_beams=beams, **settings)
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens)[0],
                                          keras.ops.convert_to_numpy(expected)[row])


def test_predict_translates_with_the_export_directory_and_each_file(exported, tmp_path,
                                                                     capsys):
    """`keras-attn predict` on the export directory (its default file) and on a file,
    with sentences or --input/--output, as on the run itself."""
    run, export, dev_pairs = exported
    source, target = dev_pairs[0]
    capsys.readouterr()
    assert cli.main(["predict", str(export), source]) == 0
    assert capsys.readouterr().out.strip() == target
    sources = tmp_path / "dev.en"
    sources.write_text("".join(s + "\n" for s, _ in dev_pairs), encoding="utf-8")
    output = tmp_path / "dev.de"
    assert cli.main(["predict", str(export / "translation_int8.tflite"), "--input",
                     str(sources), "--output", str(output), "--beams", "2",
                     "--threads", "1"]) == 0
    translations = output.read_text(encoding="utf-8").splitlines()
    assert len(translations) == len(dev_pairs)
    expected = Translator.from_run(run, num_beams=2).translate([s for s, _ in dev_pairs])
    assert np.mean([a == b for a, b in zip(translations, expected)]) >= 0.75
    assert cli.main(["predict", str(export / "translation_encoder.onnx"), source,
                     "--beams", "1"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        Translator.from_run(run, num_beams=1).translate([source])[0]


def test_a_source_longer_than_the_file_is_refused_by_name(exported):
    """The file's longest source is the run's max_length (16); the Translator cuts to it,
    a direct call with more tokens gets an error naming the limit."""
    _, export, _ = exported
    file = TranslationFile(export / "translation_fp32.tflite")
    assert file.source_lengths == [16] and file.max_length == 17
    ids = np.full((1, 20), 5, "int32")
    with pytest.raises(TranslationFileError, match="20 tokens is longer than .*16"):
        file.greedy_decode(ids, bos_token_id=1, max_new_tokens=4)
    with pytest.raises(TranslationFileError, match="18 decoder positions"):
        file.greedy_decode(ids[:, :8], bos_token_id=1, max_new_tokens=17)
    translator = runtime_translator(file)
    assert len(translator.translate(["one two " * 12])[0]) > 0  # cut to 16 pieces


def test_an_attention_rnn_run_is_refused_with_the_reason(tmp_path):
    """The files hold a Seq2SeqTransformer's encoder and decoding step; an attention-RNN
    run is named and sent to `keras-attn predict RUN`."""
    folder = tmp_path
    config = TrainingConfig.from_dict({
        "task": "seq2seq", "output_dir": str(folder / "run"),
        "data": {"train": write_parallel(folder, "train", toy_pairs(32, seed=0)),
                 "dev": write_parallel(folder, "dev", toy_pairs(2, seed=1)),
                 "max_length": 12, "target_max_length": 12},
        "model": {"preset": "attention_rnn_tiny", "vocabulary_size": 64, "lowercase": False},
        "train": {"epochs": 1, "global_batch_size": 16, "eval_num_beams": 1,
                  "log_every_steps": 1000},
    })
    train(config)
    with pytest.raises(TranslationExportError, match="AttentionRNNSeq2Seq run.*keras-attn "
                                                     "predict RUN"):
        export_translation_run(folder / "run", folder / "export")
    # Nor does it continue quantization-aware (no int8 graphs), or at all.
    with pytest.raises(ConfigError, match="holds a AttentionRNNSeq2Seq: seq2seq continues "
                                          "Seq2SeqTransformer runs only"):
        Trainer(_continue_config(folder / "run", folder / "qat")).run()
    values = config.to_dict()
    values["model"]["quantization_aware"] = True
    values["output_dir"] = str(folder / "rnn_qat")
    with pytest.raises(ConfigError, match="attention_rnn_tiny is an attention RNN: "
                                          "quantization-aware training"):
        Trainer(TrainingConfig.from_dict(values)).run()


def test_the_latency_benchmark_times_every_route_in_turns(exported, tmp_path, capsys):
    """`benchmarks/translation_latency.py`: every .tflite file and ONNX pair of the export
    translates the sources, in the same words as the fp32 file for the fp32 routes, with
    the ratios to the ONNX fp32 pair (1.00 for itself)."""
    _, export, dev_pairs = exported
    sources = tmp_path / "sources.txt"
    sources.write_text("".join(s + "\n" for s, _ in dev_pairs[:4]), encoding="utf-8")
    out = tmp_path / "latency.md"
    module = scripts.load_script("benchmarks/translation_latency.py")
    assert module.main([str(export), "--sources", str(sources), "--sentences", "4",
                        "--chunk", "2", "--out", str(out)]) == 0
    rows = {line.split("|")[1].strip(" `"): line.split("|")
            for line in out.read_text().splitlines() if line.startswith("| `")}
    assert sorted(rows) == sorted([f"translation_{v}.tflite" for v in VARIANTS]
                                  + ["translation_encoder.onnx",
                                     "translation_encoder_dynamic_int8.onnx"])
    assert rows["translation_encoder.onnx"][5].strip() == "1.00"
    assert rows["translation_encoder.onnx"][6].strip() == "100.0 %"
    assert "4 sentences" in out.read_text() and "3 beams" in out.read_text()


def _continue_config(run, output_dir, quantization_aware=True, dev=True, **train_settings):
    """`run` (the toy run, or a run continuing it) continued for an epoch."""
    folder = run.parent
    return TrainingConfig.from_dict({
        "task": "seq2seq", "output_dir": str(output_dir),
        "data": {"train": {"source": str(folder / "train.en"),
                           "target": str(folder / "train.de")},
                 "dev": {"source": str(folder / "dev.en"), "target": str(folder / "dev.de")}
                 if dev else None, "max_length": 16, "target_max_length": 16},
        "model": {"checkpoint": str(run), "quantization_aware": quantization_aware},
        "train": {"epochs": 1, "global_batch_size": 16, "learning_rate": 1e-3,
                  "weight_decay": 0.0, "log_every_steps": 1000, "label_smoothing": 0.1,
                  "checkpoint_every_steps": 10000, "eval_num_beams": 3, **train_settings},
    }, source="test_translation_exporter")


@pytest.fixture(scope="module")
def qat_exported(exported):
    """`(QAT run, its export, report)`: the toy run continued quantization-aware for an
    epoch, the QAT run itself exported (its float run is the source)."""
    run, _, _ = exported
    qat = run.parent / "qat"
    Trainer(_continue_config(run, qat)).run()
    export = run.parent / "qat_export"
    assert cli.main(["export", str(qat), "--output-dir", str(export)]) == 0
    return qat, export, json.loads((export / "export_report.json").read_text())


def _teacher_forcing(run, dev_pairs):
    """The model inputs of the dev pairs as the task feeds them (`[SEP]` ends both sides)."""
    translator = Translator.from_run(run)
    sources = translator.source_ids([s for s, _ in dev_pairs])
    targets = translator.source_ids([t for _, t in dev_pairs])
    x, _ = make_teacher_forcing_batch(pad_stack(sources, 16, 0), pad_stack(targets, 16, 0),
                                      bos_token_id=1)
    return {k: keras.ops.convert_to_numpy(v).astype("int32") for k, v in x.items()}


def _stepped_logits(runtime, x):
    """`(B, T, V)` logits of a translation runtime fed the decoder tokens one by one."""
    cache = runtime.initial_decoding_cache(x["encoder_token_ids"], x["encoder_padding_mask"],
                                           17)
    logits = []
    for index in range(x["decoder_token_ids"].shape[1]):
        step, cache = runtime.next_token_logits(x["decoder_token_ids"][:, index:index + 1],
                                                cache, index)
        logits.append(keras.ops.convert_to_numpy(step))
    return np.stack(logits, axis=1)


def _in_logit_steps(logits, expected, qat_model, x):
    """`|logits - expected|` in steps of the QAT model's logit quantizer, on real tokens."""
    quantizer = qat_model.get_layer("token_embedding_output_quantizer_2")  # the logits'
    step = float(keras.ops.convert_to_numpy(quantizer.max_value - quantizer.min_value)) / 255
    return (np.abs(logits - expected) / step)[x["decoder_padding_mask"] > 0]


def test_a_quantization_aware_run_decodes_and_exports_its_own_weights(exported,
                                                                      qat_exported):
    """The QAT copy trained on (its metrics decoded through `QATTranslation`); its graphs
    and the int8 file compute the saved QAT model's teacher-forced logits token by token
    within a few int8 logit steps (the cache inputs and decoder positions are rounded once
    more); the report has its BLEU."""
    run, _, dev_pairs = exported
    qat, export, report = qat_exported
    assert (report["source_run"], report["qat_run"]) == (str(run), str(qat))
    qat_model = keras.saving.load_model(qat / "model.keras")  # as the trainer saved it
    x = _teacher_forcing(run, dev_pairs)
    expected = keras.ops.convert_to_numpy(qat_model(x))  # (B, T, V)
    translator = Translator.from_run(run)
    runtime = QATTranslation(qat_model, translator.model, translator.source_ids(
        [s for s, _ in dev_pairs]), translator.pieces.tokenizer, 17)
    assert runtime.calibrated_only == ["self_attention_cache_input_quantizer",
                                       "cross_attention_cache_input_quantizer"]
    # Measured: mean 0.45 and 0.51 steps, 99 % within 2 and 3, at most 9 (a rounding
    # that lands one int8 step over, carried on). Without the QAT weights (the graphs as
    # calibrated): mean 2.6, 99 % within 14; without STEP_QUANTIZER_NAMES: mean 7.
    for graphs in (runtime, TranslationFile(export / "translation_int8.tflite")):
        steps = _in_logit_steps(_stepped_logits(graphs, x), expected, qat_model, x)
        assert steps.mean() <= 0.75 and np.percentile(steps, 99) <= 4 and steps.max() <= 12, \
            (type(graphs).__name__, steps.mean(), np.percentile(steps, 99), steps.max())
    rows = {row["artifact"]: row for row in report["artifacts"]}
    metrics = json.loads((qat / "metrics.json").read_text())
    assert rows["keras_qat"]["bleu"] == pytest.approx(metrics["best_dev"]["bleu"], abs=3)
    assert rows["keras_qat"]["bleu"] > 60 and rows["int8"]["bleu"] > 60
    assert "| Keras QAT model |" in (export / "export_report.md").read_text()


def test_what_quantization_aware_translation_refuses(exported, qat_exported, tmp_path,
                                                     capsys):
    """A QAT run continues only quantization-aware (and trains on); `--qat-run` takes a
    QAT seq2seq run only; `predict` sends a QAT run to its export."""
    run, _, _ = exported
    qat, _, _ = qat_exported
    with pytest.raises(ConfigError, match="is a quantization-aware run: set "
                                          "model.quantization_aware: true"):
        Trainer(_continue_config(qat, tmp_path / "float", quantization_aware=False)).run()
    # The saved QAT copy trains on (one embedding table, as tied as the float model's).
    Trainer(_continue_config(qat, tmp_path / "again", dev=False, max_steps=2)).run()
    before, after = (keras.saving.load_model(path / "model.keras")
                     for path in (qat, tmp_path / "again"))
    assert [w.path for w in after.get_layer("token_embedding").weights] == [
        "token_embedding/embeddings"]
    assert not np.array_equal(*(keras.ops.convert_to_numpy(model.get_layer(
        "token_embedding").embeddings) for model in (before, after)))
    assert cli.main(["export", str(run), "--qat-run", str(run),
                     "--output-dir", str(tmp_path / "export")]) == 2
    assert "is not a quantization-aware seq2seq run" in capsys.readouterr().err
    assert cli.main(["predict", str(qat), "one two three four."]) == 2
    assert "a quantization-aware run; its model.keras is the QAT copy" in \
        capsys.readouterr().err
