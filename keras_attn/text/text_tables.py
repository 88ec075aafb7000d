"""BERT's normalizer and pre-tokenizer as per-code-point tables (`bert_text_tables.txt`).

The tables are the answers of the reference, HF `tokenizers`' `BertNormalizer` and
`BertPreTokenizer` (the tokenizer BERT and MiniLM were pretrained with), for every code point,
written by `tools/make_text_tables.py` (its docstring has the file format) and shared by the
Python tokenizer, the Kotlin core and the JS core (the web core imports this file, the Android
core's build copies it onto its class path). Looking characters up instead of calling a
Unicode library makes every port answer as the reference does, whatever Unicode version its
platform knows.

BERT's normalization works on each character alone: control and private-use characters (and
U+0000, U+FFFD) are removed, whitespace becomes a space; uncased models also NFD-decompose,
drop nonspacing marks (`Mn`) and lower-case. Pre-tokenization then splits the normalized text
at spaces and around each punctuation character and CJK ideograph (`tokenizer_classes`).
"""

import functools
import pathlib

import numpy as np

TABLES_FILE = pathlib.Path(__file__).resolve().parent / "bert_text_tables.txt"

# Classes of normalized characters (`tokenizer_classes`).
WORD = 0
WHITESPACE = 1
SINGLE = 2
_CLASS_LETTERS = {"W": WORD, "S": WHITESPACE, "P": SINGLE}

HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3


@functools.lru_cache(maxsize=1)
def _sections():
    """`{name: [line, ...]}` of the tables file, checked against each header's line count."""
    sections, name, expected = {}, None, 0
    for number, line in enumerate(TABLES_FILE.read_text("ascii").splitlines(), 1):
        if line.startswith("#"):
            continue
        if line.startswith("table ") or line == "end":
            if name is not None and len(sections[name]) != expected:
                raise ValueError(f"{TABLES_FILE}:{number}: table {name} is truncated "
                                 f"({len(sections[name])} of {expected} lines)")
            if line == "end":
                return sections
            _, name, count = line.split()
            sections[name], expected = [], int(count)
        else:
            sections[name].append(line)
    raise ValueError(f"{TABLES_FILE}: no `end` line (truncated file?)")


def _hangul_nfd(code):
    index = code - HANGUL_FIRST
    lead, vowel, trail = 0x1100 + index // 588, 0x1161 + (index % 588) // 28, index % 28
    return (lead, vowel) + ((0x11A7 + trail,) if trail else ())


@functools.lru_cache(maxsize=None)
def _changes(section):
    """`{code point: tuple of output code points}` for the changed code points of a section."""
    changes = {}
    for line in _sections()[section]:
        kind, *fields = line.split()
        if kind == "H":
            first, last = int(fields[0], 16), int(fields[1], 16)
            changes.update({c: _hangul_nfd(c) for c in range(first, last + 1)})
        elif kind == "M":
            changes[int(fields[0], 16)] = tuple(int(f, 16) for f in fields[1:])
        else:
            start, count, step = int(fields[0], 16), int(fields[1]), int(fields[2])
            for code in range(start, start + count * step, step):
                if kind == "R":
                    changes[code] = (code + int(fields[3]),)
                elif kind == "T":
                    changes[code] = (int(fields[3], 16),)
                else:  # "E": removed
                    changes[code] = ()
    return changes


@functools.lru_cache(maxsize=4)
def normalization_changes(lowercase, strip_accents):
    """BERT's normalization of each changed code point, for one mode.

    Args:
        lowercase: bool. Lower-case (BERT uncased).
        strip_accents: bool. NFD-decompose and drop nonspacing marks.

    Returns:
        dict of code point to the tuple of code points it becomes (empty: removed); code
        points not in it stay as they are.

    Example:
    >>> changes = normalization_changes(True, True)
    >>> [changes.get(ord(c), (ord(c),)) for c in "Aé\\u200b…"]
    [(97,), (101,), (), (8230,)]
    """
    if lowercase and strip_accents:
        return _changes("normalize_uncased")
    cased = _changes("normalize_cased")
    if not lowercase and not strip_accents:
        return cased
    step = _changes("normalize_lowercase" if lowercase else "normalize_strip_accents")
    changed = set(cased) | set(step)
    changes = {}
    for code in changed:
        out = tuple(x for y in cased.get(code, (code,)) for x in step.get(y, (y,)))
        if out != (code,):
            changes[code] = out
    return changes


@functools.lru_cache(maxsize=4)
def normalization_arrays(lowercase, strip_accents):
    """`normalization_changes` as arrays for a lookup in TensorFlow.

    Returns:
        `(keys, row_splits, values)`: int32 numpy arrays; the changed code points sorted, and
        code point `keys[i]` becomes `values[row_splits[i]:row_splits[i + 1]]`.
    """
    changes = normalization_changes(lowercase, strip_accents)
    keys = np.array(sorted(changes), dtype=np.int32)
    lengths = np.array([len(changes[k]) for k in keys.tolist()], dtype=np.int32)
    row_splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.array([x for k in keys.tolist() for x in changes[k]], dtype=np.int32)
    return keys, row_splits, values


@functools.lru_cache(maxsize=1)
def piece_class_runs():
    """Pre-tokenization classes of normalized characters, run-length encoded.

    Returns:
        `(starts, classes)`: int32 numpy arrays; code points `starts[i]` up to
        `starts[i + 1] - 1` have class `classes[i]` (`WORD`, `WHITESPACE` or `SINGLE`).
    """
    starts, classes = [], []
    for line in _sections()["tokenizer_classes"]:
        _, start, letter = line.split()
        starts.append(int(start, 16))
        classes.append(_CLASS_LETTERS[letter])
    return np.array(starts, dtype=np.int32), np.array(classes, dtype=np.int32)


def piece_class(code):
    """The pre-tokenization class of one normalized code point (`WORD`, `WHITESPACE`, `SINGLE`).

    Example:
    >>> [piece_class(ord(c)) for c in "a ,中…"] == [WORD, WHITESPACE, SINGLE, SINGLE, SINGLE]
    True
    """
    starts, classes = piece_class_runs()
    return int(classes[np.searchsorted(starts, code, side="right") - 1])
