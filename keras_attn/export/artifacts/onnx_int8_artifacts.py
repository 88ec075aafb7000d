"""`model_int8.onnx` (the calibrated twin as a QDQ graph, `export_onnx_qdq`) and
`model_int8_ptq.onnx` (onnxruntime's static calibration of `model.onnx`,
`quantize_onnx_static`, the post-training baseline), run like the other ONNX files. Both
keep `model.onnx`'s dynamic batch and sequence axes; a CRF tagger's files hold its
emissions."""

import tempfile

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.onnx_artifacts import ONNX_OPSET
from keras_attn.export.artifacts.onnx_artifacts import OnnxStep
from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_qdq_export import export_onnx_qdq
from keras_attn.export.onnx.onnx_static_quantization import quantize_onnx_static


class OnnxInt8Step(OnnxStep):
    """`model_int8.onnx` (when there is a calibrated twin) and `model_int8_ptq.onnx`.

    A step of its own, after `OnnxStep` (whose `model.onnx` the PTQ file quantizes), and
    optional: a twin tf2onnx cannot convert is reported without losing the other files.
    """

    name = "onnx_int8"
    optional = True

    def files(self, plan):
        files = [ArtifactFile("model_int8_ptq.onnx", "onnx", "int8_ptq", timed=True)]
        if plan.int8_model is not None:
            files.insert(0, ArtifactFile("model_int8.onnx", "onnx", "int8", source="int8",
                                         timed=True))
        return files

    def write(self, plan, files):
        precisions = {f.precision for f in files}
        if "int8" in precisions:
            plan.log(f"ONNX int8 (QDQ) from the calibrated twin (opset {ONNX_OPSET})")
            export_onnx_qdq(plan.int8_model, plan.output_dir / "model_int8.onnx",
                            opset=ONNX_OPSET)
        if "int8_ptq" in precisions:
            plan.log(f"ONNX int8_ptq: onnxruntime static calibration on "
                     f"{len(plan.calibration)} batches")
            self._write_ptq(plan)

    @staticmethod
    def _write_ptq(plan):
        float_path = plan.output_dir / "model.onnx"
        with tempfile.TemporaryDirectory() as directory:
            if not float_path.is_file():
                float_path = f"{directory}/model.onnx"
                export_onnx(plan.model, float_path, opset=ONNX_OPSET)
            quantize_onnx_static(float_path, plan.output_dir / "model_int8_ptq.onnx",
                                 plan.calibration)
