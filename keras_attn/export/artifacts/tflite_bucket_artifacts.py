"""`model_<precision>_buckets.tflite`: the float, dynamic-range int8 and int8 files with one
signature per length bucket over one copy of the weights (`keras_attn.export.length_buckets`);
each input runs on the shortest bucket that holds it. Their latency over real input lengths
is the report's `length_buckets` section."""

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.tflite_artifacts import TFLiteStep
from keras_attn.export.artifacts.tflite_artifacts import converted
from keras_attn.export.length_buckets import BUCKET_VARIANTS
from keras_attn.export.length_buckets import bucketed_file_name


class TFLiteBucketsStep(TFLiteStep):
    """`model_{fp32,dynamic_int8,int8}_buckets.tflite` (`--no-length-buckets`: none; one
    bucket: none)."""

    name = "tflite_buckets"

    def files(self, plan):
        if not plan.options.length_buckets or len(plan.bucket_lengths) == 1:
            return []
        return [ArtifactFile(bucketed_file_name(p), "tflite", p, tuple(plan.bucket_lengths),
                             "int8" if p == "int8" else "float")
                for p in BUCKET_VARIANTS if p != "int8" or plan.int8_model is not None]

    def write(self, plan, files):
        converted(plan, files)
