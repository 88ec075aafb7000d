"""MediaPipe-ready classifier files: the appended softmax, MediaPipe's own `TextClassifier`
against the Keras float model, and which texts MediaPipe tokenizes differently (and why)."""

import pathlib
import sys

import numpy as np
import pytest

from keras_attn.export.mediapipe_export import append_softmax
from keras_attn.export.mediapipe_export import keras_probabilities
from keras_attn.export.mediapipe_export import mediapipe_classifier
from keras_attn.export.mediapipe_export import mediapipe_probabilities
from keras_attn.export.mediapipe_export import self_describing_artifacts
from keras_attn.export.mediapipe_export import self_describing_markdown
from keras_attn.export.mediapipe_export import write_mediapipe_artifacts
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.export.tflite.tflite_metadata import read_metadata
from keras_attn.export.tflite.tflite_metadata import settings_from_tflite
from keras_attn.export.tflite.tflite_metadata import side_files
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.text.tokenizer import WordPieceTokenizer
from tests.tflite_classifier import LABELS
from tests.tflite_classifier import LENGTH
from tests.tflite_classifier import VOCABULARY
from tests.tflite_classifier import tiny_classifier

pytestmark = pytest.mark.tensorflow
ASCII_TEXTS = ["the film was very good !", "a bad plot .", "The FILM was GOOD", "BAD films",
               ""]
# Accented and non-Latin cased letters: BERT's uncased normalization maps them to "cafe",
# "ete"; MediaPipe keeps them and the words become [UNK]. Compatibility characters: tf-text
# maps full-width letters to ASCII and "…" to "...", MediaPipe keeps them ([UNK]).
NON_ASCII_TEXTS = ["Café good", "ÉTÉ bad", "the ＦＩＬＭ was good", "good — bad …"]
# ASCII control characters: BERT drops them (a word boundary), MediaPipe keeps them inside
# the word ("good\x07bad" is one [UNK]) and stops reading at NUL.
CONTROL_TEXTS = ["good\x07bad", "good\x00bad"]
SAME_NON_ASCII_TEXTS = ["good « bad"]  # non-ASCII punctuation: [UNK] in both


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return tiny_classifier(tmp_path_factory.mktemp("mediapipe"))


def _inputs(tokenizer, texts):
    packed = tokenizer(list(texts))
    return {name: np.asarray(packed[name]).astype("int32")
            for name in ("token_ids", "segment_ids", "padding_mask")}


def test_append_softmax_outputs_the_probabilities(classifier, tmp_path):
    _, source, tokenizer, _ = classifier
    path = append_softmax(source, tmp_path / "softmax.tflite")
    x = _inputs(tokenizer, ASCII_TEXTS)
    logits = run_tflite(source, x).astype("float64")
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(run_tflite(path, x), expected, atol=1e-6)
    before, after = tflite_op_report(source)["ops"], tflite_op_report(path)["ops"]
    assert after.pop("SOFTMAX") == before.pop("SOFTMAX", 0) + 1 and after == before
    assert tflite_op_report(path)["output_types"] == ["FLOAT32"]


def test_mediapipe_text_classifier_agrees_with_keras(classifier, tmp_path):
    pytest.importorskip("mediapipe", reason="MediaPipe's TextClassifier needs the mediapipe "
                        "extra: pip install 'keras-attn[mediapipe]'")

    model, source, tokenizer, card = classifier
    (tmp_path / "model_fp32.tflite").write_bytes(open(source, "rb").read())
    texts = ASCII_TEXTS + NON_ASCII_TEXTS + CONTROL_TEXTS + SAME_NON_ASCII_TEXTS
    section = write_mediapipe_artifacts(tmp_path, card, VOCABULARY, texts,
                                        keras_probabilities(model, tokenizer, texts),
                                        tokenizer)
    row = section["model_fp32_mediapipe.tflite"]
    assert set(section) == {"model_fp32_mediapipe.tflite"}  # no model_int8.tflite here
    assert row["texts"] == len(texts)
    # Our tokenizer follows HF (no compatibility mapping, control characters dropped), so
    # some of these texts now tokenize as MediaPipe does; accented capitals and letters still
    # differ (measured: 3 of the 6).
    assert row["tokenized_differently"] == 3
    assert set(row["examples"]) <= set(NON_ASCII_TEXTS + CONTROL_TEXTS)
    assert {"Café good", "ÉTÉ bad"} <= set(row["examples"])
    assert row["tokenized_differently_non_ascii"] >= 2
    assert row["max_abs_probability_diff_same_tokens"] <= 1e-5
    assert row["label_agreement"] == 1.0
    assert row["max_abs_probability_diff"] > 1e-5  # the texts tokenized differently
    metadata = read_metadata(tmp_path / "model_fp32_mediapipe.tflite")
    assert metadata["process_units"] == ["BertTokenizerOptions"]
    assert sorted(t["name"] for t in metadata["inputs"]) == ["ids", "mask", "segment_ids"]


