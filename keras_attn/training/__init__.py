"""Training's library: the tasks, strategies, the epoch loop, optimizer and step
checkpoints, and the config (`TrainingConfig`, declared in `keras_attn.runs`). The train
stage that runs them, `keras-attn train CONFIG.yaml`, is `keras_attn.stages.train`; the run
directory it writes is `keras_attn.runs.RunDirectory`."""

from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.task_registry import TaskSpec
from keras_attn.runs.task_registry import task_spec
from keras_attn.runs.task_registry import tasks_with
from keras_attn.runs.training_config import DataSection
from keras_attn.runs.training_config import DistributeSection
from keras_attn.runs.training_config import ModelSection
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.runs.training_config import TrainSection
from keras_attn.training.bleu import corpus_bleu
from keras_attn.training.global_gradient_adamw import GlobalGradientAdamW
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.optimizer import no_decay_variables
from keras_attn.training.step_checkpoints import CheckpointError
from keras_attn.training.step_checkpoints import StepCheckpoints
from keras_attn.training.strategy import StrategyError
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.tasks.batch_stream import BatchStream
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
    "TrainingConfig",
    "WarmupDecaySchedule",
    "corpus_bleu",
    "make_optimizer",
    "no_decay_variables",
    "resolve_strategy",
]
