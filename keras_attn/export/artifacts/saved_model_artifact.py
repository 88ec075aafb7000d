"""`saved_model/`: the TensorFlow SavedModel for TF Serving and `keras-attn serve`: text in,
labels or entity spans out (`serving_default`), the tokenizer and decoding in the graph
(`keras_attn.export.serving_module`); `predict_ids` runs the model on token ids."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.serving_module import export_saved_model
from keras_attn.export.serving_module import load_saved_model


class SavedModelStep(ArtifactStep):
    """`saved_model/`, scored through its `predict_ids` signature."""

    name = "saved_model"

    def files(self, plan):
        return [ArtifactFile("saved_model", "saved_model", "fp32")]

    def is_written(self, path):
        return (path / "saved_model.pb").is_file()

    def write(self, plan, files):
        plan.log("SavedModel for TF Serving (text in)")
        export_saved_model(plan.model, plan.tokenizer, plan.labels,
                           plan.output_dir / "saved_model")

    def run_logits(self, path, num_threads=2):
        signature = load_saved_model(path).signatures["predict_ids"]
        crf = "label_mask" in signature.structured_input_signature[1]

        def run_logits(x):
            # A CRF signature also takes `label_mask`, which only its `tags` output reads.
            extra = {"label_mask": x["padding_mask"]} if crf else {}
            return signature(**x, **extra)["logits"].numpy()

        return run_logits
