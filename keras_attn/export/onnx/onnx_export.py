"""ONNX export of keras-attn models (through tf2onnx) and onnxruntime inference.

- `export_onnx`: a float Keras model with a dict of inputs -> an ONNX file with dynamic
  `batch` and `sequence` axes, the Keras input names and a `logits` output.
- `keras_attn.export.onnx.onnx_quantization.quantize_onnx_dynamic`: onnxruntime dynamic-range
  int8 (int8 weights, activations quantized at run time).
- `keras_attn.export.onnx.onnx_runner.OnnxRunner`: an onnxruntime session fed with the same dict
  of numpy arrays as the Keras model, with a fixed number of intra-op threads
  (for latency measurements).
- `keras_attn.export.onnx.onnx_metadata`: the model card, vocabulary and labels as the file's
  `metadata_props`, so one `.onnx` file is enough to tokenize, run and decode.

Exact GELU: on TensorFlow, `keras.activations.gelu(x)` is `0.5 x erfc(-x / sqrt(2))`.
tf2onnx has no conversion for `Erfc` (ONNX has no such operator) and leaves the TF op in
the graph, which onnxruntime then refuses to load. `export_onnx` converts it with the
identity erfc(z) = 1 - erf(z) (ONNX `Erf`, opset 9), so models with the exact GELU of
the published BERT checkpoints export unchanged.
"""

import logging
import os
import tempfile

import keras
import numpy as np
import onnx
import onnxruntime
import tensorflow as tf
import tf2onnx

from keras_attn import atomic_files

logger = logging.getLogger(__name__)

# The opsets tf2onnx 1.17 can target at or above 17: 17 is the first with
# LayerNormalization, 18 the newest tf2onnx knows.
SUPPORTED_OPSETS = (17, 18)
BATCH_AXIS = "batch"
SEQUENCE_AXIS = "sequence"


