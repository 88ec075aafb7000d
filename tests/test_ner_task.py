"""NerTask: tiny BERT taggers (softmax and CRF) learn a toy CoNLL set; the reported strict
entity F1 is recomputed from the saved model with a span extraction written here and with
seqeval; the frozen pooler, labels.txt reuse, unknown tags and max_length cuts."""

import json
import random
import re
import warnings

import keras
import numpy as np
import pytest
from seqeval.metrics import f1_score as seqeval_f1
from seqeval.metrics import precision_score as seqeval_precision
from seqeval.metrics import recall_score as seqeval_recall
from seqeval.scheme import IOB2

from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import Trainer
from keras_attn.text.errors import DataError
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.tasks.ner_task import NerTask

pytestmark = pytest.mark.tensorflow  # the trainer runs on tf.distribute / tf.data

MAX_LENGTH = 16
# The tag is a function of the word: first names start a person, surnames continue one,
# every word of a city name is a location, the rest is outside.
FIRST_NAMES = ["john", "mary", "anna", "peter"]
SURNAMES = ["smith", "johnson", "garcia"]  # johnson -> john ##son, garcia -> gar ##cia
CITIES = [["paris"], ["london"], ["berlin"], ["new", "york"], ["los", "angeles"]]
FILLER = ["met", "in", "visited", "and", "the", "lives", "works", "from", "today", "friend",
          "near", "walked"]  # visited -> visit ##ed, lives -> live ##s, ...
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
         "john", "mary", "anna", "peter", "smith", "##son", "gar", "##cia",
         "paris", "london", "ber", "##lin", "new", "york", "los", "angel", "##es",
         "met", "in", "visit", "##ed", "and", "the", "live", "##s", "work", "from", "today",
         "friend", "near", "walk"]
TAGS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]  # LabelVocabulary's order: O, then sorted


def toy_sentences(count, seed):
    """`count` (words, tags) sentences: fillers with 1-2 entities, at most 14 word pieces."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        words, tags = [], []
        for _ in range(rng.randint(1, 2)):
            for _ in range(rng.randint(1, 2)):
                words.append(rng.choice(FILLER))
                tags.append("O")
            if rng.random() < 0.5:
                names = [rng.choice(FIRST_NAMES)] + \
                    ([rng.choice(SURNAMES)] if rng.random() < 0.6 else [])
                words += names
                tags += ["B-PER"] + ["I-PER"] * (len(names) - 1)
            else:
                city = rng.choice(CITIES)
                words += city
                tags += ["B-LOC"] + ["I-LOC"] * (len(city) - 1)
        if rng.random() < 0.5:
            words.append(rng.choice(FILLER))
            tags.append("O")
        sentences.append((words, tags))
    return sentences


def write_conll(path, sentences):
    """Writes CoNLL lines (`word POS tag`) after a -DOCSTART- line; returns the path and the
    line number of every word, per sentence."""
    lines, word_lines = ["-DOCSTART- -X- O", ""], []
    for words, tags in sentences:
        word_lines.append([])
        for word, tag in zip(words, tags):
            lines.append(f"{word} NN {tag}")
            word_lines[-1].append(len(lines))
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path), word_lines


def make_config(tmp_path, train_file, dev_file=None, use_crf=False, epochs=10, output="run"):
    vocab = tmp_path / "vocab.txt"
    if not vocab.is_file():
        vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return TrainingConfig.from_dict({
        "task": "ner",
        "output_dir": str(tmp_path / output),
        "data": {"train": train_file, "dev": dev_file, "max_length": MAX_LENGTH},
        "model": {"preset": "bert_tiny", "vocabulary": str(vocab), "dropout": 0.0,
                  "use_crf": use_crf,
                  "overrides": {"num_layers": 1, "hidden_dim": 32, "num_heads": 2,
                                "intermediate_dim": 64, "max_sequence_length": MAX_LENGTH}},
        "train": {"epochs": epochs, "global_batch_size": 16, "learning_rate": 1e-2,
                  "warmup_ratio": 0.1, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000},
    })


# --- an independent reference: tokenization, first-subword decoding, strict spans --------


def word_pieces(tokenizer, words):
    return [tokenizer.tokenize(word).numpy().tolist() for word in words]


def first_piece_positions(pieces_per_word, max_length):
    """Position of each word's first piece in `[CLS] pieces [SEP]` cut to `max_length`
    (`None` for a word whose first piece is cut), and the kept token ids' body."""
    body, positions = [], []
    for pieces in pieces_per_word:
        positions.append(1 + len(body) if len(body) < max_length - 2 else None)
        body += pieces
    return body[: max_length - 2], positions


