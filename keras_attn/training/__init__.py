"""Training at scale: `keras-attn train CONFIG.yaml` and its Python API. The run directory it
writes is `keras_attn.runs.RunDirectory`; the quantize stage after it is
`keras_attn.quantization.quantize_stage.quantize_run`."""

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
