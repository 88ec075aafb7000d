"""How closely `model_int8.tflite` follows the Keras model it was calibrated as (the twin),
measured against how closely the file follows itself on LiteRT's other kernel set.

A float simulation cannot be bit-exact with an int8 runtime: the runtime requantizes with its
own rounding (LiteRT's builtin kernels round twice; XNNPACK in float) and computes the float
ops between the matmuls (LayerNorm sums, softmax, GELU) with its own kernels. An output one
part in a million from a rounding tie then lands one int8 step apart, and the step spreads
through the blocks after it. The same file on LiteRT's builtin kernels (no delegate) and on
XNNPACK is two such runtimes: their agreement is the floor a twin can be held to, and both
are reported side by side."""

import numpy as np

from keras_attn.export.artifact_scoring import compare


def output_steps(outputs, reference, step):
    """Per-output max |Δlogit| in int8 steps of the logits: `(N,)` over the examples (a
    classifier) or the real tokens (a tagger)."""
    deltas = [np.abs(np.asarray(a) - np.asarray(b)).max(-1).reshape(-1)
              for a, b in zip(outputs, reference)]
    return (np.concatenate(deltas) if deltas else np.zeros(0)) / step


def agreement_row(outputs, reference, step):
    """`{"agreement", "disagreements", "outputs", "max_abs_logit_diff", "steps_median",
    "steps_p99", "steps_max"}` of `outputs` against `reference`."""
    steps = output_steps(outputs, reference, step)
    row = compare(outputs, reference)
    return {**row, "outputs": int(steps.size),
            "disagreements": int(round((1 - row["agreement"]) * steps.size)),
            "steps_median": float(np.median(steps)), "steps_p99": float(np.quantile(steps, 0.99)),
            "steps_max": float(steps.max())}


def twin_agreement(twin, xnnpack, builtin_kernels, step):
    """The export report's `twin_agreement` section.

    Args:
        twin: per-example outputs of the calibrated Keras model (ranges frozen).
        xnnpack: the same of `model_int8.tflite` on LiteRT with XNNPACK (what ships).
        builtin_kernels: the same of the file on LiteRT's builtin kernels, no delegate.
        step: the int8 step of the logits (`(max - min) / 255` of their range).

    Returns:
        dict: `logit_step` and three rows (`agreement_row`): `twin_vs_file`,
        `twin_vs_builtin_kernels` and `builtin_kernels_vs_file`, the runtime's own floor.

    Example:

    >>> twin = [np.array([1.0, -1.0]), np.array([0.2, 0.1])]
    >>> xnnpack = [np.array([1.0, -1.0]), np.array([0.1, 0.2])]
    >>> row = twin_agreement(twin, xnnpack, xnnpack, step=0.1)["twin_vs_file"]
    >>> row["agreement"], row["disagreements"], round(row["steps_max"], 6)
    (0.5, 1, 1.0)
    """
    return {"logit_step": float(step),
            "twin_vs_file": agreement_row(twin, xnnpack, step),
            "twin_vs_builtin_kernels": agreement_row(twin, builtin_kernels, step),
            "builtin_kernels_vs_file": agreement_row(builtin_kernels, xnnpack, step)}


def twin_agreement_markdown(section):
    """The report's "The calibrated model vs its file" section, or none."""
    if not section:
        return []
    lines = ["", "## The calibrated model vs its file", "",
             "Per-output argmax agreement and |Δlogit| in int8 steps of the logits (one step "
             f"= {section['logit_step']:.4g}) between the calibrated Keras model and "
             "`model_int8.tflite`. The last row is the file against itself on LiteRT's two "
             "kernel sets: how far two runtimes of the same int8 arithmetic differ, the floor "
             "for a float simulation (`keras_attn.export.twin_agreement`).", "",
             "| outputs compared | agreement | disagree | median / p99 / max steps |",
             "| --- | --- | --- | --- |"]
    names = {"twin_vs_file": "Keras model vs file (XNNPACK, as shipped)",
             "twin_vs_builtin_kernels": "Keras model vs file (builtin kernels)",
             "builtin_kernels_vs_file": "file: builtin kernels vs XNNPACK"}
    for key, name in names.items():
        row = section[key]
        lines.append(f"| {name} | {row['agreement']:.4f} | {row['disagreements']:,} of "
                     f"{row['outputs']:,} | {row['steps_median']:.1f} / "
                     f"{row['steps_p99']:.1f} / {row['steps_max']:.1f} |")
    return lines
