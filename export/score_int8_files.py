"""Scores a run's float model and the int8 TFLite files of its export on the full evaluation
split, the way `keras-attn export` scores them (its own collect/score code), and nothing
else: the export's report also scores and times every other artifact, which on a busy
2-core machine takes about an hour on CoNLL-2003 test.

    python export/score_int8_files.py RUN_DIR EXPORT_DIR [--files model_int8.tflite ...]
                                      [--no-float] [--max-eval-examples N] [--write]

EXPORT_DIR is what `keras-attn export RUN_DIR --output-dir EXPORT_DIR` wrote (its TFLite
files are read, not rewritten). `--write` first writes the listed files that EXPORT_DIR
lacks, with the export's own steps: the calibrated twin by the quantize stage
(`EXPORT_DIR/qat`, the default recipe), `model_int8.tflite` held to the int8 budget on
XNNPACK (`keras_attn.export.file_budget`), then the other TFLite conversions, nothing else.

Prints one JSON line per file: its metric, the agreement
with the float model's argmax and the max |Δlogit| (a CRF tagger's emissions, its tags
decoded by Viterbi with the run's transitions, as the export does). `--no-float` skips the
float model (and the comparison with it), e.g. to score the files while another process
scores the float model.
"""

import argparse
import json

from keras_attn.export.artifact_scoring import compare
from keras_attn.export.artifacts.tflite_artifacts import TFLiteStep
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.int8_file_budget import file_within_budget
from keras_attn.stages.run_exporter import RunExporter

FILES = ("model_int8.tflite", "model_int8_ptq.tflite")


def write_missing(exporter, names):
    """Writes the TFLite files of `names` that the export directory lacks."""
    exporter.output_dir.mkdir(parents=True, exist_ok=True)
    step = TFLiteStep()
    int8_model = exporter._int8_model() if "model_int8.tflite" in names else None
    plan = exporter._plan(int8_model)
    if int8_model is not None and exporter.budget:  # the file held to it, as the export does
        file_within_budget(
            exporter, plan,
            lambda: [row["op"] for row in exporter._sensitivity(int8_model, plan)])
    missing = [f for f in step.files(plan)
               if f.file in names and not step.is_written(exporter.output_dir / f.file)]
    if missing:
        step.write(plan, missing)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("export_dir")
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("--no-float", action="store_true")
    parser.add_argument("--max-eval-examples", type=int, default=None)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    exporter = RunExporter(args.run_dir, args.export_dir,
                           ExportOptions(max_eval_examples=args.max_eval_examples), log=print)
    exporter._load()
    if args.write:
        write_missing(exporter, args.files)
    scorer, metric, results, reference = exporter.scorer, exporter.metric, [], None
    if not args.no_float:
        reference = scorer.collect(scorer.keras_predict(exporter.model))
        results.append({"artifact": "model.keras (float, Keras)", "examples": len(reference),
                        metric: scorer.score(reference)[metric]})
        print(json.dumps(results[-1]), flush=True)
    for name in args.files:
        outputs = scorer.collect(TFLiteStep().run_logits(exporter.output_dir / name))
        results.append({"artifact": name, "examples": len(outputs),
                        metric: scorer.score(outputs)[metric],
                        **(compare(outputs, reference) if reference else {})})
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main()
