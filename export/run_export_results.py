"""Exports the fine-tuned MiniLM runs and writes the export numbers to docs/export_results.md.

    python export/run_export_results.py [--runs-dir runs] [--artifacts-dir artifacts]
                                        [--only sst2_minilm conll2003_minilm]
                                        [--all-int8] [--qat-epochs N] [--qat-max-steps N]
                                        [--feedforward-float-channels K] ...
                                        [--export-flags "--latency-runs 5 --no-text-tflite"]

Each run is `keras-attn export <runs-dir>/<name> --output-dir <artifacts-dir>/<name>` with
the recipe's flags and `--export-flags` (the runs come from `python training/run_results.py`). The
page lists every artifact of each export and checks the targets of the export stage:
fp32 TFLite / ONNX within 1e-4 of Keras with >= 99.9 % agreement; `model_int8.tflite` (the
quantize stage's model: calibrated ranges with the default recipe, QAT with `--qat-epochs`)
within 0.5 pt accuracy (SST-2) / 1.0 F1 (CoNLL-2003) of the float model and not worse than
PTQ, at most 27 % of the fp32 size; 1-thread latency of dynamic-range int8 <= 0.45x and full int8
<= 1.0x fp32, and full int8 <= dynamic-range int8. The latencies are the export report's,
one block of runs per file: on a shared machine re-time them interleaved
(`benchmarks/tflite_interleaved_latency.py`).

Each run's part of the page is the section `results:export:<run>`; the script replaces only
the sections of the runs it exported (`keras_attn.page_sections`), so the hand-written status
notes and the other run's section stay as they are.
"""

import argparse
import json
import pathlib
import shlex
import subprocess
import sys

from keras_attn.cli.flags import add_recipe_flags
from keras_attn.cli.flags import recipe_flags
from keras_attn.cli.flags import recipe_from_arguments
from keras_attn.page_sections import replace_section

HERE = pathlib.Path(__file__).resolve().parent
RUNS = {"sst2_minilm": ("SST-2 dev accuracy", 0.005),
        "conll2003_minilm": ("CoNLL-2003 test entity F1", 0.010)}


def export(name, runs_dir, artifacts_dir, flags=()):
    output = pathlib.Path(artifacts_dir) / name
    command = [sys.executable, "-m", "keras_attn.cli", "export",
               str(pathlib.Path(runs_dir) / name), "--output-dir", str(output), *flags]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads((output / "export_report.json").read_text(encoding="utf-8"))


def int8_label(recipe):
    """How `model_int8.tflite` was made, for the target rows: "calibrated" (the default
    recipe: activation ranges from training examples, no fine-tuning) or "QAT"."""
    return "int8 (calibrated)" if recipe.qat_epochs == 0 else "int8 (QAT)"


def target_checks(report, allowed_drop, label):
    rows = {row["artifact"]: row for row in report["artifacts"]}
    reference = rows["model.keras (float, Keras)"]["metric"]
    fp32, int8 = rows["model_fp32.tflite"], rows.get("model_int8.tflite")
    ptq = rows["model_int8_ptq.tflite"]

    def latency(row, threads=1):
        return next(lat["p50_ms"] for lat in row["latency"] if lat["num_threads"] == threads)

    checks = []
    for name in ("model_fp32.tflite", "model.onnx"):
        row = rows[name]
        checks.append((f"{name}: max |Δlogit| <= 1e-4, agreement >= 99.9 %",
                       row["max_abs_logit_diff"] <= 1e-4 and row["agreement"] >= 0.999,
                       f"{row['max_abs_logit_diff']:.1e}, {100 * row['agreement']:.2f} %"))
    if int8 is not None:
        checks += [
            (f"{label} drop <= {allowed_drop:.3f}", reference - int8["metric"] <= allowed_drop,
             f"{reference:.4f} -> {int8['metric']:.4f}"),
            (f"{label} >= int8 (PTQ)", int8["metric"] >= ptq["metric"],
             f"{int8['metric']:.4f} vs {ptq['metric']:.4f}"),
            ("int8 size <= 27 % of fp32", int8["size_bytes"] <= 0.27 * fp32["size_bytes"],
             f"{100 * int8['size_bytes'] / fp32['size_bytes']:.1f} %"),
            ("int8 latency <= 1.0x fp32 (1 thread)", latency(int8) <= latency(fp32),
             f"{latency(int8) / latency(fp32):.2f}x"),
        ]
    dynamic = rows["model_dynamic_int8.tflite"]
    checks.append(("dynamic int8 latency <= 0.45x fp32 (1 thread)",
                   latency(dynamic) <= 0.45 * latency(fp32),
                   f"{latency(dynamic) / latency(fp32):.2f}x"))
    if int8 is not None:
        checks.append(("int8 latency <= dynamic int8 (1 thread)",
                       latency(int8) <= latency(dynamic),
                       f"{latency(int8) / latency(dynamic):.2f}x"))
    return checks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), default=sorted(RUNS))
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--artifacts-dir", default="artifacts")
    parser.add_argument("--results", default=str(HERE.parent / "docs" / "export_results.md"))
    parser.add_argument("--export-flags", default="",
                        help="more flags of keras-attn export, e.g. \"--latency-runs 5\"")
    add_recipe_flags(parser)
    args = parser.parse_args(argv)
    recipe = recipe_from_arguments(args)
    flags = recipe_flags(recipe)
    flags += shlex.split(args.export_flags)
    from keras_attn.export.export_report import report_markdown

    intro = ("Measured with `python export/run_export_results.py`: `keras-attn export` of the "
             "fine-tuned MiniLM run of `docs/results.md`"
             + (f" with `{' '.join(flags)}`" if flags else "")
             + f"; int8 recipe: {recipe.describe()}.")
    for name in [n for n in RUNS if n in args.only]:
        report = export(name, args.runs_dir, args.artifacts_dir, flags)
        title, allowed_drop = RUNS[name]
        lines = [f"## {name}: {title}", "", intro, "",
                 "| target | met | measured |", "| --- | --- | --- |"]
        for label, met, measured in target_checks(report, allowed_drop, int8_label(recipe)):
            lines.append(f"| {label} | {'yes' if met else '**no**'} | {measured} |")
        lines += ["", report_markdown(report).split("\n", 2)[2]]
        replace_section(args.results, f"results:export:{name}", "\n".join(lines))
        print(f"wrote the {name} section of {args.results}")


if __name__ == "__main__":
    main()
