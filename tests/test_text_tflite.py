"""`model_text.tflite` (raw text in, tf-text ops inside) equals the Python path."""

import pathlib
import unicodedata

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.export.text_tflite import CLASSIFICATION_CUSTOM_OPS
from keras_attn.export.text_tflite import TAGGING_CUSTOM_OPS
from keras_attn.export.text_tflite import decode_text_entities
from keras_attn.export.text_tflite import export_text_tflite
from keras_attn.export.text_tflite import run_text_tflite
from keras_attn.export.text_tflite import text_function
from keras_attn.export.text_tflite import text_interpreter
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.export.tflite.tflite_metadata import read_metadata
from keras_attn.export.tflite.tflite_metadata import side_files
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.runs.export_directory import ModelCard
from keras_attn.stages.inference.predictor import load_predictor
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.fused_bert_path import FUSED_SAFE_UNCASED
from keras_attn.text.hard_cases import HARD_CASES
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.word_splitter import split_words
from tests.resources import minilm_directory
from tests.tolerances import float32_path_atol
from tests.tolerances import kernel_gain

pytestmark = pytest.mark.tensorflow  # TFLite / SavedModel / tf-text: TensorFlow only

SEQUENCE_LENGTH = 16
NER_LABELS = LabelVocabulary(
    ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
)
# Hard cases (accents precomposed and combining, CJK, emoji, empty, texts and words longer
# than the sequence length) plus ordinary sentences.
TEXTS = HARD_CASES + [
    "Peter Blackburn visits Paris and the European Union in Brussels .",
    "EU rejects German call to boycott British lamb, says J.R.R. Tolkien's friend in 北京.",
    "Zürich 北京 😀 " + "word " * 40,
]
# Where tf-text's whole-text word boundaries differ from BERT's (module docstring of
# keras_attn.export.text_tflite): control, private-use and unassigned characters, and
# compatibility characters that normalize to punctuation ("…" -> "...", "≠" kept whole).
WORD_BOUNDARY_DIVERGENCES = [
    "control\x00chars\x07here\x1b[0m and \x7f del",
    "«quotes» „low“ ‘single’ — dashes … ellipsis",
    "\ue000 private use",
    "ctrl\x01char \x7f del \x00 nul \ufffd replacement",
    "math ≠ ≮ ≯ 1+1=2 a<b>c ~x^y| $5 `q` ῾ ῭ ΅ `",
    "private\ue000use unassigned\u0378char",
]


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(
        str(minilm_directory() / "vocab.txt"), sequence_length=SEQUENCE_LENGTH
    )


@pytest.fixture(scope="module")
def fused_texts(tokenizer):
    """The texts on which the file's tf-text kernels give our tokenizer's pieces.

    The others are where tf-text's normalization differs from BERT's (module docstring of
    keras_attn.export.text_tflite): every one of them holds a character outside
    `FUSED_SAFE_UNCASED`, and every text made only of those characters is kept.
    """
    fused = tf_text.FastBertTokenizer(vocab=tokenizer.get_vocabulary(), token_out_type=tf.int32,
                                      lower_case_nfd_strip_accents=True)
    ours = tokenizer.tokenize(TEXTS).to_list()
    theirs = fused.tokenize(TEXTS).to_list()
    kept = [text for text, a, b in zip(TEXTS, ours, theirs) if a == b]
    safe = tf.strings.regex_full_match(TEXTS, f"[{FUSED_SAFE_UNCASED}]*").numpy()
    assert all(text in kept for text, ok in zip(TEXTS, safe) if ok)
    assert len(kept) >= 45, len(kept)
    return kept


def _backbone(tokenizer):
    keras.utils.set_random_seed(11)
    return BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size(), num_layers=1, num_heads=2,
        hidden_dim=16, intermediate_dim=32, max_sequence_length=SEQUENCE_LENGTH,
    )


@pytest.fixture(scope="module")
def classifier(tokenizer, tmp_path_factory):
    backbone = _backbone(tokenizer)
    # With initial weights (std 0.02) the pooled [CLS] state hardly depends on the text:
    # larger weights make the probabilities move between texts, so that a packing or masking
    # error shows.
    for variable in backbone.variables:
        if variable.path.endswith("kernel") or variable.path.startswith("embeddings/"):
            variable.assign(variable * 25.0)
    model = BertClassifier(backbone, num_classes=3)
    dense = model.get_layer("logits")
    dense.kernel.assign(np.random.default_rng(5).normal(scale=3.0, size=(16, 3)))
    report = export_text_tflite(
        model, tokenizer, tmp_path_factory.mktemp("cls") / "model_text.tflite"
    )
    return model, report, text_interpreter(report["path"])


