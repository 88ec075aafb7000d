"""`keras-attn export` end to end on tiny trained runs: every artifact is written, agrees
with the Keras float model within the stated tolerances, and the side files are what the
app and serving read. One export per task (module fixtures); the checks read its report."""

import json
import os
import pathlib
import shutil

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from ai_edge_litert.interpreter import OpResolverType

from keras_attn.export.artifact_scoring import interleaved_latency
from keras_attn.export.export_report import report_markdown
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.quantization.quantize_model import model_quantization_ops
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.export_options import ExportError
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.stages.quantize_stage import quantize_run
from keras_attn.stages.run_exporter import RunExporter
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from keras_attn.text.labelled_examples import id_inputs
from keras_attn.text.labelled_examples import score_sentences
from keras_attn.text.ner import repair_iob2
from tests.test_tflite_export import FLOAT_RESIDUAL_OPS
from tests.test_trainer import config_dict
from tests.test_trainer import write_data
from tests.tolerances import float32_path_atol
from tests.tolerances import kernel_gain

pytestmark = pytest.mark.tensorflow

FLOAT_TOLERANCE = 1e-4  # fp32 TFLite / ONNX / SavedModel vs Keras, max |Δlogit|
ARTIFACT_FILES = ("model_fp32.tflite", "model_fp16.tflite", "model_dynamic_int8.tflite",
                  "model_int8.tflite", "model_int8_ptq.tflite", "model_text.tflite",
                  "model.onnx", "model_dynamic_int8.onnx", "model_int8.onnx",
                  "model_int8_ptq.onnx", "saved_model/saved_model.pb",
                  "vocab.txt", "labels.txt", "model_card.json", "golden_vectors.jsonl",
                  "export_report.json", "export_report.md", "qat/model.keras")
TAGS = {"paris": "B-LOC", "rome": "B-LOC", "new": "B-LOC", "york": "I-LOC",
        "anna": "B-PER", "marco": "B-PER", "smith": "I-PER"}
FILLER = ["the", "film", "was", "in", "a", "story", "good", "bad", "plot", "very"]


def options(**overrides):
    # The classification fixture exercises QAT fine-tuning of an all-int8 model; the NER one
    # the default recipe (a CRF-free tagger: calibrated, float residual).
    values = dict(quantization=QuantizationRecipe.all_int8(qat_epochs=1), latency_runs=3,
                  latency_threads=(1,), golden_examples=8)
    values.update(overrides)
    return ExportOptions(**values)


def train_run(directory, values):
    Trainer(TrainingConfig.from_dict(values)).run()
    return directory


@pytest.fixture(scope="module")
def classification(tmp_path_factory):
    root = tmp_path_factory.mktemp("classification")
    data = write_data(root / "data")
    values = config_dict(data, root / "run", epochs=16, learning_rate=1e-2)  # see test_trainer
    values["data"]["test"] = str(data / "dev.tsv")
    run = train_run(root / "run", values)
    logs = []
    report = export_run(run, root / "export", options(), log=logs.append)
    return run, root / "export", report, logs