def predict_word_tags(model, tokenizer, sentences, use_crf):
    """Word tags from the model: the prediction at each word's first piece ('O' where cut)."""
    rows, all_positions = [], []
    for words, _ in sentences:
        body, positions = first_piece_positions(word_pieces(tokenizer, words), MAX_LENGTH)
        rows.append([tokenizer.cls_token_id] + body + [tokenizer.sep_token_id])
        all_positions.append(positions)
    token_ids = np.zeros((len(rows), MAX_LENGTH), "int32")
    for row, ids in enumerate(rows):
        token_ids[row, : len(ids)] = ids
    x = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
         "padding_mask": (token_ids != 0).astype("int32")}
    if use_crf:
        label_mask = np.zeros_like(token_ids)
        for row, positions in enumerate(all_positions):
            label_mask[row, [p for p in positions if p is not None]] = 1
        x["label_mask"] = label_mask
        predicted_ids = keras.ops.convert_to_numpy(model(x, training=False)["tags"])
    else:
        predicted_ids = keras.ops.convert_to_numpy(model(x, training=False)).argmax(-1)
    return [[TAGS[predicted_ids[row, p]] if p is not None else "O" for p in positions]
            for row, positions in enumerate(all_positions)]


def strict_spans(tags):
    """Entities `(type, start, end)` of strict IOB2: a `B-X` and the `I-X` after it; an `I-X`
    that continues no `X` entity belongs to none."""
    spans, start, kind = set(), None, None
    for position, tag in enumerate(list(tags) + ["O"]):
        if start is not None and tag != f"I-{kind}":
            spans.add((kind, start, position))
            start = None
        if tag.startswith("B-"):
            start, kind = position, tag[2:]
    return spans


def strict_prf(gold, predicted):
    true = {(s,) + span for s, tags in enumerate(gold) for span in strict_spans(tags)}
    guessed = {(s,) + span for s, tags in enumerate(predicted) for span in strict_spans(tags)}
    correct = len(true & guessed)
    precision = correct / len(guessed) if guessed else 0.0
    recall = correct / len(true) if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1, len(true)


def test_strict_spans_reference():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-PER", "B-PER"]
    assert strict_spans(tags) == {("PER", 0, 2), ("LOC", 4, 6), ("PER", 7, 8)}
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert strict_prf(gold, [["B-PER", "O", "O", "B-LOC"]]) == (0.5, 0.5, 0.5, 2)
    assert strict_prf(gold, [["B-PER", "I-PER", "O", "I-LOC"]]) == (1.0, 0.5, 2 / 3, 2)


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("use_crf", [False, True], ids=["softmax", "crf"])
def test_learns_toy_ner_and_reported_f1_matches_the_saved_model(tmp_path, use_crf):
    train_file, _ = write_conll(tmp_path / "train.txt", toy_sentences(160, seed=0))
    dev_sentences = toy_sentences(24, seed=1)
    # 17 pieces, 14 fit between [CLS] and [SEP] (max_length=16): the last 3 words (with the
    # entity "london") are cut, count as 'O' predictions, and the entity is missed.
    long_words = ["mary", "smith"] + ["the"] * 13 + ["london", "today"]
    dev_sentences.append((long_words, ["B-PER", "I-PER"] + ["O"] * 13 + ["B-LOC", "O"]))
    dev_file, _ = write_conll(tmp_path / "dev.txt", dev_sentences)
    config = make_config(tmp_path, train_file, dev_file, use_crf=use_crf)
    lines = []
    trainer = Trainer(config, log=lines.append)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = trainer.run()
    output = tmp_path / "run"

    # The pooler is not used by the token logits: frozen, so no missing-gradient warning.
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "Gradients do not exist" in m], messages
    pooler = trainer.model.backbone.get_layer("pooled_dense")
    assert not pooler.trainable
    trainable = {id(v) for v in trainer.model.trainable_variables}
    assert not [v.path for v in pooler.weights if id(v) in trainable]

    # Cut words are counted and logged (3 words of the long dev sentence, none in train).
    assert [line for line in lines if re.search(r"\b3 words cut by max_length=16\b", line)]

    best = results["best_dev"]
    assert best["f1"] >= 0.9
    assert best["recall"] < 1.0 and best["words_without_prediction"] == 3
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["task"] == "ner" and metrics["metric"] == "f1"
    assert metrics["best_dev"]["f1"] == best["f1"]

    # Recomputed from model.keras with the reference above and with seqeval.
    model = keras.saving.load_model(output / "model.keras")
    assert (output / "labels.txt").read_text().splitlines() == TAGS
    tokenizer = WordPieceTokenizer((output / "vocab.txt").read_text().splitlines())
    gold = [tags for _, tags in dev_sentences]
    predicted = predict_word_tags(model, tokenizer, dev_sentences, use_crf)
    precision, recall, f1, num_entities = strict_prf(gold, predicted)
    assert num_entities > 30 and predicted[-1][-2] == "O"  # the cut "london"
    assert (best["precision"], best["recall"]) == pytest.approx((precision, recall), abs=1e-12)
    assert metrics["best_dev"]["f1"] == pytest.approx(f1, abs=1e-12)
    assert seqeval_f1(gold, predicted, mode="strict", scheme=IOB2) == pytest.approx(f1)
    assert seqeval_precision(gold, predicted, mode="strict", scheme=IOB2) == \
        pytest.approx(precision)
    assert seqeval_recall(gold, predicted, mode="strict", scheme=IOB2) == pytest.approx(recall)

    # The pooler ends as it was initialized: the same seed rebuilds the initial model.
    task = NerTask(config, output)
    task.prepare()
    keras.utils.set_random_seed(config.train.seed)
    initial = task.build_model()
    initial_pooler = initial.backbone.get_layer("pooled_dense").get_weights()
    for before, trained, loaded in zip(initial_pooler, pooler.get_weights(),
                                       model.backbone.get_layer("pooled_dense").get_weights()):
        np.testing.assert_array_equal(before, trained)
        np.testing.assert_array_equal(before, loaded)
    assert not np.array_equal(initial.get_layer("logits").get_weights()[0],
                              trainer.model.get_layer("logits").get_weights()[0])

    # Control: the capture above does see the warning when the pooler is left trainable.
    initial.backbone.get_layer("pooled_dense").trainable = True
    initial.compile(optimizer=make_optimizer(config.train, 10, initial), loss=task.loss())
    x, y, weights = task.collate(task.train_examples[:4])
    with warnings.catch_warnings(record=True) as control:
        warnings.simplefilter("always")
        initial.train_on_batch(x, y, sample_weight=weights)
    assert [w for w in control if "Gradients do not exist" in str(w.message)
            and "pooled_dense" in str(w.message)]


