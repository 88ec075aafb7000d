"""training/run_translation_results.py on a tiny translation run (a few hundred Multi30k
pairs): the section lands between its markers, the rest of the page is kept, rerunning
replaces it, and the numbers are those of the run."""

import json

import pytest

from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from tests import scripts
from tests.resources import shared_data_file

pytestmark = pytest.mark.tensorflow


def multi30k(split, folder=None, lines=None):
    """The Multi30k files of `split`, or copies of their first `lines` lines in `folder`."""
    files = {side: shared_data_file(f"multi30k/{split}.{language}")
             for side, language in (("source", "de"), ("target", "en"))}
    if lines is None:
        return {side: str(path) for side, path in files.items()}
    for side, path in files.items():
        head = path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        files[side] = folder / path.name
        files[side].write_text("".join(head), encoding="utf-8")
    return {side: str(path) for side, path in files.items()}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("translation")
    config = TrainingConfig.from_dict({
        "task": "seq2seq", "output_dir": str(folder / "run"),
        "data": {"train": multi30k("val"), "test": multi30k("test_2016_flickr", folder, 20),
                 "max_train_examples": 300, "max_length": 24, "target_max_length": 12},
        "model": {"preset": "attention_rnn_tiny", "vocabulary_size": 500, "lowercase": False},
        "train": {"epochs": 1, "global_batch_size": 32, "learning_rate": 1e-3,
                  "eval_num_beams": 2, "log_every_steps": 1000},
    })
    train(config)
    return folder / "run"


@pytest.mark.slow  # 20-50 s on 2 cores: the slow stage keeps make test within 15 min
def test_section_between_markers_leaves_the_page_alone(tiny_run, tmp_path):
    module = scripts.load_script("training/run_translation_results.py")
    page = tmp_path / "results.md"
    before = "# Results\n\nintro\n\n<!-- translation:begin -->\nold\n<!-- translation:end -->\n"
    page.write_text(before + "\n## Later section\n", encoding="utf-8")
    arguments = [str(tiny_run), "--results", str(page), "--speed-sentences", "6",
                 "--beams", "2", "--test-source", str(shared_data_file(
                     "multi30k/test_2016_flickr.de")), "--test-target", str(shared_data_file(
                         "multi30k/test_2016_flickr.en"))]
    assert module.main(arguments) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Results\n\nintro\n\n<!-- translation:begin -->\n## Translation")
    assert text.endswith("<!-- translation:end -->\n\n## Later section\n")
    assert "old" not in text
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    assert f"| {metrics['test']['bleu']:.2f} |" in text
    assert metrics["test"]["bleu_signature"] in text
    assert "| greedy, cache | greedy, no cache | beam 2, cache | beam 2, no cache |" in text
    assert (tmp_path / "images" / "translation_alignment.png").is_file()
    assert module.main(arguments + ["--picture", ""]) == 0
    again = page.read_text(encoding="utf-8")
    assert again.count("<!-- translation:begin -->") == 1 and "## Later section" in again


def test_replace_section_appends_markers_when_missing():
    module = scripts.load_script("training/run_translation_results.py")
    assert module.replace_section("# Results\n", "new\n") == \
        "# Results\n\n<!-- translation:begin -->\nnew\n<!-- translation:end -->\n"


def test_a_checkpoint_row_scores_the_checkpoint_weights(tiny_run, tmp_path):
    # One epoch: the run's last checkpoint holds the weights of model.keras, so its row
    # repeats the run's test BLEU (measured again here, on the same 20 test pairs).
    module = scripts.load_script("training/run_translation_results.py")
    checkpoint = sorted((tiny_run / "checkpoints").iterdir())[-1]
    test = {side: str(tiny_run.parent / f"test_2016_flickr.{language}")
            for side, language in (("source", "de"), ("target", "en"))}
    pairs, _ = module.read_parallel_files(test["source"], test["target"])
    row = module.checkpoint_summary(tiny_run, checkpoint, pairs)
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    assert row["test_bleu"] == pytest.approx(metrics["test"]["bleu"], abs=1e-9)
    assert row["signature"] == metrics["test"]["bleu_signature"]
    assert row["epochs"] == 1 and row["label"] == f"`{checkpoint}`"
    record = metrics["history"][0]
    assert row["train_minutes"] == pytest.approx(record["train_seconds"] / 60)
    assert row["wall_minutes"] == pytest.approx(
        (record["train_seconds"] + record.get("eval_seconds", 0.0)) / 60)
    assert row["derived_epochs"] == 0
    # At a given time per epoch (the run's epoch measured alone): no wall time.
    timed = module.checkpoint_summary(tiny_run, checkpoint, pairs, epoch_seconds=30)
    assert (timed["train_minutes"], timed["wall_minutes"]) == (0.5, None)
    assert timed["test_bleu"] == row["test_bleu"]
    speeds = {str(tiny_run): {"greedy, cache": 1.0}}
    table = module.section_markdown([row, timed], speeds, 6, "", "cpu")
    assert "| 0 min (1 × 30 s) | — |" in table


def test_epochs_without_recorded_times_get_them_from_their_rates():
    module = scripts.load_script("training/run_translation_results.py")
    dev = {"pairs": 1000, "decoding_sentences_per_second": 10.0}
    history = [{"epoch": 1, "tokens_per_second": 500.0, "dev": dev},
               {"epoch": 2, "tokens_per_second": 999.0, "tokens": 60_000, "dev": dev,
                "train_seconds": 60.0, "eval_seconds": 120.0}]
    # epoch 1: 60,000 tokens at 500/s = 120 s, 1,000 pairs at 10/s = 100 s
    train, wall, derived = module.epoch_minutes(history)
    assert (train, wall, derived) == (pytest.approx(3.0), pytest.approx(400 / 60), 1)
    with pytest.raises(ValueError, match="train it with this version"):
        module.epoch_minutes([{"epoch": 1, "tokens_per_second": 5.0}])
