"""The int8 and serving scripts run end to end on one tiny trained and exported classifier
(`tests/exported_runs.py`'s sentiment run and quick export, made once per test session),
their numbers recomputed here from the files and models directly:

- `export/score_int8_files.py`: each int8 file's accuracy, agreement with the float model
  and max |Δlogit|; `--write` makes `model_int8.tflite` with the export's own steps;
- `benchmarks/keras_native_int8.py`: Keras' `model.quantize("int8")` against our file;
- `benchmarks/serve_slow_clients.py`: `keras-attn serve` answering while connections are
  held open (a few, not thousands).
"""

import argparse
import ast

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from keras_attn.runs.run_directory import RunDirectory
from keras_attn.text.labelled_examples import id_inputs
from tests.exported_runs import classification_run
from tests.scripts import ROOT
from tests.scripts import load_script

pytestmark = pytest.mark.tensorflow


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return classification_run(tmp_path_factory.mktemp("scripts"))


def _keras_native_int8(monkeypatch):
    """The script as a module; its 1-thread TensorFlow settings skipped (they can only be
    made before TensorFlow starts, and this process has started it)."""
    for name in ("set_intra_op_parallelism_threads", "set_inter_op_parallelism_threads"):
        monkeypatch.setattr(tf.config.threading, name, lambda threads: None)
    return load_script("benchmarks/keras_native_int8.py")


def _file_logits(path, examples, length):
    """`(N, C)` logits of a batch-1 `.tflite` file, one example at a time (XNNPACK)."""
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    rows = []
    for example in examples:
        x = id_inputs([example], length)
        (logits,) = runner(**{k: v.astype("int32") for k, v in x.items()}).values()
        rows.append(logits[0])
    return np.array(rows)


def _expected(run, export_dir, name):
    """The script's row of `name`, computed here: accuracy, argmax agreement with the
    Keras float model and max |Δlogit| on the whole dev split."""
    source = RunDirectory(run)
    length = source.sequence_length()
    examples = source.examples("dev", length)
    labels = np.array([e["label"] for e in examples])
    reference = keras.ops.convert_to_numpy(
        source.load_model()(id_inputs(examples, length), training=False))
    logits = _file_logits(export_dir / name, examples, length)
    return {"examples": len(examples), "accuracy": float(np.mean(logits.argmax(-1) == labels)),
            "agreement": float(np.mean(logits.argmax(-1) == reference.argmax(-1))),
            "max_abs_logit_diff": float(np.abs(logits - reference).max())}


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_score_int8_files_scores_each_file_and_writes_the_budgeted_int8_file(
        exported, tmp_path, capsys):
    run, export_dir = exported
    script = load_script("export/score_int8_files.py")
    results = script.main([str(run), str(export_dir)])
    assert [r["artifact"] for r in results] == ["model.keras (float, Keras)",
                                                "model_int8.tflite", "model_int8_ptq.tflite"]
    for row in results[1:]:
        expected = _expected(run, export_dir, row["artifact"])
        assert row["examples"] == expected["examples"] == 32
        for key in ("accuracy", "agreement"):
            assert row[key] == pytest.approx(expected[key], abs=1e-9), (row["artifact"], key)
        assert row["max_abs_logit_diff"] == pytest.approx(expected["max_abs_logit_diff"],
                                                          abs=1e-5)
    # --write: a directory without the int8 file gets it from the quantize stage (default
    # recipe, in EXPORT/qat), held to the int8 budget on dev, then scored.
    copy = tmp_path / "export"
    copy.mkdir()
    rows = script.main([str(run), str(copy), "--write", "--no-float",
                        "--files", "model_int8.tflite"])
    assert sorted(p.name for p in copy.glob("*.tflite")) == ["model_int8.tflite"]
    budget = RunDirectory(copy / "qat").metrics()["quantization_budget"]
    assert budget["split"] == "dev" and budget["examples"] == 32
    expected = _expected(run, copy, "model_int8.tflite")
    assert rows[0]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-9)
    assert "agreement" not in rows[0]  # --no-float: nothing to compare with
    # The file's verdict line: the file scored on dev on XNNPACK, its model beside it.
    printed = capsys.readouterr().out
    assert "int8 budget on model_int8.tflite (LiteRT, XNNPACK): 32 dev examples" in printed
    assert f"model_int8.tflite (XNNPACK) {100 * expected['accuracy']:.2f}, calibrated model " \
        f"{budget['steps'][-1]['metric']:.2f}, float {budget['float_metric']:.2f}" in printed


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_keras_native_int8_scores_keras_quantize_against_our_file(exported, monkeypatch,
                                                                  capsys):
    run, export_dir = exported
    script = _keras_native_int8(monkeypatch)
    source = RunDirectory(run)
    texts = source.texts("dev")
    gold = [source.labels().labels[e["label"]] for e in source.examples("dev")]
    monkeypatch.setattr(script.web_accuracy, "load_set", lambda name, limit: (texts, gold))
    script.args = argparse.Namespace(run_dir=str(run), export_dir=str(export_dir),
                                     data="sst2", labels="", limit=None, latency_texts=3)
    script.main()
    printed = capsys.readouterr().out.splitlines()
    rows = [ast.literal_eval(line) for line in printed if line.startswith("{")]
    assert [r["artifact"] for r in rows] == [
        "Keras float32", 'Keras `model.quantize("int8")`',
        "ours: model_int8.tflite (QAT, LiteRT)"]
    expected = _expected(run, export_dir, "model_int8.tflite")
    assert rows[2]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-9)
    assert rows[2]["agreement"] == pytest.approx(expected["agreement"], abs=1e-9)
    assert rows[2]["MB"] == (export_dir / "model_int8.tflite").stat().st_size / 1e6
    model = source.load_model()
    assert rows[0]["MB"] == sum(w.numpy().nbytes for w in model.weights) / 1e6
    assert rows[0]["agreement"] is None and rows[1]["MB"] < rows[0]["MB"]
    table = [line for line in printed if line.startswith("| ")]
    assert table[0] == "| sst2 | accuracy | agreement with float | MB | p50 ms, 1 thread |"
    assert len(table) == 4 and table[3].startswith(
        f"| ours: model_int8.tflite (QAT, LiteRT) | {expected['accuracy']:.4f} | "
        f"{expected['agreement']:.4f} |")


