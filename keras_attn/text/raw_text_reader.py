"""Streaming reader of raw pretraining text: one sentence per line, blank lines between
documents."""

import collections
import pathlib

import tensorflow as tf

from keras_attn.text.errors import DataError
from keras_attn.text.text_lines import ReadReport
from keras_attn.text.text_lines import read_lines

Document = collections.namedtuple("Document", ["sentences", "line"])
Document.__doc__ = """One document: its `sentences` (list of str) and the 1-based `line` of the
first one."""


class RawTextReader:
    """Reads documents from a BERT-style pretraining corpus, lazily.

    Format (as in BERT's `create_pretraining_data.py`): one sentence per line, a blank line
    between documents. Leading and trailing whitespace of a line is removed. Runs of several blank
    lines separate documents like one blank line; the extra ones are counted in
    `report["extra_blank_lines_skipped"]`, next to `documents` and `sentences`.

    Args:
        path: str or path-like. The UTF-8 text file.

    Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "corpus.txt"
    >>> _ = path.write_text("A cat sat.\\nIt purred.\\n\\nRain fell.\\n")
    >>> [document.sentences for document in RawTextReader(path)]
    [['A cat sat.', 'It purred.'], ['Rain fell.']]
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.report = ReadReport(self.path)

    def __iter__(self):
        self.report = ReadReport(self.path)
        return self._read()

    def _read(self):
        report = self.report
        sentences = []
        first_line = None
        for line_number, line in read_lines(self.path):
            line = line.strip()
            if not line:
                if sentences:
                    report.add("documents")
                    yield Document(sentences, first_line)
                    sentences = []
                else:
                    report.add("extra_blank_lines_skipped")
                continue
            if not sentences:
                first_line = line_number
            sentences.append(line)
            report.add("sentences")
        if sentences:
            report.add("documents")
            yield Document(sentences, first_line)
        if report["documents"] == 0:
            raise DataError(self.path, 1, "the file holds no text (only blank lines).")

    def sentences(self):
        """Yields every sentence, in order (one streaming pass)."""
        for document in self:
            yield from document.sentences

    def as_dataset(self):
        """A `tf.data.Dataset` of sentences (scalar strings), for tokenizer training or MLM
        without next-sentence pairs."""
        return tf.data.Dataset.from_generator(
            self.sentences, output_signature=tf.TensorSpec((), tf.string)
        )
