"""`keras_attn.export.golden_vectors`: the model card and the golden records the Kotlin core is
checked against. Each record is decoded again here by independent code (numpy softmax and
argmax, brute-force CRF paths, a direct reading of the tags) and must agree; the Unicode
tables of the Kotlin tokenizer are checked against HF `tokenizers`."""

import itertools
import json
import pathlib
import re

import keras
import numpy as np
import pytest

from keras_attn.export import golden_vectors
from keras_attn.layers.crf import viterbi_decode
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.runs.export_directory import ModelCard
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.resources import minilm_directory
from tests.resources import shared_data_file
from tests.scripts import load_script

pytestmark = pytest.mark.tensorflow

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
TOOLS = REPOSITORY / "apps" / "android_demo" / "tools"
# The one copy of the BERT text tables: the library's package data, imported by the web core
# and copied onto the Android core's class path by its build.
TABLES = REPOSITORY / "keras_attn" / "text" / "bert_text_tables.txt"
LENGTH = 12
NER_LABELS = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
TEXTS = HARD_CASES + [
    "Peter Blackburn visits Paris and New York .",
    "EU rejects German call to boycott British lamb .",
    "the film was very good , a story of Anna Smith in Rome .",
]


def tool(name):
    return load_script(TOOLS / f"{name}.py")


@pytest.fixture(scope="module")
def tokenizers():
    vocab = str(minilm_directory() / "vocab.txt")
    return (WordPieceTokenizer(vocab, lowercase=True, sequence_length=LENGTH),
            WordPieceTokenizer(vocab, lowercase=False, sequence_length=LENGTH))


def _backbone(tokenizer, seed):
    keras.utils.set_random_seed(seed)
    return BertBackbone(vocabulary_size=tokenizer.vocabulary_size(), num_layers=1,
                        num_heads=2, hidden_dim=8, intermediate_dim=16,
                        max_sequence_length=LENGTH)


def _spread(model, seed, scale=3.0):
    # Random tiny models predict one class; large output weights spread the predictions.
    dense = model.get_layer("logits")
    rng = np.random.default_rng(seed)
    dense.kernel.assign(rng.normal(scale=scale, size=tuple(dense.kernel.shape)))
    dense.bias.assign(rng.normal(scale=0.5, size=tuple(dense.bias.shape)))


def _predict(model, output=None):
    def predict(x):
        outputs = model({k: np.asarray(v, "int32") for k, v in x.items()}, training=False)
        return keras.ops.convert_to_numpy(outputs if output is None else outputs[output])
    return predict


def _brute_force_path(emissions, crf):
    transitions = np.asarray(crf["transitions"])
    start, end = np.asarray(crf["start_transitions"]), np.asarray(crf["end_transitions"])
    best, best_score = None, -np.inf
    for path in itertools.product(range(len(start)), repeat=len(emissions)):
        score = start[path[0]] + end[path[-1]] + sum(emissions[i][t] for i, t in enumerate(path))
        score += sum(transitions[a, b] for a, b in zip(path, path[1:]))
        if score > best_score + 1e-12:
            best, best_score = list(path), score
    return best


def _tags_by_first_piece(record, scores):
    """Word tags read directly: the score row of each word's first position."""
    tags = ["O"] * len(record["words"])
    seen = set()
    for position, word in enumerate(record["word_ids"]):
        if word >= 0 and word not in seen:
            seen.add(word)
            tags[word] = scores[position]
    return tags


def _strict_entities(tags, record):
    """Entities of IOB2 tags after the conlleval repair, written out independently."""
    entities, current = [], None
    previous = "O"
    for index, tag in enumerate(tags + ["O"]):
        kind, _, name = tag.partition("-")
        starts = kind == "B" or (kind == "I" and (previous == "O" or previous[2:] != name))
        if current is not None and (starts or kind == "O"):
            entities.append(current)
            current = None
        if starts:
            current = [name, index, index + 1]
        elif kind == "I":
            current[2] = index + 1
        previous = tag
    text = record["text"]
    words = record["words"]
    return [{"type": name, "start_char": words[a][1], "end_char": words[b - 1][2],
             "text": text[words[a][1]:words[b - 1][2]]} for name, a, b in entities]


