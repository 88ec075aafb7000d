"""WordPieceTokenizer == HF `tokenizers` (MiniLM's tokenizer.json) on real data and hard cases.

Every difference ever seen is listed in `KNOWN_DIFFERENCES` with both outputs; a new one
fails. The reasons (compatibility decomposition, case folding, control characters, the
word-length limit in bytes) are explained in the tokenizer docs.
"""

import collections
import unicodedata

import numpy as np
import pytest
import tokenizers
import tokenizers.normalizers

from keras_attn.text.hard_cases import TOKENIZER_HARD_CASES
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory
from tests.resources import shared_data_file

HARD_CASES = TOKENIZER_HARD_CASES

# text -> (our tokens, HF tokens). Reasons in docs: "Differences from HF tokenizers".
KNOWN_DIFFERENCES = {
    # C0/C1 control characters: tf-text splits words there, HF deletes them and joins.
    "control\x00chars\x07here\x1b[0m and \x7f del": (
        ["control", "char", "##s", "here", "[", "0", "##m", "and", "del"],
        ["control", "##cha", "##rs", "##her", "##e", "[", "0", "##m", "and", "del"],
    ),
    # Compatibility decomposition (NFKD-like) in tf-text, canonical (NFD) only in HF.
    "Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ １２３": (
        ["full", "-", "width", "abc", "123"],
        ["[UNK]", "－", "[UNK]", "[UNK]", "[UNK]"],
    ),
    "«quotes» „low“ ‘single’ — dashes … ellipsis": (
        [
            "«",
            "quotes",
            "»",
            "„",
            "low",
            "“",
            "‘",
            "single",
            "’",
            "—",
            "dash",
            "##es",
            ".",
            ".",
            ".",
            "el",
            "##lip",
            "##sis",
        ],
        [
            "«",
            "quotes",
            "»",
            "„",
            "low",
            "“",
            "‘",
            "single",
            "’",
            "—",
            "dash",
            "##es",
            "…",
            "el",
            "##lip",
            "##sis",
        ],
    ),
    "ﬁ ligature ﬂ": (["fi", "liga", "##ture", "fl"], ["ﬁ", "liga", "##ture", "ﬂ"]),
    "Ⅻ roman ① circled ㎏ squared": (
        ["xii", "roman", "1", "circled", "kg", "squared"],
        ["[UNK]", "roman", "[UNK]", "circled", "[UNK]", "squared"],
    ),
    "ｶﾀｶﾅ": (["カ", "##タ", "##カ", "##ナ"], ["[UNK]"]),
    "Ǆ ǅ ǆ": (["d", "##z", "d", "##z", "d", "##z"], ["[UNK]", "[UNK]", "[UNK]"]),
    # Case folding in tf-text (ß -> ss, final ς -> σ), lower-casing in HF.
    "Straße groß ß": (
        ["st", "##ras", "##se", "gross", "ss"],
        ["st", "##raße", "gr", "##o", "##ß", "ß"],
    ),
    "Ελληνικά Σίσυφος ΣΑΣ": (
        [
            "ε",
            "##λ",
            "##λ",
            "##η",
            "##ν",
            "##ι",
            "##κ",
            "##α",
            "σ",
            "##ι",
            "##σ",
            "##υ",
            "##φ",
            "##ο",
            "##σ",
            "σ",
            "##α",
            "##σ",
        ],
        [
            "ε",
            "##λ",
            "##λ",
            "##η",
            "##ν",
            "##ι",
            "##κ",
            "##α",
            "σ",
            "##ι",
            "##σ",
            "##υ",
            "##φ",
            "##ος",
            "σ",
            "##α",
            "##σ",
        ],
    ),
    # Private-use characters: [UNK] in tf-text, deleted by HF (it treats them as control).
    "\ue000 private use": (["[UNK]", "private", "use"], ["private", "use"]),
    # Word limit: tf-text counts 100 UTF-8 bytes, HF 100 characters.
    "Ж" * 60: (["[UNK]"], ["ж"] + ["##ж"] * 59),
    "ω" * 51: (["[UNK]"], ["ω"] + ["##ω"] * 50),
}


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


def test_hard_cases_differ_only_as_documented(ours, reference):
    got = ours.tokenize(HARD_CASES).to_list()
    differences = {}
    for text, row in zip(HARD_CASES, got):
        ours_tokens = [ours.id_to_token(i) for i in row]
        hf_tokens = reference.encode(text, add_special_tokens=False).tokens
        if ours_tokens != hf_tokens:
            differences[text] = (ours_tokens, hf_tokens)
    assert differences == KNOWN_DIFFERENCES
    assert len(HARD_CASES) - len(differences) == 26  # identical on all the others


def _difference_class(char):
    category = unicodedata.category(char)
    if category in ("Co", "Cn", "Cc"):
        return {"Co": "private use", "Cn": "unassigned", "Cc": "control"}[category]
    decomposed = unicodedata.normalize("NFD", char)
    if any(unicodedata.decomposition(c).startswith("<") for c in decomposed):
        return "compatibility"
    if char.casefold() != char.lower():
        return "case folding"
    return "unicode version"


@pytest.mark.slow
def test_every_code_point_differs_only_in_documented_classes(ours, reference):
    """All 1,112,064 code points as "a{c}b": the differing ones, counted by class."""
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"a{chr(c)}b" for c in code_points]
    got = []
    for start in range(0, len(texts), 50_000):
        got += ours.tokenize(texts[start : start + 50_000]).to_list()
    expected = reference.encode_batch(texts, add_special_tokens=False)
    counts = collections.Counter(
        _difference_class(chr(c)) for c, row, e in zip(code_points, got, expected) if row != e.ids
    )
    # Measured with tokenizers 0.22 and Python 3.11's Unicode 14 tables; "unicode version"
    # are characters tf-text's older ICU data does not know (recent marks, Arabic number
    # signs and other format characters).
    assert dict(counts) == {
        "private use": 137_468,
        "unassigned": 3_935,
        "compatibility": 3_405,
        "unicode version": 774,
        "case folding": 74,
        "control": 62,
    }
