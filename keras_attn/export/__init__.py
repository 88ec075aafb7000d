"""Export of trained keras-attn models to deployable artifacts: TFLite (float, float16,
dynamic-range int8, full int8 from QAT or PTQ, raw text in; `run_in_float` for int8 ops
without an XNNPACK kernel), ONNX, the TF Serving SavedModel; TFLite metadata and ONNX
`metadata_props` that make each file self-describing; MediaPipe-ready classifiers; and the
runtimes that read those files back (translation and generation files on LiteRT and
onnxruntime). The `keras-attn export` stage that runs them over a trained run is
`keras_attn.stages.export_run`.

TensorFlow-specific by design (the converters are).
"""

from keras_attn.export.export_model import export_model
from keras_attn.export.mediapipe_export import append_softmax
from keras_attn.export.mediapipe_export import write_mediapipe_artifacts
from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_metadata import embed_onnx_metadata
from keras_attn.export.onnx.onnx_metadata import onnx_settings
from keras_attn.export.onnx.onnx_quantization import quantize_onnx_dynamic
from keras_attn.export.onnx.onnx_runner import OnnxRunner
from keras_attn.export.serving_module import ServingModule
from keras_attn.export.serving_module import export_saved_model
from keras_attn.export.serving_module import load_saved_model
from keras_attn.export.text_tflite import decode_text_entities
from keras_attn.export.text_tflite import export_text_tflite
from keras_attn.export.text_tflite import run_text_tflite
from keras_attn.export.text_tflite import text_interpreter
from keras_attn.export.tflite.model_int8_tflite import export_model_fp32_tflite
from keras_attn.export.tflite.model_int8_tflite import export_model_int8_tflite
from keras_attn.export.tflite.tflite_export import TFLITE_VARIANTS
from keras_attn.export.tflite.tflite_export import TFLiteExportError
from keras_attn.export.tflite.tflite_export import check_builtins_only
from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_float_ops import run_in_float
from keras_attn.export.tflite.tflite_metadata import TFLiteMetadataError
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.export.tflite.tflite_metadata import read_metadata
from keras_attn.export.tflite.tflite_metadata import settings_from_tflite
from keras_attn.export.tflite.tflite_runtime import benchmark_tflite
from keras_attn.export.tflite.tflite_runtime import run_tflite

__all__ = [
    "OnnxRunner",
    "ServingModule",
    "TFLITE_VARIANTS",
    "TFLiteExportError",
    "TFLiteMetadataError",
    "append_softmax",
    "benchmark_tflite",
    "check_builtins_only",
    "decode_text_entities",
    "embed_metadata",
    "embed_onnx_metadata",
    "export_model",
    "export_model_fp32_tflite",
    "export_model_int8_tflite",
    "export_onnx",
    "export_saved_model",
    "export_text_tflite",
    "export_tflite",
    "load_saved_model",
    "onnx_settings",
    "quantize_onnx_dynamic",
    "read_metadata",
    "run_in_float",
    "run_text_tflite",
    "run_tflite",
    "settings_from_tflite",
    "text_interpreter",
    "tflite_op_report",
    "write_mediapipe_artifacts",
]