def test_weight_bytes_and_latencies_taken_in_turns(monkeypatch):
    script = _keras_native_int8(monkeypatch)
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert script.weight_bytes(dense) == (4 * 3 + 3) * 4
    dense.quantize("int8")  # int8 kernel, float32 bias and per-unit kernel scales
    assert script.weight_bytes(dense) == 4 * 3 + 3 * 4 + 3 * 4
    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def predict(self, texts):
            calls.append((self.name, tuple(texts)))

    medians = script.latencies_ms([Fake("a"), Fake("b")], ["x", "y"])
    assert len(medians) == 2 and all(m >= 0 for m in medians)
    # One warm-up each, then every text through both before the next text.
    assert calls == [("a", ("x",)), ("b", ("x",)), ("a", ("x",)), ("b", ("x",)),
                     ("a", ("y",)), ("b", ("y",))]


@pytest.mark.slow  # 10-20 s on 2 cores: the slow stage keeps make test within 15 min
def test_serve_slow_clients_answers_while_connections_are_held(exported, monkeypatch):
    """A few half-sent and idle keep-alive connections held open against `keras-attn serve`
    on the tiny export's SavedModel: every request still answered, the same answers, no
    held connection answered, the server's sockets counted."""
    _, export_dir = exported
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    script = load_script("benchmarks/serve_slow_clients.py")
    monkeypatch.setattr(script, "export_models",
                        lambda directory: {"sentiment": export_dir / "saved_model"})
    args = argparse.Namespace(half_sent=5, idle=3, requests=16, clients=2, hold=120.0,
                              deadline=300.0, model_dir=None)
    figures = script.run(args)
    assert figures["before"][0] == figures["attacked"][0] == {200: 16}
    assert figures["wrong"] == 0 and figures["answered_held"] == 0
    # The server holds all 8 connections open (and its listening socket) while it answers
    # the others, and still after them.
    assert figures["under"][2] >= 8 + 1 and figures["still_open"] >= 8 + 1
    assert figures["under"][2] > figures["quiet"][2]
    page = script.markdown(figures, args, "python benchmarks/serve_slow_clients.py")
    assert "| attacked | 5 half-sent + 3 idle keep-alive | {200: 16} |" in page
    assert "answers different from the baseline's: 0; held connections that got an answer: 0" \
        in page


def test_serve_slow_clients_counts_wrong_answers_and_percentiles(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports serving_batching
    script = load_script("benchmarks/serve_slow_clients.py")
    expected = {0: {"label": "1", "probabilities": [0.25, 0.75]}}
    answers = [(0, 200, {"label": "1", "probabilities": [0.25, 0.75 + 5e-6]}, 0.01),
               (0, 200, {"label": "1", "probabilities": [0.25, 0.75 + 5e-5]}, 0.02),
               (0, 200, {"label": "0", "probabilities": [0.25, 0.75]}, 0.03),
               (0, 503, None, 0.05)]
    assert script.wrong_answers(answers, expected) == 2  # within 1e-5: the same answer
    statuses, p50, p99 = script.summary(answers)
    assert statuses == {200: 3, 503: 1}
    assert p50 == pytest.approx(25.0) and p99 == pytest.approx(30 + 0.97 * 20)
