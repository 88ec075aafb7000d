"""`keras-attn demo`: the embedded sample data and the fine-tune -> export -> summary pipeline.

The pipeline test runs a from-scratch tiny BERT (the real demo fine-tunes MiniLM; its numbers
are in the README) so it stays fast; the data checks read the embedded files themselves.
"""

import json

import pytest

from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.stages import demo
from keras_attn.stages.export_options import ExportOptions
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader

pytestmark = pytest.mark.tensorflow


def _sentiment(split):
    return list(ClassificationReader(demo.SAMPLE_DATA / f"sentiment_{split}.tsv",
                                     text_column="sentence", label_column="label"))


def _entities(split):
    return list(ConllReader(demo.SAMPLE_DATA / f"entities_{split}.txt"))


def test_sample_sentiment_data_is_balanced_and_dev_is_unseen():
    train, dev = _sentiment("train"), _sentiment("dev")
    assert (len(train), len(dev)) == (106, 34)
    for rows in (train, dev):
        labels = [row.label for row in rows]
        assert labels.count("positive") == labels.count("negative")
    assert not {row.text for row in train} & {row.text for row in dev}


def test_sample_entity_data_covers_every_type_and_dev_names_are_unseen():
    train, dev = _entities("train"), _entities("dev")
    assert (len(train), len(dev)) == (200, 60)

    def names(sentences):
        found = {}
        for sentence in sentences:
            words = []
            for token, tag in zip(sentence.tokens, sentence.tags):
                if tag.startswith("B-"):
                    words = [token]
                    found.setdefault(tag[2:], set()).add(token)
                elif tag.startswith("I-"):
                    assert words, f"I- tag without B- in {sentence.tokens}"
        return found

    train_names, dev_names = names(train), names(dev)
    assert set(train_names) == set(dev_names) == {"PER", "ORG", "LOC", "MISC"}
    for kind in train_names:
        assert not train_names[kind] & dev_names[kind], kind


def test_demo_config_points_at_the_embedded_data(tmp_path):
    config = demo.demo_config("entities", tmp_path)
    assert config.task == "ner"
    assert config.model.checkpoint == "minilm"
    assert config.data.train == str(demo.SAMPLE_DATA / "entities_train.txt")
    assert config.output_dir == str(tmp_path / "entities" / "run")
    with pytest.raises(ValueError, match="unknown demo task 'sentiments'"):
        demo.demo_config("sentiments", tmp_path)


def test_bad_options_fail_before_any_training(tmp_path):
    with pytest.raises(ValueError, match="Received: latency_runs=0"):
        demo.run_demo(tmp_path, export_options=ExportOptions(latency_runs=0))
    with pytest.raises(ValueError, match="unknown demo task 'sentences'"):
        demo.run_demo(tmp_path, tasks=("sentiment", "sentences"))
    assert not (tmp_path / "sentiment").exists()


# The whole demo (two trainings and exports, then a re-run): 190 s of the default suite's
# 1,188 s on a quiet 2-core machine, the longest test there. CI's slow stage runs it.
@pytest.mark.slow
def test_demo_pipeline_writes_the_summary_and_reuses_finished_steps(tmp_path, monkeypatch):
    options = ExportOptions(latency_runs=2, latency_threads=(1,), golden_examples=4,
                            quantization=QuantizationRecipe(calibration_examples=8))
    lines = []
    summary = demo.run_demo(tmp_path, model={"preset": "bert_tiny"}, epochs=1,
                            export_options=options, log=lines.append)
    assert set(summary["tasks"]) == {"sentiment", "entities"}
    for name, metric in (("sentiment", "accuracy"), ("entities", "f1")):
        task = summary["tasks"][name]
        assert task["metric"] == metric and len(task["dev_by_epoch"]) == 1
        report = json.loads((tmp_path / name / "export" / "export_report.json").read_text())
        assert [row["artifact"] for row in task["artifacts"]] == [
            row["artifact"] for row in report["artifacts"]]
        # The demo quantizes with the default (measured best) recipe.
        assert report["quantization"] == QuantizationRecipe(calibration_examples=8).to_dict()
        int8 = next(row for row in task["artifacts"] if row["artifact"] == "model_int8.tflite")
        assert int8["p50_ms_1_thread"] > 0 and int8["size_bytes"] > 0
        assert [e["text"] for e in task["examples"]] == demo.DEMO_TASKS[name]["examples"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["tasks"].keys() == summary["tasks"].keys()
    markdown = (tmp_path / "summary.md").read_text()
    assert "| model_int8.tflite |" in markdown and "## entities (ner)" in markdown
    assert any(line.startswith("[4/4] entities: export") for line in lines)

    # A second run must not train or export again.
    def fail(*args, **kwargs):
        raise AssertionError("a finished step ran again")

    monkeypatch.setattr("keras_attn.stages.train_stage.train", fail)
    monkeypatch.setattr("keras_attn.stages.run_exporter.export_run", fail)
    lines.clear()
    again = demo.run_demo(tmp_path, model={"preset": "bert_tiny"}, epochs=1,
                          export_options=options, log=lines.append)
    assert sum("reusing" in line for line in lines) == 4
    assert again["tasks"]["sentiment"]["artifacts"] == summary["tasks"]["sentiment"]["artifacts"]


def test_introduction_says_how_the_recipe_quantizes(tmp_path):
    default = demo.introduction(tasks=("sentiment", "entities"))
    assert "(sentiment and named entities)" in default
    assert f"quantize to int8 ({QuantizationRecipe().describe()})" in default
    assert "quantization-aware" not in default
    qat = demo.introduction(ExportOptions(quantization=QuantizationRecipe.all_int8(
        qat_epochs=1)), tasks=("entities",), model={"preset": "bert_tiny"}, output_dir="out")
    assert qat.splitlines() == [
        "keras-attn demo: fine-tune bert_tiny on the embedded sample data (named entities), "
        "quantize to int8 (1 epoch(s) of quantization-aware fine-tuning, learning rate: the "
        "run's / 10; every activation int8 (--all-int8)), export every artifact",
        "  output: out; re-running reuses finished steps"]
