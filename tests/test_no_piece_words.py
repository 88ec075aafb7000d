"""Tokens that yield no word piece (issue 50, item 2): U+00A0 alone (CoNLL columns split on
ASCII whitespace, so it is a token), U+FE0F alone (a combining mark: removed where accents are
stripped), U+200B alone (a format character). A CoNLL token like that is kept as `[UNK]` (its
tag trained and scored) with one notice per file; a classification text keeps working without
those words, and one with no piece at all is still an error; prediction stays aligned.

Expected ids are indices into the vocabulary written here, expected scores are counted by hand."""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.train_stage import Trainer
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.errors import DataError
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.labelled_examples import encode_sentences
from keras_attn.text.labelled_examples import encode_texts
from keras_attn.text.labelled_examples import score_sentences
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.tokenizer import WordPieceTokenizer

pytestmark = pytest.mark.tensorflow  # tf-text, tf.data and the trainer on tf.distribute

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "new", "york", "met", "anna",
         "in", "paris", "@", "user", "!", "good", "film", "bad", "plot", "smith"]
ID = {token: index for index, token in enumerate(VOCAB)}
CLS, SEP, UNK = ID["[CLS]"], ID["[SEP]"], ID["[UNK]"]
TAGS = ["O", "B-LOC", "B-MISC", "B-PER", "I-LOC", "I-PER"]
NO_PIECE = [("\u00a0", "U+00A0 NO-BREAK SPACE"),
            ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
            ("\u200b", "U+200B ZERO WIDTH SPACE")]
NO_PIECE_IDS = ["nbsp", "variation_selector_16", "zero_width_space"]


def tokenizer(sequence_length=32):
    return WordPieceTokenizer(VOCAB, sequence_length=sequence_length)


def write_conll(path, sentences):
    """CoNLL lines `token NN tag` after a -DOCSTART- line; the path and each token's line."""
    lines, token_lines = ["-DOCSTART- -X- O", ""], []
    for tokens, tags in sentences:
        for token, tag in zip(tokens, tags):
            lines.append(f"{token} NN {tag}")
            token_lines.append(len(lines))
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path), token_lines


def encode(path, sequence_length=32):
    """`encode_sentences` of a CoNLL file with the vocabulary above: `(examples, log lines)`."""
    lines = []
    examples = encode_sentences(list(ConllReader(path)), tokenizer(sequence_length),
                                LabelVocabulary(TAGS), path, lines.append)
    return examples, lines


@pytest.mark.parametrize("token, names", NO_PIECE, ids=NO_PIECE_IDS)
def test_the_reader_keeps_the_token_and_the_tokenizer_gives_it_no_piece(tmp_path, token, names):
    path, token_lines = write_conll(tmp_path / "dev.txt", [(["anna", token, "paris"],
                                                            ["B-PER", "O", "B-LOC"])])
    [sentence] = list(ConllReader(path))
    assert sentence.tokens == ["anna", token, "paris"]
    assert sentence.tags == ["B-PER", "O", "B-LOC"] and sentence.line == token_lines[0] == 3
    pieces = tokenizer().tokenize_words([sentence.tokens]).to_list()
    assert pieces == [[[ID["anna"]], [], [ID["paris"]]]]  # what this issue is about


@pytest.mark.parametrize("token, names", NO_PIECE, ids=NO_PIECE_IDS)
def test_a_token_without_pieces_is_unknown_with_its_tag_and_one_notice(tmp_path, token, names):
    """The token is an entity of its own: its tag must sit on its own [UNK] position."""
    path, token_lines = write_conll(tmp_path / "dev.txt", [
        (["the", "film"], ["O", "O"]),
        (["anna", token, "met", "new", "york"], ["B-PER", "B-MISC", "O", "B-LOC", "I-LOC"])])
    examples, lines = encode(path)
    tag = {t: i for i, t in enumerate(TAGS)}
    second = examples[1]
    assert second["token_ids"].tolist() == [CLS, ID["anna"], UNK, ID["met"], ID["new"],
                                            ID["york"], SEP]
    assert second["labels"].tolist() == [-100, tag["B-PER"], tag["B-MISC"], tag["O"],
                                         tag["B-LOC"], tag["I-LOC"], -100]
    assert second["word_ids"].tolist() == [-1, 0, 1, 2, 3, 4, -1]
    assert [e["words_without_pieces"] for e in examples] == [0, 1]
    assert examples[0]["token_ids"].tolist() == [CLS, ID["the"], ID["film"], SEP]
    assert lines == [f"{path}: 1 token yields no word piece (the tokenizer drops all their "
                     "characters: whitespace, control and format characters, and combining "
                     "marks when it strips accents); each is kept as [UNK], so its tag is "
                     f"trained and scored: {path}:{token_lines[3]} {token!r} ({names})"]
    assert token_lines[3] == 7


