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
