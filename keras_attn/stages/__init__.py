"""The stages of the pipeline (docs/pipeline.md), above the contracts (`keras_attn.runs`) and
the libraries (layers, models, text, training's loop, quantization, the export formats):
`train` (`keras-attn train`), `quantize_run` (`keras-attn quantize`), `export_run`
(`keras-attn export`, with the translation and generation exports), `inference`
(`keras-attn predict` and `serve`), `explain` (`keras-attn explain`) and the demos (`demo`,
`reversal_demo`). Stages talk to each other only through the run and export directories."""

from keras_attn.stages.export_options import ExportError
from keras_attn.stages.export_options import ExportOptions
from keras_attn.stages.quantize_stage import quantize_run
from keras_attn.stages.run_exporter import RunExporter
from keras_attn.stages.run_exporter import export_run
from keras_attn.stages.train_stage import Trainer
from keras_attn.stages.train_stage import train

__all__ = ["ExportError", "ExportOptions", "RunExporter", "Trainer", "export_run", "quantize_run",
           "train"]
