"""Parallel text as machine-translation corpora keep it: two aligned UTF-8 line files, one
sentence per line, line `n` of the source translated by line `n` of the target."""

import collections
import itertools

from keras_attn.text.errors import DataError
from keras_attn.text.text_lines import read_lines

Pair = collections.namedtuple("Pair", ["source", "target", "line"])


def read_parallel_files(source_path, target_path):
    """`(pairs, blank_lines)`: a `Pair(source, target, line)` for every line of two
    aligned files, and the numbers of the lines blank on both sides (skipped; the
    caller reports them).

    Every problem is a `DataError` naming `file:line`: files of different line counts
    (at the first line the shorter file lacks), a line blank on one side only,
    undecodable UTF-8 (`read_lines`), an empty file. Text is stripped of surrounding
    whitespace and otherwise kept as it is (cased, untokenized).

    Args:
        source_path, target_path: str or path-like, the two files.

    Returns:
        `(pairs, blank_lines)`: list of `Pair`, list of int.

    Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.de").write_text("Ein Hund.\\nZwei Katzen.\\n", encoding="utf-8")
    >>> _ = (folder / "a.en").write_text("A dog.\\n", encoding="utf-8")
    >>> read_parallel_files(folder / "a.de", folder / "a.en")
    Traceback (most recent call last):
    ...
    keras_attn.text.errors.DataError: ...a.de:2: this line has no counterpart: ...a.en ends ...
    """
    pairs, blank_lines = [], []
    lines = itertools.zip_longest(read_lines(source_path), read_lines(target_path))
    for source_line, target_line in lines:
        if source_line is None or target_line is None:
            longer, shorter = ((source_path, target_path) if target_line is None
                               else (target_path, source_path))
            number = (source_line or target_line)[0]
            raise DataError(longer, number, f"this line has no counterpart: {shorter} ends at "
                                            f"line {number - 1}; aligned files need the same "
                                            "number of lines (one sentence per line).")
        number, source = source_line[0], source_line[1].strip()
        target = target_line[1].strip()
        if not source and not target:
            blank_lines.append(number)
            continue
        if not source or not target:
            empty, other = ((source_path, target_path) if not source
                            else (target_path, source_path))
            raise DataError(empty, number, f"empty line, but line {number} of {other} is "
                                           "not: a sentence without its translation. Fill it "
                                           "in or remove the line from both files.")
        pairs.append(Pair(source, target, number))
    if not pairs:
        raise DataError(source_path, 1, f"no sentence pairs in {source_path} and {target_path}.")
    return pairs, blank_lines
