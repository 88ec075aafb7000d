"""The kinds of artifact `keras-attn export` writes, in the order it writes and reports them.

Adding a kind = one module with an `ArtifactStep` subclass and one line here.

Readers of an export (`keras-attn predict`, `serve`) open its files with `load_artifact`,
`load_saved_model` and `decode_text_entities` from here, not from the runtime modules."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.artifacts.artifact_step import ExportPlan
from keras_attn.export.artifacts.loaded_artifact import ArtifactLoadError
from keras_attn.export.artifacts.loaded_artifact import LoadedArtifact
from keras_attn.export.artifacts.loaded_artifact import load_artifact
from keras_attn.export.artifacts.onnx_artifacts import OnnxStep
from keras_attn.export.artifacts.onnx_artifacts import onnx_logits
from keras_attn.export.artifacts.onnx_int8_artifacts import OnnxInt8Step
from keras_attn.export.artifacts.saved_model_artifact import SavedModelStep
from keras_attn.export.artifacts.text_tflite_artifact import TextTFLiteStep
from keras_attn.export.artifacts.tflite_artifacts import TFLiteStep
from keras_attn.export.artifacts.tflite_artifacts import tflite_logits
from keras_attn.export.artifacts.tflite_bucket_artifacts import TFLiteBucketsStep
from keras_attn.export.serving_module import load_saved_model
from keras_attn.export.text_tflite import decode_text_entities

ARTIFACT_STEPS = (
    TFLiteStep(),
    TFLiteBucketsStep(),
    OnnxStep(),
    OnnxInt8Step(),
    SavedModelStep(),
    TextTFLiteStep(),
)

__all__ = ["ARTIFACT_STEPS", "ArtifactFile", "ArtifactLoadError", "ArtifactStep", "ExportPlan",
           "LoadedArtifact", "decode_text_entities", "load_artifact", "load_saved_model",
           "onnx_logits", "tflite_logits"]
