"""The run directory: the one contract between keras-attn's stages.

`keras-attn train` and `keras-attn quantize` write a run directory; `quantize`, `export`,
`predict` and `explain` read one, only through `RunDirectory` (docs/pipeline.md). `serve`
reads no run: it serves the SavedModel of an export (`keras-attn export`'s `saved_model/`).
A run directory holds:

    RUN/
      config.json      the training configuration as run
      tokenizer.json   the tokenizer in effect (after continuing another run): kind,
                       lowercase, max_length
      lineage.json     what the run started from: nothing, a checkpoint, or another run
                       (with that run's task); for a QAT run, its quantization recipe
      vocab.txt        WordPiece vocabulary (characters.json for character tokenizers)
      labels.txt       class labels or NER tags (classification and ner runs)
      model.keras      the trained model (best weights), for inference and export
      metrics.json     the results; written last, so it marks a finished run
      checkpoints/ tensorboard/ best.weights.h5   training state (resuming)

Runs written before `tokenizer.json` and `lineage.json` existed are read too: their settings
are derived from `config.json` and the run they continued, as training derived them.
"""

import copy
import dataclasses
import json
import pathlib
import zipfile

import keras

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.errors import first_line
from keras_attn.runs.task_head import check_length
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import task_spec
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.labelled_examples import calibration_sample
from keras_attn.text.labelled_examples import encode_sentences
from keras_attn.text.labelled_examples import encode_texts
from keras_attn.text.labelled_examples import not_in_sample
from keras_attn.text.tokenizer import WordPieceTokenizer

# Which command writes each file (an error for a missing file says so).
WRITTEN_BY = {
    "config.json": "keras-attn train CONFIG (at its start)",
    "tokenizer.json": "keras-attn train CONFIG (at its start)",
    "lineage.json": "keras-attn train CONFIG (at its start)",
    "vocab.txt": "keras-attn train CONFIG (at its start)",
    "labels.txt": f"keras-attn train CONFIG of a {' or '.join(DEPLOYABLE_TASKS)} task",
    "model.keras": "a finished keras-attn train CONFIG (re-run it to resume from "
                   "checkpoints/) or keras-attn quantize RUN",
    "metrics.json": "a finished keras-attn train CONFIG or keras-attn quantize RUN",
}