@pytest.fixture(scope="module")
def tagger(tokenizer, tmp_path_factory):
    """A CRF tagger's artifact and a softmax twin sharing its backbone and logits weights.

    The artifact of a CRF model computes the emissions only, the same graph as the twin's:
    one conversion serves both decodings.
    """
    backbone = _backbone(tokenizer)
    crf_model = BertTokenClassifier(backbone, num_labels=len(NER_LABELS), use_crf=True)
    dense = crf_model.get_layer("logits")
    rng = np.random.default_rng(5)
    # A random tiny model predicts almost one tag; a larger output kernel spreads the
    # predictions over all tags (I- after O included, so the IOB2 repair is exercised).
    dense.kernel.assign(rng.normal(scale=3.0, size=tuple(dense.kernel.shape)))
    dense.bias.assign(rng.normal(scale=0.5, size=tuple(dense.bias.shape)))
    crf_model.crf.transitions.assign(rng.normal(scale=2.0, size=(len(NER_LABELS),) * 2))
    softmax_model = BertTokenClassifier(backbone, num_labels=len(NER_LABELS))
    softmax_model.get_layer("logits").set_weights(dense.get_weights())
    report = export_text_tflite(
        crf_model, tokenizer, tmp_path_factory.mktemp("ner") / "model_text.tflite"
    )
    models = {"softmax": softmax_model, "crf": crf_model}
    return models, report, text_interpreter(report["path"])


def _path_atol(model):
    """LiteRT vs Keras run other kernels (tests/tolerances.py): one block of 6 reductions plus
    the embedding norm and the pooler, sums of up to the intermediate size (32), magnified by
    the output kernel (probabilities move at most as much as the logits)."""
    return float32_path_atol(1.0, reduction=32, depth=6 + 2,
                             gain=kernel_gain(model.get_layer("logits").kernel.numpy()))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_classification_equals_python_path(tokenizer, classifier, fused_texts):
    model, _, interpreter = classifier
    packed = tokenizer(fused_texts, return_num_truncated=True)
    logits = np.asarray(model({
        "token_ids": packed["token_ids"], "segment_ids": packed["segment_ids"],
        "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
    }), dtype="float64")  # (N, C)
    expected = _softmax(logits)
    got = [run_text_tflite(interpreter, text) for text in fused_texts]
    probabilities = np.concatenate([out["probabilities"] for out in got])  # (N, C)
    assert probabilities.shape == (len(fused_texts), 3)
    np.testing.assert_allclose(probabilities, expected, atol=_path_atol(model), rtol=0)
    np.testing.assert_allclose(
        np.concatenate([out["logits"] for out in got]), logits, atol=_path_atol(model), rtol=0
    )
    truncated = np.concatenate([out["num_truncated_tokens"] for out in got])
    np.testing.assert_array_equal(truncated, packed["num_truncated"].numpy())
    assert truncated.max() >= 100  # "日本語" * 40 and the long sentences were cut
    # The test can tell texts apart: probabilities vary widely between them.
    assert np.ptp(probabilities, axis=0).max() > 0.3


@pytest.mark.parametrize("text", ["", "Héllo Wörld, naïve café", "北京 😀👍🏽 " * 20])
def test_classification_equals_unconverted_graph(tokenizer, classifier, text):
    model, _, interpreter = classifier
    expected = text_function(model, tokenizer)(tf.constant([text]))
    got = run_text_tflite(interpreter, text)
    for name in ("logits", "probabilities", "num_truncated_tokens"):
        np.testing.assert_allclose(got[name], expected[name].numpy(), atol=_path_atol(model),
                                   rtol=0)


