"""The training tasks, each declared once with what the pipeline may do with its runs.

The config's `task:` choices, the tasks that fine-tune a pretrained encoder, the pretraining
tasks, the tasks the quantize, export, predict and serve stages take: every list of task
names in keras-attn is read from `TASK_SPECS` here (the `Task` class of each name is in
`keras_attn.training.tasks.TASKS`). Pure Python, so the config checks need no backend.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One `task:` of a training config.

    Attributes:
        name: the `task:` value.
        trains: what it trains, for messages.
        bert_checkpoint: `model.checkpoint` may name BERT weights (`minilm`, a Hugging Face
            directory) or a run; the other tasks start from `model.preset` (or continue a run
            of their own task).
        fine_tunes_pretraining: `model.checkpoint` may name a run of a `pretraining` task,
            whose encoder it fine-tunes.
        pretraining: its encoder is fine-tuned by the `fine_tunes_pretraining` tasks.
        character_tokenizer: `model.tokenizer` may be `characters` or `bytes` (language
            models over raw text); the others read WordPiece.
        token_labels: its labels name word pieces (a tagger, logits `(batch, sequence,
            labels)`); a deployable task without it labels whole texts (`(batch, labels)`).
        deployable: a labelled BERT model (classifier or tagger): `keras-attn quantize`,
            `export`, `predict`, `explain` and `serve` take its runs.
        quantization_aware: `model.quantization_aware` trains the `quantize_model` copy of
            its model (continuing a float run of the task), which `keras-attn export` converts.
        metric: the metric a deployable task's runs and exports report (`None` otherwise:
            the task class names its own).
    """

    name: str
    trains: str
    bert_checkpoint: bool = False
    fine_tunes_pretraining: bool = False
    pretraining: bool = False
    character_tokenizer: bool = False
    token_labels: bool = False
    deployable: bool = False
    quantization_aware: bool = False
    metric: str = None

    @property
    def logits_layout(self):
        """The layout of a deployable task model's logits, for messages and shape checks.

        Example:
        >>> task_spec("ner").logits_layout
        '(batch, sequence, labels)'
        """
        return "(batch, sequence, labels)" if self.token_labels else "(batch, labels)"

    @property
    def logits_rank(self):
        """The rank of `logits_layout`: 3 for a tagger, 2 for a text classifier."""
        return 3 if self.token_labels else 2


TASK_SPECS = (
    TaskSpec("classification", "a BERT sentence classifier", bert_checkpoint=True,
             fine_tunes_pretraining=True, deployable=True, quantization_aware=True,
             metric="accuracy"),
    TaskSpec("ner", "a BERT token tagger (optionally with a CRF)", bert_checkpoint=True,
             fine_tunes_pretraining=True, token_labels=True, deployable=True,
             quantization_aware=True, metric="f1"),
    TaskSpec("mlm", "a BERT masked language model", bert_checkpoint=True, pretraining=True),
    TaskSpec("causal_lm", "a GPT language model", character_tokenizer=True,
             quantization_aware=True),
    TaskSpec("seq2seq", "an encoder-decoder Transformer", quantization_aware=True),
    TaskSpec("permutation_lm", "an XLNet permutation language model", pretraining=True),
    TaskSpec("transformer_xl_lm", "a Transformer-XL language model", character_tokenizer=True,
             quantization_aware=True),
)

TASK_NAMES = tuple(spec.name for spec in TASK_SPECS)


def task_spec(name):
    """The `TaskSpec` called `name`.

    Example:
    >>> task_spec("ner").deployable
    True
    """
    for spec in TASK_SPECS:
        if spec.name == name:
            return spec
    raise ValueError(f"unknown task {name!r}; the tasks are {list(TASK_NAMES)}. "
                     f"Received: task={name!r}")


def tasks_with(attribute):
    """Names of the tasks whose `TaskSpec` has `attribute` set, in declaration order.

    Example:
    >>> tasks_with("pretraining")
    ('mlm', 'permutation_lm')
    """
    flags = [f.name for f in dataclasses.fields(TaskSpec) if f.type in (bool, "bool")]
    if attribute not in flags:
        raise ValueError(f"`attribute` must be one of {flags}. Received: "
                         f"attribute={attribute!r}")
    return tuple(spec.name for spec in TASK_SPECS if getattr(spec, attribute))


BERT_CHECKPOINT_TASKS = tasks_with("bert_checkpoint")
FINE_TUNING_TASKS = tasks_with("fine_tunes_pretraining")
PRETRAINING_TASKS = tasks_with("pretraining")
CHARACTER_LM_TASKS = tasks_with("character_tokenizer")
DEPLOYABLE_TASKS = tasks_with("deployable")
QUANTIZATION_AWARE_TASKS = tasks_with("quantization_aware")
TAGGING_TASKS = tasks_with("token_labels")


def check_deployable(task, name="task"):
    """Raises unless `task` is one of `DEPLOYABLE_TASKS` (the message lists them).

    Example:
    >>> check_deployable("mlm")
    Traceback (most recent call last):
    ...
    ValueError: `task` must be one of ['classification', 'ner']. Received: task='mlm'
    """
    if task not in DEPLOYABLE_TASKS:
        raise ValueError(f"`{name}` must be one of {list(DEPLOYABLE_TASKS)}. "
                         f"Received: {name}={task!r}")
