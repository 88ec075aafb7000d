"""The ops of a `QatBert` that its `float_ops` can move to float (an int8 accuracy budget's
moves, `quantization_budget`; the rows of `quantization_sensitivity`)."""

import numpy as np

from keras_attn.layers.int8_layout_settings import MATMULS


def quantization_ops(num_layers, head="classification"):
    """The names of the int8 ops of a `QatBert` that `float_ops` can move to float, in
    graph order: `"embeddings"`, each block's weight matmuls
    (`"transformer_layer_{i}/{qkv,attention_output,intermediate,feedforward_output}"`),
    `"pooled_dense"` (classification) and `"logits"`."""
    blocks = [f"transformer_layer_{i}/{m}" for i in range(num_layers) for m in MATMULS]
    return ["embeddings", *blocks,
            *(["pooled_dense"] if head == "classification" else []), "logits"]


def check_float_ops(float_ops, names):
    """`float_ops` as a tuple in graph order, or an error naming the unknown op."""
    if isinstance(float_ops, str):
        float_ops = [float_ops]
    unknown = [op for op in float_ops if op not in names]
    if unknown:
        raise ValueError(f"`float_ops` names an op the model does not have: {unknown[0]!r}; "
                         f"its ops: {names[0]!r}, {names[1]!r}, ..., {names[-1]!r} "
                         f"(`quantization_ops`). Received: float_ops={list(float_ops)!r}")
    return tuple(op for op in names if op in float_ops)


def op_weight_count(model, op):
    """How many weights op `op` of a `QatBert` stores in int8 (in float32, 4 bytes each
    instead of 1, when `float_ops` lists it): the embedding tables, a block matmul's
    kernel (the feed-forward ones without the float channels), or a dense layer's kernel."""
    if op == "embeddings":
        layer = model.get_layer("embeddings")
        return sum(_count(w) for w in (layer.token_embeddings, layer.segment_embeddings,
                                       layer.position_embeddings))
    if "/" not in op:
        return _count(model.get_layer(op).kernel)
    name, matmul = op.split("/")
    block = model.get_layer(name)
    kernel = {"qkv": block.qkv_kernel, "attention_output": block.output_kernel,
              "intermediate": block.intermediate_kernel,
              "feedforward_output": block.feedforward_output_kernel}[matmul]
    float_channels = block.feedforward_float_channels * block.intermediate_kernel.shape[0]
    return _count(kernel) - (float_channels if matmul in ("intermediate",
                                                           "feedforward_output") else 0)


def _count(variable):
    return int(np.prod(variable.shape))
