"""The run directory: the contract between `keras-attn train` / `quantize` and every stage
that reads a trained run (`quantize`, `export`, `predict`, `explain`); docs/pipeline.md."""

# `config.json` is a `keras_attn.training.TrainingConfig`, and the trainer writes runs through
# this package: the training package is initialised first, whichever is imported first.
import keras_attn.training  # noqa: F401  isort: skip

from keras_attn.runs.run_directory import Lineage
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import TokenizerSettings

__all__ = ["Lineage", "RunDirectory", "RunDirectoryError", "TokenizerSettings"]