def test_saved_tagger_keeps_the_pooler_frozen(tmp_path):
    train_file, _ = write_conll(tmp_path / "train.txt", toy_sentences(16, seed=5))
    task = NerTask(make_config(tmp_path, train_file), tmp_path / "run")
    task.prepare()
    model = task.build_model()
    model.save(tmp_path / "tagger.keras")
    loaded = keras.saving.load_model(tmp_path / "tagger.keras")
    assert len(loaded.trainable_variables) == len(model.trainable_variables)
    assert not loaded.backbone.get_layer("pooled_dense").trainable


def test_labels_txt_is_written_and_reused_on_resume(tmp_path):
    sentences = toy_sentences(32, seed=2)
    train_file, _ = write_conll(tmp_path / "train.txt", sentences)
    lines = []
    Trainer(make_config(tmp_path, train_file, epochs=1), log=lines.append).run()
    labels_file = tmp_path / "run" / "labels.txt"
    assert labels_file.read_text() == "".join(tag + "\n" for tag in TAGS)

    # Rerun for one more epoch with the locations tagged 'O': built from this file the
    # tags would be [O, B-PER, I-PER] and the checkpoint (5 tags) would not fit the model.
    # labels.txt is reused, so the run resumes and keeps all 5 tags.
    no_locations = [(words, [t if t.endswith("PER") else "O" for t in tags])
                    for words, tags in sentences]
    write_conll(tmp_path / "train.txt", no_locations)
    lines.clear()
    trainer = Trainer(make_config(tmp_path, train_file, epochs=2), log=lines.append)
    results = trainer.run()
    assert [line for line in lines if line.startswith("resumed from checkpoint at step 2 ")]
    assert not [line for line in lines if "skipping" in line]
    assert [line for line in lines if "5 tags" in line]
    assert trainer.model.get_layer("logits").units == len(TAGS)
    assert labels_file.read_text() == "".join(tag + "\n" for tag in TAGS)
    assert [record["epoch"] for record in results["history"]] == [1, 2]


