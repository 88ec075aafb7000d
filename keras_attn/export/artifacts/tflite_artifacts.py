"""`model_<precision>.tflite`: batch 1, one signature of the export's fixed length, builtin
ops only (`keras_attn.export.tflite.tflite_export`). The float, fp16, dynamic-range int8 and
post-training int8 files convert the float model; `model_int8.tflite` converts its calibrated
twin (the `QuantizationRecipe`)."""

import numpy as np
from ai_edge_litert.interpreter import Interpreter
from ai_edge_litert.interpreter import OpResolverType

from keras_attn.export.artifacts.artifact_step import ArtifactFile
from keras_attn.export.artifacts.artifact_step import ArtifactStep
from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_runtime import BucketedTFLite
from keras_attn.export.tflite.tflite_runtime import default_signature_runner

FLOAT_MODEL_PRECISIONS = ("fp32", "fp16", "dynamic_int8")


def tflite_logits(interpreter):
    """`x -> logits` of a batch-1 LiteRT interpreter over a batch of inputs: one row at a
    time, each on the shortest length bucket that holds it (a fixed-length file has one)."""
    buckets = BucketedTFLite(interpreter)
    (output,) = default_signature_runner(interpreter).get_output_details().values()

    def run_logits(x):
        rows = [buckets({k: v[b:b + 1] for k, v in x.items()})[0]
                for b in range(len(x["token_ids"]))]
        return np.stack(rows) if rows else np.zeros((0,) + tuple(output["shape"][1:]), "float32")

    return run_logits


def converted(plan, files):
    """Writes `files` (`model_<precision>[...].tflite`) with `export_tflite`: those of the
    float model in one conversion, `int8` from the calibrated twin."""
    buckets = plan.bucket_lengths if files and len(files[0].lengths) > 1 else None
    for source, model in (("float", plan.model), ("int8", plan.int8_model)):
        precisions = [f.precision for f in files if f.source == source]
        if precisions:
            plan.log(f"TFLite {', '.join(precisions)} from the {source} model (batch 1, "
                     f"lengths {list(files[0].lengths)})")
            export_tflite(model, plan.output_dir, precisions, plan.length,
                          representative_data=plan.calibration, buckets=buckets)


class TFLiteStep(ArtifactStep):
    """`model_{fp32,fp16,dynamic_int8,int8,int8_ptq}.tflite` (int8 when there is a
    calibrated twin)."""

    name = "tflite"

    def files(self, plan):
        int8 = ("int8",) if plan.int8_model is not None else ()
        return [ArtifactFile(f"model_{p}.tflite", "tflite", p, (plan.length,),
                             "int8" if p == "int8" else "float", timed=True)
                for p in FLOAT_MODEL_PRECISIONS + int8 + ("int8_ptq",)]

    def write(self, plan, files):
        converted(plan, files)

    def run_logits(self, path, num_threads=2, builtin_kernels=False):
        """`x -> logits` of the file on LiteRT with XNNPACK (as it ships), or with
        `builtin_kernels` on LiteRT's builtin kernels (no delegate)."""
        resolver = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels
                    else OpResolverType.AUTO)
        return tflite_logits(Interpreter(model_path=str(path), num_threads=num_threads,
                                         experimental_op_resolver_type=resolver))

    def timed_call(self, path, num_threads, x):
        runner = Interpreter(model_path=str(path),
                             num_threads=num_threads).get_signature_runner()
        return lambda: runner(**x)

    def details(self, path):
        report = tflite_op_report(path)
        return {"ops": report["ops"], "non_int8_ops": report["non_int8_ops"]}
