"""`export_onnx_qdq`: a calibrated `quantize_model` copy (the twin) as a static int8 (QDQ)
ONNX graph that carries exactly the twin's activation ranges, int8 weights and float choices.

How the graph is made (tf2onnx 1.17, onnxruntime 1.31):

- The twin is traced with its ranges frozen (`freeze_model_ranges`, then as it was) and
  converted by `export_onnx`. tf2onnx turns each activation `FakeQuantWithMinMaxVars`
  (constant min/max) into a `QuantizeLinear` / `DequantizeLinear` pair, uint8 with
  `scale = (max - min) / 255` and `zero_point = round(-min / scale)`: TF's nudged range.
- tf2onnx has no conversion for `FakeQuantWithMinMaxVarsPerChannel` and refuses
  `narrow_range=True` (the symmetric weight fake quant): neither reaches it, because TF's
  constant folding, run by tf2onnx's loader, folds every weight fake quant (a constant
  kernel, constant bounds) into a float kernel whose values are the fake-quantized ones.
  Each such kernel lies on its own symmetric grid: `w = q * s` with `s = max|w| / 127`
  per output channel (or per tensor) and integer `q` in [-127, 127]. `_store_int8_weights`
  finds those kernels, stores `q` as an int8 initializer followed by a `DequantizeLinear`
  (per-axis scales), and checks that it found as many as the traced graph has weight fake
  quants: the values are the twin's, bit for bit. The embedding tables (per tensor) are
  stored the same way; `Gather` / `Slice` read int8 rows, dequantized after the lookup.
- The twin's per-channel matmuls are 1x1 convolutions (the TFLite layout); tf2onnx makes
  them `Conv` between transposes, which onnxruntime leaves in float (its int8 `Conv` needs
  a `QuantizeLinear` right after it). `_pointwise_convs_as_matmuls` writes each as a
  `MatMul` (same values), which onnxruntime runs as `MatMulIntegerToFloat` or
  `QLinearMatMul`.
- All this happens before onnxruntime's basic optimizations (`export_onnx`'s constant
  folding). Left to them, onnxruntime's `WeightBiasQuantization` would re-quantize the
  folded float kernels of a `Conv` per tensor: another, coarser int8 weight than the
  twin's per-channel one.

Weights the twin keeps in float (e.g. `feedforward_float_channels`) are not on a grid and
stay float; tensors without a fake quant (e.g. float attention) stay float.
"""

import os

import numpy as np
import onnx
import tensorflow as tf
from onnx import helper
from onnx import numpy_helper

from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.emissions_model import emissions_model
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import uncalibrated_quantizers
from keras_attn.quantization.quantized_model import QuantizedModel

# Ops whose input 1 is a weight the twin may have fake-quantized, and the axis of its
# output channels (`Gemm` with `transB=1`: axis 0).
_WEIGHT_OPS = {"Conv": 0, "MatMul": 1, "Gemm": 1}
# Largest distance of `w / s` from an integer on a fake-quantized kernel (measured 7.6e-6:
# float rounding of `q * s`); a float kernel is ~0.25 away on average.
_GRID_TOLERANCE = 1e-3
# Ops that read rows of an embedding table (input 0): they run on the int8 table, and the
# rows they return are dequantized (the tables are quantized per tensor).
_TABLE_OPS = ("Gather", "Slice")
_WEIGHT_FAKE_QUANTS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxVarsPerChannel")


