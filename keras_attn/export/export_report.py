"""`export_report.md`: the export report as a Markdown page (the artifact table, latencies,
op histograms, the calibrated model vs its file, the self-describing files and the length
buckets)."""

import dataclasses

from keras_attn.export.length_buckets import buckets_markdown
from keras_attn.export.mediapipe_export import self_describing_markdown
from keras_attn.export.twin_agreement import twin_agreement_markdown
from keras_attn.runs.quantization_recipe import QuantizationRecipe


def _qat_description(report):
    """The line of the report saying how the QAT model was made (from the recipe, or the
    options of reports written before the recipe was recorded)."""
    recorded = report.get("quantization")
    legacy = report.get("options") or {}
    if recorded is None and "qat_epochs" in legacy:
        names = {f.name for f in dataclasses.fields(QuantizationRecipe)}
        recorded = {k: v for k, v in legacy.items() if k in names}
    if recorded is None:
        return []
    recipe = QuantizationRecipe.from_dict(recorded)
    return [f"QAT model (`model_int8.tflite`): {recipe.describe()}.", ""]


def report_markdown(report):
    """The report as a Markdown page: the artifact table, latencies and op histograms."""
    metric = report["metric"]
    float_row = report["artifacts"][0]
    float_size = next((r["size_bytes"] for r in report["artifacts"]
                       if r["artifact"] == "model_fp32.tflite"), None)
    threads = sorted({lat["num_threads"] for r in report["artifacts"]
                      for lat in r.get("latency", [])})
    float_latency = {lat["num_threads"]: lat["p50_ms"] for r in report["artifacts"]
                     if r["artifact"] == "model_fp32.tflite" for lat in r.get("latency", [])}
    lines = [
        f"# Export report: {report['task']}",
        "",
        f"Source run `{report['source_run']}`; {metric} on {report['eval_examples']:,} "
        f"{report['eval_split']} examples; sequence length {report['sequence_length']}; "
        f"{report['machine']['cpu']}, {report['machine']['cpu_count']} cores; TensorFlow "
        f"{report['machine']['tensorflow']}, Keras {report['machine']['keras']}.",
        "",
        *_qat_description(report),
        "Agreement: top-1 (classification) or per-token argmax (NER) equal to the Keras "
        "float model's; max |Δlogit| over real tokens. Latency: one batch-1 inference "
        "(LiteRT with XNNPACK; onnxruntime), p50 / p90 ms, the artifacts timed in turns.",
        "",
        f"| artifact | {metric} | Δ vs float | agreement | max \\|Δlogit\\| | size | "
        "% of fp32 | " + " | ".join(f"{t} thread{'s' if t > 1 else ''} p50 / p90 (× fp32)"
                                   for t in threads) + " |",
        "| --- " * (7 + len(threads)) + "|",
    ]
    for row in report["artifacts"]:
        cells = [f"`{row['artifact']}`", f"{row['metric']:.4f}",
                 f"{row['metric'] - float_row['metric']:+.4f}", f"{row['agreement']:.4f}",
                 f"{row['max_abs_logit_diff']:.2e}", f"{row['size_bytes'] / 1e6:.1f} MB",
                 f"{100 * row['size_bytes'] / float_size:.0f} %" if float_size else "—"]
        by_threads = {lat["num_threads"]: lat for lat in row.get("latency", [])}
        for t in threads:
            lat = by_threads.get(t)
            ratio = f" ({lat['p50_ms'] / float_latency[t]:.2f}×)" \
                if lat and t in float_latency else ""
            cells.append(f"{lat['p50_ms']:.2f} / {lat['p90_ms']:.2f}{ratio}" if lat else "—")
        lines.append("| " + " | ".join(cells) + " |")
    int8 = next((r for r in report["artifacts"] if r["artifact"] == "model_int8.tflite"), None)
    if int8 is not None:
        lines += ["", "## Ops of `model_int8.tflite` that are not int8", ""]
        if int8["non_int8_ops"]:
            lines += [f"- `{op}` × {count}" for op, count in int8["non_int8_ops"].items()]
        else:
            lines.append("None: every op runs in integer arithmetic.")
        if report.get("float_layers"):
            lines += ["", "Layers the QAT model left in float (not known to `quantize_model`; "
                      "the converter calibrated their outputs): "
                      + ", ".join(f"`{name}`" for name in report["float_layers"]) + "."]
    lines += twin_agreement_markdown(report.get("twin_agreement"))
    lines += sensitivity_markdown(report.get("quantization_sensitivity"))
    lines += budget_markdown(report.get("quantization_budget"))
    lines += ["", "## Op histograms", ""]
    for row in report["artifacts"]:
        if "ops" in row:
            ops = ", ".join(f"{op} {count}" for op, count in row["ops"].items())
            lines.append(f"- `{row['artifact']}`: {ops}")
    lines += self_describing_markdown(report.get("self_describing_tflite"))
    lines += buckets_markdown(report.get("length_buckets"))
    if report.get("model_text_tflite_error"):
        lines += ["", f"`model_text.tflite` was not written: {report['model_text_tflite_error']}"]
    lines.append("")
    return "\n".join(lines)