def write_conll(path, n, seed):
    rng = np.random.default_rng(seed)
    entities = [["paris"], ["rome"], ["new", "york"], ["anna"], ["marco", "smith"]]
    lines = []
    for _ in range(n):
        words = list(rng.choice(FILLER, size=rng.integers(2, 6)))
        words[int(rng.integers(0, len(words))):0] = entities[int(rng.integers(0, 5))]
        lines += [f"{w} {TAGS.get(w, 'O')}" for w in words] + [""]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def ner_values(root, use_crf=False):
    """The config of a toy tagger of LOC and PER entities, its data written to `root`."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILLER, *TAGS, "##s"]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    values = config_dict(root, root / "run", epochs=10, learning_rate=1e-2)
    values.update(task="ner")
    values["data"] = {"train": write_conll(root / "train.txt", 96, 0),
                      "dev": write_conll(root / "dev.txt", 24, 1),
                      "test": write_conll(root / "test.txt", 24, 2), "max_length": 16}
    values["model"].update(vocabulary=str(root / "vocab.txt"), use_crf=use_crf)
    return values


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
    root = tmp_path_factory.mktemp("ner")
    run = train_run(root / "run", ner_values(root))
    # Length buckets 8, 12 and 16 (the default smallest bucket, 16, is this run's max length).
    report = export_run(run, root / "export", options(quantization=QuantizationRecipe(),
                                                      smallest_bucket=8))
    return run, root / "export", report


def rows(report):
    return {row["artifact"]: row for row in report["artifacts"]}


@pytest.mark.parametrize("fixture", ["classification", "ner"])
def test_every_artifact_is_written(request, fixture):
    export_dir = request.getfixturevalue(fixture)[1]
    for name in ARTIFACT_FILES:
        assert (export_dir / name).is_file(), name


@pytest.mark.parametrize("fixture", ["classification", "ner"])
def test_float_artifacts_equal_keras(request, fixture):
    report = request.getfixturevalue(fixture)[2]
    table = rows(report)
    reference = table["model.keras (float, Keras)"]["metric"]
    for name in ("model_fp32.tflite", "model.onnx", "saved_model/ (predict_ids)"):
        assert table[name]["max_abs_logit_diff"] <= FLOAT_TOLERANCE, name
        assert table[name]["agreement"] == 1.0, name
        assert table[name]["metric"] == reference, name


@pytest.mark.parametrize("fixture", ["classification", "ner"])
def test_quantized_artifacts_keep_the_task_metric_and_stay_integer(request, fixture):
    report = request.getfixturevalue(fixture)[2]
    table = rows(report)
    reference = table["model.keras (float, Keras)"]["metric"]
    assert reference >= 0.9  # the tiny runs learned their toy tasks
    for name in ("model_fp16.tflite", "model_dynamic_int8.tflite", "model_int8.tflite",
                 "model_int8_ptq.tflite", "model_dynamic_int8.onnx"):
        assert table[name]["metric"] >= reference - 0.1, name
        assert table[name]["agreement"] >= 0.9, name
    # All-int8 (the classification fixture): only the boundary ops see float (ids in,
    # dequantized logits out). The default recipe (ner): also the residual stream, LayerNorm,
    # the float feed-forward channels (their FULLY_CONNECTED and GELU) and the ops XNNPACK has
    # no int8 kernel for (attention products, softmax, GELU); every weight matmul of the int8
    # channels stays int8.
    int8 = table["model_int8.tflite"]
    allowed = {"DEQUANTIZE", "QUANTIZE"} if fixture == "classification" else \
        FLOAT_RESIDUAL_OPS | {"FULLY_CONNECTED", "GELU"}
    assert set(int8["non_int8_ops"]) <= allowed, int8["non_int8_ops"]
    assert not any(op.startswith("Flex") for op in int8["ops"])
    for row in report["artifacts"]:
        for latency in row.get("latency", []):
            assert 0 < latency["p50_ms"] <= latency["p90_ms"]


def test_report_markdown_lists_every_artifact(classification):
    _, export_dir, report, _ = classification
    markdown = (export_dir / "export_report.md").read_text()
    for row in report["artifacts"]:
        assert f"`{row['artifact']}`" in markdown
    assert "## Ops of `model_int8.tflite` that are not int8" in markdown
    # One sensitivity row for the recipe, then one per int8 op (embeddings, each block's
    # matmuls, head), with its picture.
    sensitivity = report["quantization_sensitivity"]
    assert sensitivity[0]["op"] == "all" and len(sensitivity) >= 4
    assert {"embeddings", "transformer_layer_0/qkv", "logits"} <= {r["op"] for r in sensitivity}
    assert (export_dir / "quantization_sensitivity.png").stat().st_size > 1000
    assert [r["snr_db"] for r in sensitivity[1:]] == sorted(r["snr_db"] for r in sensitivity[1:])
    assert "## Quantization sensitivity" in markdown and "| `embeddings` only |" in markdown
    assert report["quantization"] == QuantizationRecipe.all_int8(qat_epochs=1).to_dict()
    assert "QAT model (`model_int8.tflite`): 1 epoch(s) of quantization-aware fine-tuning, " \
           "learning rate: the run's / 10; every activation int8 (--all-int8)." in markdown
    default = dict(report, quantization=QuantizationRecipe().to_dict())
    assert "QAT model (`model_int8.tflite`): ranges calibrated on up to 512 training examples " \
           "drawn at random, no fine-tuning; residual sums and LayerNorm internals float; " \
           "the 4 widest feed-forward channels of each block float; the most sensitive ops " \
           "float until at most 0.5 points (or one example, if more) are lost on held-out " \
           "examples." \
           in report_markdown(default)
    # A report written before the recipe was recorded describes its options the same way.
    legacy = dict(report, quantization=None, options={
        "qat_epochs": 0, "float_residual": True, "feedforward_float_channels": 4,
        "qat_learning_rate": None, "qat_max_steps": None, "sequence_length": None})
    assert "no fine-tuning; residual sums and LayerNorm internals float; the 4 widest" in \
           report_markdown(legacy)
    assert json.loads((export_dir / "export_report.json").read_text()) == report


def test_the_report_holds_the_calibrated_model_against_its_file(ner):
    """`twin_agreement`: the QAT Keras model (ranges frozen) against `model_int8.tflite` on
    XNNPACK and on LiteRT's builtin kernels, and the file's two kernel sets against each
    other, per real token; recomputed here from the two models directly."""
    run, export_dir, report = ner
    section = report["twin_agreement"]
    qat = RunDirectory(export_dir / "qat").load_model()
    freeze_model_ranges(qat)
    step = float(qat.get_layer("logits").output_quantizer.step())
    assert section["logit_step"] == pytest.approx(step, rel=1e-6)
    examples = RunDirectory(run).examples(report["eval_split"], report["sequence_length"])
    runner = Interpreter(model_path=str(export_dir / "model_int8.tflite")).get_signature_runner()
    twin, out = [], []
    for example in examples:
        x = id_inputs([example], report["sequence_length"])
        n = len(example["token_ids"])
        twin.append(keras.ops.convert_to_numpy(qat(x))[0, :n])
        (logits,) = runner(**{k: v.astype("int32") for k, v in x.items()}).values()
        out.append(logits[0, :n])
    twin, out = np.concatenate(twin), np.concatenate(out)
    row = section["twin_vs_file"]
    assert row["outputs"] == len(twin) == sum(len(e["token_ids"]) for e in examples)
    assert row["disagreements"] == int(np.sum(twin.argmax(-1) != out.argmax(-1)))
    steps = np.abs(twin - out).max(-1) / step
    assert row["steps_max"] == pytest.approx(steps.max(), abs=1e-3)
    assert row["steps_median"] == pytest.approx(np.median(steps), abs=1e-3)
    # The tiny tagger: every token agrees, within a few steps (the runtime's roundings).
    for key in ("twin_vs_file", "twin_vs_builtin_kernels", "builtin_kernels_vs_file"):
        assert section[key]["agreement"] == 1.0 and section[key]["steps_max"] <= 6.01, key
    markdown = (export_dir / "export_report.md").read_text()
    assert "## The calibrated model vs its file" in markdown
    assert f"| file: builtin kernels vs XNNPACK | 1.0000 | 0 of {len(twin):,} |" in markdown


def _file_f1(path, examples, labels, length, builtin_kernels=False):
    """Strict entity F1 (points) of a tagger's `.tflite` file on `examples`, run one
    example at a time on a plain LiteRT interpreter (XNNPACK, or the builtin kernels)."""
    resolver = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels
                else OpResolverType.AUTO)
    runner = Interpreter(model_path=str(path),
                         experimental_op_resolver_type=resolver).get_signature_runner()
    outputs = []
    for example in examples:
        x = id_inputs([example], length)
        (logits,) = runner(**{k: v.astype("int32") for k, v in x.items()}).values()
        outputs.append(logits[0, :len(example["token_ids"])])
    return 100 * score_sentences(examples, outputs, labels)["f1"]


def test_the_int8_budget_verdict_is_the_shipped_files(ner):
    """`quantization_budget.file`: `model_int8.tflite` scored on the budget's held-out split
    (dev, not the test split the report evaluates a tagger on) on XNNPACK, its calibrated
    model beside it and the builtin kernels third; recomputed here from the file and the
    QAT run directly. The page states the file's verdict first."""
    run, export_dir, report = ner
    budget = report["quantization_budget"]
    record, length = budget["file"], report["sequence_length"]
    source = RunDirectory(run)
    dev, labels = source.examples("dev", length), source.labels()
    assert record["split"] == "dev" != report["eval_split"]
    assert record["examples"] == len(dev) == 24
    last = record["steps"][-1]
    assert last["file_metric"] == pytest.approx(
        _file_f1(export_dir / "model_int8.tflite", dev, labels, length), abs=1e-3)
    assert record["builtin_kernels_metric"] == pytest.approx(
        _file_f1(export_dir / "model_int8.tflite", dev, labels, length, True), abs=1e-3)
    assert last["file_drop"] == pytest.approx(budget["float_metric"] - last["file_metric"],
                                              abs=1e-3)
    # The tiny tagger's file is within the default budget: nothing moved, the twin as chosen.
    assert record["moved"] == [] and record["within_budget"]
    assert last["twin_metric"] == budget["steps"][-1]["metric"]
    assert RunDirectory(export_dir / "qat").metrics()["float_ops"] == budget["float_ops"]
    page = (export_dir / "export_report.md").read_text()
    first, twin, builtin, search = (page.index(text) for text in (
        "| `model_int8.tflite`, LiteRT + XNNPACK (ships) |", "| calibrated Keras model |",
        "| `model_int8.tflite`, LiteRT builtin kernels |", "The calibrated model's search"))
    assert first < twin < builtin < search


