"""`keras-attn` command line. This is the only layer that writes to the terminal.

Every import is at the top, the stages' too. `import keras_attn` imports Keras and
TensorFlow, which is nearly all of `keras-attn --help`'s time (measured on 2 busy cores:
7.1-7.7 s of CPU for `import keras_attn`, 7.4-8.4 s for `--help`); once they are loaded,
the export, inference, demo and explain modules add about 0.2 s, so importing them lazily
per command would save nothing a user notices.
"""

import argparse
import json
import logging
import os
import sys

from keras_attn import reversal_demo
from keras_attn.demo import DEMO_TASKS
from keras_attn.demo import run_demo
from keras_attn.demo import summary_markdown
from keras_attn.errors import KerasAttnError
from keras_attn.explain import explain
from keras_attn.export.run_exporter import EVAL_SPLITS
from keras_attn.export.run_exporter import ExportOptions
from keras_attn.export.run_exporter import export_run
from keras_attn.generation_commands import add_generation_arguments
from keras_attn.generation_commands import generation_command
from keras_attn.generation_commands import is_generation_artifact
from keras_attn.inference.http_server import ServerLimits
from keras_attn.inference.http_server import make_server
from keras_attn.inference.http_server import url_of
from keras_attn.inference.predictor import load_predictor
from keras_attn.inference.rest_api import DEFAULT_MAX_BATCH
from keras_attn.inference.rest_api import DEFAULT_MAX_TEXT_CHARS
from keras_attn.inference.rest_api import RestApi
from keras_attn.quantization.quantization_recipe import QuantizationRecipe
from keras_attn.quantization.quantize_stage import quantize_run
from keras_attn.runs.overwrite_guard import guarded_export
from keras_attn.runs.run_lock import run_lock
from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.text_lines import decode_lines
from keras_attn.text.text_lines import read_lines
from keras_attn.text_generation import is_generation_run
from keras_attn.training.config import TrainingConfig
from keras_attn.training.task_registry import DEPLOYABLE_TASKS
from keras_attn.training.task_registry import TASK_NAMES
from keras_attn.training.trainer import train
from keras_attn.translation import is_translation_run
from keras_attn.translation_commands import is_translation_artifact
from keras_attn.translation_commands import translation_command

# What a command reports as `keras-attn CMD: error: ...` and exit status 2 (one handler, in
# `main`): keras-attn's own errors, argument checks (`ValueError` from
# `keras_attn.layers.validation`), unreadable files and a missing optional extra.
USER_ERRORS = (KerasAttnError, ValueError, OSError, ImportError)


def _say(text=""):
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def _demo(args):
    options = ExportOptions(quantization=QuantizationRecipe.from_arguments(args),
                            latency_runs=args.latency_runs, latency_threads=(1,))
    summary = run_demo(args.output_dir, tasks=args.tasks, epochs=args.epochs,
                       export_options=options, log=_say)
    _say()
    _say(summary_markdown(summary).rstrip())
    _say()
    _say(f"summary: {os.path.join(args.output_dir, 'summary.md')}; try "
         f"`keras-attn predict {os.path.join(args.output_dir, 'entities', 'export')} "
         "\"Lucia Moreno flew to Kyoto.\"`")
    return 0


def _reversal_demo(args):
    _say("keras-attn demo: a causal Transformer (our layers) learns to reverse digit strings")
    summary = reversal_demo.run_demo(
        args.output_dir, num_digits=args.digits, train_examples=args.examples,
        epochs=args.epochs, seed=args.seed, log=_say,
    )
    mirror = summary["mirror_attention"]
    _say()
    _say("== results")
    _say(f"  exact match, 1000 unseen strings: {summary['exact_match_before_training']:.1%} "
         f"before training -> {summary['exact_match_after_training']:.1%} after "
         f"({summary['digit_accuracy_after_training']:.1%} of digits)")
    _say(f"  example: {summary['example']['input']} {summary['example']['output']}")
    _say(f"  KV-cache greedy decoding vs full recomputation: max |dlogit| = "
         f"{summary['kv_cache_vs_full_max_abs_logit_difference']:.2e}")
    _say(f"  {mirror['layer']} head {mirror['head']} puts {mirror['mean_probability']:.0%} of "
         "its attention on the mirrored input digit:")
    _say(_ascii_heatmap(summary["attention_matrix"], summary["example"]))
    _say(f"  trained in {summary['train_seconds']:.0f} s, "
         f"whole demo {summary['total_seconds']:.0f} s")
    _say()
    _say("== files")
    for name, path in summary["files"].items():
        _say(f"  {name:24s} {path}")
    return 0