def export_onnx(model, path, opset=17, outputs=None, rewrite=None):
    """Writes a float Keras model as an ONNX graph with dynamic batch and sequence axes.

    The model's forward pass (inference mode: dropout off) is traced as a `tf.function`
    on `tf.TensorSpec`s with a `None` batch and sequence dimension and converted by
    `tf2onnx.convert.from_function`. The ONNX graph keeps the Keras input names
    (`token_ids`, `segment_ids`, `padding_mask` for the BERT models) and their dtypes,
    names dimension 0 of every input and output `batch` and dimension 1 `sequence`
    when they are dynamic, and names the output `logits` (a model with a dict of
    outputs keeps its keys). Erfc (the exact GELU on TensorFlow) is written as
    `1 - Erf`, and onnxruntime's basic (hardware-independent) optimizations fold the
    constant subgraphs tf2onnx leaves (a second copy of each fused Q/K/V kernel). The
    result passes `onnx.checker.check_model(full_check=True)` before it is written.

    A `BertTokenClassifier(use_crf=True)` is exported as its emission scores
    (`outputs=["logits"]` by default): Viterbi decoding runs outside the network with
    the CRF's `(K, K)` transition matrix, and the `label_mask` input, which only the
    decoding reads, is not part of the graph. Graph inputs that the exported outputs
    do not read are removed and logged.

    Args:
        model: a float32 `keras.Model` (TensorFlow backend) whose `model.input` is a
            dict of named `keras.Input`s, e.g. `BertClassifier`, `BertTokenClassifier`.
        path: str or path-like, the `.onnx` file to write (its directory must exist).
        opset: int, the ONNX opset, 17 or 18. Defaults to `17`.
        outputs: for a model with a dict of outputs, the list of output keys to export;
            `None` exports every output (only `"logits"` for a CRF tagger). Must be
            `None` for a model with a single output, which is named `logits`.
        rewrite: optional callable `ModelProto -> ModelProto` applied to tf2onnx's graph
            before the constant folding (`keras_attn.export.onnx.onnx_qdq_export` stores the
            fake-quantized weights of a `quantize_model` copy in int8 there). Defaults to `None`.

    Returns:
        A dict: `path` (str), `input_names` and `output_names` (lists of str, graph
        order), `opset` (int), `removed_inputs` (list of str, inputs not read by the
        exported outputs).

    Raises:
        ValueError: a bad argument, a model without a dict of inputs, a model not in
            float32, or an op tf2onnx cannot express in standard ONNX (the message
            names the node and the op).

    Example:
    >>> import tempfile
    >>> from keras_attn.models.bert_backbone import BertBackbone
    >>> from keras_attn.models.bert_classifier import BertClassifier
    >>> classifier = BertClassifier(BertBackbone(
    ...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16), num_classes=3)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    >>> info = export_onnx(classifier, path)
    >>> info["input_names"], info["output_names"]
    (['token_ids', 'segment_ids', 'padding_mask'], ['logits'])
    """
    _check_export_arguments(model, path, opset, outputs)
    selected = _select_outputs(model, outputs)
    model_proto = _convert(model, selected, opset)
    _check_standard_ops(model_proto, opset)
    if rewrite is not None:
        model_proto = rewrite(model_proto)
    model_proto = _fold_constants(model_proto)
    removed = _remove_unread_inputs(model_proto)
    _order_inputs(model_proto, list(model.input))
    _name_dynamic_axes(model_proto)
    onnx.checker.check_model(model_proto, full_check=True)
    model_proto.producer_name = "keras-attn (tf2onnx)"
    onnx.helper.set_model_props(model_proto, {
        "keras_attn.model_class": type(model).__name__,
        "keras_attn.keras_version": keras.__version__,
    })
    with atomic_files.atomic_path(path) as temporary:
        onnx.save(model_proto, os.fspath(temporary))
    if removed:
        logger.info("ONNX export of %s: inputs %s are not read by the outputs %s and are "
                    "not graph inputs.", model.name, removed, list(selected))
    return {
        "path": os.fspath(path),
        "input_names": [i.name for i in model_proto.graph.input],
        "output_names": [o.name for o in model_proto.graph.output],
        "opset": opset,
        "removed_inputs": removed,
    }


def _check_export_arguments(model, path, opset, outputs):
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "export_onnx converts through tf2onnx and needs the TensorFlow backend: set "
            "KERAS_BACKEND=tensorflow. Received: "
            f"keras.backend.backend()={keras.backend.backend()!r}"
        )
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}")
    try:
        model_inputs = model.input
    except AttributeError:  # a subclassed or never-called model has no symbolic inputs
        model_inputs = None
    if not isinstance(model_inputs, dict):
        raise ValueError(
            "`model` must take a dict of named inputs (e.g. token_ids, segment_ids, "
            "padding_mask), whose keys become the ONNX input names; wrap a model with "
            "positional inputs in a functional model with named keras.Input dict "
            f"inputs. Received: model.input={model_inputs!r}"
        )
    outputs_flat = list(model.output.values()) if isinstance(model.output, dict) else [
        model.output]
    for tensor in outputs_flat:
        dtype = keras.backend.standardize_dtype(getattr(tensor, "dtype", "float32"))
        if "float" in dtype and dtype != "float32":
            raise ValueError(
                "export_onnx exports float32 models (ONNX-side quantization: "
                "quantize_onnx_dynamic); rebuild the model with dtype='float32' and load "
                f"its weights. Received: an output of dtype {dtype}"
            )
    if isinstance(opset, bool) or opset not in SUPPORTED_OPSETS:
        raise ValueError(
            f"`opset` must be one of {SUPPORTED_OPSETS} (17 is the first ONNX opset with "
            f"LayerNormalization; tf2onnx 1.17 targets at most 18). Received: opset={opset!r}"
        )
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a str or path-like. Received: path={path!r}")
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(directory):
        raise ValueError(
            f"The directory of `path` does not exist ({directory}); create it first. "
            f"Received: path={path!r}"
        )
    if outputs is not None and not isinstance(model.output, dict):
        raise ValueError(
            "`outputs` selects keys of a model with a dict of outputs; this model has a "
            f"single output (exported as 'logits'): pass outputs=None. Received: "
            f"outputs={outputs!r}"
        )