@pytest.mark.slow
def test_a_file_that_misses_the_budget_moves_an_op_and_is_converted_again(
        ner, tmp_path, monkeypatch):
    """A budget no file meets (-1 points), one move allowed: the export moves the most
    sensitive op to float, converts model_int8.tflite again, writes the model back to the
    QAT run, converts the other int8 files from it, and (dev evaluated) reports the file's
    scores of the check. A re-run keeps the move and converts nothing."""
    from keras_attn.export.file_budget import file_budget
    from keras_attn.stages import int8_file_budget

    run, export_dir = tmp_path / "run", tmp_path / "export"
    shutil.copytree(ner[0], run)
    shutil.copytree(ner[1], export_dir)
    shipped_before = (export_dir / "model_int8.tflite").stat().st_size
    metrics = json.loads((export_dir / "qat" / "metrics.json").read_text())
    metrics["quantization_budget"]["max_accuracy_drop"] = -1
    (export_dir / "qat" / "metrics.json").write_text(json.dumps(metrics))
    monkeypatch.setattr(int8_file_budget, "file_budget",
                        lambda *args, **kwargs: file_budget(*args, **kwargs, max_moves=1))
    logs = []
    exporter = RunExporter(run, export_dir, options(
        quantization=QuantizationRecipe(), smallest_bucket=8, eval_split="dev",
        latency_runs=1, golden_examples=0), log=logs.append)
    report = exporter.run()
    record = report["quantization_budget"]["file"]
    moved = report["quantization_sensitivity"][1]["op"]
    assert record["moved"] == [moved] and not record["within_budget"]
    assert len(record["steps"]) == 2 and record["steps"][1]["float_ops"][-1] == moved
    # Each step's file measured as the budget scored it (the first: the earlier export's
    # file, its metadata inside; the second converted again, the metadata added after).
    shipped = (export_dir / "model_int8.tflite").stat().st_size
    assert record["steps"][0]["size_bytes"] == shipped_before
    assert 0 < record["steps"][1]["size_bytes"] < shipped
    assert all(step["p50_ms"] > 0 for step in record["steps"])
    qat = RunDirectory(export_dir / "qat")
    assert moved in qat.metrics()["float_ops"]
    assert moved in model_quantization_ops(qat.load_model())
    assert qat.metrics()["quantization_budget"]["file"]["moved"] == [moved]
    # The int8 files were converted again (the moved op's weights now float32: 3 bytes
    # more each), the float ones reused; no trial left behind.
    conversions = [line for line in logs if line.startswith("TFLite ")]
    assert conversions == ["TFLite int8 from the int8 model (batch 1, lengths [16])",
                           "TFLite int8 from the int8 model (batch 1, lengths [8, 12, 16])"], \
        conversions
    table, old = rows(report), rows(ner[2])
    grown = table["model_int8.tflite"]["size_bytes"] - old["model_int8.tflite"]["size_bytes"]
    assert record["size_cost_bytes"] > 0
    assert abs(grown - record["size_cost_bytes"]) <= 0.1 * record["size_cost_bytes"] + 4096
    assert not list(export_dir.glob(".tmp-*"))
    # The evaluation reused the check's scores: dev is both; the file row says the same.
    assert 100 * table["model_int8.tflite"]["metric"] == pytest.approx(
        record["steps"][-1]["file_metric"], abs=1e-3)
    dev = RunDirectory(run).examples("dev", report["sequence_length"])
    assert record["steps"][-1]["file_metric"] == pytest.approx(_file_f1(
        export_dir / "model_int8.tflite", dev, RunDirectory(run).labels(),
        report["sequence_length"]), abs=1e-3)
    # A re-run starts from the QAT run written back: the move is kept, nothing converted.
    shipped = (export_dir / "model_int8.tflite").stat().st_mtime_ns
    again = RunExporter(run, export_dir, exporter.options)
    again._load()
    plan = again._plan(again._int8_model())
    _, budget, _ = int8_file_budget.file_within_budget(
        again, plan, lambda: pytest.fail("the one move allowed was made"))
    assert budget["file"]["moved"] == [moved]
    assert len(budget["file"]["steps"]) == 2
    assert (export_dir / "model_int8.tflite").stat().st_mtime_ns == shipped


