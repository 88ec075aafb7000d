"""The `keras-attn` command line (`main`), on top of the stages (docs/pipeline.md)."""

from keras_attn.cli.command_line import build_parser
from keras_attn.cli.command_line import main

__all__ = ["build_parser", "main"]
