"""The kinds of artifact `keras-attn export` writes, in the order it writes and reports them.

Adding a kind = one module with an `ArtifactStep` subclass and one line here."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.artifacts.artifact_step import ExportPlan
from keras_attn.export.artifacts.onnx_artifacts import OnnxStep
from keras_attn.export.artifacts.onnx_artifacts import onnx_logits
from keras_attn.export.artifacts.saved_model_artifact import SavedModelStep
from keras_attn.export.artifacts.text_tflite_artifact import TextTFLiteStep
from keras_attn.export.artifacts.tflite_artifacts import TFLiteStep
from keras_attn.export.artifacts.tflite_artifacts import tflite_logits
from keras_attn.export.artifacts.tflite_bucket_artifacts import TFLiteBucketsStep

ARTIFACT_STEPS = (
    TFLiteStep(),
    TFLiteBucketsStep(),
    OnnxStep(),
    SavedModelStep(),
    TextTFLiteStep(),
)

__all__ = ["ARTIFACT_STEPS", "ArtifactFile", "ArtifactStep", "ExportPlan", "onnx_logits",
           "tflite_logits"]