def export_onnx_qdq(model, path, opset=17):
    """Writes a calibrated `quantize_model` copy as a QDQ int8 ONNX graph (dynamic batch and
    sequence).

    Activations: `x -> DequantizeLinear(QuantizeLinear(x, s, z), s, z)` (uint8) wherever
    the twin fake-quantizes, with its frozen range `[min, max]`: `s = (max - min) / 255`,
    `z = round(-min / s)`. Weights: int8 `q` with `W = s_c q` (`s_c = max|W_c| / 127`, per
    output channel `c` or per tensor, as the twin's `weight_quantization`), read through a
    `DequantizeLinear`. onnxruntime fuses these into int8 kernels when it loads the file.
    A CRF tagger exports its emissions (`emissions_model`).

    Args:
        model: a `QuantizedModel` or `quantize_model` copy whose ranges are trained or
            calibrated. Its ranges are frozen while it is traced, then left as they were.
        path: str or path-like, the `.onnx` file to write.
        opset: int, 17 or 18 (see `export_onnx`). Defaults to `17`.

    Returns:
        The `export_onnx` dict, plus `int8_weights` (int, kernels stored in int8).

    Raises:
        ValueError: `model` is not a calibrated quantization-aware model, or the graph's int8
            kernels do not match the twin's weight fake quants.

    Example:
    >>> import tempfile
    >>> from keras_attn.models.bert_backbone import BertBackbone
    >>> from keras_attn.models.bert_classifier import BertClassifier
    >>> x = {"token_ids": np.array([[2, 7, 9, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.array([[1, 1, 1, 0]])}
    >>> qat = QuantizedModel.calibrated(BertClassifier(BertBackbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16), num_classes=3), [x])
    >>> info = export_onnx_qdq(qat, os.path.join(tempfile.mkdtemp(), "model_int8.onnx"))
    >>> info["output_names"], info["int8_weights"]
    (['logits'], 9)
    """
    model = model.model if isinstance(model, QuantizedModel) else model
    _check_arguments(model, path)
    graph_model = emissions_model(model)
    frozen = all(q.frozen_range is not None for q in activation_quantizers(model))
    freeze_model_ranges(model)
    try:
        return _export(graph_model, path, opset)
    finally:
        if not frozen:  # as it was
            freeze_model_ranges(model, False)


def _export(graph_model, path, opset):
    expected = _count_weight_fake_quants(graph_model)
    stored = []

    def rewrite(model_proto):
        stored.append(_store_int8_weights(_pointwise_convs_as_matmuls(model_proto)))
        if stored[0] != expected:
            raise ValueError(
                f"The traced twin has {expected} weight fake quants but {stored[0]} kernels "
                "of the ONNX graph lie on a symmetric int8 grid: the conversion no longer "
                "keeps the twin's int8 weights (see keras_attn.export.onnx.onnx_qdq_export)."
            )
        return model_proto

    info = export_onnx(graph_model, path, opset=opset, rewrite=rewrite)
    return {**info, "int8_weights": stored[0]}


def _check_arguments(model, path):
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a str or path-like. Received: path={path!r}")
    quantizers = activation_quantizers(model) if hasattr(model, "_flatten_layers") else []
    if not any(q.quantize for q in quantizers):
        raise ValueError("`model` must be a calibrated quantization-aware model (the QDQ graph "
                         "takes its ranges): `QuantizedModel.calibrated(model, batches)` or "
                         "`quantize_model(model)` + `calibrate_model`. Received: "
                         f"model={type(model).__name__} without fake quantization")
    missing = uncalibrated_quantizers(model)
    if missing:
        raise ValueError(
            f"`model` has {len(missing)} quantizers without a range (first: {missing[0]}): "
            "train it or call `calibrate_model(model, batches)` first. Received: an "
            "uncalibrated model"
        )


def _count_weight_fake_quants(model):
    """Weights with a fake quant (symmetric: `narrow_range`) in the traced inference graph."""
    specs = {key: tf.TensorSpec((None, None), tensor.dtype, name=key)
             for key, tensor in model.input.items()}
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(specs).graph
    # One per weight the outputs read: a layer called twice (BERT's last block, once for
    # the [CLS] row) rounds the same weight twice, and the file stores it once; a branch
    # the outputs do not read (a tagger's pooler) is left out of the file.
    return len({_weight_source(op.inputs[0]) for op in _ops_read_by(graph.outputs)
                if op.type in _WEIGHT_FAKE_QUANTS and op.get_attr("narrow_range")})


