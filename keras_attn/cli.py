"""`keras-attn` command line. This is the only layer that writes to the terminal."""

import argparse
import os
import sys


def _say(text=""):
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def _demo(args):
    from keras_attn.demo import run_demo

    _say("keras-attn demo: a causal Transformer (our layers) learns to reverse digit strings")
    summary = run_demo(
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
    from keras_attn.text.errors import DataError
    from keras_attn.training.config import ConfigError
    from keras_attn.training.config import TrainingConfig
    from keras_attn.training.step_checkpoints import CheckpointError
    from keras_attn.training.strategy import StrategyError
    from keras_attn.training.trainer import train

    overrides = list(args.set)
    for flag, key in (("output_dir", "output_dir"), ("strategy", "distribute.strategy"),
                      ("epochs", "train.epochs"), ("max_steps", "train.max_steps"),
                      ("seed", "train.seed")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append((key, value))
    try:
        config = TrainingConfig.from_file(args.config, overrides)
        _say(f"keras-attn train {args.config}: task {config.task}, output {config.output_dir}")
        results = train(config, log=_say)
    except (ConfigError, DataError, StrategyError, CheckpointError, FileNotFoundError) as error:
        sys.stderr.write(f"keras-attn train: error: {error}\n")
        return 2
    metric = results["metric"]
    best = results["best_dev"] or {}
    test = results["test"] or {}
    _say()
    _say("== results")
    if metric in best:
        _say(f"  dev {metric} (best, epoch {results['best_epoch']}): {best[metric]:.4f}")
    if metric in test:
        _say(f"  test {metric}: {test[metric]:.4f}")
    _say(f"  files in {config.output_dir}: model.keras, metrics.json, checkpoints/, tensorboard/")
    return 0


def _export(args):
    from keras_attn.export.run_exporter import ExportError
    from keras_attn.export.run_exporter import ExportOptions
    from keras_attn.export.run_exporter import export_run
    from keras_attn.export.tflite_export import TFLiteExportError
    from keras_attn.text.errors import DataError
    from keras_attn.training.config import ConfigError

    output_dir = args.output_dir or os.path.join(args.run_dir, "export")
    try:
        options = ExportOptions(
            sequence_length=args.sequence_length, qat_epochs=args.qat_epochs,
            qat_learning_rate=args.qat_learning_rate, qat_max_steps=args.qat_max_steps,
            calibration_examples=args.calibration_examples, eval_split=args.eval_split,
            max_eval_examples=args.max_eval_examples,
            latency_threads=tuple(args.latency_threads), latency_runs=args.latency_runs,
            text_tflite=not args.no_text_tflite, golden_examples=args.golden_examples)
        _say(f"keras-attn export {args.run_dir} -> {output_dir}")
        report = export_run(args.run_dir, output_dir, options, log=_say)
    except (ExportError, ConfigError, DataError, TFLiteExportError, ValueError) as error:
        sys.stderr.write(f"keras-attn export: error: {error}\n")
        return 2
    _say()
    _say("== artifacts")
    for row in report["artifacts"]:
        latency = ", ".join(f"{lat['p50_ms']:.1f} ms ({lat['num_threads']}t)"
                            for lat in row.get("latency", []))
        _say(f"  {row['artifact']:<34} {report['metric']} {row['metric']:.4f}  agreement "
             f"{row['agreement']:.4f}  {row['size_bytes'] / 1e6:6.1f} MB  {latency}")
    _say(f"  report: {os.path.join(output_dir, 'export_report.md')}")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-attn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train a tiny Transformer built from keras-attn layers and show what it learned",
    )
    demo.add_argument("--output-dir", default="runs/demo", help="where figures and summary go")
    demo.add_argument("--digits", type=_positive_int, default=6, help="string length")
    demo.add_argument("--examples", type=_positive_int, default=20000, help="training strings")
    demo.add_argument("--epochs", type=_positive_int, default=3, help="training epochs")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(handler=_demo)

    train = commands.add_parser(
        "train",
        help="train a task model from a YAML config (classification, ner, mlm, causal_lm, "
             "seq2seq) on one device, all local GPUs, several workers or a TPU",
        description="Train from CONFIG.yaml. Any config key can be overridden with "
                    "--set section.key=value (value read as YAML). Re-running with the same "
                    "output directory resumes from its last checkpoint.",
    )
    train.add_argument("config", help="the YAML config (examples in training/)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key, e.g. --set train.learning_rate=3e-5")
    train.add_argument("--output-dir", help="overrides output_dir")
    train.add_argument("--strategy", help="overrides distribute.strategy")
    train.add_argument("--epochs", type=_positive_int, help="overrides train.epochs")
    train.add_argument("--max-steps", type=_positive_int, help="overrides train.max_steps")
    train.add_argument("--seed", type=int, help="overrides train.seed")
    train.set_defaults(handler=_train)

    export = commands.add_parser(
        "export",
        help="export a trained classification or NER run: QAT, int8/fp16/fp32 TFLite, "
             "ONNX, SavedModel, model card, golden vectors and a parity/latency report",
        description="Export RUN_DIR (a keras-attn train output directory). Re-running "
                    "reuses the artifacts already written.",
    )
    export.add_argument("run_dir", help="the training run directory (holds model.keras)")
    export.add_argument("--output-dir", help="artifact directory (default RUN_DIR/export)")
    export.add_argument("--sequence-length", type=_positive_int,
                        help="fixed input length of the mobile artifacts (default: the "
                             "run's data.max_length)")
    export.add_argument("--qat-epochs", type=int, default=1,
                        help="quantization-aware fine-tuning epochs (0: calibrate only)")
    export.add_argument("--qat-learning-rate", type=float,
                        help="QAT peak learning rate (default: the run's / 10)")
    export.add_argument("--qat-max-steps", type=_positive_int, help="cap on QAT updates")
    export.add_argument("--calibration-examples", type=_positive_int, default=128,
                        help="training examples calibrating post-training quantization")
    export.add_argument("--eval-split", choices=("auto", "dev", "test"), default="auto",
                        help="data the artifacts are scored on (auto: test for NER, dev for "
                             "classification)")
    export.add_argument("--max-eval-examples", type=_positive_int,
                        help="score on the first N examples only")
    export.add_argument("--latency-threads", type=_positive_int, nargs="+", default=[1, 2],
                        help="thread counts of the latency measurements")
    export.add_argument("--latency-runs", type=_positive_int, default=50,
                        help="timed runs per latency measurement")
    export.add_argument("--golden-examples", type=int, default=1000,
                        help="data sentences in golden_vectors.jsonl (plus the hard cases)")
    export.add_argument("--no-text-tflite", action="store_true",
                        help="skip model_text.tflite (tokenizer inside, tf-text custom ops)")
    export.set_defaults(handler=_export)
    return parser


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
