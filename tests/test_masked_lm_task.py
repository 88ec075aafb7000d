"""MaskedLMTask: static BERT masking, MLM (and MLM + NSP) training on a toy corpus, and
the perplexity recomputed in numpy from the saved model."""

import json

import keras
import numpy as np
import pytest

from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import train
from keras_attn.training.tasks import TASKS
from keras_attn.training.tasks.masked_lm_task import MaskedLMTask
from keras_attn.training.tasks.masked_lm_task import mask_tokens

pytestmark = pytest.mark.tensorflow  # the trainer runs on tf.distribute / tf.data

TASKS.setdefault("mlm", MaskedLMTask)

WORDS = "alpha beta gamma delta epsilon zeta eta theta".split()


def corpus(num_documents, sentences_per_document=3, offset=0):
    """Documents made of one of two rotations of a fixed 8-word cycle: every token is
    predictable from its neighbours."""
    documents = []
    for d in range(num_documents):
        sentences = []
        for s in range(sentences_per_document):
            k = (d + offset) % 2
            sentences.append(" ".join(WORDS[k:] + WORDS[:k]))
        documents.append("\n".join(sentences))
    return "\n\n".join(documents) + "\n"


def make_config(tmp_path, train_file, dev_file=None, epochs=1, nsp=False, **data):
    return TrainingConfig.from_dict({
        "task": "mlm",
        "output_dir": str(tmp_path / "run"),
        "data": {"train": train_file, "dev": dev_file, "max_length": 16,
                 "next_sentence_prediction": nsp, **data},
        "model": {"preset": "bert_tiny", "vocabulary_size": 40, "dropout": 0.0,
                  "overrides": {"num_layers": 1, "hidden_dim": 32, "num_heads": 2,
                                "intermediate_dim": 64}},
        "train": {"epochs": epochs, "global_batch_size": 8, "learning_rate": 3e-3,
                  "warmup_ratio": 0.05, "weight_decay": 0.0, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000},
    })


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_mask_tokens_counts_and_80_10_10():
    rng = np.random.default_rng(0)
    pool = np.arange(10, 50)
    chosen = 0
    counts = {"mask": 0, "kept": 0}
    for _ in range(400):
        ids = np.concatenate([[2], rng.integers(10, 50, size=40), [3]]).astype("int32")
        corrupted, positions, original = mask_tokens(ids, rng, 0.15, 20, 4, [0, 2, 3], pool)
        assert len(positions) == round(0.15 * 40) == 6
        assert (original == ids[positions]).all()
        assert not np.isin(positions, [0, 41]).any()
        untouched = np.setdiff1d(np.arange(len(ids)), positions)
        assert (corrupted[untouched] == ids[untouched]).all()
        counts["mask"] += int((corrupted[positions] == 4).sum())
        counts["kept"] += int((corrupted[positions] == original).sum())
        chosen += len(positions)
    assert counts["mask"] / chosen == pytest.approx(0.8, abs=0.03)
    # 10 % unchanged + 10 % random (a random token equals the original 1/40 of the time).
    assert counts["kept"] / chosen == pytest.approx(0.1 + 0.1 / 40, abs=0.02)
    # min(max_predictions, max(1, round(rate * n))).
    assert len(mask_tokens(np.array([2, 11, 3]), rng, 0.15, 20, 4, [0, 2, 3], pool)[1]) == 1
    assert len(mask_tokens(np.arange(10, 50), rng, 0.5, 7, 4, [0, 2, 3], pool)[1]) == 7


def test_static_masks_are_a_function_of_seed_and_index(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(12))
    task = MaskedLMTask(make_config(tmp_path, train_file), tmp_path / "run")
    task.prepare()
    again = MaskedLMTask(make_config(tmp_path, train_file), tmp_path / "run")
    again.prepare()
    assert task.max_predictions == 3  # ceil(0.15 * 16)
    for a, b in zip(task.train_examples, again.train_examples):
        assert a["index"] == b["index"]
        assert a["token_ids"].tolist() == b["token_ids"].tolist()
        assert a["mask_positions"].tolist() == b["mask_positions"].tolist()
    # Recompute one example's mask from (seed, split, index) and its clean tokens.
    example = task.train_examples[5]
    clean = example["token_ids"].copy()
    clean[example["mask_positions"]] = example["mask_ids"]
    expected = mask_tokens(clean, np.random.default_rng([0, 0, 5]), 0.15, 3,
                           task.tokenizer.mask_token_id, task.unselectable, task.random_pool)
    assert expected[0].tolist() == example["token_ids"].tolist()
    # Packing: each 8-word sentence is 8 pieces; two do not fit in 16 - 2, so one each.
    assert len(clean) == 10 and clean[0] == task.tokenizer.cls_token_id
    x, y, w = task.collate(task.train_examples[:4])
    assert x["mask_positions"].shape == y.shape == w.shape == (4, 3)
    assert w.sum() == sum(len(e["mask_positions"]) for e in task.train_examples[:4])
    assert (y[w == 0] == -100).all()


