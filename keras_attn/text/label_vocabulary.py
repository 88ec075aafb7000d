"""The label <-> id mapping of a classification or tagging task, built from training data."""

import pathlib

from keras_attn import atomic_files
from keras_attn.text.errors import DataError

LABELS_FILENAME = "labels.txt"


def _sort_key(label):
    # Integer labels ("0", "1", ..., "10") sort as numbers, the rest as strings; "O" (outside an
    # entity) comes first so a tagging head's class 0 is "no entity".
    if label == "O":
        return (0, 0, "")
    try:
        return (1, int(label), "")
    except ValueError:
        return (2, 0, label)


class LabelVocabulary:
    """An ordered, immutable list of labels; a label's id is its index.

    The order is stable, whatever the order of the training data: `"O"` first (for tagging),
    then integer labels by value, then the others sorted as strings (`B-LOC`, `B-MISC`, ...,
    `I-PER`). The vocabulary must travel with the model that was trained with it:

    - as a file: `save(model_dir)` writes `model_dir/labels.txt` (one label per line, line `i`
      is id `i - 1`), `LabelVocabulary.load(model_dir)` reads it back;
    - or inside a layer or model config: `get_config()` is `{"labels": [...]}` (JSON-safe), and
      `LabelVocabulary.from_config(config)` rebuilds it.

    Args:
        labels: sequence of str. The labels, in id order. Must be unique and non-empty strings
            without line breaks.

    Example:
    >>> vocab = LabelVocabulary.build(["B-PER", "O", "I-PER", "O", "B-LOC"])
    >>> vocab.labels
    ('O', 'B-LOC', 'B-PER', 'I-PER')
    >>> vocab.encode(["O", "B-PER"]), vocab.decode([2, 3])
    ([0, 2], ['B-PER', 'I-PER'])
    """

    def __init__(self, labels):
        labels = tuple(labels)
        if not labels:
            raise ValueError(f"`labels` must contain at least one label. Received: labels={labels}")
        seen = set()
        for label in labels:
            if not isinstance(label, str) or not label or "\n" in label or "\r" in label:
                raise ValueError(
                    "Each label must be a non-empty string without line breaks. "
                    f"Received: labels={labels!r}"
                )
            if label in seen:
                raise ValueError(f"Duplicate label {label!r}. Received: labels={labels!r}")
            seen.add(label)
        self._labels = labels
        self._ids = {label: index for index, label in enumerate(labels)}

    @classmethod
    def build(cls, labels):
        """Builds the vocabulary of every label seen in `labels` (any iterable, e.g. a reader's
        label stream), in the stable order described above."""
        unique = set()
        for label in labels:
            if isinstance(label, (list, tuple)):
                unique.update(label)
            else:
                unique.add(label)
        if not unique:
            raise ValueError("Cannot build a label vocabulary: the data contains no labels.")
        return cls(sorted(unique, key=_sort_key))

    @property
    def labels(self):
        """The labels, in id order (a tuple)."""
        return self._labels

    def __len__(self):
        return len(self._labels)

    def __contains__(self, label):
        return label in self._ids

    def __iter__(self):
        return iter(self._labels)

    def __eq__(self, other):
        return isinstance(other, LabelVocabulary) and other.labels == self.labels

    def __hash__(self):
        return hash(self._labels)

    def __repr__(self):
        return f"LabelVocabulary({list(self._labels)!r})"

    def id(self, label, path=None, line=None):
        """The id of `label`. An unknown label raises `DataError` naming `path:line` when they
        are given (readers pass them), `KeyError` otherwise."""
        try:
            return self._ids[label]
        except KeyError:
            known = ", ".join(repr(known) for known in self._labels)
            message = (
                f"unknown label {label!r}: the label vocabulary built from the training data has "
                f"{len(self._labels)} labels ({known}). Fix the label or rebuild the vocabulary "
                "from data that contains it."
            )
            if path is not None:
                raise DataError(path, line or 0, message) from None
            raise KeyError(message) from None

    def encode(self, labels):
        """Ids of a sequence of labels (list of int)."""
        return [self.id(label) for label in labels]

    def decode(self, ids):
        """Labels of a sequence of ids (list of str)."""
        size = len(self._labels)
        result = []
        for index in ids:
            index = int(index)
            if not 0 <= index < size:
                raise ValueError(f"Label id {index} is outside [0, {size}). Received: ids={ids}")
            result.append(self._labels[index])
        return result

    def save(self, directory):
        """Writes `directory/labels.txt` (created if needed) and returns its path."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LABELS_FILENAME
        atomic_files.write_text(path, "".join(label + "\n" for label in self._labels))
        return path

    @classmethod
    def load(cls, path):
        """Reads a vocabulary saved by `save`: `path` is the `labels.txt` file or its directory."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / LABELS_FILENAME
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, label in enumerate(lines, start=1):
            if not label:
                raise DataError(path, number, "empty line in a label file; each line holds one "
                                "label. Remove the empty line.")
        if not lines:
            raise DataError(path, 1, "the label file is empty.")
        return cls(lines)

    def get_config(self):
        return {"labels": list(self._labels)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