def _ops_read_by(tensors):
    """The ops the `tensors` are computed from."""
    seen, stack = set(), [tensor.op for tensor in tensors]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(tensor.op for tensor in op.inputs)
    return seen


def _weight_source(tensor):
    """The graph input (a captured variable) that a weight tensor is read and reshaped from."""
    while tensor.op.inputs and tensor.op.type != "Placeholder":
        tensor = tensor.op.inputs[0]
    return tensor.name


def _pointwise_convs_as_matmuls(model_proto):
    """Rewrites each 1x1 `Conv` with a constant kernel `(out, in, 1, 1)` as
    `Transpose(NCHW -> NHWC) -> MatMul(kernel^T (in, out)) [-> Add(bias)] -> Transpose back`.

    The same values. The twin runs its per-channel matmuls as 1x1 convolutions (the layout
    the TFLite converter quantizes per channel), and tf2onnx wraps each in transposes to
    NCHW and back. onnxruntime fuses that `Conv` into an int8 one only when a
    `QuantizeLinear` follows it directly, which the bias add and the transposes prevent
    (measured on MiniLM: all 25 stayed float `Conv`); a `MatMul` between dequantized
    inputs becomes `MatMulIntegerToFloat` (int8 inputs, float output), and the transposes
    around it cancel those of tf2onnx.
    """
    graph = model_proto.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    nodes = []
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel = initializers.get(node.input[1]) if node.op_type == "Conv" else None
        if (kernel is None or list(kernel.dims[2:]) != [1, 1]
                or attributes.get("group", 1) != 1
                or any(stride != 1 for stride in attributes.get("strides", [1, 1]))
                or any(pad != 0 for pad in attributes.get("pads", [0, 0, 0, 0]))
                or attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")):
            nodes.append(node)
            continue
        prefix = node.name or node.output[0]
        weight = numpy_helper.to_array(kernel)[:, :, 0, 0].T  # (in, out)
        graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(weight), f"{prefix}_matmul_weight"))
        product = f"{prefix}_matmul"
        nodes += [
            helper.make_node("Transpose", [node.input[0]], [f"{prefix}_nhwc"],
                             name=f"{prefix}_nhwc", perm=[0, 2, 3, 1]),  # (B, H, W, in)
            helper.make_node("MatMul", [f"{prefix}_nhwc", f"{prefix}_matmul_weight"],
                             [product], name=product),  # (B, H, W, out)
        ]
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("Add", [product, node.input[2]],
                                          [f"{prefix}_biased"], name=f"{prefix}_bias_add"))
            product = f"{prefix}_biased"
        nodes.append(helper.make_node("Transpose", [product], [node.output[0]],
                                      name=f"{prefix}_nchw", perm=[0, 3, 1, 2]))
    del graph.node[:]
    graph.node.extend(nodes)
    read = {name for node in graph.node for name in node.input}
    for tensor in [t for t in graph.initializer if t.name not in read]:
        graph.initializer.remove(tensor)
    return model_proto


def _symmetric_grid(weight, axis):
    """`(q, scale)` when `weight` is `q * scale` with int `q` in [-127, 127] and `scale`
    `max|w| / 127` per tensor (`axis=None`) or per slice along `axis`, else `None`. A slice
    of one value lies on its own grid whatever it is: no evidence of a quantized weight
    (XLNet's sinusoid frequencies, a `(1, d)` constant of a MatMul, are float)."""
    reduce_axes = None if axis is None else tuple(i for i in range(weight.ndim) if i != axis)
    bound = np.abs(weight).max(axis=reduce_axes, keepdims=True)
    if weight.size < 2 * bound.size:
        return None
    scale = np.where(bound > 0, bound, 1.0).astype("float32") / 127.0
    steps = weight / scale
    q = np.round(steps)
    if np.abs(steps - q).max() > _GRID_TOLERANCE:
        return None
    return q.astype("int8"), scale.reshape(-1) if axis is not None else scale.reshape(())


