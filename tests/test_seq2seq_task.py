"""Seq2SeqTask: a tiny Transformer learns a word-for-word toy translation; BLEU and
perplexity are recomputed from the saved model (its own cached greedy decoding and a
numpy log-softmax) with tensorflow/nmt's BLEU."""

import json
import random

import keras
import numpy as np
import pytest

from keras_attn.text.errors import DataError
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.config import TrainingConfig
from keras_attn.training.tasks import TASKS
from keras_attn.training.tasks.seq2seq_task import Seq2SeqTask
from keras_attn.training.tasks.seq2seq_task import read_pairs
from keras_attn.training.trainer import train
from tests.test_bleu import nmt_compute_bleu

pytestmark = pytest.mark.tensorflow  # the trainer runs on tf.distribute / tf.data

TASKS.setdefault("seq2seq", Seq2SeqTask)

LEXICON = {"one": "eins", "two": "zwei", "three": "drei", "four": "vier", "five": "funf",
           "six": "sechs"}


def toy_pairs(count, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        words = [rng.choice(sorted(LEXICON)) for _ in range(rng.randint(4, 6))]
        lines.append(" ".join(words) + "\t" + " ".join(LEXICON[w] for w in words))
    return lines


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def make_config(tmp_path, train_file, dev_file=None, epochs=1, **data):
    return TrainingConfig.from_dict({
        "task": "seq2seq",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": train_file, "dev": dev_file, "max_length": 10,
                 "target_max_length": 10, **data},
        "model": {"preset": "transformer_tiny", "vocabulary_size": 64, "dropout": 0.0,
                  "overrides": {"num_layers": 1, "hidden_dim": 32, "num_heads": 2,
                                "intermediate_dim": 64}},
        "train": {"epochs": epochs, "global_batch_size": 16, "learning_rate": 1e-2,
                  "warmup_ratio": 0.1, "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000},
    })


def test_learns_toy_translation_and_metrics_match_the_saved_model(tmp_path):
    train_file = write(tmp_path / "train.tsv", toy_pairs(320, seed=0))
    dev_lines = toy_pairs(12, seed=1)
    dev_file = write(tmp_path / "dev.tsv", dev_lines)
    results = train(make_config(tmp_path, train_file, dev_file, epochs=8))
    history = results["history"]
    assert history[-1]["dev"]["perplexity"] < history[0]["dev"]["perplexity"]
    assert history[-1]["dev"]["perplexity"] < 1.6
    assert results["best_dev"]["bleu"] > 60.0

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    vocabulary = (tmp_path / "run" / "vocab.txt").read_text().splitlines()
    tokenizer = WordPieceTokenizer(vocabulary)
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    sources = [tokenizer.tokenize(line.split("\t")[0]).numpy().tolist() + [sep]
               for line in dev_lines]
    targets = [tokenizer.tokenize(line.split("\t")[1]).numpy().tolist() + [sep]
               for line in dev_lines]
    hypotheses, total_nll, count = [], 0.0, 0
    for source, target in zip(sources, targets):
        src = np.array([source])
        tokens = keras.ops.convert_to_numpy(model.greedy_decode(
            src, bos_token_id=cls, max_new_tokens=10, eos_token_id=sep))[0].tolist()
        tokens = tokens[: tokens.index(sep)] if sep in tokens else tokens
        hypotheses.append([vocabulary[t] for t in tokens])
        decoder = np.array([[cls] + target[:-1]])
        logits = keras.ops.convert_to_numpy(model({
            "encoder_token_ids": src, "encoder_padding_mask": np.ones_like(src),
            "decoder_token_ids": decoder, "decoder_padding_mask": np.ones_like(decoder)}))[0]
        logits = logits.astype("float64") - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total_nll -= log_probs[np.arange(len(target)), target].sum()
        count += len(target)
    # Every toy word is one vocabulary piece, so pieces are the words.
    assert set(LEXICON) | set(LEXICON.values()) <= set(vocabulary)
    references = [[[vocabulary[t] for t in target[:-1]]] for target in targets]
    bleu = nmt_compute_bleu(references, hypotheses)[0]
    assert metrics["best_dev"]["bleu"] == pytest.approx(100 * bleu, abs=1e-9)
    assert metrics["best_dev"]["perplexity"] == pytest.approx(np.exp(total_nll / count),
                                                              rel=1e-4)


def test_teacher_forcing_batch(tmp_path):
    train_file = write(tmp_path / "train.tsv", toy_pairs(20, seed=0))
    task = Seq2SeqTask(make_config(tmp_path, train_file, max_length=4, target_max_length=3),
                       tmp_path / "run")
    task.prepare()
    x, y, w = task.collate(task.train_examples[:2])
    sep, cls = task.eos_token_id, task.bos_token_id
    for row, example in enumerate(task.train_examples[:2]):
        target = example["target_ids"]
        assert target[-1] == sep and len(target) <= 3 and len(example["source_ids"]) <= 4
        assert y[row, : len(target)].tolist() == target.tolist()
        assert x["decoder_token_ids"][row, : len(target)].tolist() == [cls] + \
            target[:-1].tolist()
        assert w[row].sum() == len(target)
    assert (x["decoder_padding_mask"] == w).all()


def test_malformed_lines_name_file_and_line(tmp_path):
    bad = write(tmp_path / "bad.tsv", ["one two\teins zwei", "", "three vier"])
    with pytest.raises(DataError, match=r"bad\.tsv:3: 1 tab-separated column"):
        read_pairs(bad)
    empty = write(tmp_path / "empty.tsv", ["one\teins", "two\t  "])
    with pytest.raises(DataError, match=r"empty\.tsv:2: empty target text"):
        read_pairs(empty)
    with pytest.raises(ValueError, match=r"`data.target_column` must be an integer \(seq2seq "
                                         r"reads TSV columns by index\)\. Received: "
                                         r"data.target_column='target'"):
        read_pairs(empty, 0, "target")
    task = Seq2SeqTask(make_config(tmp_path, bad), tmp_path / "run")
    with pytest.raises(DataError, match=r"bad\.tsv:3"):
        task.prepare()
