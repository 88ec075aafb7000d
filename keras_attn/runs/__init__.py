"""The two contracts of the pipeline (docs/pipeline.md): the run directory, between
`keras-attn train` / `quantize` and every stage that reads a trained run, and the export
directory, between `keras-attn export` and everything that reads an export."""

# `config.json` is a `keras_attn.training.TrainingConfig`, and the trainer writes runs through
# this package: the training package is initialised first, whichever is imported first.
import keras_attn.training  # noqa: F401  isort: skip

from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.export_directory import ExportDirectoryError
from keras_attn.runs.export_directory import ModelCard
from keras_attn.runs.run_directory import Lineage
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import TokenizerSettings

__all__ = ["ExportDirectory", "ExportDirectoryError", "ModelCard", "Lineage", "RunDirectory",
           "RunDirectoryError", "TokenizerSettings"]
