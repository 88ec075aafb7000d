"""training/run_char_results.py on toy versions of its three configs: it trains them (the
committed configs shrunk to 2 layers of width 16, two updates, a few hundred characters),
scores them, and rewrites only the `results:char` and `results:char-sample` sections of a
copy of docs/results.md."""

import json
import math

import pytest
import yaml

from keras_attn import cli
from keras_attn.page_sections import section_markers
from keras_attn.text.character_tokenizer import CharacterTokenizer
from tests.scripts import ROOT
from tests.scripts import load_script

TEXT = ("HAMLET. To be, or not to be, that is the question:\n"
        "Whether 'tis nobler in the mind to suffer\n"
        "The slings and arrows of outrageous fortune,\n") * 6
SECTIONS = ("results:char", "results:char-sample")


def tiny_char_configs(directory):
    """`shakespeare_char_{none,aux,txl}.yaml` of training/ at toy size, on toy text."""
    directory.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (directory / f"{split}.txt").write_text(TEXT)
    for name in ("none", "aux", "txl"):
        config = yaml.safe_load((ROOT / "training" / f"shakespeare_char_{name}.yaml")
                                .read_text())
        config["data"].update(train=str(directory / "train.txt"),
                              dev=str(directory / "valid.txt"),
                              test=str(directory / "test.txt"), max_length=16)
        config["model"]["overrides"].update(num_layers=2, num_heads=2, hidden_dim=16,
                                            intermediate_dim=32)
        if name == "txl":
            config["data"]["eval_memory_length"] = 16
            config["model"]["memory_length"] = 16
        config["train"].update(max_steps=2, global_batch_size=4, checkpoint_every_steps=100,
                               log_every_steps=1, eval_batch_size=8)
        (directory / f"shakespeare_char_{name}.yaml").write_text(yaml.safe_dump(config))
    return directory


def outside(text):
    """`text` with the script's two sections cut out (what it must leave alone)."""
    for section in SECTIONS:
        begin, end = section_markers(section)
        text = text[: text.index(begin)] + text[text.index(end):]
    return text


@pytest.mark.slow  # three trainings: 34 s of CPU, 78 s on 2 busy cores
def test_trains_scores_and_rewrites_only_its_sections(tmp_path, monkeypatch):
    module = load_script("training/run_char_results.py")
    monkeypatch.setattr(module, "HERE", tiny_char_configs(tmp_path / "configs"))
    monkeypatch.setattr(module, "SAMPLE_CHARACTERS", 12)
    monkeypatch.setattr(module, "SPEED_CHARACTERS", 40)
    monkeypatch.setattr(module.subprocess, "run",
                        lambda command, check: cli.main(command[3:]) or None)
    page = tmp_path / "results.md"
    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    page.write_text(committed, encoding="utf-8")
    module.main(["--runs", str(tmp_path / "runs"), "--results", str(page)])

    text = page.read_text(encoding="utf-8")
    assert outside(text) == outside(committed)
    results = json.loads((tmp_path / "runs" / "char_results.json").read_text())
    table = text.split(section_markers("results:char")[0])[1].split("<!--")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`training/" in line]
    assert [row.split("`")[1] for row in rows] == [
        f"training/shakespeare_char_{name}.yaml" for name in ("none", "aux", "txl")]
    for row, result in zip(rows, results["rows"]):
        assert f"**{result['test_bpc']:.3f}**" in row
        assert f"| {result['parameters']:,} | 2 |" in row
    assert "one read, segments of 16 + memory 16" in rows[2]
    assert "blocks of 16 (mean context 8)" in rows[0]
    sample = text.split(section_markers("results:char-sample")[0])[1]
    assert f"```\n{results['sample']}\n```" in sample
    # Transformer-XL's one read with memory (the script) scores Hamlet as the trainer's
    # test evaluation of the same model did; two updates leave every model near a uniform
    # guess over the characters.
    txl = results["rows"][2]
    assert txl["test_bpc"] == pytest.approx(txl["test_bpc_training_eval"], rel=1e-6)
    uniform = math.log2(CharacterTokenizer.load(tmp_path / "runs" / "none").vocabulary_size())
    for result in results["rows"]:
        assert result["test_bpc"] == pytest.approx(uniform, abs=2.0)


def test_the_committed_sections_are_what_the_script_writes_for_their_numbers():
    """The rows of docs/results.md's character-LM table, fed back as the script's scores,
    give the committed section byte for byte: the page holds the script's output, nothing
    edited by hand inside the markers."""
    module = load_script("training/run_char_results.py")
    measured = {  # run: parameters, test, dev, prefix bits/char, ms/char, train / wall min
        "none": (886_272, 2.410, 2.397, 3.126, 5.68, 33.8, 34.3),
        "aux": (886_272, 2.381, 2.381, 3.023, 4.91, 35.5, 36.0),
        "txl": (870_912, 2.230, 2.263, 2.981, 0.14, 46.5, 47.1)}
    rows = []
    for name, title in module.ROWS:
        parameters, test, dev, prefix, ms, train, wall = measured[name]
        rows.append({"model": title, "run": name, "parameters": parameters, "updates": 2400,
                     "context": 128, "memory": 128, "test_eval_seconds": 21.0,
                     "evaluation": "segments + memory" if name == "txl" else "sliding window",
                     "test_bpc": test, "best_dev_bpc": dev, "prefix_bpc": prefix,
                     "seconds_per_character": ms / 1000, "train_seconds": 60 * train,
                     "wall_seconds": 60 * wall})
    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    page = committed.split(section_markers("results:char")[0] + "\n")[1]
    assert page.startswith(module.results_table(rows) + "\n" + section_markers("results:char")[1])
    sample = committed.split(section_markers("results:char-sample")[0] + "\n")[1]
    text = sample.split("```\n")[1].rsplit("\n", 1)[0]
    assert sample.startswith(module.sample_section({"sample": text}, rows[2]))
