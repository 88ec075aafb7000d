"""The export directory: the one contract between `keras-attn export` and everything that
reads an export (`predict`, `serve`, `explain`, the golden-vector and metadata tools, the
Android app's asset task, the web demo); docs/pipeline.md.

    EXPORT/
      model_card.json      task, labels, sequence length, tokenizer settings, CRF
                           transitions, the int8 recipe, and `artifacts`: one entry per
                           artifact file (file, kind, precision, lengths)
      vocab.txt            WordPiece vocabulary the artifacts' token ids index
      labels.txt           the labels in output order (the card lists them too)
      model_*.tflite, *.onnx, saved_model/    the artifacts (`keras_attn.export.artifacts`)
      golden_vectors.jsonl texts -> ids and float logits, for the apps' parity tests
      export_report.json / export_report.md   every artifact scored and timed; the report
                           is written last, so it marks a finished export
      qat/                 the calibrated (or quantization-aware) run of `model_int8*`

A model file can also carry the card, vocabulary and labels inside it (TFLite metadata, ONNX
`metadata_props`): `ModelCard` reads both the same way.
"""

import dataclasses
import json
import pathlib
import types

import numpy as np

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import TAGGING_TASKS
from keras_attn.runs.task_registry import check_deployable
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.tokenizer import MAX_CHARS_PER_WORD
from keras_attn.text.tokenizer import WordPieceTokenizer

CARD_FILE, VOCAB_FILE, LABELS_FILE = "model_card.json", "vocab.txt", "labels.txt"
REPORT_FILE, REPORT_PAGE, GOLDEN_FILE = ("export_report.json", "export_report.md",
                                         "golden_vectors.jsonl")
CARD_KEYS = ("task", "labels", "sequence_length", "tokenizer")
CARD_FORMAT = "keras-attn model card 1"
CRF_DECIMALS = 6
CRF_WEIGHTS = ("transitions", "start_transitions", "end_transitions")
WRITTEN_BY = "keras-attn export RUN --output-dir {path}"


class ExportDirectoryError(KerasAttnError, ValueError):
    """An export directory (or a model file's embedded card) lacks a file or holds
    inconsistent ones."""