@pytest.mark.parametrize("decoding", ["softmax", "crf"])
def test_tagging_equals_python_path(tokenizer, tagger, decoding, fused_texts):
    models, _, interpreter = tagger
    model = models[decoding]
    use_crf = decoding == "crf"
    texts = [text for text in fused_texts if text not in WORD_BOUNDARY_DIVERGENCES]
    python = predict_entities(model, tokenizer, NER_LABELS, texts, batch_size=len(texts))
    words = [split_words(text, tokenizer.strip_accents) for text in texts]
    inputs, word_ids, truncated = ner_model_inputs(
        tokenizer, [[word for word, _, _ in row] for row in words], use_crf
    )
    logits = model(inputs, training=False)
    logits = np.asarray(logits["logits"] if use_crf else logits)  # (N, L, C)
    num_entities = 0
    for row, (text, reference) in enumerate(zip(texts, python)):
        out = run_text_tflite(interpreter, text)
        np.testing.assert_array_equal(out["token_ids"][0], inputs["token_ids"][row], text)
        np.testing.assert_array_equal(out["word_ids"][0], word_ids[row], text)
        np.testing.assert_allclose(out["logits"][0], logits[row], atol=_path_atol(model),
                                   rtol=0, err_msg=text)
        assert out["num_words"].tolist() == [len(words[row])], text
        assert out["num_truncated_words"].tolist() == [truncated[row]], text
        # Word spans (code points) of the kept words, also of a word cut mid-way.
        kept = len(words[row]) - int(truncated[row])
        spans = [(start, end) for _, start, end in words[row][:kept]]
        starts, ends = out["word_start"][0], out["word_end"][0]
        assert list(zip(starts[:kept].tolist(), ends[:kept].tolist())) == spans, text
        assert (out["word_start"][0, kept:] == -1).all() and (out["word_end"][0, kept:] == -1).all()
        decoded = decode_text_entities(out, text, NER_LABELS, crf=model.crf if use_crf else None)
        assert decoded["tags"] == reference["tags"], text
        assert decoded["entities"] == reference["entities"], text
        assert decoded["num_truncated_words"] == reference["num_truncated_words"]
        assert decoded["num_repairs"] == reference["num_repairs"]
        num_entities += len(reference["entities"])
    assert num_entities > 20  # the comparison saw many entities


def test_tagging_token_offsets(tokenizer, tagger):
    _, _, interpreter = tagger
    text = "Café e\u0301te\u0301 Straße 北京 😀 zero\u200bwidth"
    out = run_text_tflite(interpreter, text)
    count = int((out["token_ids"][0] != tokenizer.pad_token_id).sum()) - 2
    starts = out["token_start"][0, 1:count + 1]
    ends = out["token_end"][0, 1:count + 1]
    pieces = [tokenizer.id_to_token(int(i)) for i in out["token_ids"][0, 1:count + 1]]
    # Each piece's source span, normalized as the tokenizer does, holds the piece ("ß" gives
    # "ss", so two pieces may share it); spans move forward through the text.
    def normalized(source):
        source = unicodedata.normalize("NFD", source.lower().replace("\u200b", ""))
        return "".join(c for c in source if unicodedata.category(c) != "Mn").replace("ß", "ss")

    for piece, start, end in zip(pieces, starts, ends):
        if piece != tokenizer.unknown_token:
            assert piece.removeprefix("##") in normalized(text[start:end]), (piece, start, end)
    assert (np.diff(starts) >= 0).all() and (ends > starts).all()
    assert pieces.count(tokenizer.unknown_token) == 1  # the emoji
    assert text[starts[0]:ends[-1]] == text  # from "C" to the last "h"
    specials = np.concatenate([out["token_start"][0, :1], out["token_start"][0, count + 1:]])
    assert (specials == -1).all()


@pytest.mark.parametrize("text", WORD_BOUNDARY_DIVERGENCES)
def test_tagging_tokenizes_whole_text(tokenizer, tagger, text):
    # The documented divergence: the graph's pieces are tf-text's fused kernels' on the whole
    # text, which differ from BERT's word-by-word pieces on these characters.
    _, _, interpreter = tagger
    out = run_text_tflite(interpreter, text)
    fused = tf_text.FastBertTokenizer(vocab=tokenizer.get_vocabulary(), token_out_type=tf.int32,
                                      lower_case_nfd_strip_accents=True)
    pieces = fused.tokenize([text]).flat_values.numpy()[: SEQUENCE_LENGTH - 2].tolist()
    expected = [tokenizer.cls_token_id] + pieces + [tokenizer.sep_token_id]
    expected += [tokenizer.pad_token_id] * (SEQUENCE_LENGTH - len(expected))
    np.testing.assert_array_equal(out["token_ids"][0], expected)
    words = split_words(text, tokenizer.strip_accents)
    inputs, word_ids, _ = ner_model_inputs(tokenizer, [[w for w, _, _ in words]])
    assert out["num_words"][0] != len(words) or (out["token_ids"] != inputs["token_ids"]).any()


