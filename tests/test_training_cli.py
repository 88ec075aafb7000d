"""`keras-attn train` (keras_attn.cli) on a tiny config, and strategy selection."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_attn import cli
from keras_attn.training import strategy as strategy_module
from keras_attn.training.strategy import StrategyError
from keras_attn.training.strategy import is_chief
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.strategy import tf_config_cluster
from keras_attn.training.strategy import worker_index

pytestmark = pytest.mark.tensorflow

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "plot", "the",
         "was", "great", "awful"]


def write_project(directory, n=24):
    """A toy sentiment set (label: is a positive word present) and a config next to it
    that names its files relative to itself."""
    rng = np.random.default_rng(0)
    rows = ["sentence\tlabel"]
    for i in range(n):
        label = i % 2
        words = list(rng.choice(["the", "film", "plot", "was"], size=rng.integers(2, 6)))
        words.insert(int(rng.integers(0, len(words) + 1)),
                     str(rng.choice(["good", "great"] if label else ["bad", "awful"])))
        rows.append(" ".join(words) + f"\t{label}")
    directory = pathlib.Path(directory)
    (directory / "data").mkdir(parents=True, exist_ok=True)
    (directory / "data" / "train.tsv").write_text("\n".join(rows) + "\n")
    (directory / "data" / "dev.tsv").write_text("\n".join(rows[:9]) + "\n")
    (directory / "data" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    config = directory / "toy.yaml"
    config.write_text(textwrap.dedent(f"""\
        task: classification
        output_dir: {directory / "run"}
        data:
          train: data/train.tsv
          dev: data/dev.tsv
          text_column: sentence
          label_column: label
          max_length: 12
        model:
          preset: bert_tiny
          vocabulary: data/vocab.txt
          overrides: {{num_layers: 1, hidden_dim: 8, num_heads: 2, intermediate_dim: 16,
                       max_sequence_length: 12}}
        train:
          epochs: 3
          global_batch_size: 4
          learning_rate: 1.0e-3
          log_every_steps: 1
          checkpoint_every_steps: 100
          seed: 1
        """))
    return config


def results_of(output_dir):
    return json.loads((pathlib.Path(output_dir) / "metrics.json").read_text())


def test_train_runs_and_prints_the_results(tmp_path, capsys):
    config = write_project(tmp_path)
    code = cli.main(["train", str(config), "--set", "train.max_steps=2",
                     "--set", "train.learning_rate=3e-5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"keras-attn train {config}: task classification, "
                          f"output {tmp_path / 'run'}")
    assert "== results" in out
    assert "  dev accuracy (best, epoch 1): " in out
    assert f"files in {tmp_path / 'run'}: model.keras, metrics.json" in out
    results = results_of(tmp_path / "run")
    assert results["updates"] == 2 and results["total_steps"] == 2
    assert results["config"]["train"]["learning_rate"] == 3e-5
    # The printed accuracy is the one in metrics.json (dev has 8 examples: k/8).
    accuracy = results["best_dev"]["accuracy"]
    assert f"dev accuracy (best, epoch 1): {accuracy:.4f}" in out
    assert accuracy * 8 == pytest.approx(round(accuracy * 8))
    # Data paths were read relative to the config file.
    assert results["config"]["data"]["train"] == str(tmp_path / "data" / "train.tsv")
    for name in ("model.keras", "metrics.json", "config.json"):
        assert (tmp_path / "run" / name).is_file()


def test_flags_override_the_config_and_win_over_set(tmp_path, capsys):
    config = write_project(tmp_path)
    output = tmp_path / "flag_run"
    code = cli.main(["train", str(config), "--set", "train.seed=5", "--set", "train.epochs=9",
                     "--epochs", "2", "--max-steps", "1", "--seed", "7",
                     "--output-dir", str(output), "--strategy", "one_device"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"output {output}" in out and "strategy: one device (CPU)" in out
    results = results_of(output)
    train = results["config"]["train"]
    assert (train["epochs"], train["max_steps"], train["seed"]) == (2, 1, 7)
    assert results["config"]["distribute"]["strategy"] == "one_device"
    assert results["config"]["output_dir"] == str(output)
    assert results["updates"] == 1
    assert not (tmp_path / "run").exists()  # the config's own output_dir was not used


def test_config_error_exits_2_with_the_message_on_stderr(tmp_path, capsys):
    config = write_project(tmp_path)
    code = cli.main(["train", str(config), "--set", "train.epoch=2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("keras-attn train: error: override: unknown key `train.epoch`")

    broken = tmp_path / "broken.yaml"
    broken.write_text("task: classification\ndata:\n  train: [x\n")
    assert cli.main(["train", str(broken)]) == 2
    _, err = capsys.readouterr()
    assert f"{broken}:4: invalid YAML" in err

    assert cli.main(["train", str(config), "--strategy", "parameter_server"]) == 2
    _, err = capsys.readouterr()
    assert "`distribute.strategy` must be one of [" in err
    assert "Received: distribute.strategy='parameter_server'" in err

    assert cli.main(["train", str(tmp_path / "missing.yaml")]) == 2
    _, err = capsys.readouterr()
    assert "config file not found" in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_data_error_exits_2(tmp_path, capsys):
    config = write_project(tmp_path)
    code = cli.main(["train", str(config), "--set", f"data.train={tmp_path / 'nope.tsv'}",
                     "--output-dir", str(tmp_path / "data_error")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("keras-attn train: error: ") and "nope.tsv" in err


@pytest.mark.parametrize("flag, value", [("--epochs", "0"), ("--max-steps", "-1"),
                                         ("--epochs", "two")])
def test_flags_must_be_positive_integers(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "config.yaml", flag, value])
    assert info.value.code == 2
    assert "expected a positive integer" in capsys.readouterr().err


# --- strategy.py ---------------------------------------------------------------------------

WORKERS = ["127.0.0.1:2222", "127.0.0.1:2223"]


def set_tf_config(monkeypatch, cluster, task_type, index):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": index}}))


@pytest.mark.parametrize("raw", [
    "not json",
    '["a list"]',
    '{"cluster": {"worker": "host:1"}, "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"worker": ["host:1"]}, "task": {"type": "worker"}}',
    '{"cluster": {"worker": ["host:1"]}}',
    '{"cluster": ["host:1"], "task": {"type": "worker", "index": 0}}',
])
def test_malformed_tf_config(monkeypatch, raw):
    monkeypatch.setenv("TF_CONFIG", raw)
    expected = ('TF_CONFIG must be JSON like {"cluster": {"worker": ["host:port", ...]}, '
                '"task": {"type": "worker", "index": 0}}')
    for call in (tf_config_cluster, is_chief, worker_index,
                 lambda: resolve_strategy("multi_worker")):
        with pytest.raises(StrategyError) as info:
            call()
        message = str(info.value)
        assert message.startswith(expected)
        assert message.endswith(f"Received: TF_CONFIG={raw!r}")


def test_no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert tf_config_cluster() == (None, None)
    assert is_chief() is True and worker_index() == 0
    with pytest.raises(StrategyError, match=r"distribute\.strategy=multi_worker needs "
                                            r"TF_CONFIG describing the cluster"):
        resolve_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "")
    assert tf_config_cluster() == (None, None)


@pytest.mark.parametrize("cluster, task_type, index, chief, expected_index", [
    ({"worker": WORKERS}, "worker", 0, True, 0),
    ({"worker": WORKERS}, "worker", 1, False, 1),
    ({"chief": ["127.0.0.1:2221"], "worker": WORKERS}, "chief", 0, True, 0),
    ({"chief": ["127.0.0.1:2221"], "worker": WORKERS}, "worker", 0, False, 0),
    ({"chief": ["127.0.0.1:2221"], "worker": WORKERS}, "worker", 1, False, 1),
    ({"worker": WORKERS}, "worker", "1", False, 1),  # an index given as a string
])
def test_is_chief_and_worker_index(monkeypatch, cluster, task_type, index, chief,
                                   expected_index):
    set_tf_config(monkeypatch, cluster, task_type, index)
    assert is_chief() is chief
    assert worker_index() == expected_index
    parsed_cluster, task = tf_config_cluster()
    assert parsed_cluster == cluster and task == {"type": task_type, "index": index}


def test_one_device_and_unknown_names(monkeypatch):
    import tensorflow as tf

    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy, description = resolve_strategy("one_device")
    assert strategy is tf.distribute.get_strategy()
    assert description == "one device (CPU)"
    # auto: no TPU, no cluster, one CPU -> one device.
    assert resolve_strategy("auto")[1] == "one device (CPU)"
    # A one-worker TF_CONFIG is not a multi-worker run.
    set_tf_config(monkeypatch, {"worker": WORKERS[:1]}, "worker", 0)
    assert resolve_strategy("auto")[1] == "one device (CPU)"
    with pytest.raises(StrategyError, match="unknown strategy 'parameter_server'"):
        resolve_strategy("parameter_server")


def test_split_cpu_after_start_is_an_error():
    import tensorflow as tf

    tf.constant(1.0)  # TensorFlow has initialized its devices in this process
    if len(tf.config.list_logical_devices("CPU")) == 3:
        pytest.skip("this process already has 3 logical CPUs")
    with pytest.raises(StrategyError, match=r"cannot split the CPU into 3 devices after "
                                            r"TensorFlow has started .*a fresh process"):
        strategy_module.split_cpu(3)


TPU_PROBE = """
import json, sys
from keras_attn.training.strategy import StrategyError, resolve_strategy
for address in sys.argv[1:]:
    try:
        resolve_strategy("tpu", tpu=address)
        result = {"error": None}
    except StrategyError as error:
        result = {"error": "StrategyError", "message": str(error)}
    except Exception as error:
        result = {"error": type(error).__name__, "message": str(error)[:300]}
    print(json.dumps({"address": address, **result}), flush=True)
