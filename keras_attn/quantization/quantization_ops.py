"""`check_float_ops`: the names an int8 budget moves to float (`float_ops` of
`quantize_model` and `QuantizedModel`), checked against the model's ops
(`model_quantization_ops`)."""


def check_float_ops(float_ops, names):
    """`float_ops` as a tuple in graph order, or an error naming the unknown op."""
    if isinstance(float_ops, str):
        float_ops = [float_ops]
    unknown = [op for op in float_ops if op not in names]
    if unknown:
        shown = [repr(name) for name in names]
        if len(shown) > 3:
            shown = [shown[0], shown[1], "...", shown[-1]]
        raise ValueError(f"`float_ops` names an op the model does not have: {unknown[0]!r}; "
                         f"its ops: {', '.join(shown)} (`model_quantization_ops`). "
                         f"Received: float_ops={list(float_ops)!r}")
    return tuple(op for op in names if op in float_ops)
