"""`load_artifact`: a model file opened by its runtime, as `keras-attn predict` reads it."""

import numpy as np
import pytest

from keras_attn.export.artifacts import ArtifactLoadError
from keras_attn.export.artifacts import load_artifact
from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier

pytestmark = pytest.mark.tensorflow


def test_onnx_file_runs_like_the_keras_model(tmp_path):
    classifier = BertClassifier(BertBackbone(
        vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=16), num_classes=3)
    path = tmp_path / "model.onnx"
    export_onnx(classifier, path)
    loaded = load_artifact(path, num_threads=1)
    assert loaded.kind == "onnx" and loaded.path == path and loaded.length is None
    assert set(loaded.input_names) <= {"token_ids", "segment_ids", "padding_mask"}
    assert [shape[-1] for shape in loaded.output_shapes.values()] == [3]
    x = {"token_ids": np.array([[2, 7, 9, 3, 0]], "int32"),
         "segment_ids": np.zeros((1, 5), "int32"),
         "padding_mask": np.array([[1, 1, 1, 1, 0]], "int32")}
    np.testing.assert_allclose(loaded.run_logits(x), classifier.predict(x, verbose=0),
                               atol=1e-5)
    assert loaded.run_text is None
    assert loaded.embedded_card() is None  # export_onnx alone embeds no model card


@pytest.mark.parametrize("name, runtime", [("model.tflite", "LiteRT"),
                                           ("model.onnx", "onnxruntime")])
def test_a_damaged_file_names_itself_and_its_runtime(tmp_path, name, runtime):
    path = tmp_path / name
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(range(256)) * 4)
    with pytest.raises(ArtifactLoadError, match=f"{name}: {runtime} cannot load it"):
        load_artifact(path)


def test_other_files_are_refused(tmp_path):
    with pytest.raises(ArtifactLoadError, match=r"model\.keras: not a \.tflite or \.onnx"):
        load_artifact(tmp_path / "model.keras")
