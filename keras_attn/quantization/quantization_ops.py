"""The ops of a `QatBert` that its `float_ops` can move to float (an int8 accuracy budget's
moves, `quantization_budget`; the rows of `quantization_sensitivity`)."""

from keras_attn.quantization.qat_encoder_block import MATMULS


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