def _store_int8_weights(model_proto):
    """Replaces each fake-quantized float kernel by int8 + `DequantizeLinear`, and each
    fake-quantized embedding table by an int8 table whose gathered (or sliced) rows are
    dequantized; returns how many weights it stored."""
    graph = model_proto.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}

    def float_initializer(name):
        tensor = initializers.get(name)
        return tensor is not None and tensor.data_type == onnx.TensorProto.FLOAT

    dequantized, tables, nodes = {}, {}, []
    for node in graph.node:
        if node.op_type in _WEIGHT_OPS and len(node.input) > 1 and float_initializer(
                node.input[1]):
            name = node.input[1]
            if name not in dequantized:
                weight = numpy_helper.to_array(initializers[name])
                dequantized[name] = _dequantize_node(graph, weight, name, _output_axis(node))
            if dequantized[name] is not None:
                nodes.append(dequantized[name])
                node.input[1] = dequantized[name].output[0]
        elif node.op_type in _TABLE_OPS and float_initializer(node.input[0]):
            name = node.input[0]
            if name not in tables:
                tables[name] = _int8_table(graph, numpy_helper.to_array(initializers[name]),
                                           name)
            if tables[name] is not None:
                nodes.append(node)
                nodes.append(_dequantize_rows(node, name))
                continue
        nodes.append(node)
    # A weight read by several nodes has one DequantizeLinear, placed before the first.
    ordered = list({id(node): node for node in nodes}.values())
    del graph.node[:]
    graph.node.extend(ordered)
    stored = [name for name, found in {**dequantized, **tables}.items() if found is not None]
    read = {name for node in graph.node for name in node.input}
    for name in stored:
        if name not in read:
            graph.initializer.remove(initializers[name])
    return len(stored)


def _int8_table(graph, table, name):
    """Adds the int8 form of an embedding table on a per-tensor symmetric grid (the twin's
    table fake quant) and returns `True`, or `None` for a float table."""
    found = _symmetric_grid(table, None) if table.ndim == 2 else None
    if found is None:
        return None
    q, scale = found
    graph.initializer.extend([
        numpy_helper.from_array(q, f"{name}_int8"),
        numpy_helper.from_array(scale, f"{name}_scale"),
        numpy_helper.from_array(np.zeros((), "int8"), f"{name}_zero_point"),
    ])
    return True


def _dequantize_rows(node, name):
    """Makes `node` (Gather / Slice) read the int8 table and returns the per-tensor
    `DequantizeLinear` that gives its rows in float under the old output name."""
    node.input[0] = f"{name}_int8"
    output = node.output[0]
    node.output[0] = f"{output}_int8"
    return helper.make_node("DequantizeLinear",
                            [node.output[0], f"{name}_scale", f"{name}_zero_point"],
                            [output], name=f"{node.name}_dequantize")


def _output_axis(node):
    axis = _WEIGHT_OPS[node.op_type]
    if node.op_type == "Gemm":
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis = 0 if attributes.get("transB", 0) else 1
    return axis


def _dequantize_node(graph, weight, name, axis):
    """A `DequantizeLinear` of the int8 form of `weight` (its initializers added to
    `graph`), or `None` when `weight` is not on a symmetric grid (a float weight)."""
    for grid_axis in (None, axis):  # per tensor first: per-tensor kernels pass both
        found = _symmetric_grid(weight, grid_axis)
        if found is not None:
            break
    else:
        return None
    q, scale = found
    graph.initializer.extend([
        numpy_helper.from_array(q, f"{name}_int8"),
        numpy_helper.from_array(scale, f"{name}_scale"),
        numpy_helper.from_array(np.zeros(scale.shape, "int8"), f"{name}_zero_point"),
    ])
    attributes = {} if grid_axis is None else {"axis": grid_axis}
    return helper.make_node("DequantizeLinear",
                            [f"{name}_int8", f"{name}_scale", f"{name}_zero_point"],
                            [f"{name}_dequantized"], name=f"{name}_dequantize", **attributes)
