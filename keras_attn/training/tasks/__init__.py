"""Training tasks: what each `task:` of a config reads, builds, batches and scores."""

from keras_attn.training.tasks.causal_lm_task import CausalLMTask
from keras_attn.training.tasks.classification_task import ClassificationTask
from keras_attn.training.tasks.masked_lm_task import MaskedLMTask
from keras_attn.training.tasks.ner_task import NerTask
from keras_attn.training.tasks.permutation_lm_task import PermutationLMTask
from keras_attn.training.tasks.seq2seq_task import Seq2SeqTask
from keras_attn.training.tasks.task import Task
from keras_attn.training.tasks.transformer_xl_task import TransformerXLTask

# The `Task` class of each name in `task_registry.TASK_NAMES` (the names are declared there;
# tests/test_task_registry.py checks that the two agree).
TASKS = {task.name: task for task in (
    ClassificationTask, NerTask, MaskedLMTask, CausalLMTask, Seq2SeqTask, PermutationLMTask,
    TransformerXLTask)}


def make_task(config, output_dir, log=None, write_files=True):
    """The `Task` for `config.task`."""
    return TASKS[config.task](config, output_dir, log=log, write_files=write_files)


__all__ = [
    "CausalLMTask",
    "ClassificationTask",
    "MaskedLMTask",
    "NerTask",
    "PermutationLMTask",
    "Seq2SeqTask",
    "TASKS",
    "Task",
    "TransformerXLTask",
    "make_task",
]
