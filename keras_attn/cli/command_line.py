"""`keras-attn` command line. This is the only layer that writes to the terminal.

The parser of every command and `main`, on top of the stages (docs/pipeline.md); the
commands themselves are in `run_commands` (demo, train, quantize, export) and
`model_commands` (explain, predict, serve).

Every import is at the top, the stages' too. `import keras_attn` imports Keras and
TensorFlow, which is nearly all of `keras-attn --help`'s time (measured on 2 busy cores:
7.1-7.7 s of CPU for `import keras_attn`, 7.4-8.4 s for `--help`); once they are loaded,
the export, inference, demo and explain modules add about 0.2 s, so importing them lazily
per command would save nothing a user notices.
"""

import argparse
import sys

from keras_attn.cli import model_commands
from keras_attn.cli import run_commands
from keras_attn.cli.terminal import notes_on_stderr
from keras_attn.errors import KerasAttnError

# What a command reports as `keras-attn CMD: error: ...` and exit status 2 (one handler, in
# `main`): keras-attn's own errors, argument checks (`ValueError` from
# `keras_attn.layers.validation`), unreadable files and a missing optional extra.
USER_ERRORS = (KerasAttnError, ValueError, OSError, ImportError)

# One `add_*_command(commands)` per sub-command, in `--help`'s order.
COMMANDS = (run_commands.add_demo_command, run_commands.add_reversal_demo_command,
            run_commands.add_train_command, run_commands.add_export_command,
            run_commands.add_quantize_command, model_commands.add_explain_command,
            model_commands.add_predict_command, model_commands.add_serve_command)


def build_parser():
    """The `keras-attn` parser: one sub-command per entry of `COMMANDS`."""
    parser = argparse.ArgumentParser(prog="keras-attn", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv=None):
    """Runs one command; a `USER_ERRORS` error is printed as `keras-attn CMD: error: ...`
    (its message says what, where and how to fix it) and exits with status 2."""
    args = build_parser().parse_args(argv)
    notes_on_stderr(args.command)
    try:
        return args.handler(args)
    except USER_ERRORS as error:
        sys.stderr.write(f"keras-attn {args.command}: error: {error}\n")
        return 2
