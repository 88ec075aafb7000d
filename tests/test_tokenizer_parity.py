"""WordPieceTokenizer == HF `tokenizers` (MiniLM's tokenizer.json) on any text.

Ids and offsets are compared on real data (SST-2, CoNLL-2003, Multi30k German and English,
Shakespeare), the hard cases, every assigned code point up to U+1FFFF alone and inside a word,
random strings mixing characters of every kind, in the uncased and cased modes and the two
mixed ones, and with a cased vocabulary. No difference is allowed.
"""

import random
import unicodedata

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text
import tokenizers
import tokenizers.normalizers

from keras_attn.text.fused_bert_path import FUSED_SAFE_CASED
from keras_attn.text.fused_bert_path import FUSED_SAFE_UNCASED
from keras_attn.text.hard_cases import TOKENIZER_HARD_CASES
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory
from tests.resources import shared_data_file

# The tokenizer is TensorFlow by design (tf-text): the JAX stage has nothing to add here.
pytestmark = pytest.mark.tensorflow

HARD_CASES = TOKENIZER_HARD_CASES
MODES = [(True, True), (False, False), (True, False), (False, True)]
# Every assigned code point up to U+1FFFF (Python 3.11's Unicode 14.0), surrogates aside.
ASSIGNED = [c for c in range(0x20000)
            if unicodedata.category(chr(c)) not in ("Cn", "Cs")]


def _hf_tokenizer(model_dir, lowercase=True, strip_accents=None, vocabulary=None):
    if vocabulary is None:
        hf = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    else:
        hf = tokenizers.BertWordPieceTokenizer(
            {token: index for index, token in enumerate(vocabulary)}, lowercase=lowercase)
    hf.no_truncation()
    hf.no_padding()
    hf.normalizer = tokenizers.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents,
        lowercase=lowercase)
    return hf


def _differences(ours, reference, texts):
    """Texts whose ids or offsets differ, with both answers (at most 5)."""
    ids, starts, ends = ours.tokenize_with_offsets(texts)
    encodings = reference.encode_batch(texts, add_special_tokens=False)
    rows = zip(texts, ids.to_list(), starts.to_list(), ends.to_list(), encodings)
    return [(text, row, list(zip(s, e)), enc.ids, enc.offsets)
            for text, row, s, e, enc in rows
            if row != enc.ids or list(zip(s, e)) != enc.offsets][:5]


@pytest.fixture(scope="module")
def model_dir():
    return minilm_directory()


@pytest.fixture(scope="module")
def ours(model_dir):
    return WordPieceTokenizer(str(model_dir / "vocab.txt"))


@pytest.fixture(scope="module")
def reference(model_dir):
    hf = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    hf.no_truncation()
    hf.no_padding()
    return hf


@pytest.fixture(scope="module")
def sst2_dev():
    lines = shared_data_file("sst2/dev.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines[1:]]


@pytest.fixture(scope="module")
def conll_valid():
    sentences, words = [], []
    for line in shared_data_file("conll2003/valid.txt").read_text(encoding="utf-8").split("\n"):
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split(" ")[0])
        elif words:
            sentences.append(words)
            words = []
    if words:
        sentences.append(words)
    return sentences


def _compare(ours, reference, texts):
    ids, starts, ends = ours.tokenize_with_offsets(texts)
    encodings = reference.encode_batch(texts, add_special_tokens=False)
    same_ids = [a == e.ids for a, e in zip(ids.to_list(), encodings)]
    same_offsets = [
        list(zip(s, t)) == e.offsets for s, t, e in zip(starts.to_list(), ends.to_list(), encodings)
    ]
    return same_ids, same_offsets


def test_sst2_dev_identical_ids_and_offsets(ours, reference, sst2_dev):
    same_ids, same_offsets = _compare(ours, reference, sst2_dev)
    assert len(sst2_dev) == 872
    assert sum(same_ids) == 872, [t for t, s in zip(sst2_dev, same_ids) if not s][:5]
    assert sum(same_offsets) == 872


def test_conll_valid_identical_ids_and_offsets(ours, reference, conll_valid):
    texts = [" ".join(words) for words in conll_valid]
    same_ids, same_offsets = _compare(ours, reference, texts)
    assert len(texts) == 3250
    assert sum(same_ids) == 3250, [t for t, s in zip(texts, same_ids) if not s][:5]
    assert sum(same_offsets) == 3250


@pytest.mark.parametrize("lowercase, strip_accents", [(False, False), (True, False), (False, True)])
def test_other_normalization_modes_match_hf_bert_normalizer(
    model_dir, sst2_dev, conll_valid, lowercase, strip_accents
):
    ours = WordPieceTokenizer(
        str(model_dir / "vocab.txt"), lowercase=lowercase, strip_accents=strip_accents
    )
    reference = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.no_truncation()
    reference.no_padding()
    reference.normalizer = tokenizers.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    texts = sst2_dev + [" ".join(words) for words in conll_valid]
    same_ids, same_offsets = _compare(ours, reference, texts)
    assert (sum(same_ids), sum(same_offsets)) == (len(texts), len(texts))


