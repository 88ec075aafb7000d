"""Streaming reader of text-classification data: TSV, CSV and JSON Lines files."""

import collections
import csv
import json
import pathlib

import tensorflow as tf

from keras_attn.text.errors import DataError
from keras_attn.text.errors import character_names
from keras_attn.text.errors import is_invisible
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.text_lines import ReadReport
from keras_attn.text.text_lines import read_lines

ClassificationExample = collections.namedtuple(
    "ClassificationExample", ["text", "text_pair", "label", "line"]
)
ClassificationExample.__doc__ = """One example: `text`, `text_pair` (`None` without a pair
column), `label` (str, `None` without a label column) and the 1-based `line` it starts on."""

_FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
_DEFAULT = object()


class ClassificationReader:
    """Reads (text, optional text pair, label) examples from a TSV, CSV or JSON Lines file.

    The file is read lazily, one line at a time (`iter(reader)` is a generator and `as_dataset`
    wraps it with `tf.data.Dataset.from_generator`), so files larger than memory work. Each pass
    fills `reader.report` with `examples` and `blank_lines_skipped` counts.

    Tabular files (`.tsv`, `.csv`): columns are chosen by name (looked up in the header row) or by
    0-based index (negative counts from the end). TSV is split on tabs with no quoting (the GLUE
    convention: a `"` is an ordinary character); CSV follows RFC 4180 quoting, so a quoted field
    may span lines (the example's line is where it starts). JSON Lines files (`.jsonl`): one JSON
    object per line, columns are keys; integer and boolean labels become strings (`1` -> `"1"`).

    Args:
        path: str or path-like. The file.
        text_column: str or int. Column (or key) of the text. Defaults to `0` for tabular files
            and `"text"` for JSON Lines.
        label_column: str, int or `None`. Column of the label, `None` for unlabelled data.
            Defaults to `-1` (the last column) for tabular files and `"label"` for JSON Lines.
        text_pair_column: str, int or `None`. Column of the second text of a pair task.
        header: `"infer"`, `True` or `False`. Whether the first row of a tabular file names the
            columns. `"infer"` means `True` when a column is chosen by name, `False` otherwise.
        file_format: `"tsv"`, `"csv"`, `"jsonl"` or `None` (from the file extension).

    Raises (while reading, as `DataError` naming `file:line`): a column missing from the header
    or from a row, invalid UTF-8, invalid JSON, an empty file; an unknown label when a label
    vocabulary is given to `as_dataset` or `encoded`.

    Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "dev.tsv"
    >>> _ = path.write_text("sentence\\tlabel\\ngood film\\t1\\nbad film\\t0\\n")
    >>> reader = ClassificationReader(path, text_column="sentence", label_column="label")
    >>> [(example.text, example.label) for example in reader]
    [('good film', '1'), ('bad film', '0')]
    >>> labels = reader.build_label_vocabulary()
    >>> labels.labels
    ('0', '1')
    >>> next(iter(reader.as_dataset(labels)))["label"].numpy()
    np.int32(1)
    """

    def __init__(
        self,
        path,
        text_column=_DEFAULT,
        label_column=_DEFAULT,
        text_pair_column=None,
        header="infer",
        file_format=None,
    ):
        self.path = pathlib.Path(path)
        if file_format is None:
            file_format = _FORMATS.get(self.path.suffix.lower())
            if file_format is None:
                raise ValueError(
                    f"Cannot tell the format of {self.path} from its extension; pass "
                    f"`file_format` ('tsv', 'csv' or 'jsonl'). Received: file_format=None"
                )
        if file_format not in ("tsv", "csv", "jsonl"):
            raise ValueError(
                "`file_format` must be 'tsv', 'csv' or 'jsonl'. "
                f"Received: file_format={file_format!r}"
            )
        self.file_format = file_format
        tabular = file_format != "jsonl"
        if text_column is _DEFAULT:
            text_column = 0 if tabular else "text"
        if label_column is _DEFAULT:
            label_column = -1 if tabular else "label"
        columns = {"text_column": text_column, "label_column": label_column,
                   "text_pair_column": text_pair_column}
        for name, column in columns.items():
            if column is None and name != "text_column":
                continue
            if tabular and (not isinstance(column, (str, int)) or isinstance(column, bool)):
                raise ValueError(
                    f"`{name}` must be a column name or index. Received: {name}={column!r}"
                )
            if not tabular and not isinstance(column, str):
                raise ValueError(
                    f"`{name}` must be a JSON key (str) for JSON Lines files. "
                    f"Received: {name}={column!r}"
                )
        if header not in ("infer", True, False):
            raise ValueError(
                f"`header` must be 'infer', True or False. Received: header={header!r}"
            )
        by_name = any(isinstance(column, str) for column in columns.values())
        # Columns by index with header="infer": the first row is read as data; the label
        # vocabulary checks it does not look like a header (see `build_label_vocabulary`).
        self.header_inferred = header == "infer" and tabular and not by_name
        if header == "infer":
            header = by_name
        if tabular and not header and by_name:
            raise ValueError(
                "Columns chosen by name need a header row; pass `header=True` or choose columns "
                f"by index. Received: header={header!r}, {columns}"
            )
        self.text_column = text_column
        self.label_column = label_column
        self.text_pair_column = text_pair_column
        self.header = bool(header) if tabular else False
        self.report = ReadReport(self.path)

    def __iter__(self):
        self.report = ReadReport(self.path)
        if self.file_format == "jsonl":
            return self._read_jsonl()
        return self._read_tabular()

    def _read_tabular(self):
        report = self.report
        lines = (line + "\n" for _, line in read_lines(self.path))
        if self.file_format == "tsv":
            rows = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            rows = csv.reader(lines, delimiter=",", quotechar='"')
        indices = None
        width = None
        while True:
            start_line = rows.line_num + 1
            try:
                row = next(rows)
            except StopIteration:
                self._check_examples()
                return
            except csv.Error as error:
                raise DataError(self.path, rows.line_num, f"malformed CSV ({error}).") from None
            if not row:
                report.add("blank_lines_skipped")
                continue
            if indices is None:
                if self.header:
                    indices = self._indices_from_header(row, start_line)
                    width = len(row)
                    continue
                indices = self._columns()
                width = len(row)
            values = {}
            for name, column in indices.items():
                if column is None:
                    values[name] = None
                    continue
                index = column if column >= 0 else len(row) + column
                if not 0 <= index < len(row):
                    raise DataError(
                        self.path, start_line,
                        f"missing column: `{name}_column={column}` needs at least "
                        f"{max(column + 1, -column)} fields, the row has {len(row)} "
                        f"(the first row has {width}). Check the delimiter and the row.",
                    )
                values[name] = row[index]
            if len(row) != width:
                raise DataError(self.path, start_line, self._width_message(row, width))
            self._check_label(values["label"], start_line)
            report.add("examples")
            yield ClassificationExample(values["text"], values["text_pair"], values["label"],
                                        start_line)

    def _width_message(self, row, width):
        first = "the header" if self.header else "the first row"
        message = f"the row has {len(row)} fields, {first} has {width}."
        if self.file_format == "tsv":
            return message + (" A tab inside a text splits it into two fields: replace tabs in "
                              "texts by spaces (TSV has no quoting).")
        return message + ' Quote fields that contain commas ("a, b").'

    def _check_label(self, label, line):
        if label is None:
            return
        visible = label.strip("".join(c for c in label if is_invisible(c)))
        if not visible:
            shown = f"label {label!r} ({character_names(label)}) has no visible character" \
                if label else "empty label"
            raise DataError(
                self.path, line,
                f"{shown} (`label_column={self.label_column!r}`): every example needs a "
                "label. Fill it in or remove the row.",
            )
        if label != visible:
            raise DataError(
                self.path, line,
                f"label {label!r} has leading or trailing whitespace or invisible characters "
                f"({character_names(label.replace(visible, ''))}), which would make it a "
                f"class of its own; write it as {visible!r}.",
            )

    def _check_examples(self):
        if self.report["examples"] == 0:
            raise DataError(self.path, 1, "the file holds no example (only a header or blank "
                            "lines). Point the reader at a file with data.")

    def _columns(self):
        return {"text": self.text_column, "text_pair": self.text_pair_column,
                "label": self.label_column}

    def _indices_from_header(self, header_row, line):
        indices = {}
        for name, column in self._columns().items():
            if isinstance(column, str):
                if column not in header_row:
                    raise DataError(
                        self.path, line,
                        f"missing column: the header has no column {column!r} for "
                        f"`{name}_column`; its columns are {header_row}. Pass one of them "
                        "or a column index.",
                    )
                indices[name] = header_row.index(column)
            else:
                indices[name] = column
        return indices

    def _read_jsonl(self):
        report = self.report
        for line_number, line in read_lines(self.path):
            if not line.strip():
                report.add("blank_lines_skipped")
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(self.path, line_number,
                                f"invalid JSON ({error.msg} at column {error.colno}).") from None
            if not isinstance(record, dict):
                raise DataError(self.path, line_number,
                                f"expected a JSON object, got {type(record).__name__}.")
            values = {}
            for name, key in self._columns().items():
                if key is None:
                    values[name] = None
                    continue
                if key not in record:
                    raise DataError(
                        self.path, line_number,
                        f"missing column: no key {key!r} (`{name}_column`); the keys are "
                        f"{sorted(record)}.",
                    )
                value = record[key]
                if name == "label" and isinstance(value, (bool, int)):
                    value = str(value).lower() if isinstance(value, bool) else str(value)
                if not isinstance(value, str):
                    raise DataError(
                        self.path, line_number,
                        f"key {key!r} holds a {type(value).__name__}, expected a string.",
                    )
                values[name] = value
            self._check_label(values["label"], line_number)
            report.add("examples")
            yield ClassificationExample(values["text"], values["text_pair"], values["label"],
                                        line_number)
        self._check_examples()

    def labels(self):
        """Yields the label of each example (one streaming pass)."""
        if self.label_column is None:
            raise ValueError("This reader has no label column (`label_column=None`).")
        for example in self:
            yield example.label

    def build_label_vocabulary(self):
        """A `LabelVocabulary` of the labels in this file (one streaming pass); checks the
        first row with `check_inferred_header`."""
        if self.label_column is None:
            raise ValueError("This reader has no label column (`label_column=None`).")
        counts = self.check_inferred_header(self)
        return LabelVocabulary.build(counts)

    def check_inferred_header(self, examples):
        """The label counts of `examples` (this file's); raises `DataError` when the columns
        are chosen by index with `header="infer"` (the first row is read as data) and the first
        row's label occurs nowhere else: it is most likely a header row."""
        counts = collections.Counter()
        first = None
        for example in examples:
            first = first or example
            counts[example.label] += 1
        if self.header_inferred and self.label_column is not None and len(counts) > 1 and \
                counts[first.label] == 1:
            raise DataError(
                self.path, first.line,
                f"the label {first.label!r} of the first row occurs nowhere else: is the first "
                f"row a header? Columns are chosen by index, so `header: infer` reads it as an "
                "example. Set `header: true` to skip it, or `header: false` to keep it.")
        return counts

    def encoded(self, label_vocabulary=None):
        """Yields examples as dicts `{"text", ["text_pair"], ["label"]}` with label ids.

        An unknown label raises `DataError` naming this file, the line and the label.
        """
        if self.label_column is not None and label_vocabulary is None:
            raise ValueError(
                "This reader has labels: pass the `label_vocabulary` built from the training "
                "data (`ClassificationReader(train_path).build_label_vocabulary()`)."
            )
        for example in self:
            features = {"text": example.text}
            if self.text_pair_column is not None:
                features["text_pair"] = example.text_pair
            if self.label_column is not None:
                features["label"] = label_vocabulary.id(example.label, self.path, example.line)
            yield features

    def output_signature(self):
        signature = {"text": tf.TensorSpec((), tf.string)}
        if self.text_pair_column is not None:
            signature["text_pair"] = tf.TensorSpec((), tf.string)
        if self.label_column is not None:
            signature["label"] = tf.TensorSpec((), tf.int32)
        return signature

    def as_dataset(self, label_vocabulary=None):
        """A `tf.data.Dataset` of `{"text": (), ["text_pair": ()], ["label": () int32]}`.

        Streams the file through `encoded`. A `DataError` raised while the dataset is iterated
        surfaces as `tf.errors.InvalidArgumentError` whose message contains the `DataError`
        message (`file:line: ...`).
        """
        return tf.data.Dataset.from_generator(
            lambda: self.encoded(label_vocabulary), output_signature=self.output_signature()
        )