def test_one_notice_per_file_counts_all_and_names_the_first_five(tmp_path):
    """A mixed, social-media-like file: emoji followed by a lone U+FE0F, NBSP and zero-width
    tokens inside entities, tokens that do have pieces ('@user', an unknown emoji)."""
    sentences = [
        (["@user", "\u2764", "\ufe0f", "new", "york"], ["O", "O", "O", "B-LOC", "I-LOC"]),
        (["anna", "\u00a0", "smith", "!"], ["B-PER", "I-PER", "I-PER", "O"]),
        (["the", "film"], ["O", "O"]),
        (["\u200b", "paris", "\u200b\ufe0f"], ["O", "B-LOC", "O"]),
        (["new", "\u200b", "york", "\ufe0f", "\u00a0"], ["B-LOC", "I-LOC", "I-LOC", "O", "O"]),
    ]
    path, token_lines = write_conll(tmp_path / "test.txt", sentences)
    examples, lines = encode(path)
    expected = [(line, token) for (line, token) in zip(
        token_lines, [t for tokens, _ in sentences for t in tokens])
        if token in ("\u00a0", "\ufe0f", "\u200b", "\u200b\ufe0f")]
    assert len(expected) == 7
    assert [e["words_without_pieces"] for e in examples] == [1, 1, 0, 2, 3]
    [notice] = lines  # one line for the whole file
    assert notice.startswith(f"{path}: 7 tokens yield no word piece ")
    named = re.findall(rf"{re.escape(path)}:(\d+) ", notice)
    assert [int(n) for n in named] == [line for line, _ in expected[:5]]
    assert notice.endswith(" and 2 more")
    assert "(U+200B ZERO WIDTH SPACE, U+FE0F VARIATION SELECTOR-16)" in notice
    # Every tag stays on its word: one first piece per word, in order.
    for example, (tokens, tags) in zip(examples, sentences):
        first = [label for label, word in zip(example["labels"], example["word_ids"])
                 if word >= 0 and label != -100]
        assert [TAGS[i] for i in first] == tags
        assert sorted(set(example["word_ids"]) - {-1}) == list(range(len(tokens)))
    # '@user' has two pieces of one word; the heart is an ordinary unknown word.
    assert examples[0]["token_ids"].tolist() == [CLS, ID["@"], ID["user"], UNK, UNK,
                                                 ID["new"], ID["york"], SEP]
    assert examples[0]["word_ids"].tolist() == [-1, 0, 0, 1, 2, 3, 4, -1]


def test_a_file_without_such_tokens_gets_no_notice(tmp_path):
    path, _ = write_conll(tmp_path / "dev.txt", [(["anna", "met"], ["B-PER", "O"])])
    examples, lines = encode(path)
    assert lines == [] and examples[0]["words_without_pieces"] == 0


def test_the_unknown_word_is_scored(tmp_path):
    """Gold: 'new \\u200b york' is one LOC of three words and '\\ufe0f' one MISC. Predicting
    them right gives F1 1; a wrong tag at an [UNK] word loses its entity (counted by hand)."""
    path, _ = write_conll(tmp_path / "dev.txt", [
        (["new", "\u200b", "york", "met", "anna"], ["B-LOC", "I-LOC", "I-LOC", "O", "B-PER"]),
        (["the", "\ufe0f"], ["O", "B-MISC"])])
    examples, _ = encode(path)
    labels = LabelVocabulary(TAGS)

    def logits(example, tags):  # (S, C): one-hot of `tags` at each word's first piece
        out = np.zeros((len(example["token_ids"]), len(TAGS)), "float32")
        out[:, 0] = 1.0
        for position, label in enumerate(example["labels"]):
            if label != -100:
                out[position] = 0.0
                out[position, TAGS.index(tags.pop(0))] = 1.0
        return out

    right = [logits(examples[0], ["B-LOC", "I-LOC", "I-LOC", "O", "B-PER"]),
             logits(examples[1], ["O", "B-MISC"])]
    scores = score_sentences(examples, right, labels)
    assert scores["f1"] == 1.0 and scores["words_without_pieces"] == 2
    assert scores["words_without_prediction"] == 0
    # The [UNK] inside the city predicted 'O': the LOC entity breaks into 'new' + 'york'
    # (B-LOC, then an orphan I-LOC that strict IOB2 counts as no entity).
    wrong = [logits(examples[0], ["B-LOC", "O", "I-LOC", "O", "B-PER"]), right[1]]
    scores = score_sentences(examples, wrong, labels)
    # gold 3 entities; predicted LOC('new') wrong, PER right, MISC right: P 2/3, R 2/3.
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    # The lone U+FE0F's MISC missed: P 2/2, R 2/3.
    missed = [right[0], logits(examples[1], ["O", "O"])]
    scores = score_sentences(examples, missed, labels)
    assert scores["precision"] == 1.0 and scores["recall"] == pytest.approx(2 / 3)


