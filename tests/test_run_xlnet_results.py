"""training/run_xlnet_results.py: the held-out words it picks, its tables against the
committed page, and a whole run on toy versions of its two configs that rewrites only its
sections of a copy of docs/results.md."""

import json
import pathlib

import numpy as np
import pytest
import yaml

from keras_attn import cli
from keras_attn.page_sections import read_section
from keras_attn.page_sections import section_markers
from tests.scripts import ROOT
from tests.scripts import load_script

TEXT = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
        "the slings and arrows of outrageous fortune\n") * 8
SECTIONS = ("results:xlnet", "results:xlnet-sst2")


def script():
    return load_script("training/run_xlnet_results.py")


def test_held_out_words_are_whole_words_never_first_or_sep():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "play", "##s", "king"]
    blocks = np.array([[4, 5, 6, 3, 7, 4, 5],    # the play ##s [SEP] king the play
                       [7, 7, 4, 5, 6, 7, 3]])   # king king the play ##s king [SEP]
    chosen = script().held_out_positions(blocks, vocabulary, sep=3, per_block=10, seed=0)
    # Whole words: not position 0, not [SEP], not a "##" piece, not followed by one.
    assert sorted(chosen) == [(0, 4), (0, 5), (0, 6), (1, 1), (1, 2), (1, 5)]
    assert len(script().held_out_positions(blocks, vocabulary, 3, per_block=2, seed=0)) == 4


def write_metrics(run, **values):
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps(values))
    return run


def test_the_committed_tables_are_what_the_script_writes_for_their_numbers(tmp_path):
    """The numbers of docs/results.md's two XLNet tables, given to the script as run
    metrics and scores, give the committed sections byte for byte."""
    module = script()
    history = [{"tokens_per_second": 3765.0}]
    runs = {"xlnet_both_sides": write_metrics(
                tmp_path / "x", best_dev={"perplexity": 54.4}, history=history,
                train_seconds_this_process=22.7 * 60),
            "causal_lm_left_side": write_metrics(
                tmp_path / "c", best_dev={"perplexity": 80.5}, history=history,
                train_seconds_this_process=24.9 * 60)}
    scores = {"xlnet_both_sides": {"accuracy": 0.3231, "mean_nll": 3.725},
              "causal_lm_left_side": {"accuracy": 0.2025, "mean_nll": 4.384}}
    page = ROOT / "docs" / "results.md"
    assert read_section(page, "results:xlnet") == module.held_out_table(runs, scores)
    fine_tunes = [
        write_metrics(tmp_path / "sst2_xlnet", updates=500, best_dev={"accuracy": 0.7179},
                      wall_seconds_this_process=232.0,
                      config={"model": {"checkpoint": "/abs/runs/shakespeare_xlnet"}}),
        write_metrics(tmp_path / "sst2_bert_tiny_500", updates=500,
                      best_dev={"accuracy": 683 / 872}, wall_seconds_this_process=237.1,
                      config={"model": {"preset": "bert_tiny", "vocabulary_size": 4000}})]
    assert read_section(page, "results:xlnet-sst2") == module.sst2_table(fine_tunes)


def tiny_runs(directory):
    """The two Shakespeare configs of training/ at toy size (1 layer, hidden 16, two
    updates) on toy text, trained with `keras-attn train`; the causal LM reads the XLNet
    run's vocabulary, as on the page."""
    directory.mkdir(parents=True)
    (directory / "text.txt").write_text(TEXT)
    runs = {}
    for name in ("shakespeare_xlnet", "shakespeare_causal_lm"):
        config = yaml.safe_load((ROOT / "training" / f"{name}.yaml").read_text())
        config["data"].update(train=str(directory / "text.txt"),
                              dev=str(directory / "text.txt"), max_length=16)
        config["model"].update(vocabulary_size=60)
        config["model"]["overrides"].update(num_layers=1, hidden_dim=16, num_heads=2,
                                            intermediate_dim=32)
        if "max_sequence_length" in config["model"]["overrides"]:
            config["model"]["overrides"]["max_sequence_length"] = 16
        if name == "shakespeare_causal_lm":
            config["model"]["vocabulary"] = str(runs["shakespeare_xlnet"] / "vocab.txt")
        config["train"].update(max_steps=2, global_batch_size=4, checkpoint_every_steps=100)
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        runs[name] = directory / "runs" / name
        assert cli.main(["train", str(path), "--output-dir", str(runs[name])]) == 0
    return runs


@pytest.mark.slow  # two trainings: about 40 s on 2 busy cores
def test_scores_both_models_and_rewrites_only_its_section(tmp_path):
    runs = tiny_runs(tmp_path / "toy")
    page = tmp_path / "results.md"
    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    page.write_text(committed, encoding="utf-8")
    script().main(["--xlnet", str(runs["shakespeare_xlnet"]),
                   "--causal-lm", str(runs["shakespeare_causal_lm"]),
                   "--test", str(tmp_path / "toy" / "text.txt"), "--results", str(page),
                   "--output", str(tmp_path / "scores.json")])
    text = page.read_text(encoding="utf-8")
    begin, end = section_markers("results:xlnet")
    assert text.split(begin)[0] == committed.split(begin)[0]
    assert text.split(end)[1] == committed.split(end)[1]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["held_out_words"] > 0
    table = read_section(page, "results:xlnet")
    for name in ("xlnet_both_sides", "causal_lm_left_side"):
        assert f"{scores[name]['accuracy']:.4f}" in table
        # Two updates from random weights: close to a uniform guess over the vocabulary.
        size = len(pathlib.Path(runs["shakespeare_xlnet"], "vocab.txt").read_text().split())
        assert scores[name]["mean_nll"] == pytest.approx(np.log(size), abs=1.0)
