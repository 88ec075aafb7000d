"""How much int8 error each part of a calibrated model adds on its own.

For a `QatBert` twin, `quantization_sensitivity` runs the same inputs with every fake
quantization off (the float arithmetic of the twin, equal to the float model), with all of
it on (the recipe), and with only one group on at a time: the embeddings, each Transformer
block, the head. Each row compares that run's logits with the float run's:

    SNR_dB = 10 log10( sum(z_float^2) / sum((z_group - z_float)^2) )

over the real positions (all classes), the max |Δlogit| and the argmax agreement. A low SNR
marks the group whose int8 costs the most; the rows are sorted from the most to the least
sensitive. The export report shows them (`export_report.md`, "Quantization sensitivity"),
the evidence an int8 budget acts on (keeping the most sensitive groups in float first, as
the LiteRT / AI Edge quantizer's per-op error report and OpenVINO's accuracy-aware
quantization do).

A group keeps the recipe's own choices when it is on (a float residual stream stays float).
"""

import keras
import numpy as np

SENSITIVITY_EXAMPLES = 128  # calibration examples the export measures on


def quantization_groups(model):
    """`{group name: [layers whose `quantize` flag belongs to it]}` of a `QatBert`, in graph
    order: each top-level layer holding fake quantization (embeddings, every block, the
    pooled dense and the logits) with its nested quantizers."""
    groups = {}
    for layer in model.layers:
        members = [sub for sub in [layer, *layer._flatten_layers(include_self=False)]
                   if isinstance(getattr(sub, "quantize", None), bool)]
        if members:
            groups[layer.name] = members
    return groups


def quantization_sensitivity(model, batches):
    """Rows `{"group", "snr_db", "max_abs_logit_diff", "agreement"}`: `"all"` (the recipe)
    first, then one per group, most sensitive (lowest SNR) first.

    Args:
        model: a calibrated `QatBert` (its flags are restored afterwards).
        batches: list of input dicts (the three id inputs; a CRF model's `label_mask`
            defaults to the padding mask).

    Returns:
        list of dicts.

    Example:
    >>> from keras_attn.quantization.qat_bert import QatBert
    >>> qat = QatBert(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
    ...               intermediate_dim=16, max_sequence_length=8, num_outputs=3)
    >>> x = {"token_ids": np.array([[2, 5, 9, 3]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.ones((1, 4), "int32")}
    >>> qat.calibrate([x])
    >>> rows = quantization_sensitivity(qat, [x])
    >>> [r["group"] for r in rows][0], sorted(r["group"] for r in rows[1:])
    ('all', ['embeddings', 'logits', 'pooled_dense', 'transformer_layer_0', 'transformer_layer_1'])
    """
    groups = quantization_groups(model)
    recipe = {id(layer): layer.quantize for members in groups.values() for layer in members}
    layers = {id(layer): layer for members in groups.values() for layer in members}

    def logits_with(enabled):
        for key, layer in layers.items():
            layer.quantize = recipe[key] and key in enabled
        return [_logits(model, x) for x in batches]

    try:
        reference = logits_with(set())
        rows = [_compare("all", logits_with(set(layers)), reference, batches)]
        per_group = [_compare(name, logits_with({id(layer) for layer in members}),
                              reference, batches) for name, members in groups.items()]
    finally:
        for key, layer in layers.items():
            layer.quantize = recipe[key]
    return rows + sorted(per_group, key=lambda row: row["snr_db"])


def _logits(model, x):
    inputs = dict(x)
    if getattr(model, "use_crf", False):
        inputs.setdefault("label_mask", inputs["padding_mask"])
    outputs = model(inputs, training=False)
    if isinstance(outputs, dict):
        outputs = outputs["logits"]
    return keras.ops.convert_to_numpy(outputs).astype("float64")


def _compare(name, outputs, reference, batches):
    signal = noise = 0.0
    delta, agree, total = 0.0, 0, 0
    for out, ref, x in zip(outputs, reference, batches):
        if out.ndim == 3:  # (B, L, C): the real tokens only
            mask = np.asarray(x["padding_mask"]).astype(bool)
            out, ref = out[mask], ref[mask]
        signal += float((ref ** 2).sum())
        noise += float(((out - ref) ** 2).sum())
        delta = max(delta, float(np.abs(out - ref).max(initial=0.0)))
        agree += int((out.argmax(-1) == ref.argmax(-1)).sum())
        total += len(out)
    snr = float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-30) / noise)
    return {"group": name, "snr_db": round(float(snr), 2),
            "max_abs_logit_diff": round(delta, 5), "agreement": agree / max(total, 1)}
