"""training/run_results.py: a fine-tuning run trains its pretraining run first and gets
it as `model.checkpoint`; finished runs are not repeated; the table formats every row; a
run on tiny configs rewrites only its rows of the page's `results:training` section."""

import json
import pathlib

import pytest
import yaml

from keras_attn import cli
from keras_attn.page_sections import section_markers
from tests import scripts
from tests.scripts import ROOT
from tests.test_trainer import config_dict
from tests.test_trainer import write_data


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


def tiny_scratch_configs(directory):
    """The two configs of the from-scratch SST-2 rows at toy size (1 layer, hidden 16, two
    updates each) on the toy sentiment data of tests/test_trainer.py, as `<run>.yaml`."""
    data = write_data(directory / "data")
    mlm = config_dict(data, "runs/sst2_scratch_mlm", max_steps=2, epochs=1)
    mlm.update(task="mlm")
    mlm["data"] = {"train": str(data / "train.tsv"), "dev": str(data / "dev.tsv"),
                   "text_column": "sentence", "max_length": 16}
    fine_tune = config_dict(data, "runs/sst2_scratch", max_steps=2, epochs=1)
    fine_tune["model"] = {"checkpoint": "runs/sst2_scratch_mlm", "dropout": 0.1}
    for name, values in (("sst2_scratch_mlm", mlm), ("sst2_scratch", fine_tune)):
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(values))
    return directory


def page_parts(text, section):
    """`(before, inside, after)` the markers of `section` in `text`."""
    begin, end = section_markers(section)
    before, rest = text.split(begin)
    inside, after = rest.split(end)
    return before, inside, after


@pytest.mark.tensorflow  # trains through keras-attn train (tf.distribute)
def test_results_page_keeps_what_the_script_does_not_measure(tmp_path, monkeypatch):
    """`--only sst2_scratch` on tiny configs: both runs train (in-process `keras-attn
    train`), the sst2_scratch row is rewritten from its metrics.json, every other row, the
    notes and the other scripts' sections are kept byte for byte."""
    module = load_script()
    monkeypatch.setattr(module, "HERE", tiny_scratch_configs(tmp_path / "configs"))
    monkeypatch.setattr(module.subprocess, "run",
                        lambda command, check: cli.main(command[3:]) or None)
    page = tmp_path / "results.md"
    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    page.write_text(committed, encoding="utf-8")
    module.main(["--only", "sst2_scratch", "--runs-dir", str(tmp_path / "runs"),
                 "--results", str(page)])
    before, inside, after = page_parts(page.read_text(encoding="utf-8"), module.SECTION)
    old_before, old_inside, old_after = page_parts(committed, module.SECTION)
    assert (before, after) == (old_before, old_after)
    metrics = json.loads((tmp_path / "runs" / "sst2_scratch" / "metrics.json").read_text())
    new_rows = [line for line in inside.splitlines() if line.startswith("| `training/")]
    old_rows = [line for line in old_inside.splitlines() if line.startswith("| `training/")]
    assert len(new_rows) == len(old_rows) == len(module.RUNS)
    changed = [new for new, old in zip(new_rows, old_rows) if new != old]
    assert len(changed) == 1 and changed[0].startswith("| `training/sst2_scratch.yaml` |")
    assert f"**{metrics['best_dev']['accuracy']:.4f}**" in changed[0]
    assert f"| {metrics['history'][-1]['updates']:,} |" in changed[0]
    assert (tmp_path / "runs" / "sst2_scratch_mlm" / "metrics.json").is_file()


def test_a_resumed_run_says_its_wall_time_is_the_last_process(tmp_path, monkeypatch):
    module = load_script()
    checkpoints = tmp_path / "sst2_minilm" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "step-500").mkdir()

    def fake_train(command, check):
        (tmp_path / "sst2_minilm" / "metrics.json").write_text("{}")

    monkeypatch.setattr(module.subprocess, "run", fake_train)
    module.run("sst2_minilm", tmp_path)
    seconds, resumed = module.wall_time(tmp_path, "sst2_minilm")
    assert resumed and seconds >= 0
    assert module.wall_time(tmp_path, "conll2003_minilm") == (None, False)


def test_the_page_holds_one_section_per_result_script():
    """docs/results.md and docs/export_results.md carry the markers every script writes
    between, once each (a missing or doubled marker would make the script fail)."""
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for section in ("results:training", "results:xlnet", "results:xlnet-sst2",
                    "results:char", "results:char-sample"):
        assert all(results.count(marker) == 1 for marker in section_markers(section))
    exports = (ROOT / "docs" / "export_results.md").read_text(encoding="utf-8")
    for run in ("sst2_minilm", "conll2003_minilm"):
        assert all(exports.count(marker) == 1
                   for marker in section_markers(f"results:export:{run}"))
