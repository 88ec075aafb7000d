"""The error every reader raises for bad input: it names the file and the line."""

import unicodedata

from keras_attn.errors import KerasAttnError


class DataError(KerasAttnError, ValueError):
    """Bad input data, located at `path:line`.

    The message reads `"<path>:<line>: <what is wrong>. <how to fix it>"`, the format compilers
    use, so editors and terminals link it to the offending line. `line` is 1-based.

    Args:
        path: str. The file the bad data came from.
        line: int. 1-based line number.
        message: str. What is wrong and how to fix it.

    Example:
    >>> error = DataError("train.tsv", 12, "unknown label 'maybe'")
    >>> str(error)
    "train.tsv:12: unknown label 'maybe'"
    >>> (error.path, error.line)
    ('train.tsv', 12)
    """

    def __init__(self, path, line, message):
        self.path = str(path)
        self.line = int(line)
        self.message = message
        super().__init__(f"{self.path}:{self.line}: {message}")

    def __reduce__(self):
        return (type(self), (self.path, self.line, self.message))


def character_names(text, most=4):
    """The code points and Unicode names of `text`'s first `most` distinct characters, for
    messages about text that looks empty (`"U+00A0 NO-BREAK SPACE"`).

    Example:
    >>> character_names("\u00a0\u200b\u00a0")
    'U+00A0 NO-BREAK SPACE, U+200B ZERO WIDTH SPACE'
    """
    distinct = list(dict.fromkeys(text))
    names = [f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}" for c in distinct[:most]]
    return ", ".join(names) + (", ..." if len(distinct) > most else "") if names else "empty"


def is_invisible(character):
    """Whether `character` prints nothing: whitespace, a control or a format character
    (U+200B ZERO WIDTH SPACE, U+FEFF, soft hyphen...)."""
    return character.isspace() or unicodedata.category(character) in ("Cc", "Cf", "Zs",
                                                                     "Zl", "Zp")
