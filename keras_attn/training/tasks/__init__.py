"""Training tasks: what each `task:` of a config reads, builds, batches and scores."""

from keras_attn.training.tasks.causal_lm_task import CausalLMTask
from keras_attn.training.tasks.classification_task import ClassificationTask
from keras_attn.training.tasks.masked_lm_task import MaskedLMTask
from keras_attn.training.tasks.ner_task import NerTask
from keras_attn.training.tasks.permutation_lm_task import PermutationLMTask
from keras_attn.training.tasks.seq2seq_task import Seq2SeqTask
from keras_attn.training.tasks.task import Task
from keras_attn.training.tasks.transformer_xl_task import TransformerXLTask

TASKS = {
    "classification": ClassificationTask,
    "ner": NerTask,
    "mlm": MaskedLMTask,
    "causal_lm": CausalLMTask,
    "seq2seq": Seq2SeqTask,
    "permutation_lm": PermutationLMTask,
    "transformer_xl_lm": TransformerXLTask,
}


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
