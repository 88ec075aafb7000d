"""Streaming reader of CoNLL-format named-entity data (one token per line, IOB tags)."""

import collections
import pathlib
import re

import tensorflow as tf

from keras_attn.layers.validation import check_int
from keras_attn.text.errors import DataError
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.text.ner import IOB_TAG
from keras_attn.text.text_lines import ReadReport
from keras_attn.text.text_lines import read_lines

# Columns are split on ASCII whitespace only: `str.split()` also splits on U+00A0, U+0085,
# U+2028..., which occur inside tokens (and would drop the token's second half).
_ASCII_WHITESPACE = re.compile("[ \t\n\r\x0b\x0c]+")
TaggedSentence = collections.namedtuple("TaggedSentence", ["tokens", "tags", "line"])
TaggedSentence.__doc__ = """One sentence: `tokens` and IOB2 `tags` (lists of str; `tags` is
`None` for untagged input) and the 1-based `line` of its first token."""



def iob1_to_iob2(tags):
    """Converts IOB1 tags to IOB2 (every entity starts with `B-`).

    In IOB1 an entity starts with `I-X` and `B-X` only separates two adjacent entities of the same
    type, so an `I-X` that does not continue an `X` entity (after `O`, at the start, or after
    another type) becomes `B-X`. The same rule turns an invalid IOB2 sequence into a valid one
    (see `keras_attn.text.ner.repair_iob2`).

    Example:
    >>> iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"])
    ['B-PER', 'I-PER', 'O', 'B-LOC', 'B-LOC', 'B-ORG']
    """
    result = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            tag = "B-" + tag[2:]
        result.append(tag)
        previous = tag
    return result