@dataclasses.dataclass
class ModelCard:
    """What an app needs besides the weights: the card dict, the vocabulary and the labels,
    read from an export directory or from a model file's embedded copies. The card an export
    writes is made here too (`card_dict`, `crf_section`), so one class both writes and
    reads it.

    Attributes:
        card: the `model_card.json` dict.
        vocabulary: list of str, the `vocab.txt` lines.
        labels: list of str, the `labels.txt` lines.
        source: where they were read (named in errors).
        vocabulary_error: why `vocabulary` is `None` (a text-in model needs none; `tokenizer()`
            raises it).
    """

    card: dict
    vocabulary: list
    labels: list
    source: str = "model_card.json"
    vocabulary_error: str = None

    def __post_init__(self):
        missing = [key for key in CARD_KEYS if key not in self.card]
        if missing or self.card.get("task") not in DEPLOYABLE_TASKS:
            raise ExportDirectoryError(
                f"{self.source} is not a keras-attn model card (missing {missing}, task "
                f"{self.card.get('task')!r}): re-run `keras-attn export`")
        if list(self.labels) != list(self.card["labels"]):
            raise ExportDirectoryError(
                f"{self.source}: {LABELS_FILE} and {CARD_FILE} list different labels: they "
                "come from different exports; copy both from the same export directory")

    @property
    def task(self):
        return self.card["task"]

    @property
    def sequence_length(self):
        return int(self.card["sequence_length"])

    def tokenizer(self):
        """The `WordPieceTokenizer` of the card's settings over the vocabulary."""
        settings = self.card["tokenizer"]
        if self.vocabulary is None:
            raise ExportDirectoryError(self.vocabulary_error)
        if len(self.vocabulary) != settings["vocabulary_size"]:
            raise ExportDirectoryError(
                f"{self.source}: {VOCAB_FILE} has {len(self.vocabulary)} tokens but "
                f"{CARD_FILE} says {settings['vocabulary_size']} (tokenizer.vocabulary_size): "
                "the files come from different exports; copy them from the same export "
                "directory")
        return WordPieceTokenizer(list(self.vocabulary), lowercase=bool(settings["lowercase"]),
                                  strip_accents=bool(settings["strip_accents"]),
                                  sequence_length=self.sequence_length)

    def label_vocabulary(self):
        """The labels as a `LabelVocabulary`."""
        return LabelVocabulary(self.labels)

    def crf(self):
        """The CRF weights (`transitions`, `start_transitions`, `end_transitions` float32
        arrays) of a CRF tagger, else `None`."""
        if not self.card.get("crf"):
            return None
        return types.SimpleNamespace(**{name: np.asarray(self.card["crf"][name], "float32")
                                        for name in CRF_WEIGHTS})


    @staticmethod
    def card_dict(task, labels, sequence_length, tokenizer, lowercase, metric=None,
                      crf=None, metrics=None, source_run=None, version=None, quantization=None):
        """The `model_card.json` dict of an exported classifier or tagger.

        Args:
            task: one of `task_registry.DEPLOYABLE_TASKS` (`"classification"`, `"ner"`).
            labels: list of str, the labels in output order.
            sequence_length: int, the fixed input length of the mobile artifacts.
            tokenizer: the run's `WordPieceTokenizer` (vocabulary and special ids).
            lowercase: bool, the run's `lowercase` (accents are stripped iff lower-cased).
            metric: name of the task metric, or `None`.
            crf: `ModelCard.crf_section(...)` of a CRF tagger, else `None`.
            metrics: dict artifact -> metric value, or `None`.
            source_run: str path of the training run, or `None`.
            version: keras-attn version string, or `None`.
            quantization: how `model_int8*.tflite` were quantized (`{"recipe": ...,
                "description": ...}` of the `QuantizationRecipe`), or `None`.

        Returns:
            dict, JSON-serializable.
        """
        check_deployable(task)
        tagger = task_spec(task).token_labels
        if crf is not None and not tagger:
            raise ValueError(f"Only a tagger (task in {list(TAGGING_TASKS)}) can carry CRF "
                             f"transitions. Received: task={task!r}")
        num_labels = len(labels)
        return {
            "format": CARD_FORMAT,
            "task": task,
            "metric": metric,
            "labels": list(labels),
            "sequence_length": int(sequence_length),
            "inputs": [{"name": name, "dtype": "int32", "shape": [1, int(sequence_length)]}
                       for name in ID_INPUTS],
            "outputs": [{"name": "logits", "dtype": "float32",
                         "shape": [1, int(sequence_length), num_labels] if tagger
                         else [1, num_labels]}],
            "tokenizer": {
                "vocabulary": "vocab.txt", "vocabulary_size": tokenizer.vocabulary_size(),
                "lowercase": bool(lowercase),
                "strip_accents": bool(tokenizer.strip_accents),
                "cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id,
                "pad_token_id": tokenizer.pad_token_id,
                "unknown_token_id": tokenizer.unknown_token_id,
                # BERT's limit: a longer normalized word is one unknown token. Cards written
                # before the tokenizer followed HF also held "max_word_bytes" (tf-text's limit).
                "max_word_characters": MAX_CHARS_PER_WORD,
                "offsets": "code points",
            },
            "words": "BERT basic tokenization: whitespace, each punctuation character and "
                     "CJK ideograph is a word (keras_attn.text.word_splitter)"
                     if tagger else None,
            "decoding": ("first word piece of each word, IOB2 repair (an I- tag after O or "
                         "another type opens an entity), entity spans with code-point "
                         "offsets" if tagger else "softmax over logits"),
            "crf": crf,
            "metrics": metrics or {},
            "source_run": source_run,
            "keras_attn_version": version,
            "quantization": quantization,
        }

    @staticmethod
    def crf_section(transitions, start_transitions, end_transitions):
        """The card's `crf` entry: the three CRF weights rounded to 6 decimals, as lists.

        Args:
            transitions: `(K, K)` array, `A[i, j]` the score of tag `i` followed by tag `j`.
            start_transitions, end_transitions: `(K,)` arrays.

        Returns:
            dict with `transitions`, `start_transitions`, `end_transitions` (nested lists of
            floats), the numbers `viterbi_float64` and the app decode with.

        Example:
        >>> ModelCard.crf_section(np.eye(2), np.zeros(2), [0.1234567, 0.0])["end_transitions"]
        [0.123457, 0.0]
        """
        arrays = {"transitions": transitions, "start_transitions": start_transitions,
                  "end_transitions": end_transitions}
        section = {}
        for name, value in arrays.items():
            value = np.asarray(value, "float64")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"CRF `{name}` holds non-finite values; the model is broken")
            section[name] = value.round(CRF_DECIMALS).tolist()
        num_tags = len(section["start_transitions"])
        if np.shape(section["transitions"]) != (num_tags, num_tags) or \
                len(section["end_transitions"]) != num_tags:
            raise ValueError(
                "CRF weights must be transitions (K, K), start and end (K,). Received shapes "
                f"{np.shape(section['transitions'])}, ({num_tags},), "
                f"({len(section['end_transitions'])},)")
        return section


