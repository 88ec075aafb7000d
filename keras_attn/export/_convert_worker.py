"""Subprocess entry of `keras_attn.export.tflite_export.export_tflite` (the TFLite
converter leaks memory, so each export runs in a fresh process).

Usage: python -m keras_attn.export._convert_worker JOB.json
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_attn.export.tflite_export import INPUT_NAMES

# Registers QatBert and its layers for `keras.saving.load_model`.
from keras_attn.quantization.qat_bert import QatBert  # noqa: F401


def _saved_model(model, sequence_length, directory):
    """A SavedModel of `model` with a static `(1, L)` int32 signature."""
    specs = [tf.TensorSpec((1, sequence_length), tf.int32, name=name) for name in INPUT_NAMES]

    @tf.function(input_signature=specs)
    def serve(token_ids, segment_ids, padding_mask):
        inputs = {"token_ids": token_ids, "segment_ids": segment_ids,
                  "padding_mask": padding_mask}
        return {"logits": model(inputs, training=False)}

    # Weights become graph constants: saved as variables they stay VAR_HANDLE /
    # READ_VARIABLE ops in the TFLite model and their FakeQuants are not turned into
    # int8 scales (measured with Keras 3 variables tracked by a tf.Module).
    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    tf.saved_model.save(tf.Module(), directory, signatures={"serving_default": frozen})
    return directory


def _converter(variant, saved_model_dir, examples, float_residual=False):
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

        def representative_dataset():
            for i in range(len(examples["token_ids"])):
                yield {name: examples[name][i] for name in INPUT_NAMES}

        converter.representative_dataset = representative_dataset
    return converter


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    model = keras.saving.load_model(job["model_path"])
    examples = None
    if job["data_path"]:
        with np.load(job["data_path"]) as data:
            examples = {name: data[name] for name in INPUT_NAMES}
    length = job["sequence_length"]
    for variant in job["variants"]:
        if variant == "int8":
            graph = model
            graph.freeze_ranges()
        elif variant == "int8_ptq":
            graph = model.with_quantization(False, masked_score=job["ptq_masked_score"])
        else:
            graph = model.with_quantization(False)
        directory = _saved_model(graph, length, os.path.join(job["work_dir"], variant))
        float_residual = variant == "int8" and getattr(model, "float_residual", False)
        content = _converter(variant, directory, examples, float_residual).convert()
        with open(job["outputs"][variant], "wb") as f:
            f.write(content)


if __name__ == "__main__":
    main(sys.argv[1])