class RunDirectoryError(KerasAttnError, ValueError):
    """A run directory lacks a file or holds inconsistent ones."""


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer a run's model reads: `kind` (wordpiece, characters, bytes), `lowercase`
    (WordPiece) and `max_length` (tokens per example, specials included)."""

    kind: str
    lowercase: bool
    max_length: int


@dataclasses.dataclass(frozen=True)
class Lineage:
    """Where a run started: `source` is `None` (from scratch), a checkpoint (`"minilm"`, a
    Hugging Face directory) or a run directory; `source_task` is that run's task;
    `quantization` the recipe dict of a QAT run."""

    source: str = None
    source_kind: str = "scratch"  # scratch | checkpoint | run
    source_task: str = None
    quantization: dict = None


class RunDirectory:
    """Reads (and, for the training and quantize stages, writes) one run directory.

    Args:
        path: the directory.

    Example:
    >>> run = RunDirectory("runs/does_not_exist")
    >>> run.is_run()
    False
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._config_values = None  # config.json, read once (`_recorded`)
        self._splits = {}  # split -> (path, raw examples), read once (`_read_split`)

    def __repr__(self):
        return f"RunDirectory({str(self.path)!r})"

    def is_run(self):
        """Whether the directory holds a trained model (`model.keras`)."""
        return (self.path / "model.keras").is_file()

    def file(self, name, needed_for=None):
        """Path of `name`, or a `RunDirectoryError` naming it and the command that writes it."""
        path = self.path / name
        if not path.is_file():
            purpose = f" ({needed_for})" if needed_for else ""
            raise RunDirectoryError(
                f"{path} is missing{purpose}: a run directory gets it from "
                f"`{WRITTEN_BY.get(name, 'keras-attn train CONFIG')}`; point at such a "
                "directory and keep it whole")
        return path

    def require(self, *names, needed_for=None):
        for name in names:
            self.file(name, needed_for)

    # --- reading ------------------------------------------------------------------------

    def _recorded(self):
        """`config.json` as a dict, read on first use and kept (not to be edited)."""
        if self._config_values is None:
            self._config_values = _read_json(self.file("config.json"))
        return self._config_values

    def recorded_config(self):
        """`config.json` as a dict (a copy, free to edit)."""
        return copy.deepcopy(self._recorded())

    def config(self):
        """The run's `TrainingConfig`."""
        return TrainingConfig.from_dict(self._recorded(), source=str(self.path / "config.json"))

    @property
    def task(self):
        """The run's `task` (from `config.json`)."""
        return self._recorded().get("task")

    def tokenizer_settings(self):
        """The `TokenizerSettings` the run's model was trained with."""
        if (self.path / "tokenizer.json").is_file():
            return TokenizerSettings(**_read_json(self.path / "tokenizer.json"))
        config = self._recorded()  # a run written before tokenizer.json
        model, data = config.get("model", {}), config.get("data", {})
        lowercase = model.get("lowercase", True)
        source = continued_run(model.get("checkpoint"))
        if source is not None and (source.path / "config.json").is_file():
            lowercase = source.tokenizer_settings().lowercase
        return TokenizerSettings(kind=model.get("tokenizer", "wordpiece"), lowercase=lowercase,
                                 max_length=data.get("max_length", 128))

    def tokenizer(self, sequence_length=None):
        """The run's `WordPieceTokenizer`, packing to `sequence_length` (default: the run's
        `max_length`)."""
        settings = self.tokenizer_settings()
        if settings.kind != "wordpiece":
            raise RunDirectoryError(
                f"{self.path}: a {settings.kind} language-model run has no WordPiece "
                f"tokenizer; predict, explain and export take {' and '.join(DEPLOYABLE_TASKS)} "
                "runs")
        return WordPieceTokenizer(str(self.file("vocab.txt")), lowercase=settings.lowercase,
                                  sequence_length=sequence_length or settings.max_length)

    def labels(self):
        """The run's `LabelVocabulary` (`labels.txt`)."""
        return LabelVocabulary.load(self.file("labels.txt", "the names of the model's outputs"))

    def load_model(self, compile=False):
        """The trained model (`model.keras`, see `load_keras_model`)."""
        return load_keras_model(self.file("model.keras"), compile=compile)

    def metrics(self):
        return _read_json(self.file("metrics.json"))

    def sequence_length(self, requested=None, limit=None):
        """The length rule of every stage that reads a run: `requested` (a
        `--sequence-length`), else the run's `max_length`; never over `limit` (the model's
        `max_sequence_length`), which is an error naming the longest length to use."""
        length = requested or self.tokenizer_settings().max_length
        check_length(length, limit, "sequence_length", fix=f"use --sequence-length {limit} or less",
                     error=RunDirectoryError)
        return length

    # --- the run's labelled data (classification and ner runs) -------------------------

    def data_file(self, split):
        """The path of `split` (`"train"`, `"dev"` or `"test"`) in the run's config, or
        `None` when the config names none."""
        return getattr(self.config().data, split)

    def evaluation_split(self, requested="auto"):
        """The split an export scores its files on: `requested` (`"dev"` or `"test"`), or
        for `"auto"` test when the config names one, else dev; an error when it names
        neither."""
        order = ("test", "dev") if requested == "auto" else (requested,)
        split = next((s for s in order if self.data_file(s)), None)
        if split is None:
            raise RunDirectoryError(
                f"{self.path}: the run has no {' or '.join(order)} data to score the exported "
                "files on (data.dev / data.test in its config)")
        return split

    def _read_split(self, split):
        """`(path, raw examples)` of `split`, read once per instance (export reads the
        evaluation split for its scores, golden vectors and MediaPipe texts)."""
        if split not in self._splits:
            self._splits[split] = self._read_split_file(split)
        return self._splits[split]

    def _read_split_file(self, split):
        config, path = self.config(), self.data_file(split)
        if path is None:
            raise RunDirectoryError(f"{self.path / 'config.json'} names no data.{split}: the "
                                    f"run has no {split} examples")
        data = config.data
        if task_spec(self.task).token_labels:
            raw = list(ConllReader(path))
        else:
            reader = ClassificationReader(path, text_column=data.text_column,
                                          label_column=data.label_column,
                                          text_pair_column=data.text_pair_column,
                                          header=data.header)
            raw = list(reader)
        if split == "train" and data.max_train_examples:
            raw = raw[: data.max_train_examples]
        return path, raw

    def texts(self, split, limit=None):
        """Raw texts of `split` (CoNLL sentences joined with spaces), the first `limit`."""
        if limit == 0:
            return []
        _, raw = self._read_split(split)
        return [" ".join(e.tokens) if hasattr(e, "tokens") else e.text for e in raw[:limit]]

    def examples(self, split, sequence_length=None, sample=None, log=None, beside_sample=None):
        """The labelled examples of `split`, tokenized with the run's tokenizer and labels
        at `sequence_length` (`keras_attn.text.labelled_examples`: `encode_texts` for a
        classifier, `encode_sentences` for a tagger).

        Args:
            split: `"train"`, `"dev"` or `"test"`.
            sequence_length: the length they are cut to (default: the run's).
            sample: tokenize only `calibration_sample(examples, sample)` of them.
            log: callable receiving the truncation note.
            beside_sample: first keep only the examples `sample=beside_sample` would not
                pick (`not_in_sample`: held out from a calibration of that many).
        """
        if self.task not in DEPLOYABLE_TASKS:
            raise RunDirectoryError(f"{self.path}: a {self.task} run has no labelled "
                                    f"examples; {' and '.join(DEPLOYABLE_TASKS)} runs have")
        path, raw = self._read_split(split)
        if beside_sample is not None:
            raw = not_in_sample(raw, beside_sample)
        if sample is not None:
            raw = calibration_sample(raw, sample)
        encode = encode_sentences if task_spec(self.task).token_labels else encode_texts
        return encode(raw, self.tokenizer(sequence_length), self.labels(), path,
                      log or (lambda message: None))

    def lineage(self):
        """The run's `Lineage` (derived from `config.json` for older runs)."""
        if (self.path / "lineage.json").is_file():
            return Lineage(**_read_json(self.path / "lineage.json"))
        return lineage_of(self._recorded().get("model", {}).get("checkpoint"))

    def float_run(self):
        """The float run at the start of a quantization-aware run's lineage (through QAT
        runs continuing QAT runs; the run itself when it is not quantization-aware), or
        `None` when that run is gone."""
        run = self
        while (lineage := run.lineage()).quantization is not None:
            if lineage.source is None or not RunDirectory(lineage.source).is_run():
                return None
            run = RunDirectory(lineage.source)
        return run

    # --- writing (training and quantize stages) -----------------------------------------

    def write_start(self, config, tokenizer_settings, lineage):
        """`config.json`, `tokenizer.json` and `lineage.json` of a run that starts (and the
        temporary files a killed earlier process left, removed)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_files.remove_stale_temporaries(self.path)
        _write_json(self.path / "config.json", config.to_dict())
        self._config_values = None  # read again, as written
        _write_json(self.path / "tokenizer.json", dataclasses.asdict(tokenizer_settings))
        _write_json(self.path / "lineage.json", dataclasses.asdict(lineage))

    def write_finish(self, model, metrics):
        """`model.keras`, then `metrics.json`, which marks the run finished."""
        with atomic_files.atomic_path(self.path / "model.keras") as path:
            model.save(path)
        _write_json(self.path / "metrics.json", metrics)


def load_keras_model(path, compile=False):
    """`keras.models.load_model(path)`; a file that Keras cannot read (damaged, or written by
    hand) is a `RunDirectoryError` naming it and the command that remakes it."""
    try:
        return keras.models.load_model(path, compile=compile)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise RunDirectoryError(
            f"{path} is damaged or not a Keras model ({first_line(error)}): it is remade by "
            f"`{WRITTEN_BY['model.keras']}`") from None


def continued_run(checkpoint):
    """The `RunDirectory` that a `model.checkpoint` value names, or `None` when it names a
    backbone checkpoint (`"minilm"`, a Hugging Face directory) or nothing."""
    if checkpoint in (None, "minilm"):
        return None
    run = RunDirectory(checkpoint)
    return run if run.is_run() else None


def qat_source_runs(run, qat_run, task):
    """`(float run, QAT run or None)` of an export of `run` (a `RunDirectory`) with the
    optional `--qat-run` `qat_run` of `task`: a quantization-aware `run` exported alone is
    its own QAT run, its lineage's float run the source. A `RunDirectoryError` names a QAT
    run whose float run is gone, and a `qat_run` that is not a QAT run of `task`."""
    qat = None
    if qat_run is not None:
        qat = RunDirectory(qat_run)
        if not qat.is_run() or qat.lineage().quantization is None or qat.task != task:
            raise RunDirectoryError(
                f"--qat-run {qat.path} is not a quantization-aware {task} run (a keras-attn "
                f"train run with model.checkpoint: {run.path} and "
                "model.quantization_aware: true)")
    elif run.is_run() and run.lineage().quantization is not None:
        qat = run
    source = run.float_run() if run.is_run() else run
    if source is None:
        raise RunDirectoryError(
            f"{run.path} is a quantization-aware run whose float run "
            f"({run.lineage().source}) is gone: export a float {task} run with --qat-run "
            f"{run.path}")
    return source, qat


def lineage_of(checkpoint, quantization=None):
    """The `Lineage` of a run whose `model.checkpoint` is `checkpoint`."""
    if checkpoint is None:
        return Lineage(quantization=quantization)
    run = continued_run(checkpoint)
    if run is None:
        return Lineage(str(checkpoint), "checkpoint", quantization=quantization)
    task = run.task if (run.path / "config.json").is_file() else None
    return Lineage(str(run.path.resolve()), "run", task, quantization)


def output_count(model):
    """Classes or tags a task model outputs (`None` for a model without label outputs)."""
    for name in ("num_classes", "num_labels", "num_outputs"):
        value = getattr(model, name, None)
        if value is not None:
            return value
    return None


def _read_json(path):
    path = pathlib.Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunDirectoryError(
            f"{path} is damaged: not a JSON file written by keras-attn ({error}); it is remade "
            f"by `{WRITTEN_BY.get(path.name, 'keras-attn train CONFIG')}`") from None


def _write_json(path, value):
    atomic_files.write_text(path, json.dumps(value, indent=1, default=float) + "\n")