# --- Viterbi ------------------------------------------------------------------------------


def test_viterbi_float64_equals_brute_force_and_the_keras_decoder():
    rng = np.random.default_rng(0)
    for _ in range(60):
        k, n = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        crf = ModelCard.crf_section(rng.normal(size=(k, k)), rng.normal(size=k),
                                              rng.normal(size=k))
        emissions = rng.normal(size=(n, k)).round(5)
        path = golden_vectors.viterbi_float64(emissions, crf["transitions"],
                                              crf["start_transitions"], crf["end_transitions"])
        assert path == _brute_force_path(emissions, crf)
        keras_path = keras.ops.convert_to_numpy(viterbi_decode(
            emissions[None].astype("float32"), np.asarray(crf["transitions"], "float32"),
            np.asarray(crf["start_transitions"], "float32"),
            np.asarray(crf["end_transitions"], "float32")))[0].tolist()
        assert keras_path == path
    assert golden_vectors.viterbi_float64(np.zeros((0, 3)), np.zeros((3, 3)), np.zeros(3),
                                          np.zeros(3)) == []


def test_crf_section_rounds_and_checks_shapes():
    section = ModelCard.crf_section([[0.1234564, 1.0], [2.0, 3.0]], [0.0, 1.0],
                                              [0.5, 0.25])
    assert section["transitions"] == [[0.123456, 1.0], [2.0, 3.0]]
    with pytest.raises(ValueError, match="transitions \\(K, K\\)"):
        ModelCard.crf_section(np.zeros((2, 3)), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="non-finite"):
        ModelCard.crf_section(np.full((2, 2), np.nan), np.zeros(2), np.zeros(2))


# --- Model card ---------------------------------------------------------------------------


def test_model_card_fields(tokenizers):
    uncased, cased = tokenizers
    vocab = uncased.get_vocabulary()
    card = ModelCard.card_dict("ner", NER_LABELS, LENGTH, cased, lowercase=False)
    assert card["format"] == "keras-attn model card 1"
    assert card["outputs"][0]["shape"] == [1, LENGTH, len(NER_LABELS)]
    assert [i["name"] for i in card["inputs"]] == ["token_ids", "segment_ids", "padding_mask"]
    assert all(i["shape"] == [1, LENGTH] for i in card["inputs"])
    t = card["tokenizer"]
    assert (t["lowercase"], t["strip_accents"]) == (False, False)
    assert t["vocabulary_size"] == len(vocab) == 30522
    assert [vocab[t[k]] for k in ("cls_token_id", "sep_token_id", "pad_token_id",
                                  "unknown_token_id")] == ["[CLS]", "[SEP]", "[PAD]", "[UNK]"]
    assert t["max_word_characters"] == 100 and "max_word_bytes" not in t
    classifier_card = ModelCard.card_dict("classification", ["neg", "pos"], LENGTH,
                                                uncased, lowercase=True)
    assert classifier_card["outputs"][0]["shape"] == [1, 2]
    assert classifier_card["tokenizer"]["strip_accents"] is True
    # The messages list the registry's task names.
    with pytest.raises(ValueError, match=re.escape(
            "Only a tagger (task in ['ner']) can carry CRF transitions. "
            "Received: task='classification'")):
        ModelCard.card_dict("classification", ["a"], LENGTH, uncased, True,
                                  crf={"transitions": [[0.0]]})
    with pytest.raises(ValueError, match=re.escape(
            "`task` must be one of ['classification', 'ner']. Received: task='qa'")):
        ModelCard.card_dict("qa", ["a"], LENGTH, uncased, True)


# --- Golden records -----------------------------------------------------------------------