def test_a_cut_unknown_word_counts_as_truncated(tmp_path):
    """max_length 5 holds [CLS] + 3 pieces + [SEP]: the [UNK] word at piece 4 is cut."""
    path, _ = write_conll(tmp_path / "dev.txt", [(["anna", "met", "new", "\u00a0"],
                                                  ["B-PER", "O", "B-LOC", "O"])])
    examples, lines = encode(path, sequence_length=5)
    assert examples[0]["token_ids"].tolist() == [CLS, ID["anna"], ID["met"], ID["new"], SEP]
    assert examples[0]["words_without_pieces"] == 1
    assert len(lines) == 2 and "1 token yields no word piece" in lines[0]
    assert "1 words cut by max_length=5" in lines[1]


def test_alignment_with_an_unknown_id_in_graph_and_its_argument_check():
    pieces = tf.ragged.constant([[[5], [], [6, 7], []], [[], [8]]], ragged_rank=2)
    labels = tf.ragged.constant([[1, 2, 3, 4], [5, 6]])
    aligned = tf.function(lambda p, l: align_word_labels(  # noqa: E741
        p, l, cls_token_id=CLS, sep_token_id=SEP, unknown_token_id=UNK))(pieces, labels)
    assert aligned["token_ids"].to_list() == [[CLS, 5, UNK, 6, 7, UNK, SEP], [CLS, UNK, 8, SEP]]
    assert aligned["labels"].to_list() == [[-100, 1, 2, 3, -100, 4, -100], [-100, 5, 6, -100]]
    assert aligned["word_ids"].to_list() == [[-1, 0, 1, 2, 2, 3, -1], [-1, 0, 1, -1]]
    assert aligned["num_words_without_pieces"].numpy().tolist() == [2, 1]
    # Without the id, the old contract: no position, filled by decode_word_labels.
    plain = align_word_labels(pieces, labels, cls_token_id=CLS, sep_token_id=SEP)
    assert plain["token_ids"].to_list() == [[CLS, 5, 6, 7, SEP], [CLS, 8, SEP]]
    with pytest.raises(ValueError, match=r"unknown_token_id.*Received: unknown_token_id=-1"):
        align_word_labels(pieces, cls_token_id=CLS, sep_token_id=SEP, unknown_token_id=-1)


# --- classification: words without pieces are absent; a text without any is an error ------