def _ascii_heatmap(matrix, example):
    shades = " .:-=+*#%@"
    tokens = list(example["input"] + example["output"])[: len(matrix)]
    lines = ["      keys: " + " ".join(tokens)]
    for token, row in zip(tokens, matrix):
        cells = " ".join(shades[min(int(p * len(shades)), len(shades) - 1)] for p in row)
        lines.append(f"  query {token}: {cells}")
    return "\n".join(lines)


def _train(args):
    overrides = list(args.set)
    for flag, key in (("output_dir", "output_dir"), ("strategy", "distribute.strategy"),
                      ("epochs", "train.epochs"), ("max_steps", "train.max_steps"),
                      ("seed", "train.seed")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append((key, value))
    config = TrainingConfig.from_file(args.config, overrides)
    _say(f"keras-attn train {args.config}: task {config.task}, output {config.output_dir}")
    results = train(config, log=_say, overwrite=args.overwrite)
    metric = results["metric"]
    best = results["best_dev"] or {}
    test = results["test"] or {}
    _say()
    _say("== results")
    if metric in best:
        _say(f"  dev {metric} (best, epoch {results['best_epoch']}): {best[metric]:.4f}")
    average = results.get("checkpoint_average") or {}
    if average.get("used"):
        _say(f"  dev {metric} (average of epochs {average['epochs'][0]}-"
             f"{average['epochs'][-1]}, kept): {average['dev'][metric]:.4f}")
    if metric in test:
        _say(f"  test {metric}: {test[metric]:.4f}")
    _say(f"  files in {config.output_dir}: model.keras, metrics.json, checkpoints/, tensorboard/")
    return 0


def _export(args):
    output_dir = args.output_dir or os.path.join(args.run_dir, "export")
    if is_translation_run(args.run_dir):
        return translation_command("export", args, _say)
    if is_generation_run(args.run_dir):
        return generation_command("export", args, _say)
    options = ExportOptions(
        sequence_length=args.sequence_length,
        quantization=QuantizationRecipe.from_arguments(args), qat_run=args.qat_run,
        eval_split=args.eval_split,
        max_eval_examples=args.max_eval_examples,
        latency_threads=tuple(args.latency_threads), latency_runs=args.latency_runs,
        text_tflite=not args.no_text_tflite, golden_examples=args.golden_examples,
        length_buckets=not args.no_length_buckets, smallest_bucket=args.smallest_bucket)
    _say(f"keras-attn export {args.run_dir} -> {output_dir}")
    # Held before --overwrite empties the directory (export_run holds it again).
    report = guarded_export(args.run_dir, output_dir, args.overwrite, lambda: export_run(
        args.run_dir, output_dir, options, log=_say), log=_say,
        reads=[args.qat_run] if args.qat_run else [])
    _say()
    _say("== artifacts")
    for row in report["artifacts"]:
        latency = ", ".join(f"{lat['p50_ms']:.1f} ms ({lat['num_threads']}t)"
                            for lat in row.get("latency", []))
        _say(f"  {row['artifact']:<34} {report['metric']} {row['metric']:.4f}  agreement "
             f"{row['agreement']:.4f}  {row['size_bytes'] / 1e6:6.1f} MB  {latency}")
    _say(f"  report: {os.path.join(output_dir, 'export_report.md')}")
    return 0


def _quantize(args):
    output_dir = args.output_dir or os.path.join(args.run_dir, "qat")
    recipe = QuantizationRecipe.from_arguments(args)
    _say(f"keras-attn quantize {args.run_dir} -> {output_dir}: {recipe.describe()}")
    run = quantize_run(args.run_dir, output_dir, recipe, args.sequence_length, log=_say)
    _say(f"QAT run: {run.path} (export it with `keras-attn export {args.run_dir} "
         f"--qat-run {run.path}`)")
    return 0


def _explain(args):
    if is_translation_run(args.run_dir):  # a seq2seq run: its cross-attention alignment
        return translation_command("explain", args, _say)
    summary = explain(args.run_dir, args.text, args.output, layers=args.layers,
                      heads=args.heads, position_encoding_png=args.position_encoding,
                      log=lambda note: _say(f"note: {note}"))
    prediction = summary["prediction"]
    _say(f"keras-attn explain {args.run_dir}: {summary['task']}"
         f"{'' if prediction else ' (attention only)'}, {len(summary['tokens'])} tokens")
    if prediction is not None:
        _say(f"  {_explained_prediction(prediction)}")
    _say(f"  attention of layers {summary['layers']} x heads {summary['heads']} "
         f"({summary['panels']} heatmaps): {summary['path']}")
    for name, path in summary["position_encoding_files"].items():
        _say(f"  {name}: {path}")
    return 0


def _explained_prediction(prediction):
    """`explain`'s prediction in one line: a tagger's entities, or a classifier's label."""
    if "entities" in prediction:
        found = ", ".join(f"{e['text']} [{e['type']}]" for e in prediction["entities"])
        return f"entities: {found or 'none'}"
    probabilities = ", ".join(f"{label} {p:.3f}"
                              for label, p in prediction["probabilities"].items())
    return f"prediction: {prediction['label']} ({probabilities})"


def _predict_inputs(args):
    """`(line number or None, text)` of the texts to predict: the arguments, `--file`, or stdin
    (one text per line; empty lines are skipped with a note)."""
    if args.texts and args.file:
        raise ValueError("give texts as arguments or --file PATH, not both")
    for index, text in enumerate(args.texts, start=1):
        if not text.strip():
            raise ValueError(f"TEXT argument {index} is empty: give a non-empty text")
    if args.texts:
        return [(None, text) for text in args.texts]
    if args.file:
        source, lines = args.file, read_lines(args.file)
    else:
        if sys.stdin is None or sys.stdin.closed:
            raise ValueError("no texts: stdin is closed; give texts as arguments or --file PATH")
        if sys.stdin.isatty():
            sys.stderr.write("keras-attn predict: reading texts from stdin, one per line "
                             "(Ctrl-D ends)\n")
        source = "<stdin>"
        # Bytes, decoded like --file: a BOM dropped, invalid UTF-8 named by its line.
        lines = decode_lines(source, getattr(sys.stdin, "buffer", sys.stdin))
    inputs = []
    for number, line in lines:
        if line.strip():
            inputs.append((number, line))
        else:
            sys.stderr.write(f"keras-attn predict: note: {source}:{number}: empty line "
                             "skipped\n")
    if not inputs:
        raise ValueError(f"{source} holds no text: one text per line")
    return inputs


def _predict(args):
    if is_translation_artifact(args.artifact):  # beam-search translations
        return translation_command("predict", args, _say)
    if is_generation_artifact(args.artifact):  # a language model: continuations
        return generation_command("predict", args, _say)
    inputs = _predict_inputs(args)
    predictor = load_predictor(args.artifact, num_threads=args.threads)
    results = predictor.predict([text for _, text in inputs], batch_size=args.batch_size)
    for (line, text), result in zip(inputs, results):
        if args.json:
            record = {"line": line} if line is not None else {}
            _say(json.dumps({**record, "text": text, **result}, ensure_ascii=False))
        elif "label" in result:  # a classification; a tagger's result has entities
            label = result["label"]
            _say(f"{label} (p={result['probabilities'][label]:.2f})\t{text}")
        else:
            _say(text)
            for entity in result["entities"]:
                _say(f"  {entity['type']:<6} {entity['start']:>4}-{entity['end']:<4} "
                     f"{entity['text']}")
            if not result["entities"]:
                _say("  (no entities)")
    return 0


def _serve(args):
    limits = ServerLimits(
        max_header_bytes=args.max_header_bytes, max_connections=args.max_connections,
        backlog=args.backlog, header_timeout=args.header_timeout,
        request_timeout=args.request_timeout, keep_alive_timeout=args.keep_alive_timeout,
        workers=args.workers, max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout_ms / 1000,
        max_queued_examples=args.max_queued_examples)
    api = RestApi(args.saved_model_dir, model_name=args.model_name,
                  max_batch=args.max_batch, max_text_chars=args.max_text_chars)
    server = make_server(api, args.host, args.port, args.max_request_bytes,
                         log=lambda line: sys.stderr.write(line + "\n"), limits=limits)
    url = url_of(server, api)
    _say(f"keras-attn serve {api.saved_model_dir} (version {api.version}): {url}")
    _say(f"  curl -d '{{\"instances\": [\"some text\"]}}' {url}:predict   (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        _say("stopped")
    finally:
        server.server_close()
    return 0


def build_parser():
    """The `keras-attn` parser: one sub-command per `_add_*_command` below."""
    parser = argparse.ArgumentParser(prog="keras-attn", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in (_add_demo_command, _add_reversal_demo_command, _add_train_command,
                        _add_export_command, _add_quantize_command, _add_explain_command,
                        _add_predict_command, _add_serve_command):
        add_command(commands)
    return parser


def _add_demo_command(commands):
    """`keras-attn demo`."""
    demo = commands.add_parser(
        "demo",
        help="the main job: fine-tune MiniLM-L6 on the embedded sample data, quantize to "
             "int8, export every artifact, print a summary table",
    )
    demo.add_argument("--output-dir", default="runs/demo", help="where runs, artifacts and "
                      "the summary go")
    demo.add_argument("--tasks", nargs="+", choices=tuple(DEMO_TASKS),
                      default=list(DEMO_TASKS), help="which tasks to run")
    demo.add_argument("--epochs", type=_positive_int, help="overrides the fine-tuning epochs")
    QuantizationRecipe.add_arguments(demo)
    demo.add_argument("--latency-runs", type=_positive_int, default=30,
                      help="timed runs per latency measurement")
    demo.set_defaults(handler=_demo)


def _add_reversal_demo_command(commands):
    """`keras-attn reversal-demo`."""
    demo = commands.add_parser(
        "reversal-demo",
        help="train a tiny Transformer built from keras-attn layers and show what it learned",
    )
    demo.add_argument("--output-dir", default="runs/reversal_demo",
                      help="where figures and summary go")
    demo.add_argument("--digits", type=_positive_int, default=6, help="string length")
    demo.add_argument("--examples", type=_positive_int, default=20000, help="training strings")
    demo.add_argument("--epochs", type=_positive_int, default=3, help="training epochs")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(handler=_reversal_demo)


def _add_train_command(commands):
    """`keras-attn train`."""
    train = commands.add_parser(
        "train",
        help=f"train a task model from a YAML config ({', '.join(TASK_NAMES)}) on one "
             "device, all local GPUs, several workers or a TPU",
        description="Train from CONFIG.yaml. Any config key can be overridden with "
                    "--set section.key=value (value read as YAML). Re-running with the same "
                    "configuration and output directory resumes from its last checkpoint; "
                    "a run of another configuration there is refused (exit 2) unless "
                    "--overwrite.",
    )
    train.add_argument("config", help="the YAML config (examples in training/)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.learning_rate=3e-5")
    train.add_argument("--output-dir", help="overrides output_dir")
    train.add_argument("--strategy", help="overrides distribute.strategy")
    train.add_argument("--epochs", type=_positive_int, help="overrides train.epochs")
    train.add_argument("--max-steps", type=_positive_int, help="overrides train.max_steps")
    train.add_argument("--seed", type=int, help="overrides train.seed")
    train.add_argument("--overwrite", action="store_true",
                       help="replace a run of another configuration in the output directory "
                            "(without it: exit 2 naming the settings that differ; the same "
                            "configuration resumes)")
    train.set_defaults(handler=_train)


def _add_export_command(commands):
    """`keras-attn export`."""
    export = commands.add_parser(
        "export",
        help=f"export a trained {' or '.join(DEPLOYABLE_TASKS)} run: QAT, int8/fp16/fp32 "
             "TFLite, ONNX, SavedModel, model card, golden vectors and a parity/latency "
             "report",
        description="Export RUN_DIR (a keras-attn train output directory). Re-running "
                    "reuses the artifacts already written. A seq2seq run exports its "
                    "translation files (encode + decode_step signatures, and the ONNX "
                    "encoder + decoder-with-past pair) scored by BLEU, a causal_lm run its "
                    "generation files (a decode_step signature) scored by perplexity: of "
                    "the options below these take --output-dir, --overwrite, --eval-split "
                    "and --max-eval-examples.",
    )
    defaults = ExportOptions()
    export.add_argument("run_dir", help="the training run directory (holds model.keras)")
    export.add_argument("--output-dir", help="artifact directory (default RUN_DIR/export)")
    export.add_argument("--sequence-length", type=_positive_int,
                        help="fixed input length of the mobile artifacts (default: the "
                             "run's data.max_length)")
    export.add_argument("--qat-run", metavar="QAT_RUN",
                        help="convert this QAT run (from `keras-attn quantize`, or a "
                             "quantization-aware `keras-attn train` run continuing RUN_DIR) "
                             "instead of quantizing RUN_DIR into OUTPUT/qat")
    QuantizationRecipe.add_arguments(export)
    export.add_argument("--eval-split", choices=EVAL_SPLITS, default=defaults.eval_split,
                        help="data the artifacts are scored on (auto: test for NER, dev for "
                             "classification)")
    export.add_argument("--max-eval-examples", type=_positive_int,
                        help="score on the first N examples only")
    export.add_argument("--latency-threads", type=_positive_int, nargs="+",
                        default=list(defaults.latency_threads),
                        help="thread counts of the latency measurements")
    export.add_argument("--latency-runs", type=_positive_int, default=defaults.latency_runs,
                        help="timed runs per latency measurement")
    export.add_argument("--golden-examples", type=int, default=defaults.golden_examples,
                        help="data sentences in golden_vectors.jsonl (plus the hard cases)")
    export.add_argument("--no-text-tflite", action="store_true",
                        help="skip model_text.tflite (tokenizer inside, tf-text custom ops)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an export of another run in the output directory (its "
                             "files are removed; without it: exit 2)")
    export.add_argument("--no-length-buckets", action="store_true",
                        help="skip model_<variant>_buckets.tflite (one signature per length "
                             "bucket) and its latency over the evaluation lengths")
    export.add_argument("--smallest-bucket", type=_positive_int,
                        default=defaults.smallest_bucket,
                        help="the shortest length bucket of model_<variant>_buckets.tflite")
    export.set_defaults(handler=_export)


def _add_quantize_command(commands):
    """`keras-attn quantize`."""
    quantize = commands.add_parser(
        "quantize",
        help=f"make the QAT run of a trained {' or '.join(DEPLOYABLE_TASKS)} run "
             "(calibration, or quantization-aware fine-tuning with --qat-epochs)",
        description="Quantize RUN_DIR into a QAT run directory that `keras-attn export "
                    "--qat-run` converts to model_int8.tflite (export does it for you when "
                    "not given one).")
    quantize.add_argument("run_dir", help="the float training run directory")
    quantize.add_argument("--output-dir", help="the QAT run directory (default RUN_DIR/qat)")
    quantize.add_argument("--sequence-length", type=_positive_int,
                          help="length the calibration examples are padded to (default: the "
                               "run's data.max_length)")
    QuantizationRecipe.add_arguments(quantize)
    quantize.set_defaults(handler=_quantize)


def _add_explain_command(commands):
    """`keras-attn explain`."""
    explain = commands.add_parser(
        "explain",
        help="draw the attention maps (every layer and head) of a trained BERT run for one "
             f"sentence, with the prediction of a {' or '.join(DEPLOYABLE_TASKS)} run, as a "
             "PNG",
        description="Explain RUN_DIR (a keras-attn train output directory, or an export "
                    "directory whose source run still exists) on TEXT.",
    )
    explain.add_argument("run_dir", help="the training run directory (holds model.keras)")
    explain.add_argument("text", help="the sentence to explain (cut to the run's length)")
    explain.add_argument("--output", default="explain.png", help="the PNG to write")
    explain.add_argument("--layers", help="comma-separated layer indices, e.g. 0,5 (default "
                         "all)")
    explain.add_argument("--heads", help="comma-separated head indices (default all)")
    explain.add_argument("--position-encoding", metavar="PATH.png",
                         help="also write the sinusoidal position-encoding matrix there "
                              "(and the model's learned table to PATH_learned.png)")
    explain.set_defaults(handler=_explain)


def _add_predict_command(commands):
    """`keras-attn predict`."""
    predict = commands.add_parser(
        "predict",
        help="run any artifact (run directory, model.keras, export directory, SavedModel, "
             ".tflite, .onnx) on texts and print labels or entities",
        description="Predict with ARTIFACT on the TEXTs, the lines of --file, or the lines "
                    "of stdin (one text per line; empty lines are skipped with a note).",
    )
    predict.add_argument("artifact", help="a run or export directory, saved_model/, "
                         "model.keras, model_*.tflite, translation_*.tflite or *.onnx")
    predict.add_argument("texts", nargs="*", metavar="TEXT", help="texts to predict")
    predict.add_argument("--file", help="a UTF-8 file with one text per line")
    predict.add_argument("--json", action="store_true",
                         help="one JSON object per text (line, text, label and probabilities "
                              "or entities and words)")
    predict.add_argument("--batch-size", type=_positive_int, default=PREDICT_BATCH_SIZE,
                         help="texts per model call")
    predict.add_argument("--threads", type=_positive_int,
                         help="LiteRT / onnxruntime threads (default: theirs)")
    translation = predict.add_argument_group(
        "translation (a seq2seq run, its export directory or a translation_*.tflite file)")
    translation.add_argument("--input", help="a file of source sentences, one per line")
    translation.add_argument("--output", help="write the translations here, one per line")
    translation.add_argument("--beams", type=_positive_int,
                             help="beam width (default: the run's train.eval_num_beams)")
    add_generation_arguments(predict)
    predict.set_defaults(handler=_predict)


def _add_serve_command(commands):
    """`keras-attn serve`."""
    serve = commands.add_parser(
        "serve",
        help="serve an exported SavedModel over HTTP with TensorFlow Serving's REST API",
        description="Serve SAVED_MODEL_DIR (saved_model/ of keras-attn export, the export "
                    "directory, or a TF Serving base path NAME/<version>/) at "
                    "/v1/models/NAME (status), /v1/models/NAME/metadata and "
                    "/v1/models/NAME:predict.",
    )
    serve.add_argument("saved_model_dir", help="the SavedModel (or export) directory")
    serve.add_argument("--model-name", default="model", help="NAME in the URLs")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8501, help="port (0: any free port)")
    _serve_limits(serve)
    serve.set_defaults(handler=_serve)


def _serve_limits(serve):
    """`keras-attn serve`'s limits, each with its default (`ServerLimits`'s) in --help."""
    limits = serve.add_argument_group(
        "limits", "every request is bounded in size and time, and the server in connections, "
        "threads and queued work")
    add = limits.add_argument
    defaults = ServerLimits()
    add("--max-batch", type=_positive_int, default=DEFAULT_MAX_BATCH,
        help="most examples per request; more: 400 (default: %(default)s)")
    add("--max-text-chars", type=_positive_int, default=DEFAULT_MAX_TEXT_CHARS,
        help="longest text of a request, in characters; longer: 400 (default: %(default)s)")
    add("--max-request-bytes", type=_positive_int, default=defaults.max_request_bytes,
        help="largest request body; larger: 413, not read (default: %(default)s)")
    add("--max-header-bytes", type=_positive_int, default=defaults.max_header_bytes,
        help="largest request line plus headers; larger: 400 (default: %(default)s)")
    add("--max-connections", type=_positive_int, default=defaults.max_connections,
        help="most open connections, idle and half-sent ones included (each costs a few "
             "KB and no thread); past it a new connection gets 503 and is closed; the "
             "open-file limit is raised to fit it (default: %(default)s)")
    add("--backlog", type=_positive_int, default=defaults.backlog,
        help="listen backlog: connections the kernel queues until accepted "
             "(default: %(default)s)")
    add("--header-timeout", type=_positive_float, default=defaults.header_timeout,
        help="seconds for a request's line and headers, from the connection's opening or "
             "the previous answer; then the connection is closed (default: %(default)s)")
    add("--request-timeout", type=_positive_float, default=defaults.request_timeout,
        help="seconds for the body, the model work and the answer after the headers; past "
             "it: 408 (body incomplete) or 504 (default: %(default)s)")
    add("--keep-alive-timeout", type=_positive_float, default=defaults.keep_alive_timeout,
        help="seconds an idle keep-alive connection stays open (default: %(default)s)")
    add("--workers", type=_positive_int, default=defaults.workers,
        help="model batches run at once, in threads (default: %(default)s)")
    add("--max-batch-size", type=_non_negative_int, default=defaults.max_batch_size,
        help="most examples of concurrent requests merged into one model batch; 0 runs "
             "every request alone (default: %(default)s)")
    add("--batch-timeout-ms", type=_non_negative_float, default=defaults.batch_timeout * 1000,
        help="milliseconds a request waits for others to join its batch "
             "(default: %(default)s)")
    add("--max-queued-examples", type=_positive_int, default=defaults.max_queued_examples,
        help="most examples waiting for the model; past it: 503 (default: %(default)s)")


def _positive_float(text):
    return _number(text, float, 0, "a positive number")


def _non_negative_float(text):
    return _number(text, float, -1, "a non-negative number")


def _non_negative_int(text):
    return _number(text, int, -1, "a non-negative integer")


def _number(text, kind, above, what):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not value > above or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _notes_on_stderr(command):
    """The stages' notes on the `keras_attn.runs.run_lock` logger (a lock taken over from a
    killed process) as `keras-attn CMD: note: ...` lines on stderr."""
    handler = _StderrLines()
    handler.setFormatter(logging.Formatter(f"keras-attn {command}: note: %(message)s"))
    notes = logging.getLogger(run_lock.__module__)
    notes.handlers, notes.propagate = [handler], False


class _StderrLines(logging.Handler):
    """Writes each record as a line to `sys.stderr` as it is when the record comes."""

    def emit(self, record):
        sys.stderr.write(self.format(record) + "\n")


def main(argv=None):
    """Runs one command; a `USER_ERRORS` error is printed as `keras-attn CMD: error: ...`
    (its message says what, where and how to fix it) and exits with status 2."""
    args = build_parser().parse_args(argv)
    _notes_on_stderr(args.command)
    try:
        return args.handler(args)
    except USER_ERRORS as error:
        sys.stderr.write(f"keras-attn {args.command}: error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
