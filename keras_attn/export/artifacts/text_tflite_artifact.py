"""`model_text.tflite`: raw strings in, the tokenizer inside the graph (tf-text custom ops,
`keras_attn.export.text_tflite`); `--no-text-tflite` leaves it out. Not scored with the
token-id artifacts: `keras-attn predict` runs it on text."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.text_tflite import export_text_tflite


class TextTFLiteStep(ArtifactStep):
    """`model_text.tflite` (optional: a conversion error is reported, not raised)."""

    name = "text_tflite"
    optional = True

    def files(self, plan):
        if not plan.options.text_tflite:
            return []
        return [ArtifactFile("model_text.tflite", "text_tflite", "fp32",
                             (plan.length,), scored=False)]

    def write(self, plan, files):
        plan.log("TFLite with the tokenizer inside (tf-text custom ops)")
        export_text_tflite(plan.model, plan.tokenizer, plan.output_dir / "model_text.tflite")