def numpy_masked_perplexity(model, examples, nsp):
    """exp(mean masked-slot NLL) (numpy log-softmax of the model's logits, one example at a
    time) and, with NSP, the next-sentence accuracy."""
    total, count, nsp_correct = 0.0, 0, 0
    for example in examples:
        ids = example["token_ids"][None]
        x = {"token_ids": ids, "segment_ids": example["segment_ids"][None],
             "padding_mask": np.ones_like(ids), "mask_positions": example["mask_positions"][None]}
        out = model(x)
        logits = keras.ops.convert_to_numpy(out["mlm_logits"] if nsp else out)[0]
        if nsp:
            nsp_logits = keras.ops.convert_to_numpy(out["nsp_logits"])[0]
            nsp_correct += int(nsp_logits.argmax() == example["next_sentence_label"])
        logits = logits.astype("float64") - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total -= log_probs[np.arange(len(example["mask_ids"])), example["mask_ids"]].sum()
        count += len(example["mask_ids"])
    return float(np.exp(total / count)), nsp_correct / len(examples)


def test_mlm_learns_and_perplexity_matches_numpy(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(80))
    dev_file = write(tmp_path / "dev.txt", corpus(8, offset=3))
    config = make_config(tmp_path, train_file, dev_file, epochs=8, mask_rate=0.25)
    results = train(config)
    history = results["history"]
    first, last = history[0]["dev"]["perplexity"], history[-1]["dev"]["perplexity"]
    vocabulary = (tmp_path / "run" / "vocab.txt").read_text().splitlines()
    assert last < first and last < 1.6 and len(vocabulary) > 8
    assert history[-1]["dev"]["masked_accuracy"] > 0.9

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    # A fresh task rebuilds the same static dev masks from (seed, split, index).
    task = MaskedLMTask(config, tmp_path / "run")
    task.prepare()
    expected, _ = numpy_masked_perplexity(model, task.dev_examples, nsp=False)
    assert metrics["best_dev"]["perplexity"] == pytest.approx(expected, rel=1e-4)


def test_mlm_with_next_sentence_prediction(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(24))
    dev_file = write(tmp_path / "dev.txt", corpus(6, offset=1))
    config = make_config(tmp_path, train_file, dev_file, epochs=2, nsp=True, max_length=24)
    results = train(config)
    dev = results["history"][-1]["dev"]
    assert dev["sequences"] == 6 * 2  # two pairs per 3-sentence document
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    assert type(model).__name__ == "BertPretrainer"
    task = MaskedLMTask(config, tmp_path / "run")
    task.prepare()
    pair = task.dev_examples[0]
    assert pair["segment_ids"].max() == 1 and pair["next_sentence_label"] in (0, 1)
    perplexity, nsp_accuracy = numpy_masked_perplexity(model, task.dev_examples, nsp=True)
    assert results["best_dev"]["perplexity"] == pytest.approx(perplexity, rel=1e-4)
    assert results["best_dev"]["next_sentence_accuracy"] == pytest.approx(nsp_accuracy)
    labels = [e["next_sentence_label"] for e in task.train_examples]
    assert 0 < sum(labels) < len(labels)  # both IsNext and NotNext pairs


