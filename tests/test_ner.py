"""NER: first-subword alignment, decoding, BIO repair, spans, strict IOB2 metrics vs seqeval."""

import random
import warnings

import numpy as np
import pytest
import tensorflow as tf
from seqeval.metrics import classification_report
from seqeval.metrics import f1_score
from seqeval.metrics import precision_score
from seqeval.metrics import recall_score
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB2

from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.ner import IGNORE_LABEL
from keras_attn.text.ner import Entity
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_scores
from keras_attn.text.ner import entity_spans
from keras_attn.text.ner import iob2_entities
from keras_attn.text.ner import repair_iob2
from keras_attn.text.ner import word_offsets_from_subwords
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

CLS, SEP = 101, 102


def reference_alignment(sentence_pieces, sentence_labels, sequence_length):
    """Plain-Python first-subword alignment of one sentence."""
    tokens, labels, word_ids = [CLS], [IGNORE_LABEL], [-1]
    for word, (pieces, label) in enumerate(zip(sentence_pieces, sentence_labels)):
        for k, piece in enumerate(pieces):
            tokens.append(piece)
            labels.append(label if k == 0 else IGNORE_LABEL)
            word_ids.append(word)
    truncated_words = 0
    if sequence_length is not None and len(tokens) + 1 > sequence_length:
        truncated_words = len({w for w in word_ids[sequence_length - 1:]}
                              - set(word_ids[:sequence_length - 1]))
        tokens, labels, word_ids = (x[:sequence_length - 1] for x in (tokens, labels, word_ids))
    return tokens + [SEP], labels + [IGNORE_LABEL], word_ids + [-1], truncated_words


@pytest.mark.parametrize("sequence_length", [None, 6, 9])
def test_alignment_matches_reference(sequence_length):
    rng = random.Random(sequence_length or 0)
    pieces, labels = [], []
    for _ in range(12):
        words = rng.randint(1, 6)
        pieces.append([[rng.randint(1000, 2000) for _ in range(rng.choice([1, 1, 2, 3]))]
                       for _ in range(words)])
        labels.append([rng.randint(0, 8) for _ in range(words)])
    out = align_word_labels(tf.ragged.constant(pieces, ragged_rank=2, dtype=tf.int32),
                            tf.ragged.constant(labels), cls_token_id=CLS, sep_token_id=SEP,
                            sequence_length=sequence_length)
    for row in range(12):
        tokens, row_labels, word_ids, truncated = reference_alignment(
            pieces[row], labels[row], sequence_length)
        assert out["token_ids"][row].numpy().tolist() == tokens
        assert out["labels"][row].numpy().tolist() == row_labels
        assert out["word_ids"][row].numpy().tolist() == word_ids
        assert out["segment_ids"][row].numpy().tolist() == [0] * len(tokens)
        assert out["padding_mask"][row].numpy().all()
        assert int(out["num_truncated_words"][row]) == truncated
    if sequence_length:
        assert max(out["token_ids"].row_lengths().numpy()) <= sequence_length
        assert int(tf.reduce_sum(out["num_truncated_words"])) > 0


def test_alignment_dense_labels_in_dataset_map_and_zero_piece_words():
    pieces = tf.ragged.constant([[[5], [], [6, 7]], [[8], [9], [10]]], ragged_rank=2)
    out = align_word_labels(pieces, tf.constant([[1, 2, 3], [4, 5, 6]]), cls_token_id=CLS,
                            sep_token_id=SEP)
    assert out["labels"].to_list() == [[-100, 1, 3, -100, -100], [-100, 4, 5, 6, -100]]
    assert out["num_words_without_pieces"].numpy().tolist() == [1, 0]
    dataset = tf.data.Dataset.from_tensor_slices({"pieces": pieces, "tags": [[1, 2, 3]] * 2})
    dataset = dataset.map(lambda x: {k: v[0] for k, v in align_word_labels(
        x["pieces"][None], x["tags"][None], cls_token_id=CLS, sep_token_id=SEP,
        sequence_length=4).items()})
    first = next(iter(dataset))
    assert first["token_ids"].numpy().tolist() == [CLS, 5, 6, SEP]
    assert first["labels"].numpy().tolist() == [-100, 1, 3, -100]


