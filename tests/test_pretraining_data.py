"""MLM masking statistics, special tokens, whole words, determinism; NSP pairs."""

import math
import random

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.text.errors import DataError
from keras_attn.text.pretraining_data import MaskedLMMasker
from keras_attn.text.pretraining_data import NextSentencePairs
from keras_attn.text.raw_text_reader import RawTextReader
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)] + [
    f"##p{i}" for i in range(100)]  # ids 100..199 are continuation pieces
SPECIAL = {PAD, UNK, CLS, SEP, MASK}


def binomial_tolerance(n, p, sigmas=4.5):
    """Half-width of a +-4.5 sigma interval of a Binomial(n, p) proportion (false-failure
    probability ~7e-6 per check)."""
    return sigmas * math.sqrt(p * (1 - p) / n)


def random_batch(batch=1000, length=48, seed=0, continuation_rate=0.0):
    """[CLS] words [SEP] padding, with random lengths; returns ids (B, S)."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, length), PAD, np.int32)
    for row in range(batch):
        n = rng.integers(1, length - 1)
        body = rng.integers(5, 100, n)
        continuation = rng.random(n) < continuation_rate
        body[continuation] = rng.integers(100, 200, continuation.sum())
        ids[row, : n + 2] = [CLS, *body, SEP]
    return ids


def test_selection_count_fraction_and_80_10_10():
    ids = random_batch()
    masker = MaskedLMMasker.from_vocabulary(VOCABULARY, max_predictions=8)
    out = masker({"token_ids": tf.constant(ids)}, seed=tf.constant([3, 4]))
    corrupted = out["token_ids"].numpy()
    positions, mask_ids = out["mask_positions"].numpy(), out["mask_ids"].numpy()
    weights = out["mask_weights"].numpy()
    candidates = ~np.isin(ids, [CLS, SEP, PAD])
    n = candidates.sum(axis=1)
    # BERT's count: min(max_predictions, max(1, round(0.15 n))), Python's rounding.
    expected = [min(8, max(1, int(round(k * 0.15)))) for k in n]
    assert weights.sum(axis=1).astype(int).tolist() == expected
    fraction = weights.sum() / n.sum()
    assert abs(fraction - 0.15) < 0.02, fraction  # cap of 8 and rounding only
    uncapped = n * 0.15 < 7.5
    uncapped_fraction = weights[uncapped].sum() / n[uncapped].sum()
    assert abs(uncapped_fraction - 0.15) < 0.5 / n[uncapped].mean() + 0.01

    selected = np.zeros_like(candidates)
    for row in range(len(ids)):
        valid = weights[row] == 1
        rows_positions = positions[row][valid]
        assert (np.diff(rows_positions) > 0).all()  # increasing, no duplicates
        assert (mask_ids[row][valid] == ids[row][rows_positions]).all()
        assert (positions[row][~valid] == 0).all() and (mask_ids[row][~valid] == 0).all()
        selected[row, rows_positions] = True
    assert not (selected & ~candidates).any()  # [CLS], [SEP], padding never selected
    assert (corrupted[~selected] == ids[~selected]).all()  # only selected tokens change

    total = selected.sum()
    masked = (corrupted[selected] == MASK).sum()
    unchanged = (corrupted[selected] == ids[selected]).sum()
    replaced = total - masked - unchanged
    assert abs(masked / total - 0.8) < binomial_tolerance(total, 0.8)
    assert abs(replaced / total - 0.1) < binomial_tolerance(total, 0.1)
    assert abs(unchanged / total - 0.1) < binomial_tolerance(total, 0.1)
    random_ids = corrupted[selected & (corrupted != MASK) & (corrupted != ids)]
    assert not set(random_ids.tolist()) & SPECIAL  # random replacements are never specials


def test_padding_mask_input_and_rank_one():
    masker = MaskedLMMasker(200, MASK, [CLS, SEP, PAD], selection_rate=1.0, max_predictions=10)
    ids = tf.constant([CLS, 10, 11, 12, 13, SEP, 14, 15])
    mask = tf.constant([True] * 6 + [False] * 2)  # 14, 15 are padding by the mask
    out = masker({"token_ids": ids, "padding_mask": mask}, seed=[0, 1])
    assert out["mask_positions"].numpy().tolist() == [1, 2, 3, 4] + [0] * 6
    assert out["mask_weights"].numpy().tolist() == [1.0] * 4 + [0.0] * 6
    assert out["padding_mask"] is mask  # other features pass through
    assert out["token_ids"].numpy()[5:].tolist() == [SEP, 14, 15]


def test_whole_word_masking_selects_whole_words():
    ids = random_batch(batch=600, seed=1, continuation_rate=0.4)
    masker = MaskedLMMasker.from_vocabulary(VOCABULARY, max_predictions=12,
                                            whole_word_masking=True)
    out = masker({"token_ids": tf.constant(ids)}, seed=tf.constant([5, 6]))
    positions, weights = out["mask_positions"].numpy(), out["mask_weights"].numpy()
    candidates = ~np.isin(ids, [CLS, SEP, PAD])
    total_selected = 0
    for row in range(len(ids)):
        chosen = set(positions[row][weights[row] == 1].tolist())
        total_selected += len(chosen)
        budget = min(12, max(1, int(round(candidates[row].sum() * 0.15))))
        assert len(chosen) <= budget
        # Words: a non-continuation candidate and the continuation pieces after it.
        words, current = [], None
        for position in np.flatnonzero(candidates[row]):
            if ids[row, position] < 100 or current is None:
                current = [position]
                words.append(current)
            else:
                current.append(position)
        for word in words:
            flags = {position in chosen for position in word}
            assert len(flags) == 1, (row, word, chosen)  # all pieces or none
    fraction = total_selected / candidates.sum()
    assert 0.10 < fraction <= 0.15, fraction


def test_masking_is_deterministic_given_the_seed():
    ids = tf.constant(random_batch(batch=16, seed=2))
    masker = MaskedLMMasker.from_vocabulary(VOCABULARY, seed=11)
    first = masker({"token_ids": ids}, seed=[1, 2])
    again = masker({"token_ids": ids}, seed=[1, 2])
    other = masker({"token_ids": ids}, seed=[1, 3])
    for key in ("token_ids", "mask_positions", "mask_ids", "mask_weights"):
        assert (first[key].numpy() == again[key].numpy()).all()
    assert (first["mask_positions"].numpy() != other["mask_positions"].numpy()).any()
    dataset = tf.data.Dataset.from_tensor_slices({"token_ids": ids}).batch(4)

    def run(masker):
        return [b["token_ids"].numpy() for b in masker.map(dataset)]

    runs = run(masker), run(masker), run(MaskedLMMasker.from_vocabulary(VOCABULARY, seed=12))
    assert all((a == b).all() for a, b in zip(runs[0], runs[1]))
    assert any((a != b).any() for a, b in zip(runs[0], runs[2]))
    # Each batch gets its own seed: equal inputs in different batches are masked differently.
    same = tf.data.Dataset.from_tensors({"token_ids": ids[:4]}).repeat(2)
    a, b = [x["mask_positions"].numpy() for x in masker.map(same)]
    assert (a != b).any()


def test_masker_argument_errors():
    with pytest.raises(ValueError, match="mask_token_rate \\+ random_token_rate"):
        MaskedLMMasker(10, 4, [0], mask_token_rate=0.9, random_token_rate=0.2)
    with pytest.raises(ValueError, match="continuation_token_ids"):
        MaskedLMMasker(10, 4, [0], whole_word_masking=True)
    with pytest.raises(ValueError, match="unselectable_token_ids"):
        MaskedLMMasker(10, 4, [10])
    with pytest.raises(ValueError, match="selection_rate"):
        MaskedLMMasker(10, 4, [0], selection_rate=1.5)
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        MaskedLMMasker.from_vocabulary(["[PAD]", "[CLS]", "[SEP]", "a"])


def documents(num_documents, seed=0):
    rng = random.Random(seed)
    return [[f"d{d}s{i}" for i in range(rng.randint(1, 8))] for d in range(num_documents)]


def parse(sentence):
    document, index = sentence[1:].split("s")
    return int(document), int(index)


@pytest.mark.parametrize("buffer_size", [2, 5, 1000])
def test_nsp_pairs_balance_and_other_document(buffer_size):
    docs = documents(400)
    pairs = NextSentencePairs(docs, seed=1, buffer_size=buffer_size)
    result = list(pairs)
    assert len(result) == sum(len(d) - 1 for d in docs)
    randoms = 0
    for pair in result:
        (doc_a, index_a), (doc_b, index_b) = parse(pair["text"]), parse(pair["text_pair"])
        if pair["next_sentence_label"] == 0:
            assert (doc_b, index_b) == (doc_a, index_a + 1)  # the actual next sentence
        else:
            randoms += 1
            assert doc_b != doc_a  # a sentence of ANOTHER document
            assert abs(doc_b - doc_a) < buffer_size + 1 or buffer_size >= 400
    assert abs(randoms / len(result) - 0.5) < binomial_tolerance(len(result), 0.5)
    report = pairs.report.as_dict()
    assert report["pairs"] == len(result) and report["random_next"] == randoms
    assert report["documents_without_pairs"] == sum(len(d) == 1 for d in docs)
    again = list(NextSentencePairs(docs, seed=1, buffer_size=buffer_size))
    assert again == result  # deterministic
    assert list(NextSentencePairs(docs, seed=2, buffer_size=buffer_size)) != result


def test_nsp_needs_two_documents(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("Only one.\nDocument here.\n")
    with pytest.raises(DataError, match=r"one\.txt:1: next-sentence pairs need at least 2"):
        list(NextSentencePairs(RawTextReader(path), seed=0))


def test_pretraining_pipeline_with_wordpiece_tokenizer(tmp_path):
    vocab = str(minilm_directory() / "vocab.txt")
    path = tmp_path / "corpus.txt"
    path.write_text("The cat sat on the mat.\nIt purred loudly.\nThen it slept.\n\n"
                    "Rain fell on the city.\nThe streets were wet.\n\n"
                    "Stock markets rallied today.\nInvestors cheered.\n")
    tokenizer = WordPieceTokenizer(vocab, sequence_length=16)
    masker = MaskedLMMasker.from_vocabulary(vocab, max_predictions=4, seed=5)
    pairs = NextSentencePairs(RawTextReader(path), seed=0).as_dataset().batch(2)
    dataset = masker.map(pairs.map(lambda x: tokenizer(x["text"], x["text_pair"])))
    batches = list(dataset)
    assert sum(int(b["token_ids"].shape[0]) for b in batches) == 4  # 2 + 1 + 1 pairs
    specials = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    for batch in batches:
        assert tuple(batch["mask_positions"].shape[1:]) == (4,)
        positions = batch["mask_positions"].numpy()
        weights = batch["mask_weights"].numpy()
        ids = batch["mask_ids"].numpy()[weights == 1]
        assert ids.size > 0 and not set(ids.tolist()) & specials
        chosen = positions[weights == 1]
        rows = np.nonzero(weights == 1)[0]
        assert batch["padding_mask"].numpy()[rows, chosen].all() and (chosen > 0).all()
    # The masker changes nothing but the selected positions, whose originals are `mask_ids`.
    plain = list(pairs.map(lambda x: tokenizer(x["text"], x["text_pair"])))
    for batch, unmasked in zip(batches, plain):
        restored = batch["token_ids"].numpy().copy()
        weights = batch["mask_weights"].numpy()
        rows, slots = np.nonzero(weights == 1)
        restored[rows, batch["mask_positions"].numpy()[rows, slots]] = (
            batch["mask_ids"].numpy()[rows, slots])
        assert (restored == unmasked["token_ids"].numpy()).all()
