"""`export_model_int8_tflite`: a full-integer, builtins-only, batch-1 `.tflite` file of a
`quantize_model` copy (any functional or Sequential Keras model of the layers it knows), and
`export_model_fp32_tflite`: the float file of a Keras model."""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_attn import atomic_files
from keras_attn.export.tflite.converter_process import run_job
from keras_attn.export.tflite.signature_tflite import batch_specs
from keras_attn.export.tflite.signature_tflite import frozen_signature
from keras_attn.export.tflite.tflite_export import TFLiteExportError
from keras_attn.export.tflite.tflite_export import check_builtins_only
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_float_ops import run_in_float
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.emissions_model import emissions_model
from keras_attn.quantization.model_queries import model_layout
from keras_attn.quantization.quantize_model import float_layers


def export_model_int8_tflite(model, output_path, representative_inputs, sequence_length=None):
    """Converts a calibrated (or trained) `quantize_model` copy to a full-int8 `.tflite`.

    A model with a CRF becomes the file of its emissions (`emissions_model`; the tags are
    decoded outside, with the CRF's transitions). Its inputs get a static batch-1
    signature (the other dimensions must be known: give `keras.Input` a fixed length, or
    `sequence_length` for inputs of any length); float
    inputs and outputs stay float32 (QUANTIZE and DEQUANTIZE at the edges), integer inputs
    (token ids) stay integers. The fake-quantized
    tensors become int8 at the scales QAT learned; the converter calibrates the few others
    on `representative_inputs`. Conversion runs in the converter's child process.

    A model with a float residual stream (`quantize_model(..., float_residual=True)`)
    becomes the mixed-precision file of the int8 recipe: only the fake-quantized tensors
    are int8 (no calibration by the converter), and the ops XNNPACK has no int8 kernel
    for run in float (`tflite_float_ops.run_in_float`), as the QAT model computes them.

    Args:
        model: a `keras_attn.quantization.quantize_model` copy with its ranges set.
        output_path: str or path of the `.tflite` file.
        representative_inputs: a list of model inputs (arrays, or dicts for named
            inputs) with a batch dimension: real examples, at least one, of the file's
            length.
        sequence_length: optional int, the file's length for inputs built with a
            dynamic one (`keras.Input((None,))`, as keras-attn's backbones are).

    Returns:
        Dict `{"path", "size_bytes", "float_layers"}` (the layers `quantize_model` left in
        float: the converter calibrated them) plus `tflite_op_report`.

    Raises:
        ValueError: an input of unknown size, or no representative inputs.
        TFLiteExportError: the conversion failed, or a Flex/custom op appeared.
    """
    specs = batch_specs(emissions_model(model), sequence_length)
    return _export(model, output_path, "int8", _rows(representative_inputs, specs),
                   sequence_length)


def export_model_fp32_tflite(model, output_path, sequence_length=None):
    """Converts a float Keras model to a float32, builtins-only, batch-1 `.tflite` file
    (the float reference of `export_model_int8_tflite`'s file), in the converter's child
    process.

    Args:
        model: a functional or `Sequential` Keras model.
        output_path: str or path of the `.tflite` file.
        sequence_length: optional int, the file's length for inputs of any length.

    Returns:
        Dict `{"path", "size_bytes", "float_layers"}` plus `tflite_op_report`.
    """
    return _export(model, output_path, "fp32", None, sequence_length)


def _export(model, output_path, variant, rows, sequence_length):
    model = emissions_model(model)  # a CRF decodes outside the file
    output_path = os.path.abspath(os.fspath(output_path))
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras_attn_model_tflite_") as work:
        model_path = os.path.join(work, "model.keras")
        model.save(model_path)
        data_path = None
        if rows is not None:
            data_path = os.path.join(work, "representative.npz")
            np.savez(data_path, **rows)
        result = run_job("keras_attn.export.tflite.model_int8_tflite:_convert_job",
                         [model_path, data_path, work, output_path, sequence_length, variant])
        if not result.ok:
            raise TFLiteExportError(f"{variant} TFLite conversion failed {result.failure()}")
    report = tflite_op_report(output_path)
    check_builtins_only(report, output_path)
    return {"path": output_path, "size_bytes": os.path.getsize(output_path),
            "float_layers": float_layers(model) if variant == "int8" else [], **report}


def _rows(representative_inputs, specs):
    """`{input name: (N, 1, ...) array}` of the examples, one row each, in the dtype of
    the file's input (NumPy's int64 ids as int32); an error naming an input whose examples
    have another shape or cannot take the dtype."""
    names = [spec.name for spec in specs]
    rows = {name: [] for name in names}
    for batch in representative_inputs:
        values = batch if isinstance(batch, dict) else dict(zip(names, keras.tree.flatten(batch)))
        for name in names:
            rows[name].extend(np.asarray(values[name])[:, None])
    if not rows[names[0]]:
        raise ValueError("`representative_inputs` holds no example: give a few real inputs "
                         "(the converter calibrates the tensors QAT does not round).")
    return {spec.name: _typed(spec, np.stack(rows[spec.name])) for spec in specs}


def _typed(spec, rows):
    """The examples `(N, 1, ...)` of the input `spec` in its dtype, or an error."""
    dtype = np.dtype(spec.dtype.as_numpy_dtype)
    shape = tuple(spec.shape)
    if rows.shape[1:] != shape:
        raise ValueError(
            f"`representative_inputs[{spec.name!r}]` has examples of shape "
            f"{rows.shape[2:]}, the file's input {spec.name!r} takes {shape[1:]} (batch 1): "
            "give examples of the file's length (`sequence_length`), padded or cut.")
    integers = np.issubdtype(rows.dtype, np.integer) or rows.dtype == bool
    if np.issubdtype(dtype, np.integer) and (not integers or rows.size and (
            rows.min() < np.iinfo(dtype).min or rows.max() > np.iinfo(dtype).max)):
        raise ValueError(
            f"`representative_inputs[{spec.name!r}]` holds {rows.dtype} values the file's "
            f"{dtype} input {spec.name!r} cannot take exactly: give {dtype} examples.")
    return rows.astype(dtype)


def _convert_job(model_path, data_path, work, output_path, sequence_length, variant="int8"):
    """The conversion, in the converter's child process."""
    model = keras.saving.load_model(model_path)
    freeze_model_ranges(model)
    specs = batch_specs(model, sequence_length)
    names = [spec.name for spec in specs]
    named = frozen_signature(model, specs)
    saved = os.path.join(work, "saved_model")
    tf.saved_model.save(tf.Module(), saved, signatures={"serving_default": named})
    converter = tf.lite.TFLiteConverter.from_saved_model(saved)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if variant == "fp32":
        atomic_files.write_bytes(output_path, converter.convert())
        return
    with np.load(data_path) as data:
        rows = {name: data[name] for name in names}
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if model_layout(model)["float_residual"]:
        # Only the tensors with a FakeQuant become int8; a representative dataset would
        # make the converter calibrate and quantize the float stream too.
        atomic_files.write_bytes(output_path, run_in_float(converter.convert()))
        return
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.representative_dataset = lambda: (
        {name: rows[name][i] for name in names} for i in range(len(rows[names[0]])))
    atomic_files.write_bytes(output_path, converter.convert())