def test_classification_records_decode_to_their_label(tokenizers, tmp_path):
    tokenizer = tokenizers[0]
    model = BertClassifier(_backbone(tokenizer, 1), num_classes=2)
    tool("make_golden_vectors").point_along_variation(model, tokenizer, TEXTS)
    labels = ["negative", "positive"]
    path = tmp_path / "golden_vectors.jsonl"
    assert golden_vectors.write_golden_vectors(path, TEXTS, "classification", tokenizer,
                                               _predict(model), labels, batch_size=16) == len(TEXTS)
    assert path.read_bytes().isascii()
    records = golden_vectors.read_golden_vectors(path)
    assert [r["text"] for r in records] == TEXTS
    logits = _predict(model)({k: np.asarray(v) for k, v in tokenizer(TEXTS).items()})
    for record, row in zip(records, logits):
        expected = np.exp(np.asarray(record["logits"]) - max(record["logits"]))
        np.testing.assert_allclose(record["probabilities"], expected / expected.sum(), atol=6e-7)
        assert record["label"] == labels[int(np.argmax(record["logits"]))]
        np.testing.assert_allclose(record["logits"], row, atol=6e-6)  # rounded to 5 decimals
        ids = tokenizer.tokenize(record["text"]).numpy().tolist()
        assert record["token_ids"] == [tokenizer.cls_token_id] + ids[:LENGTH - 2] + [
            tokenizer.sep_token_id]
        assert len(record["piece_starts"]) == len(record["piece_ends"]) == len(ids)
    assert len({r["label"] for r in records}) > 1
    # Offsets are code points: on ASCII words a piece is its text's lower-cased span.
    record = records[TEXTS.index("Peter Blackburn visits Paris and New York .")]
    text = record["text"]
    pieces = [tokenizer.vocabulary[i].removeprefix("##") for i in record["token_ids"][1:-1]]
    spans = [text[s:e].lower() for s, e in zip(record["piece_starts"], record["piece_ends"])]
    assert spans[:len(pieces)] == pieces
    emoji = records[TEXTS.index("I love 🤗 and 😀👍🏽 emoji 🇫🇷 hello😀world")]
    assert emoji["piece_starts"][2] == 7  # after "I love ": code points, not UTF-16 units


@pytest.mark.parametrize("use_crf", [False, True], ids=["softmax", "crf"])
def test_ner_records_decode_to_their_tags_and_entities(tokenizers, tmp_path, use_crf):
    tokenizer = tokenizers[0] if use_crf else tokenizers[1]
    model = BertTokenClassifier(_backbone(tokenizer, 2), num_labels=len(NER_LABELS),
                                use_crf=use_crf)
    _spread(model, 2)
    crf = None
    if use_crf:
        rng = np.random.default_rng(5)
        layer = model.get_layer("crf")
        weights = [rng.normal(scale=2.0, size=tuple(w.shape)) for w in
                   (layer.transitions, layer.start_transitions, layer.end_transitions)]
        crf = ModelCard.crf_section(*weights)
    path = tmp_path / "golden_vectors.jsonl"
    golden_vectors.write_golden_vectors(path, TEXTS, "ner", tokenizer,
                                        _predict(model, "logits" if use_crf else None),
                                        NER_LABELS, crf=crf)
    records = golden_vectors.read_golden_vectors(path)
    differs_from_argmax = 0
    for record in records:
        logits = np.asarray(record["logits"])
        assert len(record["token_ids"]) == len(record["word_ids"]) == len(logits)
        argmax_tags = _tags_by_first_piece(record, [NER_LABELS[i] for i in logits.argmax(-1)])
        if use_crf:
            first = [p for p, w in enumerate(record["word_ids"])
                     if w >= 0 and (p == 0 or record["word_ids"][p - 1] != w)]
            if 0 < len(first) <= 4:
                path_tags = _brute_force_path(logits[first], crf)
                by_position = dict(zip(first, path_tags))
                raw = _tags_by_first_piece(
                    record, [NER_LABELS[by_position.get(p, 0)] for p in range(len(logits))])
                expected_entities = _strict_entities(raw, record)
                assert record["entities"] == expected_entities, record["text"]
            differs_from_argmax += _strict_entities(argmax_tags, record) != record["entities"]
        else:
            assert record["entities"] == _strict_entities(argmax_tags, record), record["text"]
        # The tags are valid IOB2 and spell the entities.
        assert _strict_entities(record["word_tags"], record) == record["entities"]
        for previous, tag in zip(["O"] + record["word_tags"], record["word_tags"]):
            assert not tag.startswith("I-") or previous[2:] == tag[2:]
    if use_crf:
        assert differs_from_argmax > 0  # the transitions matter in these golden vectors
    assert any(r["num_truncated_words"] > 0 for r in records)
    assert sum(len(r["entities"]) for r in records) > 10


