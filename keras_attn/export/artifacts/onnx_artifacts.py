"""`model.onnx` (float, opset 17, dynamic batch and sequence axes) and
`model_dynamic_int8.onnx` (onnxruntime's dynamic int8 of it), run by onnxruntime
(`keras_attn.export.onnx.onnx_export`). A CRF tagger exports its emissions; Viterbi runs outside
the graph."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_quantization import quantize_onnx_dynamic
from keras_attn.export.onnx.onnx_runner import OnnxRunner

ONNX_OPSET = 17


def onnx_logits(runner):
    """`x -> logits` of an `OnnxRunner`, fed the inputs its graph reads."""
    return lambda x: runner({k: v for k, v in x.items() if k in runner.input_names})


class OnnxStep(ArtifactStep):
    """`model.onnx` and `model_dynamic_int8.onnx`."""

    name = "onnx"

    def files(self, plan):
        return [ArtifactFile("model.onnx", "onnx", "fp32", timed=True),
                ArtifactFile("model_dynamic_int8.onnx", "onnx", "dynamic_int8", timed=True)]

    def write(self, plan, files):
        float_path = plan.output_dir / "model.onnx"
        if not float_path.is_file():
            plan.log(f"ONNX (opset {ONNX_OPSET}, dynamic batch and sequence)")
            export_onnx(plan.model, float_path, opset=ONNX_OPSET)
        if any(f.precision == "dynamic_int8" for f in files):
            quantize_onnx_dynamic(float_path, plan.output_dir / "model_dynamic_int8.onnx")

    def run_logits(self, path, num_threads=2):
        return onnx_logits(OnnxRunner(str(path), threads=num_threads))

    def timed_call(self, path, num_threads, x):
        runner = OnnxRunner(str(path), threads=num_threads)
        feed = runner.feed({k: v for k, v in x.items() if k in runner.input_names})
        return lambda: runner.session.run(runner.output_names, feed)