"""


def probe_tpu(addresses, timeout):
    """Runs resolve_strategy("tpu") in a subprocess: connecting to a cluster changes the
    process's TensorFlow context, which must not leak into the other tests."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    environment.pop("TF_CONFIG", None)
    process = subprocess.run([sys.executable, "-c", TPU_PROBE, *addresses], cwd=REPO,
                             env=environment, capture_output=True, text=True,
                             timeout=timeout)
    results = [json.loads(line) for line in process.stdout.splitlines()
               if line.startswith("{")]
    assert [r["address"] for r in results] == list(addresses), process.stderr[-2000:]
    return {r["address"]: r for r in results}


@pytest.fixture(scope="module")
def tpu_probes():
    # One subprocess for all (TensorFlow's import dominates); "local" last, as it is the
    # one that gets as far as initializing a TPU system.
    return probe_tpu(["", "no-such-tpu-name", "local"], timeout=90)


@pytest.mark.parametrize("address, reason", [
    ("", "Please provide a TPU Name"),
    ("local", "TPUs not found in the cluster"),
])
def test_tpu_that_is_not_there_raises_strategy_error(tpu_probes, address, reason):
    result = tpu_probes[address]
    assert result["error"] == "StrategyError", result
    assert result["message"].startswith(f"no TPU reachable (distribute.tpu={address!r})")
    assert reason in result["message"]
    assert "On a Cloud TPU VM use distribute.tpu=local" in result["message"]


