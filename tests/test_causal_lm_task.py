"""CausalLMTask: trains a tiny GPT on a learnable toy corpus; perplexity checked in numpy."""

import json

import keras
import numpy as np
import pytest

from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from keras_attn.text.errors import DataError
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks import TASKS
from keras_attn.training.tasks.causal_lm_task import CausalLMTask

pytestmark = pytest.mark.tensorflow  # the trainer runs on tf.distribute / tf.data

TASKS.setdefault("causal_lm", CausalLMTask)

WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


def write_corpus(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def make_config(tmp_path, train_file, dev_file=None, epochs=1, **data):
    return TrainingConfig.from_dict({
        "task": "causal_lm",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": train_file, "dev": dev_file, "max_length": 16, **data},
        "model": {"preset": "gpt2_tiny", "vocabulary_size": 40, "dropout": 0.0,
                  "overrides": {"num_layers": 1, "hidden_dim": 32, "num_heads": 2,
                                "intermediate_dim": 64}},
        "train": {"epochs": epochs, "global_batch_size": 8, "learning_rate": 1e-2,
                  "warmup_ratio": 0.05, "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000},
    })


def numpy_perplexity(model, tokenizer, lines, block):
    """exp(mean NLL) of every next token of `lines` (each followed by [SEP]), computed
    from the model's logits with a numpy log-softmax, one block at a time."""
    stream = []
    for line in lines:
        stream += tokenizer.tokenize(line).numpy().tolist() + [tokenizer.sep_token_id]
    stream = np.array(stream)
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, block):
        chunk = stream[start: start + block + 1]
        inputs = chunk[:-1][None]
        logits = keras.ops.convert_to_numpy(model(
            {"token_ids": inputs, "padding_mask": np.ones_like(inputs)}))[0].astype("float64")
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total -= log_probs[np.arange(len(chunk) - 1), chunk[1:]].sum()
        count += len(chunk) - 1
    return float(np.exp(total / count))


def test_learns_a_repeated_pattern_and_reports_numpy_perplexity(tmp_path):
    lines = [" ".join(WORDS[i % 8:] + WORDS[: i % 8]) for i in range(64)]
    train_file = write_corpus(tmp_path / "train.txt", lines)
    dev_file = write_corpus(tmp_path / "dev.txt", lines[:8])
    config = make_config(tmp_path, train_file, dev_file, epochs=6)
    results = train(config)
    history = results["history"]
    vocabulary = (tmp_path / "run" / "vocab.txt").read_text().splitlines()
    first, last = history[0]["dev"]["perplexity"], history[-1]["dev"]["perplexity"]
    # 9 word tokens + [SEP] follow each other in a fixed cycle except at line starts.
    assert last < first
    assert last < 3.0 < len(vocabulary)
    assert history[-1]["dev"]["token_accuracy"] > 0.7

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["task"] == "causal_lm" and metrics["metric"] == "perplexity"
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    tokenizer = WordPieceTokenizer(vocabulary)
    expected = numpy_perplexity(model, tokenizer, lines[:8], block=16)
    assert metrics["best_dev"]["perplexity"] == pytest.approx(expected, rel=1e-4)


def test_blocks_are_contiguous_and_weighted_per_token(tmp_path):
    train_file = write_corpus(tmp_path / "train.txt", ["alpha beta gamma"] * 12)
    task = CausalLMTask(make_config(tmp_path, train_file, max_length=4), tmp_path / "run")
    task.prepare()
    sep = task.tokenizer.sep_token_id
    stream = np.concatenate([e["token_ids"][:-1] for e in task.train_examples]
                            + [task.train_examples[-1]["token_ids"][-1:]])
    ids = task.tokenizer.tokenize("alpha beta gamma").numpy().tolist() + [sep]
    assert stream.tolist() == ids * 12
    # Consecutive blocks overlap by one token (the last target is the next first input).
    assert task.train_examples[0]["token_ids"][-1] == task.train_examples[1]["token_ids"][0]
    x, y, w = task.collate(task.train_examples[-2:])
    last = task.train_examples[-1]["token_ids"]
    assert y[1, : len(last) - 1].tolist() == last[1:].tolist()
    assert w.sum() == (len(task.train_examples[-2]["token_ids"]) - 1) + len(last) - 1
    assert (x["padding_mask"] == w).all()


def test_blank_file_names_the_file(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n", encoding="utf-8")
    task = CausalLMTask(make_config(tmp_path, str(blank)), tmp_path / "run")
    with pytest.raises(DataError, match=r"blank\.txt:1: the file holds no text"):
        task.prepare()