def test_an_mlm_run_can_be_continued(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(24))
    dev_file = write(tmp_path / "dev.txt", corpus(6, offset=1))
    first = train(make_config(tmp_path, train_file, dev_file, epochs=4, mask_rate=0.25))
    values = make_config(tmp_path, train_file, dev_file, mask_rate=0.25).to_dict()
    values["output_dir"] = str(tmp_path / "continued")
    values["model"].update(checkpoint=str(tmp_path / "run"), preset=None, overrides={})
    # A learning rate too small to move the weights: the continued run starts (and so
    # ends) where the first one stopped, far below a fresh model's perplexity.
    values["train"]["learning_rate"] = 1e-12
    lines = []
    continued = train(TrainingConfig.from_dict(values), log=lines.append)
    assert any("continuing from the trained model" in line for line in lines)
    assert continued["history"][0]["dev"]["perplexity"] == pytest.approx(
        first["history"][-1]["dev"]["perplexity"], rel=1e-4)
    assert first["history"][-1]["dev"]["perplexity"] < 0.5 * first["history"][0]["dev"][
        "perplexity"]

    values["output_dir"] = str(tmp_path / "with_nsp")
    values["data"]["next_sentence_prediction"] = True
    with pytest.raises(ConfigError, match=r"run holds a BertMaskedLM, but task 'mlm' trains a "
                                          r"BertPretrainer: data\.next_sentence_prediction: "
                                          r"true asks for that model; set it to false"):
        train(TrainingConfig.from_dict(values))


def test_bad_mask_rate_names_the_key(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(2))
    # The config's range check catches it before the task reads any data.
    with pytest.raises(ConfigError, match=r"data\.mask_rate.*Received: data\.mask_rate=1\.5"):
        make_config(tmp_path, train_file, mask_rate=1.5)


def test_table_of_texts_with_dupe_factor(tmp_path):
    """A .tsv's text column is the corpus (one document per row, labels ignored); with
    `dupe_factor=3` every training sequence appears 3 times with masks seeded by
    (seed, split, index[, copy]) and copy 0 equals the unduplicated run; dev is masked once."""
    rows = [" ".join(WORDS[k:] + WORDS[:k]) + f"\t{k % 2}" for k in range(6)]
    train_file = write(tmp_path / "train.tsv", "sentence\tlabel\n" + "\n".join(rows) + "\n")
    dev_file = write(tmp_path / "dev.tsv", "sentence\tlabel\n" + "\n".join(rows[:2]) + "\n")
    tasks = {}
    for copies in (1, 3):
        config = make_config(tmp_path, train_file, dev_file, text_column="sentence",
                             dupe_factor=copies)
        tasks[copies] = MaskedLMTask(config, tmp_path / "run")
        tasks[copies].prepare()
    single, triple = tasks[1], tasks[3]
    assert single.tokenizer.get_vocabulary() == triple.tokenizer.get_vocabulary()
    assert "label" not in single.tokenizer.get_vocabulary()  # the header is not text
    assert len(single.train_examples) == 6 and len(triple.train_examples) == 18
    assert len(single.dev_examples) == len(triple.dev_examples) == 2

    def clean(example):
        ids = example["token_ids"].copy()
        ids[example["mask_positions"]] = example["mask_ids"]
        return ids

    # Row k is one document: [CLS] + the 8 words of rotation k + [SEP].
    words = single.tokenizer.tokenize([rows[4].split("\t")[0]]).to_list()[0]
    assert clean(single.train_examples[4]).tolist() == (
        [single.tokenizer.cls_token_id] + words + [single.tokenizer.sep_token_id])
    for index in range(6):
        copies = [triple.train_examples[copy * 6 + index] for copy in range(3)]
        assert copies[0]["token_ids"].tolist() == single.train_examples[index]["token_ids"].tolist()
        assert all(clean(c).tolist() == clean(copies[0]).tolist() for c in copies)
        for copy, example in enumerate(copies):
            key = [0, 0, index] + ([copy] if copy else [])
            expected = mask_tokens(clean(example), np.random.default_rng(key), 0.15, 3,
                                   triple.tokenizer.mask_token_id, triple.unselectable,
                                   triple.random_pool)
            assert expected[1].tolist() == example["mask_positions"].tolist()
            assert expected[0].tolist() == example["token_ids"].tolist()
    # The copies of a sequence are masked differently.
    masks = {(e["index"], tuple(e["mask_positions"])) for e in triple.train_examples}
    assert len(masks) > 6


def test_dupe_factor_range_names_the_key(tmp_path):
    train_file = write(tmp_path / "train.txt", corpus(2))
    with pytest.raises(ConfigError, match=r"data\.dupe_factor=0"):
        make_config(tmp_path, train_file, dupe_factor=0)
