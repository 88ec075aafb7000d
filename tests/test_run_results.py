"""training/run_results.py: a fine-tuning run trains its pretraining run first and gets
it as `model.checkpoint`; finished runs are not repeated; the table formats every row."""

import json
import pathlib

from tests import scripts


def load_script():
    return scripts.load_script("training/run_results.py")


def test_pretraining_run_goes_first_and_becomes_the_checkpoint(tmp_path, monkeypatch):
    module = load_script()
    calls = []

    def fake_train(command, check):
        calls.append(command)
        output = pathlib.Path(command[command.index("--output-dir") + 1])
        output.mkdir(parents=True)
        (output / "metrics.json").write_text(json.dumps({"name": output.name}))

    monkeypatch.setattr(module.subprocess, "run", fake_train)
    assert module.run("sst2_scratch", tmp_path) == {"name": "sst2_scratch"}
    assert [pathlib.Path(c[4]).name for c in calls] == ["sst2_scratch_mlm.yaml",
                                                        "sst2_scratch.yaml"]
    pretrained = (tmp_path / "sst2_scratch_mlm").resolve()
    assert calls[1][-2:] == ["--set", f"model.checkpoint={pretrained}"]
    assert "--set" not in calls[0]
    assert (tmp_path / "sst2_scratch" / "wall_seconds.txt").is_file()
    module.run("sst2_scratch", tmp_path)  # both finished: nothing runs again
    assert len(calls) == 2


def test_table_rows_with_and_without_a_test_metric(tmp_path):
    module = load_script()
    rows = [{"name": "a", "dataset": "SST-2 training text", "model": "m", "metric":
             "dev perplexity", "value": 61.2135, "target": None, "dev": 61.2135, "test": None,
             "best_epoch": 2, "epochs_run": 2, "updates": 5262, "wall": 2442.0,
             "tokens_per_second": 4873.0, "config": "training/a.yaml"},
            {"name": "b", "dataset": "SST-2", "model": "m", "metric": "dev accuracy",
             "value": 0.8096, "target": 0.8, "dev": 0.8096, "test": 0.8215, "best_epoch": 2,
             "epochs_run": 3, "updates": 3159, "wall": None, "tokens_per_second": 7166.0,
             "config": "training/b.yaml"}]
    module.write_results(rows, tmp_path / "results.md", "some CPU")
    text = (tmp_path / "results.md").read_text()
    assert ("| `training/a.yaml` | SST-2 training text | m | dev perplexity | **61.2135** | — "
            "| 61.2135 | — | 2 / 2 | 5,262 | 41 min | 4,873 |") in text
    assert ("| `training/b.yaml` | SST-2 | m | dev accuracy | **0.8096** | ≥ 0.80 | 0.8096 | "
            "0.8215 | 2 / 3 | 3,159 | — | 7,166 |") in text
    assert "Machine: some CPU" in text