def sensitivity_markdown(rows):
    """The "Quantization sensitivity" section (`quantization_sensitivity` rows), or none."""
    if not rows:
        return []
    lines = ["", "## Quantization sensitivity", "",
             "The int8 error of the calibrated Keras model with only one op in int8 (the rest "
             "float), against the model with none, on calibration examples; most sensitive "
             "first (`keras_attn.quantization.quantization_sensitivity`; picture: "
             "`quantization_sensitivity.png`).", "",
             "| int8 | SNR of the logits (dB) | max \\|Δlogit\\| | argmax agreement |",
             "| --- | --- | --- | --- |"]
    for row in rows:
        op = row.get("op", row.get("group"))  # "group": reports written before per-op rows
        name = "everything (the recipe)" if op == "all" else f"`{op}` only"
        lines.append(f"| {name} | {row['snr_db']:.1f} | {row['max_abs_logit_diff']:.3g} | "
                     f"{row['agreement']:.4f} |")
    return lines


def budget_markdown(budget):
    """The "int8 accuracy budget" section (`quantization_budget` record), or none: the
    verdict of `model_int8.tflite` on XNNPACK first (`file`, `keras_attn.export.file_budget`),
    the calibrated model's beside it and the file on LiteRT's builtin kernels, then the
    calibrated model's search and the file's own moves."""
    if not budget:
        return []
    lines = ["", "## int8 accuracy budget", "",
             f"At most {budget['max_accuracy_drop']:g} points below float "
             + ("(the default: 0.5 points or one example, whichever is more) "
                if budget.get("default_budget") else "")
             + f"({budget['float_metric']:.2f}) on {budget['examples']:,} {budget['split']} "
             "examples."]
    lines += _file_verdict(budget.get("file"))
    met = "within" if budget["within_budget"] else "NOT within"
    lines += ["", "The calibrated model's search: the most sensitive ops moved to float one "
              "at a time (`keras_attn.quantization.quantization_budget`). Result: "
              f"{met} the budget, {len(budget['float_ops'])} op(s) float: "
              + (", ".join(f"`{op}`" for op in budget["float_ops"]) or "none")
              + f"; their float weights add {budget.get('size_cost_bytes', 0) / 1e6:.2f} MB "
                "to `model_int8.tflite` (its size and latency: the artifact table).", "",
              "| ops in float | metric | below float | float weights add |",
              "| --- | --- | --- | --- |"]
    for step in budget["steps"]:
        moved = f"+ `{step['float_ops'][-1]}`" if step["float_ops"] else "none (the recipe)"
        lines.append(f"| {moved} | {step['metric']:.2f} | {step['drop']:.2f} | "
                     f"{step.get('size_cost_bytes', 0) / 1e6:.2f} MB |")
    return lines + _file_moves(budget.get("file"))


def _file_verdict(file):
    """The three rows: the file on XNNPACK (the verdict), the calibrated model, the file on
    the builtin kernels; none for a record made before the file was scored."""
    if not file:
        return []
    last = file["steps"][-1]
    word = "within" if file["within_budget"] else "NOT within"
    twin = "within" if file["twin_within_budget"] else "NOT within"
    builtin = "within" if file["builtin_kernels_drop"] <= file["max_accuracy_drop"] \
        else "NOT within"
    return ["", f"Verdict: `model_int8.tflite` is {word} the budget on LiteRT with "
            f"XNNPACK (how it ships), scored on the {file['examples']:,} {file['split']} "
            "examples; the calibrated Keras model it converts and the same file on LiteRT's "
            "builtin kernels beside it (an int8 file's score depends on the kernels).", "",
            "| scored | metric | below float | budget |", "| --- | --- | --- | --- |",
            f"| `model_int8.tflite`, LiteRT + XNNPACK (ships) | {last['file_metric']:.2f} | "
            f"{last['file_drop']:.2f} | **{word}** |",
            f"| calibrated Keras model | {last['twin_metric']:.2f} | {last['twin_drop']:.2f} "
            f"| {twin} |",
            f"| `model_int8.tflite`, LiteRT builtin kernels | "
            f"{file['builtin_kernels_metric']:.2f} | {file['builtin_kernels_drop']:.2f} | "
            f"{builtin} |"]


def _file_moves(file):
    """The ops moved because the file missed while its model did not, or none."""
    if not file or not file["moved"]:
        return []
    lines = ["", f"The file missed: ops moved to float for it, each file converted again (at "
             f"most {file['max_moves']}); their float weights add "
             f"{file['size_cost_bytes'] / 1e6:.2f} MB more.", "",
             "| ops in float | file (XNNPACK) | below float | calibrated model | below float "
             "| file size | p50 ms (1 thread) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    first = len(file["float_ops"]) - len(file["moved"])
    for step in file["steps"]:
        moved = len(step["float_ops"]) - first
        name = f"+ `{step['float_ops'][-1]}`" if moved else "the calibrated model's choice"
        size = f"{step['size_bytes'] / 1e6:.2f} MB" if "size_bytes" in step else "-"
        p50 = f"{step['p50_ms']:.2f}" if "p50_ms" in step else "-"
        lines.append(f"| {name} | {step['file_metric']:.2f} | {step['file_drop']:.2f} | "
                     f"{step['twin_metric']:.2f} | {step['twin_drop']:.2f} | {size} | {p50} |")
    return lines