def test_conll_words_match_hf_pretokenized_word_ids(ours, reference, conll_valid):
    ragged = ours.tokenize_words(conll_valid)  # (B, W, None)
    # RaggedTensor.to_list() takes ~30 s here; rebuild the nested lists from the splits.
    flat = ragged.flat_values.numpy().tolist()
    word_splits = ragged.values.row_splits.numpy()
    word_pieces = [flat[a:b] for a, b in zip(word_splits[:-1], word_splits[1:])]
    sentence_splits = ragged.row_splits.numpy()
    pieces = [word_pieces[a:b] for a, b in zip(sentence_splits[:-1], sentence_splits[1:])]
    encodings = reference.encode_batch(conll_valid, is_pretokenized=True, add_special_tokens=False)
    mismatches = 0
    for words, sentence_pieces, encoding in zip(conll_valid, pieces, encodings):
        grouped = [[] for _ in words]
        for token_id, word_id in zip(encoding.ids, encoding.word_ids):
            grouped[word_id].append(token_id)
        mismatches += grouped != sentence_pieces
    assert mismatches == 0


@pytest.mark.parametrize("truncation", ["longest_first", "only_first", "only_second"])
def test_pair_packing_and_truncation_match_hf(ours, model_dir, sst2_dev, truncation):
    length = 24
    tokenizer = WordPieceTokenizer(
        str(model_dir / "vocab.txt"), sequence_length=length, truncation=truncation
    )
    first, second = sst2_dev[:400:2], sst2_dev[1:400:2]
    if truncation != "longest_first":
        # HF refuses examples the chosen segment cannot absorb; so do we (tested elsewhere).
        lengths_a = ours.tokenize(first).row_lengths().numpy()
        lengths_b = ours.tokenize(second).row_lengths().numpy()
        target = lengths_a if truncation == "only_first" else lengths_b
        excess = np.maximum(lengths_a + lengths_b - (length - 3), 0)
        keep = (excess == 0) | (target > excess)
        first = [t for t, k in zip(first, keep) if k]
        second = [t for t, k in zip(second, keep) if k]
    reference = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.enable_truncation(length, strategy=truncation)
    reference.enable_padding(length=length)
    encodings = reference.encode_batch(list(zip(first, second)))
    out = tokenizer(first, second, return_num_truncated=True)
    np.testing.assert_array_equal(out["token_ids"], [e.ids for e in encodings])
    np.testing.assert_array_equal(out["segment_ids"], [e.type_ids for e in encodings])
    np.testing.assert_array_equal(out["padding_mask"], [e.attention_mask for e in encodings])
    assert len(first) > 50 and int(np.sum(out["num_truncated"])) > 0
    reference.no_truncation()
    reference.no_padding()
    untruncated = [len(e.ids) for e in reference.encode_batch(list(zip(first, second)))]
    kept = [sum(e.attention_mask) for e in encodings]
    np.testing.assert_array_equal(out["num_truncated"], np.subtract(untruncated, kept))


def test_single_truncation_matches_hf(model_dir, sst2_dev):
    tokenizer = WordPieceTokenizer(str(model_dir / "vocab.txt"), sequence_length=16)
    reference = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference.enable_truncation(16)
    reference.enable_padding(length=16)
    encodings = reference.encode_batch(sst2_dev[:200])
    out = tokenizer(sst2_dev[:200])
    np.testing.assert_array_equal(out["token_ids"], [e.ids for e in encodings])
    np.testing.assert_array_equal(out["padding_mask"], [e.attention_mask for e in encodings])


def test_hard_cases_identical(ours, reference):
    assert _differences(ours, reference, HARD_CASES) == []


def test_issue_examples(ours, reference):
    # Seen on real social-media text: HF keeps "…" (in the vocabulary), "ß", "ĳ" and "´".
    texts = ["wait…", "heiße", "ĳ", "a´b", "ω" * 51, "e\u0301t\u00e9"]
    tokens = [[ours.id_to_token(i) for i in row] for row in ours.tokenize(texts).to_list()]
    # "ĳ" is not in MiniLM's vocabulary: one [UNK], where tf-text made it "ij".
    assert tokens[:4] == [["wait", "…"], ["he", "##i", "##ße"], ["[UNK]"], ["a", "##´", "##b"]]
    assert tokens[4] == ["ω"] + ["##ω"] * 50  # 51 characters: within BERT's 100
    assert _differences(ours, reference, texts) == []


@pytest.mark.parametrize("lowercase, strip_accents", MODES)
def test_every_assigned_code_point_alone_and_inside_a_word(model_dir, lowercase, strip_accents):
    ours = WordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=lowercase,
                              strip_accents=strip_accents)
    reference = _hf_tokenizer(model_dir, lowercase, strip_accents)
    # The mixed modes share their steps with the two usual ones: inside a word suffices.
    templates = ("{}", "a{}b") if lowercase == strip_accents else ("a{}b",)
    for template in templates:
        texts = [template.format(chr(c)) for c in ASSIGNED]
        assert _differences(ours, reference, texts) == [], template


