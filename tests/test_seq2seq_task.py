"""Seq2SeqTask: a tiny Transformer learns a word-for-word toy translation from aligned line
files; sacreBLEU and perplexity are recomputed from the saved model (sentence by sentence
beam search, a numpy log-softmax, sacrebleu.corpus_bleu); the translation commands on the
run (predict, predict --input/--output, explain)."""

import json
import random

import keras
import numpy as np
import pytest
import sacrebleu

from keras_attn import cli
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from keras_attn.text.errors import DataError
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks import TASKS
from keras_attn.training.tasks.seq2seq_task import Seq2SeqTask
from keras_attn.training.tasks.seq2seq_task import read_pairs

pytestmark = pytest.mark.tensorflow  # the trainer runs on tf.distribute / tf.data

TASKS.setdefault("seq2seq", Seq2SeqTask)

LEXICON = {"one": "eins", "two": "zwei", "three": "drei", "four": "vier", "five": "funf",
           "six": "sechs"}


def toy_pairs(count, seed):
    """`(source, target)` sentences: English words, their German words, a final period."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        words = [rng.choice(sorted(LEXICON)) for _ in range(rng.randint(4, 6))]
        pairs.append((" ".join(words) + ".", " ".join(LEXICON[w] for w in words) + "."))
    return pairs


def write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def write_parallel(folder, name, pairs):
    return {"source": write(folder / f"{name}.en", [s for s, _ in pairs]),
            "target": write(folder / f"{name}.de", [t for _, t in pairs])}


def toy_lines(count, seed):
    return [f"{s}\t{t}" for s, t in toy_pairs(count, seed)]


def make_config(tmp_path, train_file, dev_file=None, epochs=1, **data):
    return TrainingConfig.from_dict({
        "task": "seq2seq",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": train_file, "dev": dev_file, "max_length": 16,
                 "target_max_length": 16, **data},
        "model": {"preset": "transformer_tiny", "vocabulary_size": 64, "dropout": 0.0,
                  "lowercase": False,
                  "overrides": {"num_layers": 1, "hidden_dim": 32, "num_heads": 2,
                                "intermediate_dim": 64}},
        "train": {"epochs": epochs, "global_batch_size": 16, "learning_rate": 1e-2,
                  "warmup_ratio": 0.1, "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000, "label_smoothing": 0.1,
                  "eval_num_beams": 3},
    })


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seq2seq")
    dev_pairs = toy_pairs(12, seed=1)
    config = make_config(folder, write_parallel(folder, "train", toy_pairs(320, seed=0)),
                         write_parallel(folder, "dev", dev_pairs), epochs=8)
    return folder / "run", dev_pairs, train(config)


def test_learns_toy_translation_and_metrics_match_the_saved_model(toy_run):
    run, dev_pairs, results = toy_run
    history = results["history"]
    assert history[-1]["dev"]["perplexity"] < history[0]["dev"]["perplexity"]
    assert history[-1]["dev"]["perplexity"] < 1.6
    assert results["best_dev"]["bleu"] > 60.0

    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_dev"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|"
                                                            "tok:13a|smooth:exp|version:2.")
    vocabulary = (run / "vocab.txt").read_text().splitlines()
    tokenizer = WordPieceTokenizer(vocabulary, lowercase=False)
    pieces = JoinedWordPieces(tokenizer)
    model = keras.saving.load_model(run / "model.keras")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    hypotheses, total_nll, count = [], 0.0, 0
    for source_text, target_text in dev_pairs:
        source = np.array([pieces.encode([source_text])[0].tolist() + [sep]])
        target = pieces.encode([target_text])[0].tolist() + [sep]
        tokens = keras.ops.convert_to_numpy(model.beam_search(
            source, bos_token_id=cls, max_new_tokens=16, eos_token_id=sep,
            num_beams=3)[0])[0].tolist()
        hypotheses.append(pieces.decode(tokens[: tokens.index(sep)] if sep in tokens
                                        else tokens))
        decoder = np.array([[cls] + target[:-1]])
        logits = keras.ops.convert_to_numpy(model({
            "encoder_token_ids": source, "encoder_padding_mask": np.ones_like(source),
            "decoder_token_ids": decoder, "decoder_padding_mask": np.ones_like(decoder)}))[0]
        logits = logits.astype("float64") - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total_nll -= log_probs[np.arange(len(target)), target].sum()
        count += len(target)
    bleu = sacrebleu.corpus_bleu(hypotheses, [[t for _, t in dev_pairs]]).score
    assert metrics["best_dev"]["bleu"] == pytest.approx(bleu, abs=1e-9)
    assert metrics["best_dev"]["perplexity"] == pytest.approx(np.exp(total_nll / count),
                                                              rel=1e-4)


def test_predict_and_explain_a_translation_run(toy_run, tmp_path, capsys):
    run, dev_pairs, _ = toy_run
    source, target = dev_pairs[0]
    capsys.readouterr()
    assert cli.main(["predict", str(run), source]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == target  # the toy is learned: word for word, period glued
    sources = tmp_path / "dev.en"
    sources.write_text("".join(s + "\n" for s, _ in dev_pairs), encoding="utf-8")
    output = tmp_path / "dev.de"
    assert cli.main(["predict", str(run), "--input", str(sources), "--output", str(output),
                     "--beams", "2"]) == 0
    streams = capsys.readouterr()
    assert f"translated {len(dev_pairs)}/{len(dev_pairs)} sentences" in streams.err
    assert len(output.read_text(encoding="utf-8").splitlines()) == len(dev_pairs)
    assert output.read_text(encoding="utf-8").splitlines()[0] == target
    picture = tmp_path / "alignment.png"
    assert cli.main(["explain", str(run), source, "--output", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"translation: {target}" in capsys.readouterr().out
    assert cli.main(["predict", str(run)]) == 2
    assert "give the sentences to translate as arguments or --input FILE" in \
        capsys.readouterr().err


def test_teacher_forcing_batch(tmp_path):
    train_file = write(tmp_path / "train.tsv", toy_lines(20, seed=0))
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


def test_misaligned_parallel_files_stop_prepare_at_file_and_line(tmp_path):
    files = write_parallel(tmp_path, "train", toy_pairs(5, seed=0))
    lines = (tmp_path / "train.de").read_text(encoding="utf-8").splitlines()
    write(tmp_path / "train.de", lines[:2] + ["  "] + lines[3:])
    task = Seq2SeqTask(make_config(tmp_path, files), tmp_path / "run")
    with pytest.raises(DataError, match=r"train\.de:3: empty line, but line 3 of .*train\.en"):
        task.prepare()