class ConllReader:
    """Reads sentences of (token, tag) from a CoNLL-2003 style file, lazily.

    Format: one token per line, columns separated by ASCII whitespace (spaces, tabs; a
    no-break space U+00A0 or U+0085 is part of a token), the token first and the tag in the
    last column (or `tag_column`); a blank line ends a sentence. `-DOCSTART-` lines (document
    boundaries) are skipped. Tags are `O`, `B-TYPE` or `I-TYPE`; with `scheme="iob1"` they are
    converted to IOB2, with `scheme="iob2"` they must already be valid IOB2 (an `I-X` that does
    not continue an `X` entity is an error that suggests `scheme="iob1"`).

    Nothing is skipped silently: each pass fills `reader.report` with `sentences`, `tokens`,
    `docstart_lines_skipped` and `empty_sentences_skipped` (blank lines that end no sentence,
    e.g. the one after `-DOCSTART-`).

    Args:
        path: str or path-like. The file (UTF-8).
        tag_column: int or `None`. Column of the tag (negative counts from the end); `None` reads
            untagged text (tokens only). Defaults to `-1`.
        scheme: `"iob2"` (BIO) or `"iob1"`. The tagging scheme of the file; the reader always
            yields IOB2.

    Raises (while reading, as `DataError` naming `file:line`): a malformed tag (`B_PER`), a line
    without the tag column, an invalid IOB2 sequence with `scheme="iob2"`, invalid UTF-8, an
    empty file or one with no sentence; with a label vocabulary, an unknown tag.

    Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "valid.txt"
    >>> _ = path.write_text("-DOCSTART- O\\n\\nEU B-ORG\\nrejects O\\n\\nPeter B-PER\\n")
    >>> reader = ConllReader(path)
    >>> [(sentence.tokens, sentence.tags) for sentence in reader]
    [(['EU', 'rejects'], ['B-ORG', 'O']), (['Peter'], ['B-PER'])]
    >>> reader.report.as_dict()
    {'docstart_lines_skipped': 1, 'empty_sentences_skipped': 1, 'sentences': 2, 'tokens': 3}
    """

    def __init__(self, path, tag_column=-1, scheme="iob2"):
        if scheme not in ("iob1", "iob2"):
            raise ValueError(f"`scheme` must be 'iob1' or 'iob2'. Received: scheme={scheme!r}")
        check_int("tag_column", tag_column, meaning="column 0 is the token", optional=True)
        if tag_column == 0:
            raise ValueError(
                "`tag_column` must be a non-zero int (column 0 is the token) or None. "
                f"Received: tag_column={tag_column!r}"
            )
        self.path = pathlib.Path(path)
        self.tag_column = tag_column
        self.scheme = scheme
        self.report = ReadReport(self.path)

    def __iter__(self):
        self.report = ReadReport(self.path)
        return self._read()

    def _read(self):
        report = self.report
        tokens, tags, lines = [], [], []
        for line_number, line in read_lines(self.path):
            fields = _ASCII_WHITESPACE.split(line.strip(" \t\n\r\x0b\x0c"))
            fields = [] if fields == [""] else fields
            if not fields:
                if tokens:
                    yield self._sentence(tokens, tags, lines)
                    tokens, tags, lines = [], [], []
                else:
                    report.add("empty_sentences_skipped")
                continue
            if fields[0] == "-DOCSTART-":
                report.add("docstart_lines_skipped")
                if tokens:
                    yield self._sentence(tokens, tags, lines)
                    tokens, tags, lines = [], [], []
                continue
            tokens.append(fields[0])
            lines.append(line_number)
            if self.tag_column is None:
                continue
            index = self.tag_column if self.tag_column > 0 else len(fields) + self.tag_column
            if not 1 <= index < len(fields):
                raise DataError(
                    self.path, line_number,
                    f"missing column: `tag_column={self.tag_column}` needs a tag after the "
                    f"token, the line has {len(fields)} column(s): {line!r}. Expected "
                    "'<token> ... <tag>' separated by whitespace.",
                )
            tag = fields[index]
            if not IOB_TAG.match(tag):
                raise DataError(
                    self.path, line_number,
                    f"malformed tag {tag!r}: expected 'O', 'B-<TYPE>' or 'I-<TYPE>' "
                    "(IOB1/IOB2, a hyphen after B/I).",
                )
            tags.append(tag)
        if tokens:
            yield self._sentence(tokens, tags, lines)
        if report["sentences"] == 0:
            raise DataError(self.path, 1, "the file holds no sentence (only blank or "
                            "-DOCSTART- lines).")

    def _sentence(self, tokens, tags, lines):
        self.report.add("sentences")
        self.report.add("tokens", len(tokens))
        if self.tag_column is None:
            return TaggedSentence(tokens, None, lines[0])
        if self.scheme == "iob1":
            tags = iob1_to_iob2(tags)
        else:
            previous = "O"
            for tag, line in zip(tags, lines):
                if tag.startswith("I-") and previous[2:] != tag[2:]:
                    raise DataError(
                        self.path, line,
                        f"invalid IOB2: {tag!r} follows {previous!r}, but an entity must start "
                        "with 'B-'. If the file uses IOB1 (entities start with 'I-'), pass "
                        "`scheme='iob1'` to convert it.",
                    )
                previous = tag
        return TaggedSentence(tokens, tags, lines[0])

    def tags(self):
        """Yields the tag list of each sentence (one streaming pass)."""
        if self.tag_column is None:
            raise ValueError("This reader reads untagged text (`tag_column=None`).")
        for sentence in self:
            yield sentence.tags

    def build_label_vocabulary(self):
        """A `LabelVocabulary` of the (IOB2) tags in this file: `"O"` first, then sorted."""
        return LabelVocabulary.build(self.tags())

    def encoded(self, label_vocabulary=None):
        """Yields `{"tokens": [str], ["tags": [int]]}`; an unknown tag raises `DataError` with
        this file, the token's line and the tag."""
        if self.tag_column is not None and label_vocabulary is None:
            raise ValueError(
                "This reader has tags: pass the `label_vocabulary` built from the training data "
                "(`ConllReader(train_path).build_label_vocabulary()`)."
            )
        for sentence in self:
            features = {"tokens": sentence.tokens}
            if self.tag_column is not None:
                features["tags"] = [
                    label_vocabulary.id(tag, self.path, sentence.line + offset)
                    for offset, tag in enumerate(sentence.tags)
                ]
            yield features

    def output_signature(self):
        signature = {"tokens": tf.TensorSpec((None,), tf.string)}
        if self.tag_column is not None:
            signature["tags"] = tf.TensorSpec((None,), tf.int32)
        return signature

    def as_dataset(self, label_vocabulary=None):
        """A `tf.data.Dataset` of `{"tokens": (W,) string, ["tags": (W,) int32]}` per sentence.

        A `DataError` raised while iterating surfaces as `tf.errors.InvalidArgumentError` whose
        message contains it.
        """
        return tf.data.Dataset.from_generator(
            lambda: self.encoded(label_vocabulary), output_signature=self.output_signature()
        )