@pytest.mark.parametrize("word", [
    0,
    2,
], ids=["first_word", "third_word"])
def test_unknown_dev_tag_names_file_and_line(tmp_path, word):
    train_file, _ = write_conll(tmp_path / "train.txt", toy_sentences(16, seed=3))
    dev_sentences = [(["the", "friend", "walked"], ["O", "O", "O"]),
                     (["the", "friend", "visited", "paris"], ["O", "O", "O", "B-LOC"])]
    dev_sentences[1][1][word] = "B-ORG"
    dev_file, word_lines = write_conll(tmp_path / "dev.txt", dev_sentences)
    task = NerTask(make_config(tmp_path, train_file, dev_file), tmp_path / "run")
    # LabelVocabulary.id raises DataError("<file>:<line>: unknown label ...") for the reader.
    where = re.escape(f"{dev_file}:{word_lines[1][word]}: ")
    with pytest.raises(DataError, match=rf"^{where}unknown label 'B-ORG': the label vocabulary "
                                        r"built from the training data has 5 labels \('O', "
                                        r"'B-LOC', 'B-PER', 'I-LOC', 'I-PER'\)\. Fix the label"):
        task.prepare()


def test_words_cut_by_max_length_are_counted_per_file(tmp_path):
    sentences = toy_sentences(8, seed=4)
    long_train = [(["john"] + ["visited"] * 9, ["B-PER"] + ["O"] * 9),  # 19 pieces: 2 cut
                  (["the"] * 15 + ["paris"], ["O"] * 15 + ["B-LOC"])]  # 16 pieces: 2 cut
    train_file, _ = write_conll(tmp_path / "train.txt", sentences + long_train)
    dev_file, _ = write_conll(tmp_path / "dev.txt", sentences[:2] + long_train[1:])
    tokenizer = WordPieceTokenizer(VOCAB)
    expected = {}
    for name, data in (("train", sentences + long_train), ("dev", sentences[:2] +
                                                          long_train[1:])):
        expected[name] = sum(
            first_piece_positions(word_pieces(tokenizer, words), MAX_LENGTH)[1].count(None)
            for words, _ in data)
    assert expected == {"train": 4, "dev": 2}
    lines = []
    NerTask(make_config(tmp_path, train_file, dev_file), tmp_path / "run",
            log=lines.append).prepare()
    for path, count in ((train_file, expected["train"]), (dev_file, expected["dev"])):
        assert [line for line in lines if path in line and re.search(
            rf"\b{count} words cut by max_length=16\b", line)], lines


@pytest.mark.parametrize("token, names", [
    ("\u00a0", "U+00A0 NO-BREAK SPACE"),
    ("\u200b", "U+200B ZERO WIDTH SPACE"),
    ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
    ("\u00ad\ufeff", "U+00AD SOFT HYPHEN, U+FEFF ZERO WIDTH NO-BREAK SPACE"),
], ids=["no_break_space", "zero_width_space", "variation_selector_16", "soft_hyphen_and_bom"])
@pytest.mark.parametrize("split", ["train", "dev"])
def test_a_token_without_word_pieces_is_unknown_and_noticed(tmp_path, token, names, split):
    """A token of characters the tokenizer drops got no piece: it used to be tagged `O`
    unseen, then stopped the run; it is now `[UNK]` with its tag, and one notice names its
    `file:line` (CoNLL columns split on ASCII whitespace, so U+00A0 stays a token)."""
    sentences = toy_sentences(8, seed=5)
    bad = [(["the", "friend", token, "paris"], ["O", "O", "B-LOC", "B-LOC"])]
    train_file, train_lines = write_conll(tmp_path / "train.txt",
                                          sentences + (bad if split == "train" else []))
    dev_file, dev_lines = write_conll(tmp_path / "dev.txt",
                                      sentences[:2] + (bad if split == "dev" else []))
    path, line = (train_file, train_lines[-1][2]) if split == "train" else \
        (dev_file, dev_lines[-1][2])
    lines = []
    task = NerTask(make_config(tmp_path, train_file, dev_file), tmp_path / "run",
                   log=lines.append)
    task.prepare()
    notices = [text for text in lines if "no word piece" in text]
    assert len(notices) == 1 and notices[0].startswith(f"{path}: 1 token yields no word piece")
    assert notices[0].endswith(f"scored: {path}:{line} {token!r} ({names})")
    example = (task.train_examples if split == "train" else task.dev_examples)[-1]
    vocab = {token: index for index, token in enumerate(VOCAB)}
    assert example["token_ids"].tolist() == [vocab[t] for t in (
        "[CLS]", "the", "friend", "[UNK]", "paris", "[SEP]")]
    assert [TAGS[i] for i in example["labels"][1:-1]] == ["O", "O", "B-LOC", "B-LOC"]
