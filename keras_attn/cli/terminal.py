"""What the command line writes to the terminal: `say` (stdout) and the stages' notes
(stderr); the CLI is the only layer that talks to the terminal."""

import logging
import sys

from keras_attn.runs.run_lock import run_lock


def say(text=""):
    """Writes `text` and a newline to stdout at once."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def notes_on_stderr(command):
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