def test_model_card_describes_inputs_tokenizer_and_labels(classification, ner):
    for run, export_dir, *_ in (classification, ner):
        card = json.loads((export_dir / "model_card.json").read_text())
        assert card["labels"] == (run / "labels.txt").read_text().split()
        assert card["sequence_length"] == 16
        assert [i["shape"] for i in card["inputs"]] == [[1, 16]] * 3
        vocab = (export_dir / "vocab.txt").read_text().splitlines()
        assert card["tokenizer"]["vocabulary_size"] == len(vocab)
        assert vocab[card["tokenizer"]["cls_token_id"]] == "[CLS]"
        assert card["metrics"]["model_int8.tflite"] is not None
        # How model_int8*.tflite were quantized, for apps that show it (the web page).
        report = json.loads((export_dir / "export_report.json").read_text())
        assert card["quantization"]["recipe"] == report["quantization"]
        assert card["quantization"]["description"] == QuantizationRecipe.from_dict(
            report["quantization"]).describe()


def test_golden_vectors_reproduce_the_keras_model(classification):
    run, export_dir, *_ = classification
    from keras_attn.text.hard_cases import HARD_CASES

    records = [json.loads(line) for line in
               (export_dir / "golden_vectors.jsonl").read_text().splitlines()]
    assert len(records) == len(HARD_CASES) + 8
    model = keras.models.load_model(run / "model.keras")
    labels = (run / "labels.txt").read_text().split()
    # The vectors keep 5 decimals (5e-6) of logits computed by the export's graph, not this
    # eager call (tests/tolerances.py): the run's one block of 6 reductions plus the embedding
    # norm and the pooler, sums of up to 32 terms, magnified by the output kernel.
    atol = 5e-6 + float32_path_atol(1.0, reduction=32, depth=6 + 2,
                                    gain=kernel_gain(model.get_layer("logits").kernel.numpy()))
    for record in records[-8:]:
        ids = np.array(record["token_ids"])[None]
        logits = keras.ops.convert_to_numpy(model(
            {"token_ids": ids, "segment_ids": np.zeros_like(ids),
             "padding_mask": np.ones_like(ids)}))[0]
        np.testing.assert_allclose(record["logits"], logits, atol=atol)
        assert record["label"] == labels[int(np.argmax(logits))]
        assert abs(sum(record["probabilities"]) - 1) < 1e-5
        # Offsets point into the text at the pieces' sources.
        for start, end in zip(record["piece_starts"], record["piece_ends"]):
            assert 0 <= start <= end <= len(record["text"])


def test_ner_golden_vectors_decode_to_their_entities(ner):
    _, export_dir, _ = ner
    records = [json.loads(line) for line in
               (export_dir / "golden_vectors.jsonl").read_text().splitlines()]
    with_entities = [r for r in records if r["entities"]]
    assert len(with_entities) >= 8  # the data sentences all hold an entity
    labels = (export_dir / "labels.txt").read_text().split()
    for record in with_entities:
        # First-piece argmax of the stored logits, IOB2-repaired, gives the stored word tags.
        logits, word_ids = np.array(record["logits"]), record["word_ids"]
        first = {}
        for position, word in enumerate(word_ids):
            if word >= 0 and word not in first:
                first[word] = labels[int(np.argmax(logits[position]))]
        tags, _ = repair_iob2([first.get(i, "O") for i in range(len(record["words"]))])
        assert tags == record["word_tags"]
        for entity in record["entities"]:
            assert record["text"][entity["start_char"]:entity["end_char"]] == entity["text"]