def test_tpu_name_that_does_not_resolve_raises_strategy_error(tpu_probes):
    result = tpu_probes["no-such-tpu-name"]
    assert result["error"] == "StrategyError", result


@pytest.mark.slow
def test_tpu_grpc_address_that_is_unreachable():
    # Measured: with grpc://127.0.0.1:1 the TPU initialization waits for the server (> 25 s
    # on our CI machine), so this is a slow test that skips when it hangs.
    try:
        result = probe_tpu(["grpc://127.0.0.1:1"], timeout=10)["grpc://127.0.0.1:1"]
    except subprocess.TimeoutExpired:
        pytest.skip("TPU initialization against an unreachable grpc:// address hangs "
                    "(> 10 s) instead of failing")
    assert result["error"] == "StrategyError", result


@pytest.mark.parametrize("rows, overrides, message", [
    (["good film\t1", "a tab\tinside\t0"], [], r"train\.tsv:3: the row has 3 fields, the "
                                               r"header has 2\. A tab inside a text"),
    (["good film\t1", "bad plot\t0 "], [], r"train\.tsv:3: label '0 ' has leading or trailing"),
    ([], [], r"train\.tsv:1: the file holds no example"),
    (["good film\t1", "bad plot\t0", "great\t1"], ["data.text_column=0", "data.label_column=1"],
     r"train\.tsv:1: the label 'label' of the first row occurs nowhere else"),
])
def test_training_data_that_would_change_silently_exits_2(tmp_path, capsys, rows, overrides,
                                                          message):
    """Each case trained on altered data (or printed a traceback) before."""
    config = write_project(tmp_path)
    (tmp_path / "data" / "train.tsv").write_text("\n".join(["sentence\tlabel"] + rows) + "\n")
    argv = ["train", str(config), "--output-dir", str(tmp_path / "run")]
    for override in overrides:
        argv += ["--set", override]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-attn train: error: ") and "Traceback" not in err
    assert re.search(message, err), err