@pytest.mark.parametrize("lowercase, strip_accents", MODES)
def test_random_mixtures_of_every_kind_of_character(model_dir, lowercase, strip_accents):
    ours = WordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=lowercase,
                              strip_accents=strip_accents)
    reference = _hf_tokenizer(model_dir, lowercase, strip_accents)
    rng = random.Random(7)
    # Letters, marks, punctuation, spaces, controls, CJK, emoji, unassigned, private use.
    pool = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    common = list("Ab c,.'é\u0301\u200b\t…ßİ한中😀\ue000\u0378")
    texts = ["".join(rng.choice(pool) if rng.random() < 0.3 else rng.choice(common)
                     for _ in range(rng.randrange(0, 60))) for _ in range(2000)]
    assert _differences(ours, reference, texts) == []


def test_cased_vocabulary(model_dir):
    # A cased vocabulary: MiniLM's with a capitalized copy of its words appended.
    vocabulary = (model_dir / "vocab.txt").read_text("utf-8").splitlines()
    extra = [t.capitalize() for t in vocabulary[1000:8000] if t.isalpha()]
    extra += ["##" + t.capitalize() for t in vocabulary[1000:8000] if t.isalpha()]
    known = set(vocabulary)
    vocabulary += [t for t in dict.fromkeys(extra) if t not in known]
    ours = WordPieceTokenizer(vocabulary, lowercase=False)
    reference = _hf_tokenizer(model_dir, lowercase=False, vocabulary=vocabulary)
    texts = HARD_CASES + ["Heiße Straße in München…", "The Cat sat ON the Mat"]
    texts += [chr(c) + "Ab" + chr(c) for c in ASSIGNED[::97]]
    ids = ours.tokenize(["The Cat"]).to_list()[0]
    assert [vocabulary[i] for i in ids] == ["The", "Cat"]
    assert _differences(ours, reference, texts) == []


def _multi30k_and_shakespeare(splits):
    texts = []
    for language in ("de", "en"):
        for split in splits:
            path = shared_data_file(f"multi30k/{split}.{language}")
            texts += path.read_text("utf-8").splitlines()
    for split in ("test", "valid") + (("train",) if "train" in splits else ()):
        texts += shared_data_file(f"shakespeare/{split}.txt").read_text("utf-8").splitlines()
    return texts


def test_multi30k_and_shakespeare_evaluation_splits(ours, reference):
    texts = _multi30k_and_shakespeare(("val", "test_2016_flickr"))
    assert len(texts) > 14_000 and any("ß" in t for t in texts)
    assert _differences(ours, reference, texts) == []


@pytest.mark.slow
def test_every_sentence_of_the_shared_corpora(ours, reference, conll_valid):
    texts = _multi30k_and_shakespeare(("train", "val", "test_2016_flickr"))
    for split in ("train", "dev", "test"):
        lines = shared_data_file(f"sst2/{split}.tsv").read_text("utf-8").splitlines()[1:]
        texts += [line.split("\t")[0] for line in lines]
    for split in ("train", "test"):
        words, sentence = [], []
        for line in shared_data_file(f"conll2003/{split}.txt").read_text("utf-8").split("\n"):
            if line.strip() and not line.startswith("-DOCSTART-"):
                sentence.append(line.split(" ")[0])
            elif sentence:
                words.append(" ".join(sentence))
                sentence = []
        texts += words
    for start in range(0, len(texts), 20_000):
        assert _differences(ours, reference, texts[start:start + 20_000]) == []


@pytest.mark.slow
def test_every_code_point_inside_a_word(ours, reference):
    """All 1,112,064 code points as "a{c}b", assigned or not."""
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(code_points), 100_000):
        texts = [f"a{chr(c)}b" for c in code_points[start:start + 100_000]]
        assert _differences(ours, reference, texts) == []


@pytest.mark.parametrize("lowercase, pattern", [(True, FUSED_SAFE_UNCASED),
                                                 (False, FUSED_SAFE_CASED)])
def test_fused_kernels_equal_bert_on_their_characters(lowercase, pattern):
    # Texts made only of these characters take tf-text's fused kernels: each character must
    # normalize there as in BERT, to one printable ASCII character or a space.
    codes = [c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF]
    matches = tf.strings.regex_full_match([chr(c) for c in codes], f"[{pattern}]").numpy()
    safe = [c for c, match in zip(codes, matches) if match]
    fused = tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=lowercase)
    got = [t.decode() for t in fused.normalize(tf.constant([chr(c) for c in safe])).numpy()]
    bert = tokenizers.normalizers.BertNormalizer(lowercase=lowercase)
    for code, output in zip(safe, got):
        assert output == bert.normalize_str(chr(code)), f"U+{code:04X}"
        assert len(output) == 1 and " " <= output <= "~", f"U+{code:04X}"
    assert len(safe) == (516 if lowercase else 98)