def write_tsv(path, rows):
    path.write_text("\n".join(["sentence\tlabel"] + rows) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("token, names", NO_PIECE, ids=NO_PIECE_IDS)
def test_a_text_with_some_words_without_pieces_is_encoded_without_them(tmp_path, token, names):
    path = write_tsv(tmp_path / "train.tsv", [f"good {token} film\t1", f"bad{token} plot\t0",
                                              f"{token}the film {token}\t1"])
    lines = []
    encoded = encode_texts(list(ClassificationReader(path, header=True)), tokenizer(),
                           LabelVocabulary(["0", "1"]), path, lines.append)
    # "bad\u00a0plot" is two words; "bad\u200b" and "bad\ufe0f" are "bad" once removed.
    assert [e["token_ids"].tolist() for e in encoded] == [
        [CLS, ID["good"], ID["film"], SEP], [CLS, ID["bad"], ID["plot"], SEP],
        [CLS, ID["the"], ID["film"], SEP]]
    assert [e["label"] for e in encoded] == [1, 0, 1] and lines == []


@pytest.mark.parametrize("text, names", NO_PIECE + [
    ("\u00a0\ufe0f \u200b", "U+00A0 NO-BREAK SPACE, U+FE0F VARIATION SELECTOR-16, "
                            "U+0020 SPACE, U+200B ZERO WIDTH SPACE")],
    ids=NO_PIECE_IDS + ["all_three"])
def test_a_text_without_any_piece_is_still_an_error(tmp_path, text, names):
    path = write_tsv(tmp_path / "dev.tsv", ["good film\t1", f"x{text}\t0", f"{text}\t0"])
    with pytest.raises(DataError, match="^" + re.escape(
            f"{path}:4: the text {text!r} ({names}) yields no word piece: ")):
        encode_texts(list(ClassificationReader(path, header=True)), tokenizer(),
                     LabelVocabulary(["0", "1"]), path, lambda message: None)


# --- prediction: aligned tags, no crash ----------------------------------------------------


@pytest.fixture(scope="module")
def random_tagger():
    keras.utils.set_random_seed(4)
    model = BertTokenClassifier(BertBackbone(
        vocabulary_size=len(VOCAB), num_layers=1, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=16), num_labels=len(TAGS))
    return model, tokenizer(sequence_length=16), LabelVocabulary(TAGS)


def test_prediction_of_pre_split_words_without_pieces_stays_aligned(random_tagger):
    """`ner_model_inputs` (explain, golden vectors) keeps the serving contract: a word without
    a piece gets no position and is filled with 'O', the other words keep theirs."""
    model, wordpiece, labels = random_tagger
    words = [["anna", "\u00a0", "met", "\ufe0f", "new", "york", "\u200b"]]
    inputs, word_ids, truncated = ner_model_inputs(wordpiece, words)
    assert inputs["token_ids"][0, :6].tolist() == [CLS, ID["anna"], ID["met"], ID["new"],
                                                   ID["york"], SEP]
    assert word_ids[0, :6].tolist() == [-1, 0, 2, 4, 5, -1] and truncated.tolist() == [0]
    scores = keras.ops.convert_to_numpy(model(inputs, training=False))
    tags, filled = decode_word_labels(scores, word_ids, [7], labels)
    argmax = [TAGS[i] for i in scores[0].argmax(-1)]
    assert filled == 3 and len(tags[0]) == 7
    assert [tags[0][i] for i in (1, 3, 6)] == ["O", "O", "O"]
    assert [tags[0][i] for i in (0, 2, 4, 5)] == [argmax[p] for p in (1, 2, 3, 4)]


def test_predicting_raw_text_with_these_characters_is_aligned(random_tagger):
    model, wordpiece, labels = random_tagger
    texts = ["anna\u00a0met \ufe0f ne\u200bw york \u200b", "\u200b\ufe0f", "\u00a0"]
    results = predict_entities(model, wordpiece, labels, texts)
    # NBSP separates words; U+200B (and U+FE0F, accents stripped) are removed by BERT's
    # splitting: "anna met new york" with the offsets of the original text.
    assert [[w for w, _, _ in r["words"]] for r in results] == [
        ["anna", "met", "new", "york"], [], []]
    assert results[0]["words"][2] == ("new", 11, 15)  # the removed U+200B inside its span
    assert [len(r["tags"]) for r in results] == [4, 0, 0]
    assert [r["num_filled_words"] for r in results] == [0, 0, 0]


# --- a real-world-like file trains with the defaults ----------------------------------------


def test_a_social_media_like_file_trains_and_reports_the_count(tmp_path):
    sentences = [
        (["@user", "anna", "\u00b4", "smith", "in", "paris", "\u2764", "\ufe0f"],
         ["O", "B-PER", "I-PER", "I-PER", "O", "B-LOC", "O", "O"]),
        (["new", "\u200b", "york", "!"], ["B-LOC", "I-LOC", "I-LOC", "O"]),
        (["the", "\u00a0", "film"], ["O", "O", "O"]),
    ]
    train, _ = write_conll(tmp_path / "train.txt", sentences * 4)
    dev, dev_lines = write_conll(tmp_path / "dev.txt", sentences)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    config = TrainingConfig.from_dict({
        "task": "ner", "output_dir": str(tmp_path / "run"),
        "data": {"train": train, "dev": dev, "max_length": 16},
        "model": {"preset": "bert_tiny", "vocabulary": str(vocab),
                  "overrides": {"num_layers": 1, "hidden_dim": 16, "num_heads": 2,
                                "intermediate_dim": 32, "max_sequence_length": 16}},
        "train": {"epochs": 1, "global_batch_size": 4, "log_every_steps": 1000,
                  "checkpoint_every_steps": 10000}})
    lines = []
    Trainer(config, log=lines.append).run()
    # The acute accent yields a piece once the tokenizer keeps it as BERT does (issue 50,
    # item 1); counted here only while it does not.
    accent = int(tokenizer().tokenize("\u00b4").shape[0] == 0)
    per_copy = 3 + accent
    notices = [line for line in lines if "yield no word piece" in line]
    assert [n.split(":")[0] for n in notices] == [train, dev]
    assert notices[0].startswith(f"{train}: {4 * per_copy} tokens yield")
    assert notices[1].startswith(f"{dev}: {per_copy} tokens yield")
    first = dev_lines[2] if accent else dev_lines[7]
    assert f"{dev}:{first} " in notices[1].split("scored: ")[1].split(", ")[0]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["best_dev"]["words_without_pieces"] == per_copy
    assert metrics["best_dev"]["sentences"] == 3