class ExportDirectory:
    """Reads and writes one `keras-attn export` output directory.

    Args:
        path: the directory.

    Example:
    >>> export = ExportDirectory("artifacts/does_not_exist")
    >>> export.is_export()
    False
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def __repr__(self):
        return f"ExportDirectory({str(self.path)!r})"

    def is_export(self):
        """Whether the directory holds a model card."""
        return (self.path / CARD_FILE).is_file()

    def is_finished(self):
        """Whether the export ran to its end (its report is written last)."""
        return (self.path / REPORT_FILE).is_file()

    def file(self, name, needed_for=None):
        """Path of `name`, or an `ExportDirectoryError` naming it and the command that
        writes it."""
        path = self.path / name
        if not path.exists():
            purpose = f" ({needed_for})" if needed_for else ""
            raise ExportDirectoryError(
                f"{path} is missing{purpose}: an export directory gets it from "
                f"`{WRITTEN_BY.format(path=self.path)}`; copy the export directory whole")
        return path

    # --- reading ------------------------------------------------------------------------

    def card(self, needed_for=None):
        """The `model_card.json` dict."""
        return _read_json(self.file(CARD_FILE, needed_for))

    def model_card(self, needed_for=None):
        """The `ModelCard`: card, vocabulary and labels, checked against each other."""
        card = self.card(needed_for)
        vocabulary, missing = None, None
        try:
            vocabulary = _lines(self.file(VOCAB_FILE, needed_for))
        except ExportDirectoryError as error:  # raised by `tokenizer()`: text-in models need none
            missing = str(error)
        labels_file = self.path / LABELS_FILE
        labels = _lines(labels_file) if labels_file.is_file() else list(card.get("labels", []))
        return ModelCard(card, vocabulary, labels, source=str(self.path / CARD_FILE),
                         vocabulary_error=missing)

    def artifacts(self):
        """The card's artifact entries (`{"file", "kind", "precision", "lengths"}`), in the
        order the export wrote them."""
        card = self.card()
        if "artifacts" not in card:
            raise ExportDirectoryError(
                f"{self.path / CARD_FILE} predates the artifact list: re-run "
                f"`{WRITTEN_BY.format(path=self.path)}`")
        return card["artifacts"]

    def source_run(self):
        """The path of the training run the export was made from (the card's
        `source_run`), or `None`."""
        return self.card().get("source_run")

    def report(self):
        """`export_report.json` as a dict."""
        return _read_json(self.file(REPORT_FILE, "the export's scores and timings"))

    # --- writing (the export stage) -----------------------------------------------------

    def write_card(self, card):
        """Writes `model_card.json` (indented UTF-8 JSON)."""
        self.path.mkdir(parents=True, exist_ok=True)
        _write_text(self.path / CARD_FILE, json.dumps(card, indent=1, ensure_ascii=False) + "\n")

    def write_report(self, report, markdown):
        """`export_report.md`, then `export_report.json`, which marks the export finished."""
        _write_text(self.path / REPORT_PAGE, markdown)
        _write_text(self.path / REPORT_FILE, json.dumps(report, indent=1) + "\n")


def _read_json(path):
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportDirectoryError(f"{path} is damaged: not a JSON file written by keras-attn "
                                   f"({error}); re-run `keras-attn export` to rewrite it") \
            from None


def _lines(path):
    return pathlib.Path(path).read_text(encoding="utf-8").rstrip("\n").split("\n")


def _write_text(path, text):
    atomic_files.write_text(path, text)
