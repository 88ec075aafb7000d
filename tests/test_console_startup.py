"""Our command line's output is ours: no TensorFlow start-up log, no retracing warning.

The export test runs `python -m keras_attn.cli export` in a fresh process (the start-up log
happens once per process, while TensorFlow loads) on a tiny NER run: the entities export is
where the demo printed "triggered tf.function retracing".
"""

import os
import re
import subprocess
import sys

import pytest

from keras_attn import console_startup
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import Trainer
from tests.exported_runs import ner_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A TensorFlow / absl C++ log line ("I0000 00:00:1795548159.755253   22439 file.cc:31] ...")
# or absl's preamble; and the Python-side retracing detector.
CPP_LOG_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\]")
NOISE = ("absl::InitializeLog", "triggered tf.function retracing", "cpu_feature_guard")


@pytest.mark.parametrize("argv, original_argv, ours", [
    (["/venv/bin/keras-attn", "demo"], ["/venv/bin/python", "/venv/bin/keras-attn", "demo"],
     True),
    (["C:\\venv\\Scripts\\keras-attn.exe", "demo"], ["python"], True),
    (["-m"], ["python", "-m", "keras_attn", "demo"], True),
    (["-m"], ["python", "-u", "-m", "keras_attn.cli", "export"], True),
    (["-m"], ["python", "-m", "pytest", "-m", "keras_attn.cli"], False),
    (["-m"], ["python", "-m", "keras_attn_other"], False),
    (["my_keras-attn_script.py"], ["python", "my_keras-attn_script.py"], False),
    (["-c"], ["python", "-c", "import keras_attn"], False),
])
def test_only_our_command_line_counts_as_ours(argv, original_argv, ours):
    assert console_startup.started_as_our_command(argv, original_argv) is ours


@pytest.fixture(scope="module")
def ner_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    values = ner_config(root)
    values["train"]["epochs"] = 1
    Trainer(TrainingConfig.from_dict(values)).run()
    return root / "run"


def run_our_command(*arguments):
    """`python -m keras_attn.cli ARGUMENTS` in a fresh process, with the user's environment
    (the suite's TF_CPP_MIN_LOG_LEVEL taken out): its output lines, noise first."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=REPO, KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, "-m", "keras_attn.cli", *map(str, arguments)],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=900)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    noise = [line for line in lines
             if CPP_LOG_LINE.match(line) or any(text in line for text in NOISE)]
    return noise, lines


@pytest.mark.tensorflow
def test_predict_command_prints_no_tensorflow_startup_log(ner_run):
    """TensorFlow, tf-text's normalizer and tf.data load: nothing of theirs on the terminal."""
    noise, lines = run_our_command("predict", ner_run, "marco smith lives in paris")
    assert noise == []
    assert lines[0] == "marco smith lives in paris", lines


@pytest.mark.slow
@pytest.mark.tensorflow
def test_export_command_prints_no_tensorflow_noise(ner_run, tmp_path):
    """The entities export (where the demo printed "triggered tf.function retracing"):
    every artifact converted and scored, only our lines printed."""
    noise, lines = run_our_command(
        "export", ner_run, "--output-dir", tmp_path / "export", "--latency-runs", "1",
        "--latency-threads", "1", "--golden-examples", "8", "--no-text-tflite",
        "--calibration-examples", "8")
    assert noise == []
    assert any("wrote" in line and "export_report.md" in line for line in lines), lines
