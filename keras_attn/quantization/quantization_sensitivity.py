"""How much int8 error each op of a calibrated model adds on its own.

For a calibrated `QuantizedModel`, `quantization_sensitivity` runs the same inputs with every
op in float (its float model), with the recipe (its own `float_ops` float, the rest int8),
and with only one op int8 at a time: each op `model_quantization_ops` names (an embedding,
each weight matmul of each block (`qkv`, `attention_output`, `intermediate`,
`feedforward_output`, each with the rounding of its input and output), a `Dense` such as
the pooler and the output layer). Each row compares that run's logits with the
float run's:

    SNR_dB = 10 log10( sum(z_float^2) / sum((z_op - z_float)^2) )

over the real positions (all classes), the max |Δlogit| and the argmax agreement. A low SNR
marks the op whose int8 costs the most; the rows are sorted from the most to the least
sensitive. The export report shows them (`export_report.md`, "Quantization sensitivity",
and a picture), and an int8 accuracy budget moves ops to float in this order
(`quantization_budget`), as the LiteRT / AI Edge quantizer's per-op error report and
OpenVINO's accuracy-aware quantization do.

The runs use the model's frozen ranges (`QuantizedModel.freeze_ranges`: the roundings of the
int8 file, biases included).
"""

import keras
import numpy as np

from keras_attn.quantization.model_queries import model_inputs

SENSITIVITY_EXAMPLES = 128  # calibration examples the export measures on


def quantization_sensitivity(model, batches):
    """Rows `{"op", "snr_db", "max_abs_logit_diff", "agreement"}`: `"all"` (the recipe)
    first, then one per int8 op of the recipe, most sensitive (lowest SNR) first.

    Args:
        model: a calibrated `QuantizedModel` (not changed).
        batches: list of model inputs (a CRF tagger's `label_mask` defaults to the padding
            mask, `model_inputs`).

    Returns:
        list of dicts.

    Example:
    >>> from keras_attn.models import BertBackbone, BertClassifier
    >>> from keras_attn.quantization import QuantizedModel
    >>> backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         intermediate_dim=16, max_sequence_length=8)
    >>> x = {"token_ids": np.array([[2, 5, 9, 3]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.ones((1, 4), "int32")}
    >>> qat = QuantizedModel.calibrated(BertClassifier(backbone, num_classes=3), [x],
    ...                                 float_residual=True)
    >>> rows = quantization_sensitivity(qat, [x])
    >>> [r["op"] for r in rows][0], len(rows) == 1 + len(qat.quantization_ops())
    ('all', True)
    """
    names = model.quantization_ops()
    reference = logits_of(model.with_quantization(False), batches)
    rows = [_compare("all", logits_of(model, batches), reference, batches)]
    for op in names:
        if op in model.float_ops:
            continue
        alone = model.with_float_ops([name for name in names if name != op])
        rows.append(_compare(op, logits_of(alone, batches), reference, batches))
    return rows[:1] + sorted(rows[1:], key=lambda row: row["snr_db"])


def logits_of(model, batches):
    """The float64 logits (a CRF model's emissions) per batch of a `QuantizedModel` with
    frozen ranges (left frozen), or of a float model."""
    if hasattr(model, "freeze_ranges"):
        model.freeze_ranges()
    outputs = []
    for x in batches:
        out = model(model_inputs(model, x), training=False)
        if isinstance(out, dict):
            out = out["logits"]
        outputs.append(keras.ops.convert_to_numpy(out).astype("float64"))
    return outputs


def _compare(name, outputs, reference, batches):
    signal = noise = 0.0
    delta, agree, total = 0.0, 0, 0
    for out, ref, x in zip(outputs, reference, batches):
        if out.ndim == 3 and isinstance(x, dict) and "padding_mask" in x:  # the real tokens
            mask = np.asarray(x["padding_mask"]).astype(bool)
            out, ref = out[mask], ref[mask]
        signal += float((ref ** 2).sum())
        noise += float(((out - ref) ** 2).sum())
        delta = max(delta, float(np.abs(out - ref).max(initial=0.0)))
        agree += int((out.argmax(-1) == ref.argmax(-1)).sum())
        total += len(out)
    snr = float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-30) / noise)
    return {"op": name, "snr_db": round(float(snr), 2),
            "max_abs_logit_diff": round(delta, 5), "agreement": agree / max(total, 1)}