def test_mediapipe_tokenizes_with_ascii_lowercasing_only(classifier, tmp_path):
    """MediaPipe's scores on non-ASCII text equal the file's on the ids of a tokenizer that
    lower-cases ASCII letters only and strips no accents."""
    pytest.importorskip("mediapipe", reason="MediaPipe's TextClassifier needs the mediapipe "
                        "extra: pip install 'keras-attn[mediapipe]'")

    _, source, _, card = classifier
    path = append_softmax(source, tmp_path / "mediapipe.tflite")
    embed_metadata(path, card, VOCABULARY, LABELS, mediapipe=True)
    texts = NON_ASCII_TEXTS[:2] + ["Naïve GOOD film", "ÄRGER bad"]
    with mediapipe_classifier(path) as mediapipe:
        scores = mediapipe_probabilities(mediapipe, texts, LABELS)
    cased = WordPieceTokenizer(list(VOCABULARY), lowercase=False, strip_accents=False,
                               sequence_length=LENGTH)
    ascii_lower = [t.translate({c: c + 32 for c in range(ord("A"), ord("Z") + 1)})
                   for t in texts]
    np.testing.assert_allclose(scores, run_tflite(path, _inputs(cased, ascii_lower)),
                               atol=1e-6)


def test_only_classifiers_get_mediapipe_files(classifier, tmp_path):

    card = dict(classifier[3], task="ner")
    with pytest.raises(ValueError, match="no token classifier"):
        write_mediapipe_artifacts(tmp_path, card, VOCABULARY, [], np.zeros((0, 3)), None)


def _without_mediapipe(monkeypatch):
    """Imports of `mediapipe` and its modules fail, as without the extra."""
    for name in [name for name in sys.modules if name.split(".")[0] == "mediapipe"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "mediapipe", None)


def test_without_the_mediapipe_extra_the_metadata_is_still_written(classifier, tmp_path,
                                                                    monkeypatch):
    """Our own writer embeds the metadata; only the MediaPipe files, which MediaPipe's
    `TextClassifier` scores, need the extra, and the section says so."""
    model, source, tokenizer, card = classifier
    (tmp_path / "model_fp32.tflite").write_bytes(pathlib.Path(source).read_bytes())
    for name, data in side_files(card, VOCABULARY, LABELS).items():
        (tmp_path / name).write_bytes(data)
    _without_mediapipe(monkeypatch)
    section = self_describing_artifacts(tmp_path, model, tokenizer, ASCII_TEXTS)
    assert section["metadata"] == ["model_fp32.tflite"] and section["mediapipe"] is None
    assert "MediaPipe files not written" in section["error"]
    assert "pip install 'keras-attn[mediapipe]'" in section["error"]
    assert not list(tmp_path.glob("*_mediapipe.tflite"))
    settings = settings_from_tflite(tmp_path / "model_fp32.tflite")
    assert settings.card == card and settings.labels == LABELS
    markdown = "\n".join(self_describing_markdown(section))
    assert "`metadata_props`) in: `model_fp32.tflite`." in markdown
    assert section["error"] in markdown
    with pytest.raises(ImportError, match=r"keras-attn\[mediapipe\]"):
        read_metadata(tmp_path / "model_fp32.tflite")
    monkeypatch.undo()
    pytest.importorskip("mediapipe", reason="reading it back needs the mediapipe extra")
    assert read_metadata(tmp_path / "model_fp32.tflite")["outputs"][0]["name"] == "logits"