def test_alignment_errors():
    with pytest.raises(ValueError, match="word_piece_ids"):
        align_word_labels(tf.constant([[1, 2]]), cls_token_id=CLS, sep_token_id=SEP)
    pieces = tf.ragged.constant([[[5], [6]]], ragged_rank=2)
    with pytest.raises(ValueError, match="sequence_length"):
        align_word_labels(pieces, cls_token_id=CLS, sep_token_id=SEP, sequence_length=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one label per word"):
        align_word_labels(pieces, tf.ragged.constant([[1, 2, 3]]), cls_token_id=CLS,
                          sep_token_id=SEP)


def test_decode_word_labels_takes_first_subword():
    vocabulary = LabelVocabulary(["O", "B-PER", "I-PER"])
    word_ids = np.array([[-1, 0, 0, 1, 2, -1, -1], [-1, 0, 1, -1, -1, -1, -1]])
    logits = np.zeros((2, 7, 3))
    predictions = np.array([[0, 1, 0, 2, 0, 0, 0], [0, 2, 1, 0, 0, 0, 0]])
    logits[np.arange(2)[:, None], np.arange(7)[None, :], predictions] = 1.0
    labels, filled = decode_word_labels(logits, word_ids, [3, 3], vocabulary)
    # Word 0 of row 0 predicts B-PER at its first subword (its second subword says O).
    assert labels == [["B-PER", "I-PER", "O"], ["I-PER", "B-PER", "O"]]
    assert filled == 1  # word 2 of row 1 had no subword (truncated)
    with pytest.raises(ValueError, match="must agree"):
        decode_word_labels(predictions[:, :3], word_ids, [3, 3])


def test_repair_rules_and_conlleval_equivalence():
    assert repair_iob2(["O", "I-X"]) == (["O", "B-X"], 1)
    assert repair_iob2(["B-X", "I-Y"]) == (["B-X", "B-Y"], 1)
    assert repair_iob2(["I-X", "I-X", "B-X", "I-X"]) == (["B-X", "I-X", "B-X", "I-X"], 1)
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    for _ in range(500):
        sequence = [rng.choice(tags) for _ in range(rng.randint(0, 12))]
        repaired, _ = repair_iob2(sequence)
        assert repair_iob2(repaired) == (repaired, 0)  # valid IOB2 afterwards
        # Strict entities of the repaired tags == conlleval entities of the original
        # (seqeval's default, non-strict chunking).
        expected = [Entity(t, s, e + 1) for t, s, e in get_entities(sequence)]
        assert iob2_entities(repaired) == expected


def random_tags(rng, length, types=("PER", "LOC", "ORG")):
    tags = []
    for _ in range(length):
        r = rng.random()
        tags.append("O" if r < 0.4 else ("B-" if r < 0.7 else "I-") + rng.choice(types))
    return tags


def seqeval_strict(y_true, y_pred):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (precision_score(y_true, y_pred, mode="strict", scheme=IOB2),
                recall_score(y_true, y_pred, mode="strict", scheme=IOB2),
                f1_score(y_true, y_pred, mode="strict", scheme=IOB2),
                classification_report(y_true, y_pred, mode="strict", scheme=IOB2,
                                      output_dict=True))


def test_entity_scores_equal_seqeval_strict_on_random_invalid_sequences():
    rng = random.Random(1)
    for trial in range(300):
        lengths = [rng.randint(0, 10) for _ in range(rng.randint(1, 6))]
        # Random tags are mostly invalid IOB2 (I- after O, type changes inside an entity).
        y_true = [random_tags(rng, n) for n in lengths]
        y_pred = [random_tags(rng, len(s)) if rng.random() < 0.5 else
                  [t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC"]) for t in s]
                  for s in y_true]
        scores = entity_scores(y_true, y_pred)
        precision, recall, f1, report = seqeval_strict(y_true, y_pred)
        assert scores["precision"] == pytest.approx(precision, abs=1e-12), trial
        assert scores["recall"] == pytest.approx(recall, abs=1e-12), trial
        assert scores["f1"] == pytest.approx(f1, abs=1e-12), trial
        for entity_type, values in scores["per_type"].items():
            if values["support"]:
                assert values["f1"] == pytest.approx(report[entity_type]["f1-score"]), trial
                assert values["support"] == report[entity_type]["support"]


def test_iob2_entities_strict_examples():
    assert iob2_entities(["I-PER", "I-PER", "O"]) == []
    assert iob2_entities(["B-PER", "I-LOC", "I-LOC"]) == [Entity("PER", 0, 1)]
    assert iob2_entities(["B-PER", "B-PER", "I-PER"]) == [Entity("PER", 0, 1),
                                                          Entity("PER", 1, 3)]
    with pytest.raises(ValueError, match="Malformed tag 'B_PER' at position 1"):
        iob2_entities(["O", "B_PER"])
    with pytest.raises(ValueError, match="Sentence 0 has 2 true tags but 1"):
        entity_scores([["O", "O"]], [["O"]])


def test_entity_spans_with_word_and_subword_offsets():
    text = "Peter Blackburn flew to New York"
    offsets = [(0, 5), (6, 15), (16, 20), (21, 23), (24, 27), (28, 32)]
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC"]
    assert entity_spans(tags, offsets, text) == [
        {"type": "PER", "start_word": 0, "end_word": 2, "start_char": 0, "end_char": 15,
         "text": "Peter Blackburn"},
        {"type": "LOC", "start_word": 4, "end_word": 6, "start_char": 24, "end_char": 32,
         "text": "New York"}]
    # Subword offsets: "Black" "##burn" make one word.
    starts = [0, 0, 6, 11, 16]
    ends = [0, 5, 11, 15, 20]
    assert word_offsets_from_subwords(starts, ends, [-1, 0, 1, 1, 2], 3) == [
        (0, 5), (6, 15), (16, 20)]


def test_conll_valid_gold_vs_perturbed_prediction():
    gold = list(ConllReader(shared_data_file("conll2003/valid.txt")).tags())
    rng = random.Random(7)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    predicted = [[t if rng.random() < 0.9 else rng.choice(tags) for t in s] for s in gold]
    scores = entity_scores(gold, predicted)
    precision, recall, f1, report = seqeval_strict(gold, predicted)
    assert scores["true_entities"] == 5942
    assert (scores["precision"], scores["recall"], scores["f1"]) == pytest.approx(
        (precision, recall, f1), abs=1e-12)
    for entity_type in ("PER", "LOC", "ORG", "MISC"):
        assert scores["per_type"][entity_type]["f1"] == pytest.approx(
            report[entity_type]["f1-score"], abs=1e-12)
    assert entity_scores(gold, gold)["f1"] == 1.0
    # Repair gives conlleval credit: never fewer correct entities than strict scoring.
    repaired = [repair_iob2(s)[0] for s in predicted]
    assert entity_scores(gold, repaired)["correct_entities"] >= scores["correct_entities"]


def test_conll_alignment_round_trip_with_wordpiece_tokenizer():
    tokenizer = WordPieceTokenizer(str(minilm_directory() / "vocab.txt"))
    reader = ConllReader(shared_data_file("conll2003/valid.txt"))
    vocabulary = LabelVocabulary.build(reader.tags())
    sentences = [s for _, s in zip(range(200), reader)]
    lengths = [len(s.tokens) for s in sentences]
    pieces = tokenizer.tokenize_words([s.tokens for s in sentences])  # (B, W, None)
    labels = tf.ragged.constant([vocabulary.encode(s.tags) for s in sentences])
    out = align_word_labels(pieces, labels, cls_token_id=tokenizer.cls_token_id,
                            sep_token_id=tokenizer.sep_token_id, sequence_length=128)
    assert int(tf.reduce_sum(out["num_words_without_pieces"])) == 0
    truncated = int(tf.reduce_sum(out["num_truncated_words"]))
    assert truncated == 0
    # Every word has exactly one labelled position: its first subword.
    labelled = tf.reduce_sum(tf.cast(out["labels"] != IGNORE_LABEL, tf.int32), axis=1)
    assert labelled.numpy().tolist() == lengths
    # Using the gold labels as predictions decodes back to the gold tags.
    predictions = out["labels"].to_tensor(default_value=0).numpy()
    word_ids = out["word_ids"].to_tensor(default_value=-1).numpy()
    decoded, filled = decode_word_labels(predictions, word_ids, lengths, vocabulary)
    assert filled == 0
    assert decoded == [s.tags for s in sentences]
