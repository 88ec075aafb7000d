"""`export_signatures_tflite`: Keras functional graphs as the signatures of one `.tflite` file
(a translation model's encoder and decoding step, a language model's decoding step), and the
two pieces every conversion of ours shares: `batch_specs` (static input specs) and
`frozen_signature` (a graph with its weights as constants, outputs by name).

Variants: `fp32`; `dynamic_int8` (the converter's int8 weights, float activations); `int8`
from `quantize_model` copies in the int8 recipe's layout (a float residual stream: only the
fake-quantized tensors become int8 at the ranges the copies hold, and the ops XNNPACK has no
int8 kernel for run in float, `tflite_float_ops.run_in_float`). The signatures share their
weights (the converter stores a constant once; `share_quantization_parameters` stores each
quantization table once). Conversion runs in the converter's child process.
"""

import os
import tempfile

import keras
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_attn import atomic_files
from keras_attn.export.tflite.converter_process import run_job
from keras_attn.export.tflite.tflite_export import TFLiteExportError
from keras_attn.export.tflite.tflite_export import check_builtins_only
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_float_ops import run_in_float
from keras_attn.export.tflite.tflite_sharing import share_quantization_parameters
from keras_attn.layers.validation import check_positive_int
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout

SIGNATURE_VARIANTS = ("fp32", "dynamic_int8", "int8")


def export_signatures_tflite(graphs, signatures, output_path, variant="fp32"):
    """Converts functional Keras graphs to one builtins-only `.tflite` file, one signature per
    entry of `signatures`.

    Args:
        graphs: dict `{name: keras.Model}`: float graphs (`fp32`, `dynamic_int8`), or
            calibrated `quantize_model` copies in the int8 recipe's layout (`int8`).
        signatures: dict `{signature name: (graph name, length, batch)}`: the signature
            runs that graph on inputs of batch `batch`, every dynamic dimension `length`
            (`None` where the graph has none).
        output_path: str or path of the `.tflite` file.
        variant: one of `SIGNATURE_VARIANTS`.

    Returns:
        Dict `{"path", "size_bytes", "signatures"}` plus `tflite_op_report`.

    Raises:
        ValueError: an unknown variant, graphs of the wrong kind for it, a signature of an
            unknown graph.
        TFLiteExportError: the conversion failed, or a Flex/custom op appeared.

    Example:
    >>> import numpy as np, tempfile, os
    >>> from ai_edge_litert.interpreter import Interpreter
    >>> inputs = keras.Input((None,), name="x")
    >>> double = keras.Model(inputs, {"y": inputs * 2.0})
    >>> path = os.path.join(tempfile.mkdtemp(), "double.tflite")
    >>> info = export_signatures_tflite({"double": double},
    ...                                 {"double_4": ("double", 4, 1)}, path)
    >>> runner = Interpreter(model_path=path).get_signature_runner("double_4")
    >>> runner(x=np.ones((1, 4), "float32"))["y"].tolist()
    [[2.0, 2.0, 2.0, 2.0]]
    """
    _check_graphs(graphs, signatures, variant)
    output_path = os.path.abspath(os.fspath(output_path))
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras_attn_signatures_tflite_") as work:
        paths = {name: os.path.join(work, f"{name}.keras") for name in graphs}
        for name, graph in graphs.items():
            graph.save(paths[name])
        result = run_job("keras_attn.export.tflite.signature_tflite:_convert_job",
                         [paths, work, output_path, signatures, variant])
        if not result.ok:
            raise TFLiteExportError(f"{variant} TFLite conversion of {', '.join(graphs)} "
                                    f"failed {result.failure()}")
    report = tflite_op_report(output_path)
    check_builtins_only(report, output_path)
    return {"path": output_path, "size_bytes": os.path.getsize(output_path),
            "signatures": list(signatures), **report}


def _check_graphs(graphs, signatures, variant):
    if variant not in SIGNATURE_VARIANTS:
        raise ValueError(f"`variant` must be one of {SIGNATURE_VARIANTS}. "
                         f"Received: variant={variant!r}")
    for name, (graph, length, batch) in signatures.items():
        if graph not in graphs:
            raise ValueError(f"signature {name!r} runs graph {graph!r}, not one of "
                             f"{sorted(graphs)}")
        if length is not None:
            check_positive_int("length", length)
        check_positive_int("batch", batch)
    quantized = {name: bool(activation_quantizers(graph)) for name, graph in graphs.items()}
    if set(quantized.values()) != {variant == "int8"}:
        wanted = "the quantize_model copies" if variant == "int8" else "the float graphs"
        raise ValueError(f"variant {variant!r} takes {wanted}; received graphs with "
                         f"quantizers: {quantized}")
    if variant == "int8" and not all(model_layout(g)["float_residual"]
                                     for g in graphs.values()):
        raise ValueError("an int8 file of several signatures takes the int8 recipe's layout "
                         "(quantize_model(..., float_residual=True)): an all-int8 graph needs "
                         "the converter's calibration per signature, not supported")


def batch_specs(model, length=None, batch=1):
    """The `(batch, ...)` `tf.TensorSpec` of each input of `model`, named after it, every
    dynamic dimension set to `length`; an error naming an input of unknown size."""
    specs = []
    for tensor in model.inputs:
        shape = tuple(length if size is None else size for size in tensor.shape[1:])
        if any(size is None for size in shape):
            raise ValueError(
                f"Input {tensor.name!r} has shape {tensor.shape}: a TFLite file for phones has "
                "static shapes; pass `sequence_length=` or build the model with a fixed "
                "length, e.g. keras.Input((128,), dtype='int32').")
        specs.append(tf.TensorSpec((batch, *shape), tensor.dtype, name=tensor.name))
    return specs


def frozen_signature(model, specs):
    """A `tf.function` of `model` on `specs` with its variables as constants, returning its
    outputs by name (a model of one unnamed output: `{"output": ...}`)."""
    @tf.function(input_signature=specs)
    def serve(*inputs):
        # The model's own input structure (a list, a dict of named inputs, one tensor).
        outputs = model(keras.tree.pack_sequence_as(model.input, list(inputs)),
                        training=False)
        return outputs if isinstance(outputs, dict) else {"output": outputs}

    concrete = serve.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    names = sorted(concrete.structured_outputs)

    @tf.function(input_signature=specs)
    def named(*inputs):
        # A frozen function returns its outputs as a list (sorted by name): named again.
        return dict(zip(names, keras.tree.flatten(frozen(*inputs))))

    return named


def _convert_job(model_paths, work, output_path, signatures, variant):
    """The conversion, in the converter's child process."""
    graphs = {name: keras.saving.load_model(path) for name, path in model_paths.items()}
    if variant == "int8":
        for graph in graphs.values():
            freeze_model_ranges(graph)
    functions = {name: frozen_signature(graphs[graph], batch_specs(graphs[graph], length, batch))
                 for name, (graph, length, batch) in signatures.items()}
    saved = os.path.join(work, "saved_model")
    tf.saved_model.save(tf.Module(), saved, signatures=functions)
    converter = tf.lite.TFLiteConverter.from_saved_model(saved, signature_keys=list(functions))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if variant != "fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    content = converter.convert()
    # The recipe's float ops (as export_model_int8_tflite's file), or each quantization
    # table once (the signatures repeat them: dynamic int8 +11 % with a beams step).
    content = run_in_float(content) if variant == "int8" else share_quantization_parameters(
        content)
    atomic_files.write_bytes(output_path, content)
