"""Line-by-line reading of UTF-8 text files with line numbers (the readers' common source)."""

import pathlib

from keras_attn.text.errors import DataError


def read_lines(path):
    """Yields `(line_number, line)` for each line of a UTF-8 file, lazily.

    The file is read one line at a time, so files larger than memory work. Each line is decoded on
    its own, so invalid UTF-8 is reported with its line number; the line ending (`\\n` or
    `\\r\\n`) is removed, and a UTF-8 byte-order mark at the start of the file is dropped.

    Args:
        path: str or path-like. The file to read.

    Yields:
        `(line_number, line)`: 1-based line number and the decoded line without its ending.

    Raises:
        FileNotFoundError: the file does not exist.
        IsADirectoryError: the path is a directory.
        DataError: the file is empty (reported at line 1) or a line is not valid UTF-8.

    Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_text("first\\nsecond\\n", encoding="utf-8")
    >>> list(read_lines(path))
    [(1, 'first'), (2, 'second')]
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; give a UTF-8 text file.")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (relative paths start at the current "
                                f"directory, {pathlib.Path.cwd()}).")
    with open(path, "rb") as file:
        empty = yield from decode_lines(path, file)
    if empty:
        raise DataError(path, 1, "the file is empty. Point the reader at a file with data.")


def decode_lines(source, raw_lines):
    """Yields `(line_number, line)` of UTF-8 byte lines (a binary file, `sys.stdin.buffer`)
    as `read_lines` does: a leading byte-order mark dropped, line endings removed, invalid
    UTF-8 a `DataError` naming `source` and the line. Returns whether there was no line."""
    line_number = 0
    for raw in raw_lines:
        line_number += 1
        if isinstance(raw, str):  # already text (a text stream without a byte buffer)
            raw = raw.encode("utf-8", "surrogateescape")
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                source, line_number,
                f"invalid UTF-8 at byte {error.start} of the line "
                f"({raw[error.start:error.start + 4]!r}). Re-encode the file as UTF-8, e.g. "
                "`iconv -f latin1 -t utf-8`.",
            ) from None
        yield line_number, line.rstrip("\r\n")
    return line_number == 0


class ReadReport:
    """What one pass of a reader saw: named counts (examples, skipped lines, ...) for one file.

    Readers never drop input silently: every line they skip is counted here, under a name that
    says why (`"docstart_lines_skipped"`, `"blank_lines_skipped"`, ...). A reader's `report`
    describes its latest pass (it is reset when a new pass starts, and grows while the pass is
    being consumed).

    Example:
    >>> report = ReadReport("train.txt")
    >>> report.add("sentences", 2)
    >>> report.add("docstart_lines_skipped")
    >>> report["sentences"], report["tokens"]
    (2, 0)
    >>> str(report)
    'train.txt: sentences=2, docstart_lines_skipped=1'
    """

    def __init__(self, path):
        self.path = str(path)
        self.counts = {}

    def add(self, name, amount=1):
        self.counts[name] = self.counts.get(name, 0) + amount

    def __getitem__(self, name):
        return self.counts.get(name, 0)

    def as_dict(self):
        return dict(self.counts)

    def __str__(self):
        counts = ", ".join(f"{name}={value}" for name, value in self.counts.items())
        return f"{self.path}: {counts}"

    def __repr__(self):
        return f"ReadReport({self.path!r}, {self.counts!r})"