def _select_outputs(model, outputs):
    """The exported outputs, as a dict from ONNX output name to Keras tensor."""
    if not isinstance(model.output, dict):
        if isinstance(model.output, (list, tuple)):
            raise ValueError(
                "`model` must have one output tensor or a dict of named outputs (the "
                "ONNX output names); it returns a list. Wrap it in a functional model "
                f"with a dict of outputs. Received: model.output={model.output!r}"
            )
        return {"logits": model.output}
    if outputs is None:
        # A CRF tagger serves its emissions; Viterbi decoding runs outside the graph.
        if getattr(model, "use_crf", False) and "logits" in model.output:
            outputs = ["logits"]
        else:
            outputs = list(model.output)
    if isinstance(outputs, str) or not isinstance(outputs, (list, tuple)) or not outputs:
        raise ValueError(
            f"`outputs` must be a non-empty list of output keys of the model "
            f"({sorted(model.output)}). Received: outputs={outputs!r}"
        )
    unknown = [key for key in outputs if key not in model.output]
    if unknown:
        raise ValueError(
            f"`outputs` names outputs the model does not have: {unknown}; its outputs "
            f"are {sorted(model.output)}. Received: outputs={outputs!r}"
        )
    return {key: model.output[key] for key in outputs}


def _convert(model, selected, opset):
    """The tf2onnx ModelProto of `model` restricted to the `selected` outputs."""
    names = list(selected)
    keys = None if not isinstance(model.output, dict) else names
    specs = {
        key: tf.TensorSpec((None,) + tuple(tensor.shape[1:]), tensor.dtype, name=key)
        for key, tensor in model.input.items()
    }

    @tf.function(input_signature=[specs])
    def forward(inputs):
        result = model(inputs, training=False)
        if keys is None:
            return {names[0]: result}
        return {key: result[key] for key in keys}

    try:
        model_proto, _ = tf2onnx.convert.from_function(
            forward, input_signature=[specs], opset=opset,
            custom_op_handlers={"Erfc": (_erfc_as_one_minus_erf, []),
                                "XlaDynamicUpdateSlice": (_dynamic_update_slice, [])},
        )
    except Exception as error:
        raise ValueError(
            f"tf2onnx could not convert {type(model).__name__} '{model.name}' to ONNX "
            f"opset {opset}: {type(error).__name__}: {error}"
        ) from error
    return model_proto


def _erfc_as_one_minus_erf(ctx, node, name, args):
    """tf2onnx handler: TF `Erfc(z)` as ONNX `1 - Erf(z)` (erfc = 1 - erf).

    The absolute error is that of float32 `1 - erf(z)`, at most about 6e-8: in the
    exact GELU, `0.5 x erfc(-x / sqrt(2))`, it changes no logit by more than 1e-6.
    """
    node.type = "Erf"
    dtype = tf2onnx.utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    one = ctx.make_const(tf2onnx.utils.make_name(f"{name}_one"), np.array(1, dtype))
    ctx.insert_new_node_on_output(
        "Sub", node.output[0], name=tf2onnx.utils.make_name(f"{name}_one_minus"),
        inputs=[one.output[0], node.output[0]],
    )
    return node