def test_running_again_reuses_the_artifacts(classification):
    run, export_dir, _, _ = classification
    before = {name: os.path.getmtime(export_dir / name) for name in ARTIFACT_FILES
              if name.endswith((".tflite", ".onnx"))}
    logs = []
    export_run(run, export_dir, options(), log=logs.append)
    after = {name: os.path.getmtime(export_dir / name) for name in before}
    assert before == after
    assert not any(line.startswith(("TFLite", "ONNX", "quantization-aware")) for line in logs)


def test_missing_run_files_and_bad_options_are_clear_errors(tmp_path, classification):
    with pytest.raises(ExportError, match=r"model\.keras is missing \(exporting a run\): a "
                                          r"run directory gets it from `a finished keras-attn "
                                          r"train CONFIG"):
        export_run(tmp_path, tmp_path / "export")
    run = classification[0]
    with pytest.raises(ExportError, match="sequence_length=64 exceeds the "
                                          "max_sequence_length=16 of the model"):
        export_run(run, tmp_path / "export", options(sequence_length=64))
    with pytest.raises(ValueError, match="`eval_split` must be 'auto', 'dev' or 'test'"):
        options(eval_split="train").check()
    with pytest.raises(ValueError, match="`latency_threads` must be a positive integer"):
        options(latency_threads=(0,)).check()
    with pytest.raises(ValueError, match="`quantization` must be a QuantizationRecipe"):
        options(quantization={"float_residual": True}).check()
    with pytest.raises(ValueError, match="`float_residual` must be a bool"):
        QuantizationRecipe(float_residual="yes")
    with pytest.raises(ValueError, match="`feedforward_float_channels` needs "
                                         "`float_residual=True`"):
        QuantizationRecipe(float_residual=False, feedforward_float_channels=4)
    with pytest.raises(ValueError, match="`feedforward_float_channels` must be an integer >= 0"):
        QuantizationRecipe(feedforward_float_channels=-1)
    # The finished qat/ of an all-int8 export is not silently reused for another recipe.
    with pytest.raises(ExportError, match=r"qat holds a QAT run made with another recipe"):
        export_run(run, classification[1], options(quantization=QuantizationRecipe()))


