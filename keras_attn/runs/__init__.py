"""The contracts of the pipeline (docs/pipeline.md), at its bottom: the settings (the
training config schema, the quantization recipe, the task registry), the run directory,
between `keras-attn train` / `quantize` and every stage that reads a trained run, and the
export directory, between `keras-attn export` and everything that reads an export. Imports
no stage and no pipeline library: those import it."""

from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.export_directory import ExportDirectoryError
from keras_attn.runs.export_directory import ModelCard
from keras_attn.runs.run_directory import Lineage
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import TokenizerSettings

__all__ = ["ExportDirectory", "ExportDirectoryError", "ModelCard", "Lineage", "RunDirectory",
           "RunDirectoryError", "TokenizerSettings"]