def test_custom_ops_are_the_tf_text_ones(classifier, tagger):
    for (_, report, _), expected in ((classifier, CLASSIFICATION_CUSTOM_OPS),
                                     (tagger, TAGGING_CUSTOM_OPS)):
        assert report["custom_ops"] == sorted(expected)
        # Frozen weights: no resource variables (they read as NaN in the converted model).
        assert not {"VAR_HANDLE", "READ_VARIABLE", "CALL_ONCE"} & set(report["ops"])
        assert not any(op.startswith("Flex") for op in report["ops"])
        assert report["input_types"] == ["STRING"]


def test_signature_shapes(classifier, tagger):
    _, _, interpreter = classifier
    out = run_text_tflite(interpreter, "a good movie")
    assert {k: v.shape for k, v in out.items()} == {
        "logits": (1, 3), "probabilities": (1, 3), "num_truncated_tokens": (1,)}
    _, _, interpreter = tagger
    out = run_text_tflite(interpreter, "a good movie")
    length = SEQUENCE_LENGTH
    assert out["logits"].shape == (1, length, len(NER_LABELS))
    for name in ("token_ids", "word_ids", "token_start", "token_end", "word_start", "word_end"):
        assert out[name].shape == (1, length) and out[name].dtype == np.int32, name


def test_unsupported_model_is_an_error(tokenizer, tmp_path):
    backbone = _backbone(tokenizer)
    with pytest.raises(ValueError, match="must be a classifier or a tagger .BertClassifier, "
                       "XLNetClassifier, BertTokenClassifier, XLNetTokenClassifier."
                       " .the text TFLite graph packs"):
        export_text_tflite(backbone, tokenizer, tmp_path / "x.tflite")
    model = BertClassifier(backbone, num_classes=2)
    with pytest.raises(ValueError, match="must be a WordPieceTokenizer"):
        export_text_tflite(model, "vocab.txt", tmp_path / "x.tflite")
    mixed = WordPieceTokenizer(tokenizer.vocabulary, lowercase=True, strip_accents=False,
                               sequence_length=SEQUENCE_LENGTH)
    with pytest.raises(ValueError, match="fused normalization"):
        export_text_tflite(model, mixed, tmp_path / "x.tflite")
    too_long = WordPieceTokenizer(tokenizer.vocabulary, sequence_length=SEQUENCE_LENGTH + 1)
    with pytest.raises(ValueError, match=r"sequence_length=17 exceeds the max_sequence_length=16 "
                                         r"of the model .*: build the tokenizer with "
                                         r"sequence_length=16 or less"):
        export_text_tflite(model, too_long, tmp_path / "x.tflite")
    assert not (tmp_path / "x.tflite").exists()


def test_decode_rejects_wrong_label_count(tagger):
    _, _, interpreter = tagger
    out = run_text_tflite(interpreter, "Paris")
    with pytest.raises(ValueError, match="one score per label"):
        decode_text_entities(out, "Paris", LabelVocabulary(["O", "B-LOC", "I-LOC"]))
    with pytest.raises(ValueError, match="must be a str"):
        run_text_tflite(interpreter, b"Paris")


def _self_describing_copy(model, report, tokenizer, labels, directory, crf=None):
    """`model_text.tflite` with embedded metadata in `directory`, no side files beside it,
    and a copy with the side files instead in `directory / "side"`."""
    task = "ner" if isinstance(model, BertTokenClassifier) else "classification"
    card = ModelCard.card_dict(task, labels, SEQUENCE_LENGTH, tokenizer, lowercase=True, crf=crf)
    path = embed_metadata(report["path"], card, tokenizer.vocabulary, labels,
                          output_path=directory / "model_text.tflite")
    side = directory / "side"
    side.mkdir()
    (side / "model_text.tflite").write_bytes(pathlib.Path(report["path"]).read_bytes())
    for name, data in side_files(card, tokenizer.vocabulary, labels).items():
        (side / name).write_bytes(data)
    return path, side / "model_text.tflite"


def _output_order(path):
    """The signature names of a file's outputs, in the subgraph's output order."""
    interpreter = text_interpreter(path)
    names = {detail["index"]: name for name, detail in
             interpreter.get_signature_runner().get_output_details().items()}
    return [names[detail["index"]] for detail in interpreter.get_output_details()]


