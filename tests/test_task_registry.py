"""The task registry: one declaration of every task, read by the config, the tasks, the
quantize stage, the exporter and the predictor."""

import re

import pytest

from keras_attn.export import golden_vectors
from keras_attn.runs import task_registry
from keras_attn.runs import training_config as config
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.task_registry import TASK_NAMES
from keras_attn.runs.task_registry import task_spec
from keras_attn.runs.task_registry import tasks_with
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.stages.inference import predictor
from keras_attn.training.tasks import TASKS


def test_every_task_is_declared_once_and_has_its_task_class():
    assert TASK_NAMES == ("classification", "ner", "mlm", "causal_lm", "seq2seq",
                          "permutation_lm", "transformer_xl_lm")
    assert len(set(TASK_NAMES)) == len(TASK_NAMES)
    assert sorted(TASKS) == sorted(TASK_NAMES)
    assert all(TASKS[name].name == name for name in TASK_NAMES)


def test_the_properties_of_each_task():
    # Written out by hand from what each stage accepts (docs/pipeline.md, docs/training.md).
    assert tasks_with("bert_checkpoint") == ("classification", "ner", "mlm")
    assert tasks_with("fine_tunes_pretraining") == ("classification", "ner")
    assert tasks_with("pretraining") == ("mlm", "permutation_lm")
    assert tasks_with("character_tokenizer") == ("causal_lm", "transformer_xl_lm")
    assert tasks_with("deployable") == ("classification", "ner")
    assert tasks_with("token_labels") == ("ner",)
    assert [task_spec(name).logits_layout for name in ("classification", "ner")] == [
        "(batch, labels)", "(batch, sequence, labels)"]
    assert [task_spec(name).logits_rank for name in ("classification", "ner")] == [2, 3]
    assert task_spec("transformer_xl_lm").trains == "a Transformer-XL language model"


def test_readers_use_the_registry():
    assert predictor.TASKS is task_registry.DEPLOYABLE_TASKS
    assert golden_vectors.check_deployable is task_registry.check_deployable
    assert config.TrainingConfig.__dataclass_fields__["task"].metadata["choices"] == TASK_NAMES


def test_unknown_names_are_errors_that_list_the_known_ones():
    with pytest.raises(ValueError, match=re.escape(
            "unknown task 'regression'; the tasks are ['classification', 'ner', 'mlm', "
            "'causal_lm', 'seq2seq', 'permutation_lm', 'transformer_xl_lm']. "
            "Received: task='regression'")):
        task_spec("regression")
    with pytest.raises(ValueError, match=r"`attribute` must be one of \['bert_checkpoint', "
                                         r".*'quantization_aware'\]\. Received: "
                                         r"attribute='trains'"):
        tasks_with("trains")


@pytest.mark.parametrize("task", TASK_NAMES)
def test_config_checks_follow_the_registry(task):
    spec = task_spec(task)
    values = {"task": task, "data": {"train": "t.tsv"}, "model": {"checkpoint": "minilm"}}
    if spec.bert_checkpoint:
        assert TrainingConfig.from_dict(values).model.checkpoint == "minilm"
    else:  # a GPT language model may continue a run of its own task, nothing else
        with pytest.raises(ConfigError, match="continues a keras-attn train run of its own "
                           "task" if spec.quantization_aware else "imports BERT weights"):
            TrainingConfig.from_dict(values)
    values["model"] = {"preset": "p", "quantization_aware": True}
    if spec.quantization_aware:
        assert TrainingConfig.from_dict(values).model.quantization_aware
    else:
        with pytest.raises(ConfigError, match=re.escape(
                "`model.quantization_aware` trains the int8 copy of a trained model of the "
                "tasks ['classification', 'ner', 'causal_lm', 'seq2seq', "
                "'transformer_xl_lm']; a pretraining task's model is fine-tuned first. "
                f"Received: task={task!r}")):
            TrainingConfig.from_dict(values)
    values["model"] = {"preset": "p", "tokenizer": "bytes"}
    if spec.character_tokenizer:
        assert TrainingConfig.from_dict(values).model.tokenizer == "bytes"
    else:
        with pytest.raises(ConfigError, match=re.escape(
                "`model.tokenizer: bytes` is for the language-model tasks ['causal_lm', "
                f"'transformer_xl_lm']. Received: task={task!r}")):
            TrainingConfig.from_dict(values)
