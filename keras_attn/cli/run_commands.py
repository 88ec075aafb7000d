"""The commands that make runs and exports: `keras-attn demo`, `reversal-demo`, `train`,
`quantize` and `export` (each an `add_*_command(commands)` and its handler)."""

import os

from keras_attn.cli.flags import add_recipe_flags
from keras_attn.cli.flags import add_setting_flags
from keras_attn.cli.flags import positive_int
from keras_attn.cli.flags import recipe_from_arguments
from keras_attn.cli.flags import settings_from_arguments
from keras_attn.cli.generation_commands import generation_command
from keras_attn.cli.terminal import say
from keras_attn.cli.translation_commands import translation_command
from keras_attn.runs.overwrite_guard import guarded_export
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import TASK_NAMES
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages import reversal_demo
from keras_attn.stages.demo import DEMO_TASKS
from keras_attn.stages.demo import run_demo
from keras_attn.stages.demo import summary_markdown
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.quantize_stage import quantize_run
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import train
from keras_attn.text_generation import is_generation_run
from keras_attn.translation import is_translation_run


def add_demo_command(commands):
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
    demo.add_argument("--epochs", type=positive_int, help="overrides the fine-tuning epochs")
    add_recipe_flags(demo)
    demo.add_argument("--latency-runs", type=positive_int, default=30,
                      help="timed runs per latency measurement")
    demo.set_defaults(handler=_demo)


def _demo(args):
    options = ExportOptions(quantization=recipe_from_arguments(args),
                            latency_runs=args.latency_runs, latency_threads=(1,))
    summary = run_demo(args.output_dir, tasks=args.tasks, epochs=args.epochs,
                       export_options=options, log=say)
    say()
    say(summary_markdown(summary).rstrip())
    say()
    say(f"summary: {os.path.join(args.output_dir, 'summary.md')}; try "
        f"`keras-attn predict {os.path.join(args.output_dir, 'entities', 'export')} "
        "\"Lucia Moreno flew to Kyoto.\"`")
    return 0


def add_reversal_demo_command(commands):
    """`keras-attn reversal-demo`."""
    demo = commands.add_parser(
        "reversal-demo",
        help="train a tiny Transformer built from keras-attn layers and show what it learned",
    )
    demo.add_argument("--output-dir", default="runs/reversal_demo",
                      help="where figures and summary go")
    demo.add_argument("--digits", type=positive_int, default=6, help="string length")
    demo.add_argument("--examples", type=positive_int, default=20000, help="training strings")
    demo.add_argument("--epochs", type=positive_int, default=3, help="training epochs")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(handler=_reversal_demo)


def _reversal_demo(args):
    say("keras-attn demo: a causal Transformer (our layers) learns to reverse digit strings")
    summary = reversal_demo.run_demo(
        args.output_dir, num_digits=args.digits, train_examples=args.examples,
        epochs=args.epochs, seed=args.seed, log=say,
    )
    mirror = summary["mirror_attention"]
    say()
    say("== results")
    say(f"  exact match, 1000 unseen strings: {summary['exact_match_before_training']:.1%} "
        f"before training -> {summary['exact_match_after_training']:.1%} after "
        f"({summary['digit_accuracy_after_training']:.1%} of digits)")
    say(f"  example: {summary['example']['input']} {summary['example']['output']}")
    say(f"  KV-cache greedy decoding vs full recomputation: max |dlogit| = "
        f"{summary['kv_cache_vs_full_max_abs_logit_difference']:.2e}")
    say(f"  {mirror['layer']} head {mirror['head']} puts {mirror['mean_probability']:.0%} of "
        "its attention on the mirrored input digit:")
    say(_ascii_heatmap(summary["attention_matrix"], summary["example"]))
    say(f"  trained in {summary['train_seconds']:.0f} s, "
        f"whole demo {summary['total_seconds']:.0f} s")
    say()
    say("== files")
    for name, path in summary["files"].items():
        say(f"  {name:24s} {path}")
    return 0


def _ascii_heatmap(matrix, example):
    shades = " .:-=+*#%@"
    tokens = list(example["input"] + example["output"])[: len(matrix)]
    lines = ["      keys: " + " ".join(tokens)]
    for token, row in zip(tokens, matrix):
        cells = " ".join(shades[min(int(p * len(shades)), len(shades) - 1)] for p in row)
        lines.append(f"  query {token}: {cells}")
    return "\n".join(lines)