def test_cli_exports_and_reports_errors(tmp_path, classification, capsys):
    from keras_attn.cli import main

    assert main(["export", str(tmp_path / "nothing")]) == 2
    assert "keras-attn export: error:" in capsys.readouterr().err
    run, export_dir, _, _ = classification
    code = main(["export", str(run), "--output-dir", str(export_dir), "--latency-runs", "2",
                 "--latency-threads", "1", "--golden-examples", "8", "--all-int8",
                 "--qat-epochs", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "model_int8.tflite" in out and str(pathlib.Path(export_dir) / "export_report.md") in out


def test_export_results_script_checks_the_targets(classification, tmp_path, monkeypatch):
    from tests.scripts import load_script

    module = load_script("export/run_export_results.py")
    report = classification[2]
    checks = {label: (met, measured) for label, met, measured in
              module.target_checks(report, 0.005, "int8 (calibrated)")}
    assert len(checks) == 8
    assert "int8 (calibrated) >= int8 (PTQ)" in checks
    assert checks["model_fp32.tflite: max |Δlogit| <= 1e-4, agreement >= 99.9 %"][0]
    table = rows(report)
    ratio = table["model_int8.tflite"]["size_bytes"] / table["model_fp32.tflite"]["size_bytes"]
    assert checks["int8 size <= 27 % of fp32"] == (ratio <= 0.27, f"{100 * ratio:.1f} %")
    int8, dynamic = (next(lat["p50_ms"] for lat in table[name]["latency"]
                          if lat["num_threads"] == 1)
                     for name in ("model_int8.tflite", "model_dynamic_int8.tflite"))
    assert checks["int8 latency <= dynamic int8 (1 thread)"] == (
        int8 <= dynamic, f"{int8 / dynamic:.2f}x")

    # The QAT flags reach `keras-attn export`, the page says which were used, and only the
    # exported run's section changes: the notes and the other run's section stay.
    calls = []
    monkeypatch.setattr(module, "export", lambda *args: calls.append(args) or report)
    page = tmp_path / "export_results.md"
    kept = ("# Export results\n\nHand-written status.\n\n<!-- results:export:sst2_minilm:begin -->"
            "\nOLD SECTION\n<!-- results:export:sst2_minilm:end -->\n\nA note.\n\n"
            "<!-- results:export:conll2003_minilm:begin -->\nCoNLL table\n"
            "<!-- results:export:conll2003_minilm:end -->\n")
    page.write_text(kept)
    module.main(["--only", "sst2_minilm", "--all-int8", "--qat-epochs", "1",
                 "--runs-dir", "r", "--artifacts-dir", "a", "--results", str(page),
                 "--export-flags", "--latency-runs 2"])
    assert calls == [("sst2_minilm", "r", "a",
                      ["--all-int8", "--qat-epochs", "1", "--latency-runs", "2"])]
    text = page.read_text()
    assert "with `--all-int8 --qat-epochs 1 --latency-runs 2`; int8 recipe: 1 epoch(s) of " \
           "quantization-aware" in text
    assert "| int8 (QAT) >= int8 (PTQ) |" in text and "OLD SECTION" not in text
    before, after = kept.split("OLD SECTION")
    assert text.startswith(before.rsplit("\n", 1)[0]) and text.endswith(after.split("\n", 1)[1])
    module.main(["--only", "sst2_minilm", "--runs-dir", "r", "--artifacts-dir", "a",
                 "--results", str(page)])
    assert calls[-1] == ("sst2_minilm", "r", "a", [])
    assert "; int8 recipe: ranges calibrated on up to 512 training examples" in page.read_text()
    assert "| int8 (calibrated) >= int8 (PTQ) |" in page.read_text()
    assert "| int8 size <= 27 % of fp32 |" in text


def test_tflite_files_are_self_describing_and_run_in_mediapipe(classification, ner, tmp_path):
    """Issue 23: metadata in every token-id .tflite file, MediaPipe files for a classifier."""
    pytest.importorskip("mediapipe", reason="needs the mediapipe extra")
    import shutil

    from keras_attn.export.tflite.tflite_metadata import settings_from_tflite
    from keras_attn.stages.inference.predictor import load_predictor
    from keras_attn.text.hard_cases import HARD_CASES

    _, export_dir, report, _ = classification
    section = report["self_describing_tflite"]
    assert section["error"] is None
    assert section["metadata"] == ["model_dynamic_int8.tflite", "model_fp16.tflite",
                                   "model_fp32.tflite", "model_int8.tflite",
                                   "model_int8_ptq.tflite", "model_text.tflite",
                                   "model.onnx", "model_dynamic_int8.onnx",
                                   "model_int8.onnx", "model_int8_ptq.onnx"]
    fp32 = section["mediapipe"]["model_fp32_mediapipe.tflite"]
    int8 = section["mediapipe"]["model_int8_mediapipe.tflite"]
    assert fp32["label_agreement"] == 1.0 and fp32["max_abs_probability_diff_same_tokens"] < 1e-5
    assert int8["label_agreement"] >= 0.9
    # Texts tokenized differently: non-ASCII, or ASCII with control characters.
    controls = sum(t.isascii() and any(ord(c) < 32 and c not in "\t\n\r" or ord(c) == 127
                                       for c in t) for t in HARD_CASES)
    assert 0 < fp32["tokenized_differently_non_ascii"] <= fp32["tokenized_differently"] \
        <= fp32["tokenized_differently_non_ascii"] + controls
    assert "## Self-describing TFLite files and MediaPipe" in (
        export_dir / "export_report.md").read_text()
    card = json.loads((ner[1] / "model_card.json").read_text())
    assert settings_from_tflite(ner[1] / "model_int8_ptq.tflite").card == card
    assert ner[2]["self_describing_tflite"]["mediapipe"] is None
    # `keras-attn predict` from the .tflite file alone gives what it gives with side files.
    shutil.copyfile(export_dir / "model_int8.tflite", tmp_path / "model_int8.tflite")
    texts = ["a good film", "bad plot", "Café"]
    assert load_predictor(tmp_path / "model_int8.tflite").predict(texts) == \
        load_predictor(export_dir / "model_int8.tflite").predict(texts)


def test_length_buckets_give_the_fixed_files_results(ner, classification):
    """`model_<variant>_buckets.tflite` (lengths 8, 12 and 16): scored picking the shortest
    bucket, same results as the fixed files (fp32 logits within 1e-5 of them), timed against
    them over the evaluation examples; `keras-attn predict` picks buckets too."""
    _, export_dir, report = ner
    table = rows(report)
    for variant in ("fp32", "dynamic_int8", "int8"):
        fixed, bucketed = table[f"model_{variant}.tflite"], table[f"model_{variant}_buckets.tflite"]
        assert bucketed["metric"] == fixed["metric"], variant
        assert abs(bucketed["agreement"] - fixed["agreement"]) <= 0.02, variant
        assert bucketed["ops"] == fixed["ops"], variant
        # In this tiny model each extra subgraph's op tables weigh as much as the weights.
        assert fixed["size_bytes"] < bucketed["size_bytes"] < 3 * fixed["size_bytes"], variant
    assert abs(table["model_fp32_buckets.tflite"]["max_abs_logit_diff"]
               - table["model_fp32.tflite"]["max_abs_logit_diff"]) <= 1e-5
    section = report["length_buckets"]
    assert section["lengths"] == [8, 12, 16] and set(section["latency"]) == {
        "fp32", "dynamic_int8", "int8"}
    assert sum(section["bucket_counts"].values()) == section["examples"] == 24
    for latency in section["latency"].values():
        assert latency["p50_ratio"] > 0 and latency["mean_ratio"] > 0
    markdown = (export_dir / "export_report.md").read_text()
    assert "## Length buckets" in markdown and section["cpu"] in markdown
    texts = ["anna was in paris", "the film was in rome , the film was very good and anna "
             "smith was in paris", ""]
    assert load_predictor(export_dir / "model_int8_buckets.tflite").predict(texts) == \
        load_predictor(export_dir / "model_int8.tflite").predict(texts)
    # The classification fixture's run is 16 long: one bucket, so no bucketed files.
    assert report["length_buckets"] and classification[2]["length_buckets"] is None
    assert not list(classification[1].glob("*_buckets.tflite"))


def test_latency_takes_the_artifacts_in_turns():
    """Each artifact gets `latency_runs` timed runs per thread count after 5 warm-up runs,
    and the artifacts alternate in rounds, so a busy moment lands on all of them."""
    order = []

    def make(name):
        return lambda threads: lambda: order.append((name, threads))

    latency = interleaved_latency({"a": make("a"), "b": make("b")}, (1, 2), 7)
    assert [[lat["num_threads"] for lat in latency[name]] for name in "ab"] == [[1, 2], [1, 2]]
    assert all(lat["p50_ms"] >= 0 for name in "ab" for lat in latency[name])
    for threads, calls in ((1, order[:24]), (2, order[24:])):
        assert calls[:10] == [("a", threads)] * 5 + [("b", threads)] * 5  # warm-up
        # 7 runs in 5 rounds of 2, 2, 1, 1, 1, the two artifacts in turns.
        assert "".join(name for name, _ in calls[10:]) == "aabb" "aabb" "ab" "ab" "ab"
    assert len(order) == 48


def _documented_step():
    """The `OnnxFp16Step` of docs/pipeline.md ("The artifact steps"), run as written."""
    page = (pathlib.Path(__file__).parent.parent / "docs" / "pipeline.md").read_text("utf-8")
    block = page.split("```python\n# keras_attn/export/artifacts/onnx_fp16_artifact.py")[1]
    namespace = {}
    exec(block.split("```")[0], namespace)  # noqa: S102 - our own docs' example
    return namespace["OnnxFp16Step"]()


def test_a_new_artifact_kind_is_one_step_and_one_registry_line(classification, tmp_path,
                                                                 monkeypatch):
    """Registering the documented example step is all it takes: the next export writes its
    file, scores and times it, lists it in the card, and `predict` runs it."""
    import keras_attn.stages.run_exporter as run_exporter
    from keras_attn.runs import ExportDirectory

    run, export_dir = classification[0], tmp_path / "export"
    shutil.copytree(classification[1], export_dir)  # every other artifact is reused
    steps = list(run_exporter.ARTIFACT_STEPS)
    steps.insert([s.name for s in steps].index("onnx") + 1, _documented_step())
    monkeypatch.setattr(run_exporter, "ARTIFACT_STEPS", tuple(steps))
    report = export_run(run, export_dir, options())
    row = rows(report)["model_fp16.onnx"]
    assert row["agreement"] == 1.0 and row["max_abs_logit_diff"] < 1e-2
    assert [lat["num_threads"] for lat in row["latency"]] == [1]
    entries = {e["file"]: e for e in ExportDirectory(export_dir).artifacts()}
    assert entries["model_fp16.onnx"] == {"file": "model_fp16.onnx", "kind": "onnx",
                                          "precision": "fp16", "lengths": []}
    assert entries["model_int8.tflite"] == {"file": "model_int8.tflite", "kind": "tflite",
                                            "precision": "int8", "lengths": [16]}
    assert "saved_model" in entries and "model_text.tflite" in entries
    text = "a very good film"
    assert load_predictor(export_dir / "model_fp16.onnx").predict([text])[0]["label"] == \
        load_predictor(export_dir / "model.onnx").predict([text])[0]["label"]


@pytest.fixture(scope="module")
def crf_ner(tmp_path_factory):
    """A CRF tagger exported at the cheapest settings with the default (calibrated) recipe."""
    root = tmp_path_factory.mktemp("crf_ner")
    run = train_run(root / "run", ner_values(root, use_crf=True))
    report = export_run(run, root / "export", options(
        quantization=QuantizationRecipe(calibration_examples=32), latency_runs=1,
        golden_examples=0, text_tflite=False, length_buckets=False))
    return run, root / "export", report


def test_a_crf_tagger_gets_the_calibrated_int8_model(crf_ner):
    run, export_dir, report = crf_ner
    recipe = QuantizationRecipe(calibration_examples=32).to_dict()
    # The quantize stage wrote a calibrated QAT run with the float run's CRF.
    qat_run = RunDirectory(export_dir / "qat")
    assert qat_run.lineage().quantization == recipe == report["quantization"]
    qat, tagger = qat_run.load_model(), keras.models.load_model(run / "model.keras")
    assert model_layout(qat)["float_residual"] and all(
        float(q.initialized.numpy()) == 1.0 or q.fixed_range is not None
        for q in activation_quantizers(qat))
    np.testing.assert_array_equal(qat.get_layer("crf").transitions.numpy(),
                                  tagger.crf.transitions.numpy())
    # model_int8.tflite holds the QAT model's emissions (the tags are decoded outside).
    interpreter = Interpreter(model_path=str(export_dir / "model_int8.tflite"))
    assert sorted(interpreter.get_signature_list()["serving_default"]["inputs"]) == \
        ["padding_mask", "segment_ids", "token_ids"]
    ids = np.array([[2, 5, 15, 6, 19, 3] + [0] * 10], "int32")
    x = {"token_ids": ids, "segment_ids": 0 * ids, "padding_mask": (ids > 0).astype("int32")}
    (emissions,) = interpreter.get_signature_runner()(**x).values()
    emissions = emissions[0, :6]
    reference = keras.ops.convert_to_numpy(
        qat({**x, "label_mask": x["padding_mask"]})["logits"])[0, :6]
    assert np.abs(emissions - reference).max() < 0.1 * (reference.max() - reference.min())
    table = rows(report)
    float_f1 = table["model.keras (float, Keras)"]["metric"]
    assert float_f1 >= 0.9  # the toy tagger learned its entities
    for name in ("QAT model (Keras, fake int8)", "model_int8.tflite"):
        assert table[name]["metric"] >= float_f1 - 0.1, name
        assert table[name]["agreement"] >= 0.9, name
    assert set(table["model_int8.tflite"]["non_int8_ops"]) <= \
        FLOAT_RESIDUAL_OPS | {"FULLY_CONNECTED", "GELU"}
    # The CRF twin's sensitivity compares its emissions (the tags are decoded outside).
    assert report["quantization_sensitivity"][0]["op"] == "all"


def test_an_int8_budget_is_searched_on_dev_and_kept_in_the_qat_run(crf_ner, tmp_path):
    """`max_accuracy_drop`: the quantize stage scores the calibrated model on the run's dev
    split, moves ops to float until within the budget, and keeps the choice in the QAT
    run's model (the export converts it) and the search in its metrics.json."""
    run = crf_ner[0]
    recipe = QuantizationRecipe(calibration_examples=32, max_accuracy_drop=0.0)
    qat_run = quantize_run(run, tmp_path / "qat", recipe)
    record = qat_run.metrics()["quantization_budget"]
    dev = RunDirectory(run).examples("dev")
    assert record["split"] == "dev" and record["examples"] == len(dev)
    assert record["within_budget"] and record["steps"][-1]["drop"] <= 0.0
    assert record["steps"][0]["float_ops"] == []
    assert qat_run.metrics()["float_ops"] == record["float_ops"]
    assert [row["op"] for row in record["sensitivity"][1:]][:len(record["float_ops"])] == \
        record["float_ops"]
    float_f1 = json.loads((run / "metrics.json").read_text())["best_dev"]["f1"]
    assert record["float_metric"] == pytest.approx(100 * float_f1, abs=1e-3)
    assert qat_run.lineage().quantization == recipe.to_dict()
    markdown = report_markdown(dict(crf_ner[2], quantization_budget=record))
    assert "## int8 accuracy budget" in markdown and "At most 0 points below float" in markdown
    # Asking the same directory for another budget is refused, not silently reused.
    with pytest.raises(RunDirectoryError, match="another recipe"):
        quantize_run(run, tmp_path / "qat", QuantizationRecipe(calibration_examples=32))


def test_without_a_dev_split_the_budget_is_scored_on_training_examples_held_out(
        crf_ner, tmp_path):
    """A run whose config has no data.dev: the default budget is measured on the training
    examples the calibration did not use (never the test split); `none` checks nothing."""
    run = tmp_path / "run"
    shutil.copytree(crf_ner[0], run)
    config = json.loads((run / "config.json").read_text())
    config["data"]["dev"] = None
    (run / "config.json").write_text(json.dumps(config))
    recipe = QuantizationRecipe(calibration_examples=32)
    record = quantize_run(run, tmp_path / "qat", recipe).metrics()["quantization_budget"]
    train = RunDirectory(run).examples("train")
    assert record["split"] == "train (not used for calibration)"
    # The default budget: 0.5 points, or one of these examples (more, here).
    assert record["examples"] == len(train) - 32 and record["default_budget"]
    assert record["max_accuracy_drop"] == round(100 / (len(train) - 32), 4)
    assert record["steps"][0]["float_ops"] == []
    unchecked = quantize_run(run, tmp_path / "unchecked",
                             QuantizationRecipe(calibration_examples=32, max_accuracy_drop=None))
    assert "quantization_budget" not in unchecked.metrics()
    # Every training example calibrated: the budget is scored on them, and says so.
    record = quantize_run(run, tmp_path / "all", QuantizationRecipe(calibration_examples=1000)
                          ).metrics()["quantization_budget"]
    assert record["split"].startswith("train (also the calibration examples: no dev split")
    assert record["examples"] == len(train)


def test_a_crf_tagger_fine_tunes_through_its_crf_loss(crf_ner, tmp_path):
    run = crf_ner[0]
    # A budget the fine-tuned model meets: searched after the fine-tuning, nothing moved.
    recipe = QuantizationRecipe(qat_epochs=1, calibration_examples=16, max_accuracy_drop=100)
    qat_run = quantize_run(run, tmp_path / "qat", recipe)
    qat, tagger = qat_run.load_model(), keras.models.load_model(run / "model.keras")
    assert qat_run.lineage().quantization == recipe.to_dict()
    # The CRF loss reached the transitions, and the fine-tuned model still tags.
    assert np.abs(qat.get_layer("crf").transitions.numpy()
                  - tagger.crf.transitions.numpy()).max() > 1e-4
    metrics = json.loads((qat_run.path / "metrics.json").read_text())
    assert metrics["best_dev"]["f1"] >= 0.9
    assert metrics["quantization_budget"]["float_ops"] == [] == metrics["float_ops"]