def test_write_golden_vectors_rejects_unknown_tasks(tokenizers, tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "must be one of ['classification', 'ner']. Received: task='qa'")):
        golden_vectors.write_golden_vectors(tmp_path / "g.jsonl", ["x"], "qa", tokenizers[0],
                                            None, ["a"])
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not a JSON record"):
        golden_vectors.read_golden_vectors(tmp_path / "bad.jsonl")


# --- The Kotlin tokenizer's tables --------------------------------------------------------


def test_normalization_is_per_code_point_as_the_tables_assume():
    import tokenizers.normalizers

    texts = (HARD_CASES + tool("make_golden_vectors").sweep_texts(100) +
             shared_data_file("sst2/dev.tsv").read_text("utf-8").splitlines()[1:200])
    for lowercase in (True, False):
        normalizer = tokenizers.normalizers.BertNormalizer(lowercase=lowercase)
        whole = [normalizer.normalize_str(text) for text in texts]
        characters = sorted({c for text in texts for c in text})
        single = {c: normalizer.normalize_str(c) for c in characters}
        assert whole == ["".join(single[c] for c in text) for text in texts]


def test_both_apps_read_the_library_tables_file():
    """The web core imports the library's tables file and the Android core's builds (Gradle,
    `run_jvm_tests.sh`) copy it onto the class path; no app keeps a copy that could drift."""
    source = TABLES.relative_to(REPOSITORY).as_posix()
    web = REPOSITORY / "apps" / "web_demo" / "src" / "lib" / "core" / "textTables.ts"
    assert f'../../../../../{source}?raw"' in web.read_text("utf-8")
    core = REPOSITORY / "apps" / "android_demo" / "core"
    assert f'rootProject.file("../../{source}")' in (core / "build.gradle.kts").read_text("utf-8")
    assert f'"$REPO/{source}" "$WORK/resources/dev/kerasattn/core/"' in (
        core / "run_jvm_tests.sh").read_text("utf-8")
    assert not list((core / "src").rglob(TABLES.name))


@pytest.mark.slow
def test_committed_tables_equal_a_fresh_measurement():
    fresh = load_script("tools/make_text_tables.py").table_text()
    assert TABLES.read_text("ascii") == fresh, (
        "bert_text_tables.txt is stale: run tools/make_text_tables.py")


def test_committed_tables_spot_checks():
    lines = TABLES.read_text("ascii").splitlines()
    sections = {}
    for line in lines:
        if line.startswith("table "):
            _, name, count = line.split()
            sections[name] = int(count)
            current = name
            sections[name + "_lines"] = []
        elif not line.startswith("#") and line != "end":
            sections[current + "_lines"].append(line)
    for name in ("normalize_uncased", "normalize_cased", "normalize_lowercase",
                 "normalize_strip_accents", "tokenizer_classes",
                 "word_classes_strip_accents", "word_classes_keep_accents"):
        assert len(sections[name + "_lines"]) == sections[name]
    uncased = sections["normalize_uncased_lines"]
    assert "R 41 26 1 32" in uncased  # A-Z -> a-z
    # BERT keeps "ß" and "…" (tf-text's case folding made them "ss" and "...").
    assert not any(line.split()[1] in ("DF", "2026") for line in uncased)
    assert any(line.startswith("E AD ") for line in uncased)  # soft hyphen removed
    assert "H AC00 D7A3" in uncased
    assert not any(line.startswith(("H", "M")) for line in sections["normalize_cased_lines"])
    assert json.dumps(lines[-1]) == '"end"'
