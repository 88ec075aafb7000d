"""Fault test: `keras-attn train` and `keras-attn export` SIGKILLed at random moments.

After every kill, every result file in the run / export directory is whole (it loads with
the reader that `predict`, `serve`, `export` or a resumed run uses); re-running the command
finishes the work, and the results equal those of an uninterrupted run: bit-equal weights
for training (deterministic ops); for the export equal scores, byte-equal `.tflite` files,
golden vectors and side files, and ONNX files that compute the same logits (tf2onnx names
some nodes after Python object ids, so two uninterrupted exports differ in bytes too).

The kill moments are drawn (seeded) over the part of the command's wall time after
TensorFlow's start; `KERAS_ATTN_FAULT_KILLS` sets how many per command (default 4).
"""

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.test_trainer import config_dict
from tests.test_trainer import write_data

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

REPO = pathlib.Path(__file__).resolve().parents[1]
KILLS = int(os.environ.get("KERAS_ATTN_FAULT_KILLS", "4"))
EXPORT_FLAGS = ["--no-text-tflite", "--no-length-buckets", "--latency-runs", "1",
                "--latency-threads", "1", "--golden-examples", "4",
                "--calibration-examples", "16"]


def command(*arguments):
    return [sys.executable, "-m", "keras_attn.cli", *map(str, arguments)]


def run(arguments):
    started = time.perf_counter()
    done = subprocess.run(arguments, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return time.perf_counter() - started


def kill_at(arguments, seconds):
    process = subprocess.Popen(arguments, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        process.wait(timeout=seconds)
        return False  # it finished first
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return True


def killed_and_rerun(arguments, duration, check, seed):
    """Kills `arguments` `KILLS` times at random moments (each run resumes the last), checks
    the directory after each kill, then runs it to the end. Returns the moments."""
    rng = np.random.default_rng(seed)
    moments = []
    for _ in range(KILLS):
        moment = float(rng.uniform(0.2, 0.9) * duration)
        moments.append(round(moment, 1) if kill_at(arguments, moment) else None)
        check()
    run(arguments)
    check()
    return moments


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def check_run_files(directory):
    """Every result file of a run directory loads with its reader."""
    import h5py

    from keras_attn.runs import RunDirectory

    directory = pathlib.Path(directory)
    run_directory = RunDirectory(directory)
    for path in directory.glob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))
    for name in ("vocab.txt", "labels.txt"):
        if (directory / name).exists():
            assert (directory / name).read_text(encoding="utf-8").endswith("\n"), name
    if (directory / "model.keras").exists():
        run_directory.load_model()
    if (directory / "best.weights.h5").exists():
        with h5py.File(directory / "best.weights.h5", "r") as weights:
            weights.visititems(lambda name, item: getattr(item, "shape", None))
    for step in sorted((directory / "checkpoints").glob("step-*")):
        meta = json.loads((step / "meta.json").read_text(encoding="utf-8"))
        assert meta["state_sha256"] == sha256(step / "state.npz"), step


def check_export_files(directory):
    """Every result file of an export directory loads with its reader."""
    import onnx
    from ai_edge_litert.interpreter import Interpreter

    from keras_attn.runs import ExportDirectory

    directory = pathlib.Path(directory)
    if not directory.exists():
        return
    export = ExportDirectory(directory)
    for path in directory.glob("*.tflite"):
        Interpreter(model_path=str(path)).allocate_tensors()
    for path in directory.glob("*.onnx"):
        onnx.checker.check_model(onnx.load(str(path)))
    if (directory / "model_card.json").exists():
        export.model_card()
    if (directory / "export_report.json").exists():
        export.report()
    if (directory / "golden_vectors.jsonl").exists():
        for line in (directory / "golden_vectors.jsonl").read_text(encoding="utf-8").splitlines():
            json.loads(line)
    if (directory / "saved_model" / "saved_model.pb").exists():
        import tensorflow as tf

        tf.saved_model.load(str(directory / "saved_model"))
    if (directory / "qat").exists():
        check_run_files(directory / "qat")


def weights_of(run_directory):
    from keras_attn.runs import RunDirectory

    return [np.asarray(w) for w in RunDirectory(run_directory).load_model().get_weights()]


def report_scores(export_directory):
    """The report's rows without timings (and without the size of an ONNX file or the
    SavedModel, whose node and function names vary from one conversion to the next)."""
    from keras_attn.runs import ExportDirectory

    report = ExportDirectory(export_directory).report()
    keep = ("artifact", "metric", "agreement", "max_abs_logit_diff", "size_bytes")
    return [{k: row[k] for k in keep if not (k == "size_bytes" and not row["path"].endswith(
        (".tflite", ".keras")))} for row in report["artifacts"]]


def onnx_logits(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {i.name: (rng.integers(1, 15, (3, 16)) if i.name == "token_ids"
                     else np.ones((3, 16))).astype("int32") for i in session.get_inputs()}
    return session.run(None, feed)[0]


def test_train_and_export_killed_at_random_moments_end_as_uninterrupted(tmp_path):
    data = write_data(tmp_path / "data")
    configs = {}
    for name in ("straight", "killed"):
        configs[name] = tmp_path / f"{name}.json"
        configs[name].write_text(json.dumps(config_dict(data, tmp_path / name, epochs=3)))

    duration = run(command("train", configs["straight"]))
    moments = killed_and_rerun(command("train", configs["killed"]), duration,
                               lambda: check_run_files(tmp_path / "killed"), seed=1)
    print(f"train ({duration:.0f} s uninterrupted) killed at {moments} s")
    assert any(m is not None for m in moments)
    for straight, resumed in zip(weights_of(tmp_path / "straight"),
                                 weights_of(tmp_path / "killed")):
        np.testing.assert_array_equal(straight, resumed)
    metrics = [json.loads((tmp_path / name / "metrics.json").read_text())
               for name in ("straight", "killed")]
    assert [h["dev"] for h in metrics[0]["history"]] == [h["dev"] for h in metrics[1]["history"]]
    assert metrics[0]["best_epoch"] == metrics[1]["best_epoch"]

    straight_export, killed_export = tmp_path / "straight_export", tmp_path / "killed_export"
    duration = run(command("export", tmp_path / "straight", "--output-dir", straight_export,
                           *EXPORT_FLAGS))
    moments = killed_and_rerun(
        command("export", tmp_path / "straight", "--output-dir", killed_export, *EXPORT_FLAGS),
        duration, lambda: check_export_files(killed_export), seed=2)
    print(f"export ({duration:.0f} s uninterrupted) killed at {moments} s")
    assert any(m is not None for m in moments)
    assert report_scores(straight_export) == report_scores(killed_export)
    files = sorted(p.name for p in straight_export.iterdir()
                   if p.suffix in (".tflite", ".onnx", ".jsonl", ".txt"))
    assert files == sorted(p.name for p in killed_export.iterdir()
                           if p.suffix in (".tflite", ".onnx", ".jsonl", ".txt"))
    for name in files:
        if name.endswith(".onnx"):
            np.testing.assert_array_equal(onnx_logits(straight_export / name),
                                          onnx_logits(killed_export / name))
        else:
            assert sha256(straight_export / name) == sha256(killed_export / name), name
    assert not [p.name for p in killed_export.iterdir() if p.name.startswith(".tmp-")]
