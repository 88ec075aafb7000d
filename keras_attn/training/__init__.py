"""Training at scale: `keras-attn train CONFIG.yaml` and its Python API."""

from keras_attn.training.batch_stream import BatchStream
from keras_attn.training.bleu import corpus_bleu
from keras_attn.training.config import ConfigError
from keras_attn.training.config import DataSection
from keras_attn.training.config import DistributeSection
from keras_attn.training.config import ModelSection
from keras_attn.training.config import TrainingConfig
from keras_attn.training.config import TrainSection
from keras_attn.training.global_gradient_adamw import GlobalGradientAdamW
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.optimizer import no_decay_variables
from keras_attn.training.quantization_recipe import QuantizationRecipe
from keras_attn.training.quantize import quantize_run
from keras_attn.training.run_directory import RunDirectory
from keras_attn.training.run_directory import RunDirectoryError
from keras_attn.training.run_directory import TokenizerSettings
from keras_attn.training.step_checkpoints import CheckpointError
from keras_attn.training.step_checkpoints import StepCheckpoints
from keras_attn.training.strategy import StrategyError
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.task_registry import TaskSpec
from keras_attn.training.task_registry import task_spec
from keras_attn.training.task_registry import tasks_with
from keras_attn.training.trainer import Trainer
from keras_attn.training.trainer import train
from keras_attn.training.warmup_decay_schedule import WarmupDecaySchedule

__all__ = [
    "TokenizerSettings",
    "RunDirectoryError",
    "RunDirectory",
    "quantize_run",
    "QuantizationRecipe",
    "BatchStream",
    "CheckpointError",
    "ConfigError",
    "DataSection",
    "DistributeSection",
    "ModelSection",
    "TrainSection",
    "TaskSpec",
    "task_spec",
    "tasks_with",
    "GlobalGradientAdamW",
    "StepCheckpoints",
    "StrategyError",
    "Trainer",
    "TrainingConfig",
    "WarmupDecaySchedule",
    "corpus_bleu",
    "make_optimizer",
    "no_decay_variables",
    "resolve_strategy",
    "train",
]
