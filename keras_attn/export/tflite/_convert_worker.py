"""The conversion job of `keras_attn.export.tflite.tflite_export.export_tflite`, run in the child
process of `keras_attn.export.tflite.converter_process` (the TFLite converter leaks memory).

By hand, to see a conversion's whole output: python -m keras_attn.export.tflite._convert_worker JOB
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_attn import atomic_files
from keras_attn.export.tflite.tflite_export import bucket_signature
from keras_attn.export.tflite.tflite_float_ops import run_in_float
from keras_attn.export.tflite.tflite_sharing import share_quantization_parameters
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.float_layout_model import float_layout_model
from keras_attn.quantization.model_queries import model_layout
from keras_attn.runs.task_head import ID_INPUTS


def _saved_model(model, lengths, directory):
    """A SavedModel of `model` with one static `(1, n)` int32 signature per length `n`
    (`serving_default` for the longest, `bucket_signature` names for the others)."""
    signatures = {}
    for length in lengths:
        specs = [tf.TensorSpec((1, length), tf.int32, name=name) for name in ID_INPUTS]

        @tf.function(input_signature=specs)
        def serve(token_ids, segment_ids, padding_mask):
            inputs = {"token_ids": token_ids, "segment_ids": segment_ids,
                      "padding_mask": padding_mask}
            return {"logits": model(inputs, training=False)}

        # Weights become graph constants: saved as variables they stay VAR_HANDLE /
        # READ_VARIABLE ops in the TFLite model and their FakeQuants are not turned into
        # int8 scales (measured with Keras 3 variables tracked by a tf.Module). The
        # converter stores a constant that several signatures use once; the weights'
        # quantization parameters, per subgraph, are shared by the worker afterwards
        # (`tflite_sharing`). What each more signature adds is its ops and tensor tables
        # and, in float files, its slice of the position table.
        key = bucket_signature(length, max(lengths))
        signatures[key] = convert_variables_to_constants_v2(serve.get_concrete_function())
    tf.saved_model.save(tf.Module(), directory, signatures=signatures)
    return directory


def _representative_dataset(examples, lengths):
    """Calibration inputs: with one signature the examples; with buckets each signature's
    examples cut to its length (the examples whose tokens fit it, else all of them)."""
    count = len(examples["token_ids"])
    if len(lengths) == 1:
        return lambda: ({name: examples[name][i] for name in ID_INPUTS}
                        for i in range(count))
    real = examples["padding_mask"][:, 0].sum(-1)  # (N,) tokens of each example
    samples = []
    for length in lengths:
        fits = [i for i in range(count) if real[i] <= length] or list(range(count))
        key = bucket_signature(length, max(lengths))
        samples += [(key, {name: examples[name][i][:, :length] for name in ID_INPUTS})
                    for i in fits]
    return lambda: iter(samples)


def _converter(variant, saved_model_dir, examples, lengths, float_residual=False):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if variant == "int8" and float_residual:
        # Only the tensors with a FakeQuant become int8; the residual sums and LayerNorm
        # internals (no FakeQuant) stay float. A representative dataset would make the
        # converter calibrate and quantize those too.
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif variant == "dynamic_int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant in ("int8", "int8_ptq"):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.representative_dataset = _representative_dataset(examples, lengths)
    return converter


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    models = {kind: keras.saving.load_model(path) for kind, path in job["model_paths"].items()}
    examples = None
    if job["data_path"]:
        with np.load(job["data_path"]) as data:
            examples = {name: data[name] for name in ID_INPUTS}
    lengths = job["lengths"]
    for variant in job["variants"]:
        if variant == "int8":
            graph = models["int8"]
            freeze_model_ranges(graph)
        elif variant == "int8_ptq":
            graph = float_layout_model(models["float"], masked_score=job["ptq_masked_score"])
        else:
            graph = float_layout_model(models["float"])
        directory = _saved_model(graph, lengths, os.path.join(job["work_dir"], variant))
        float_residual = variant == "int8" and model_layout(graph)["float_residual"]
        content = _converter(variant, directory, examples, lengths, float_residual).convert()
        if float_residual:
            # A mixed-precision file for CPUs: the int8 ops that XNNPACK has no kernel for
            # run in float too (written, like below, with each table stored once).
            content = run_in_float(content)
        else:
            # One copy of each weight's per-channel scales, not one per signature.
            content = share_quantization_parameters(content)
        atomic_files.write_bytes(job["outputs"][variant], content)


if __name__ == "__main__":
    main(sys.argv[1])