def _dynamic_update_slice(ctx, node, name, args):
    """tf2onnx handler: TF `XlaDynamicUpdateSlice(operand, update, starts)` (Keras'
    `ops.slice_update`, the key/value caches' write) as ONNX ops: the update padded to the
    operand's shape at `starts` (clamped so that it fits, as XLA does) and selected where
    it lands, `Where(Pad(1, pads) > 0, Pad(update, pads), operand)`."""
    operand, update, starts = node.input[0], node.input[1], node.input[2]

    def op(kind, inputs, **attr):
        return ctx.make_node(kind, inputs, attr=attr,
                             op_name_scope=tf2onnx.utils.make_name(f"{name}_{kind}")).output[0]

    operand_shape, update_shape = op("Shape", [operand]), op("Shape", [update])
    room = op("Sub", [operand_shape, update_shape])  # the largest start of each axis
    zero = ctx.make_const(tf2onnx.utils.make_name(f"{name}_zero"), np.array([0], "int64"))
    starts = op("Min", [op("Max", [op("Cast", [starts], to=onnx.TensorProto.INT64),
                                   zero.output[0]]), room])
    pads = op("Concat", [starts, op("Sub", [room, starts])], axis=0)  # (2 * rank,)
    ones = op("ConstantOfShape", [update_shape], value=onnx.helper.make_tensor(
        "one", onnx.TensorProto.BOOL, [1], [True]))
    landed = op("Pad", [ones, pads])  # (bool pads with False)
    padded = op("Pad", [update, pads])
    node.type = "Where"
    ctx.replace_inputs(node, [landed, padded, operand])
    return node


def _fold_constants(model_proto):
    """The graph after onnxruntime's basic (hardware-independent) optimizations.

    tf2onnx leaves constant subgraphs behind: each fused Q/K/V kernel is stored twice
    (as the variable and as a reshaped copy whose only consumer is a `Shape` node, +47 %
    of the attention weights) and the output projection's kernel is reshaped at run
    time, so the quantizer cannot see it as a weight. Constant folding and redundant
    node elimination remove both; they change no value.
    """
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as directory:
        options.optimized_model_filepath = os.path.join(directory, "folded.onnx")
        onnxruntime.InferenceSession(
            model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        folded = onnx.load(options.optimized_model_filepath)
    # onnxruntime declares every domain it knows; keep the ones the nodes use.
    used = {node.domain for node in folded.graph.node} | {""}
    kept = [entry for entry in folded.opset_import if entry.domain in used]
    del folded.opset_import[:]
    folded.opset_import.extend(kept)
    return folded


def _remove_unread_inputs(model_proto):
    read = {name for node in model_proto.graph.node for name in node.input}
    read |= {output.name for output in model_proto.graph.output}
    removed = [i.name for i in model_proto.graph.input if i.name not in read]
    kept = [i for i in model_proto.graph.input if i.name in read]
    del model_proto.graph.input[:]
    model_proto.graph.input.extend(kept)
    return removed


def _order_inputs(model_proto, keras_order):
    # tf2onnx sorts inputs by name; the model's own order reads better in tools.
    rank = {name: position for position, name in enumerate(keras_order)}
    ordered = sorted(model_proto.graph.input, key=lambda i: rank.get(i.name, len(rank)))
    del model_proto.graph.input[:]
    model_proto.graph.input.extend(ordered)


def _name_dynamic_axes(model_proto):
    # tf2onnx names unknown dimensions "unk__N"; dimension 0 is the batch and
    # dimension 1 the sequence of token inputs and of per-token outputs.
    for value in list(model_proto.graph.input) + list(model_proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        for axis, readable in ((0, BATCH_AXIS), (1, SEQUENCE_AXIS)):
            if len(dims) > axis and not dims[axis].HasField("dim_value"):
                dims[axis].dim_param = readable


def _check_standard_ops(model_proto, opset):
    for node in model_proto.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if not onnx.defs.has(node.op_type, opset, ""):
            raise ValueError(
                f"tf2onnx left the node '{node.name}' as op '{node.op_type}', which is not "
                f"an ONNX operator at opset {opset}, so onnxruntime cannot load the graph. "
                "Replace the Keras op that produces it with one tf2onnx converts (see "
                "https://github.com/onnx/tensorflow-onnx/blob/main/support_status.md) or "
                "try the other supported opset."
            )