def add_train_command(commands):
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
    train.add_argument("--epochs", type=positive_int, help="overrides train.epochs")
    train.add_argument("--max-steps", type=positive_int, help="overrides train.max_steps")
    train.add_argument("--seed", type=int, help="overrides train.seed")
    train.add_argument("--overwrite", action="store_true",
                       help="replace a run of another configuration in the output directory "
                            "(without it: exit 2 naming the settings that differ; the same "
                            "configuration resumes)")
    train.set_defaults(handler=_train)


def _train(args):
    overrides = list(args.set)
    for flag, key in (("output_dir", "output_dir"), ("strategy", "distribute.strategy"),
                      ("epochs", "train.epochs"), ("max_steps", "train.max_steps"),
                      ("seed", "train.seed")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append((key, value))
    config = TrainingConfig.from_file(args.config, overrides)
    say(f"keras-attn train {args.config}: task {config.task}, output {config.output_dir}")
    results = train(config, log=say, overwrite=args.overwrite)
    metric = results["metric"]
    best = results["best_dev"] or {}
    test = results["test"] or {}
    say()
    say("== results")
    if metric in best:
        say(f"  dev {metric} (best, epoch {results['best_epoch']}): {best[metric]:.4f}")
    average = results.get("checkpoint_average") or {}
    if average.get("used"):
        say(f"  dev {metric} (average of epochs {average['epochs'][0]}-"
            f"{average['epochs'][-1]}, kept): {average['dev'][metric]:.4f}")
    if metric in test:
        say(f"  test {metric}: {test[metric]:.4f}")
    say(f"  files in {config.output_dir}: model.keras, metrics.json, checkpoints/, tensorboard/")
    return 0


def add_quantize_command(commands):
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
    quantize.add_argument("--sequence-length", type=positive_int,
                          help="length the calibration examples are padded to (default: the "
                               "run's data.max_length)")
    add_recipe_flags(quantize)
    quantize.set_defaults(handler=_quantize)


def _quantize(args):
    output_dir = args.output_dir or os.path.join(args.run_dir, "qat")
    recipe = recipe_from_arguments(args)
    say(f"keras-attn quantize {args.run_dir} -> {output_dir}: {recipe.describe()}")
    run = quantize_run(args.run_dir, output_dir, recipe, args.sequence_length, log=say)
    say(f"QAT run: {run.path} (export it with `keras-attn export {args.run_dir} "
        f"--qat-run {run.path}`)")
    return 0


def add_export_command(commands):
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
    export.add_argument("run_dir", help="the training run directory (holds model.keras)")
    export.add_argument("--output-dir", help="artifact directory (default RUN_DIR/export)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an export of another run in the output directory (its "
                             "files are removed; without it: exit 2)")
    add_setting_flags(export.add_argument_group("export"), ExportOptions)
    add_recipe_flags(export)
    export.set_defaults(handler=_export)


def _export(args):
    output_dir = args.output_dir or os.path.join(args.run_dir, "export")
    if is_translation_run(args.run_dir):
        return translation_command("export", args, say)
    if is_generation_run(args.run_dir):
        return generation_command("export", args, say)
    options = ExportOptions(quantization=recipe_from_arguments(args),
                            **settings_from_arguments(ExportOptions, args))
    say(f"keras-attn export {args.run_dir} -> {output_dir}")
    # Held before --overwrite empties the directory (export_run holds it again).
    report = guarded_export(args.run_dir, output_dir, args.overwrite, lambda: export_run(
        args.run_dir, output_dir, options, log=say), log=say,
        reads=[args.qat_run] if args.qat_run else [])
    say()
    say("== artifacts")
    for row in report["artifacts"]:
        latency = ", ".join(f"{lat['p50_ms']:.1f} ms ({lat['num_threads']}t)"
                            for lat in row.get("latency", []))
        say(f"  {row['artifact']:<34} {report['metric']} {row['metric']:.4f}  agreement "
            f"{row['agreement']:.4f}  {row['size_bytes'] / 1e6:6.1f} MB  {latency}")
    say(f"  report: {os.path.join(output_dir, 'export_report.md')}")
    return 0