def test_metadata_makes_the_text_file_self_describing(tokenizer, classifier, tagger, tmp_path):
    """Issue 23: `model_text.tflite` carries the vocabulary, labels and card too; `keras-attn
    predict` runs it alone (CRF transitions from the embedded card) as with side files."""
    pytest.importorskip("mediapipe", reason="reading it back needs the mediapipe extra")
    labels = ["negative", "neutral", "positive"]
    (tmp_path / "cls").mkdir()
    path, side = _self_describing_copy(classifier[0], classifier[1], tokenizer, labels,
                                       tmp_path / "cls")
    assert sorted(p.name for p in path.parent.iterdir()) == ["model_text.tflite", "side"]
    metadata = read_metadata(path)
    assert metadata["inputs"] == [{"name": "text",
                                   "associated_files": [("vocab.txt", "VOCABULARY")]}]
    # One entry per output, in the subgraph's order; the labels on the scores.
    assert [t["name"] for t in metadata["outputs"]] == _output_order(path)
    assert sorted(_output_order(path)) == ["logits", "num_truncated_tokens", "probabilities"]
    for entry in metadata["outputs"]:
        expected = [("labels.txt", "TENSOR_AXIS_LABELS")] \
            if entry["name"] in ("logits", "probabilities") else []
        assert entry["associated_files"] == expected, entry["name"]
    texts = TEXTS[:6] + ["a good film"]
    results = load_predictor(path).predict(texts)
    assert results == load_predictor(side).predict(texts)
    for text, result in zip(texts, results):
        expected = run_text_tflite(classifier[2], text)["probabilities"][0]
        np.testing.assert_array_equal([result["probabilities"][label] for label in labels],
                                      expected)
    models, report, _ = tagger
    crf = models["crf"].get_layer("crf")
    section = ModelCard.crf_section(*(keras.ops.convert_to_numpy(getattr(crf, name)) for name in
                                 ("transitions", "start_transitions", "end_transitions")))
    (tmp_path / "ner").mkdir()
    path, side = _self_describing_copy(models["crf"], report, tokenizer, list(NER_LABELS),
                                       tmp_path / "ner", crf=section)
    assert [t["name"] for t in read_metadata(path)["outputs"]] == _output_order(path)
    assert len(_output_order(path)) == 9
    ner_texts = TEXTS[-3:]
    entities = load_predictor(path).predict(ner_texts)
    assert entities == load_predictor(side).predict(ner_texts)
    assert any(result["entities"] for result in entities)


def _difference_class(char):
    category = unicodedata.category(char)
    if category in ("Co", "Cn", "Cc"):
        return {"Co": "private use", "Cn": "unassigned", "Cc": "control"}[category]
    decomposed = unicodedata.normalize("NFD", char)
    if any(unicodedata.decomposition(c).startswith("<") for c in decomposed):
        return "compatibility"
    if char.casefold() != char.lower():
        return "case folding"
    return "format or Unicode version"


def test_the_files_kernels_differ_from_the_tokenizer_only_on_the_documented_code_points(
    tokenizer,
):
    """Every code point up to U+1FFFF as "a{c}b": where tf-text's fused kernels (the ones
    model_text.tflite holds) give other pieces than WordPieceTokenizer, counted by class
    (docs/text.md). None of them is in FUSED_SAFE_UNCASED."""
    fused = tf_text.FastBertTokenizer(vocab=tokenizer.get_vocabulary(), token_out_type=tf.int32,
                                      lower_case_nfd_strip_accents=True)
    codes = [c for c in range(0x20000) if not 0xD800 <= c <= 0xDFFF]
    texts = [f"a{chr(c)}b" for c in codes]
    ours, theirs = tokenizer.tokenize(texts).to_list(), fused.tokenize(texts).to_list()
    differing = [c for c, a, b in zip(codes, ours, theirs) if a != b]
    counts = {}
    for code in differing:
        kind = _difference_class(chr(code))
        counts[kind] = counts.get(kind, 0) + 1
    assert counts == {"private use": 6400, "compatibility": 3405, "format or Unicode version": 518,
                      "unassigned": 176, "case folding": 74, "control": 62}
    safe = tf.strings.regex_full_match([chr(c) for c in differing],
                                       f"[{FUSED_SAFE_UNCASED}]").numpy()
    assert not safe.any()
