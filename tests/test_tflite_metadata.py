"""TFLite metadata round trip: what `embed_metadata` writes, the generated schema reader and
`settings_from_tflite` read back, the model still runs unchanged, and `keras-attn predict`
runs from the `.tflite` file alone."""

import json
import shutil
import zipfile

import numpy as np
import pytest

from keras_attn.export.mediapipe_export import keras_probabilities
from keras_attn.export.tflite.tflite_metadata import TFLiteMetadataError
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.export.tflite.tflite_metadata import read_metadata
from keras_attn.export.tflite.tflite_metadata import settings_from_tflite
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.runs.export_directory import ModelCard
from keras_attn.stages.inference.predictor import load_predictor
from tests.tflite_classifier import LABELS
from tests.tflite_classifier import VOCABULARY
from tests.tflite_classifier import tiny_classifier

pytestmark = pytest.mark.tensorflow
TEXTS = ["the film was very good !", "a bad plot .", "The FILM was Good", ""]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return tiny_classifier(tmp_path_factory.mktemp("tflite"))


def _inputs(tokenizer, texts):
    packed = tokenizer(texts)
    return {name: np.asarray(packed[name]).astype("int32")
            for name in ("token_ids", "segment_ids", "padding_mask")}


def _embedded(classifier, directory, card=None):

    _, path, _, default_card = classifier
    return embed_metadata(path, card or default_card, VOCABULARY, LABELS,
                          output_path=directory / "model_fp32.tflite")


def test_metadata_round_trip_and_model_unchanged(classifier, tmp_path):
    pytest.importorskip("mediapipe", reason="reading it back needs the mediapipe extra")
    from ai_edge_litert.interpreter import Interpreter


    _, source, tokenizer, card = classifier
    path = _embedded(classifier, tmp_path)
    metadata = read_metadata(path)
    # Tensor metadata in the subgraph's input order, named after the tensors.
    order = [d["name"].split("_", 2)[2].rsplit(":", 1)[0]
             for d in Interpreter(model_path=str(path)).get_input_details()]
    assert [t["name"] for t in metadata["inputs"]] == order
    ids = metadata["inputs"][order.index("token_ids")]
    assert ids["associated_files"] == [("vocab.txt", "VOCABULARY")]
    assert metadata["outputs"] == [{"name": "logits", "associated_files": [
        ("labels.txt", "TENSOR_AXIS_LABELS")]}]
    assert metadata["associated_files"] == [("model_card.json", "DESCRIPTIONS")]
    assert metadata["process_units"] == []  # the tokenizer unit only in MediaPipe files
    assert metadata["min_parser_version"] == "1.1.0"
    assert metadata["name"] == "keras-attn classification"
    assert metadata["description"].startswith("keras-attn classification model: 3 labels, 16 "
                                              "tokens, lowercase=True")
    assert metadata["files"]["vocab.txt"].decode().splitlines() == VOCABULARY
    assert metadata["files"]["labels.txt"].decode().splitlines() == LABELS
    assert json.loads(metadata["files"]["model_card.json"]) == card
    x = _inputs(tokenizer, TEXTS)
    np.testing.assert_array_equal(run_tflite(path, x), run_tflite(source, x))


def test_embedding_again_replaces_the_metadata(classifier, tmp_path):

    path = _embedded(classifier, tmp_path)
    first = path.read_bytes()
    embed_metadata(path, classifier[3], VOCABULARY, LABELS)
    assert path.read_bytes() == first
    assert sorted(zipfile.ZipFile(path).namelist()) == ["labels.txt", "model_card.json",
                                                        "vocab.txt"]


def test_tokenizer_settings_and_crf_transitions_round_trip(classifier, tmp_path):
    card = dict(classifier[3], task="ner", labels=LABELS, crf=ModelCard.crf_section(
        [[0.5, -1.25, 2.0], [0.0, 1.0, -3.5], [0.125, 0.25, 0.375]], [0.1, 0.2, 0.3],
        [-0.1, -0.2, -0.3]))
    card["tokenizer"] = dict(card["tokenizer"], lowercase=False, strip_accents=False)
    settings = settings_from_tflite(_embedded(classifier, tmp_path, card))
    assert settings.card == card
    assert settings.card["crf"]["transitions"][1] == [0.0, 1.0, -3.5]
    assert settings.vocabulary == VOCABULARY and settings.labels == LABELS
    tokenizer = settings.tokenizer()
    assert not tokenizer.lowercase and tokenizer.sequence_length == card["sequence_length"]


def test_files_without_metadata_and_inconsistent_metadata(classifier, tmp_path):
    _, source, _, card = classifier
    assert settings_from_tflite(source) is None and associated_files(source) == {}
    broken = tmp_path / "broken.tflite"
    shutil.copyfile(source, broken)
    with zipfile.ZipFile(broken, "a") as archive:
        archive.writestr("model_card.json", json.dumps(card))
    with pytest.raises(TFLiteMetadataError, match=r"not \['vocab.txt', 'labels.txt'\]"):
        settings_from_tflite(broken)

    with pytest.raises(TFLiteMetadataError, match="labels"):
        embed_metadata(source, card, VOCABULARY, LABELS[::-1])
    with pytest.raises(TFLiteMetadataError, match="vocabulary_size=18"):
        embed_metadata(source, card, VOCABULARY[:-1], LABELS)


def test_predict_runs_from_the_tflite_file_alone(classifier, tmp_path, capsys):
    from keras_attn.cli import main

    model, _, tokenizer, _ = classifier
    path = _embedded(classifier, tmp_path)  # no vocab.txt, labels.txt, model_card.json
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_fp32.tflite"]
    results = load_predictor(path).predict(TEXTS)
    reference = keras_probabilities(model, tokenizer, TEXTS)
    for result, expected in zip(results, reference):
        assert result["label"] == LABELS[int(np.argmax(expected))]
        np.testing.assert_allclose([result["probabilities"][label] for label in LABELS],
                                   expected, atol=1e-5)
    assert main(["predict", str(path), TEXTS[0]]) == 0
    label = results[0]["label"]
    assert capsys.readouterr().out.splitlines() == [
        f"{label} (p={results[0]['probabilities'][label]:.2f})\t{TEXTS[0]}"]
