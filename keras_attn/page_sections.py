"""Generated sections of a hand-written Markdown page (the result pages under `docs/`).

A script that measures something owns one section of a page, between two HTML comments that
Markdown does not render:

    <!-- results:training:begin -->
    ...written by training/run_results.py...
    <!-- results:training:end -->

`replace_section` rewrites only what lies between the two markers of its name and leaves
everything else on the page (hand-written notes, other scripts' sections) byte for byte as
it was. The result scripts (`training/run_results.py`, `training/run_xlnet_results.py`,
`training/run_char_results.py`, `export/run_export_results.py`) all write through it.
"""

import pathlib

from keras_attn import atomic_files


def section_markers(name):
    """`(begin, end)`: the two marker lines of section `name`.

    Example:
    >>> section_markers("results:training")
    ('<!-- results:training:begin -->', '<!-- results:training:end -->')
    """
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_section(path, name, body):
    """Writes `body` between the markers of section `name` in the page at `path`.

    Args:
        path: str or path of the Markdown page. A page that does not exist yet is created
            holding only the section.
        name: the section's name, e.g. `"results:training"` (see `section_markers`).
        body: the section's new Markdown text (without the markers).

    Returns:
        The page's new text.

    Raises:
        ValueError: the page exists but lacks either marker, has one twice, or has the end
            marker before the begin marker: the message says which lines to add or remove.

    Example:
    >>> import pathlib, tempfile
    >>> page = pathlib.Path(tempfile.mkdtemp()) / "results.md"
    >>> _ = page.write_text("# Results\\n<!-- a:begin -->\\nold\\n<!-- a:end -->\\nNotes.\\n")
    >>> print(replace_section(page, "a", "new table"), end="")
    # Results
    <!-- a:begin -->
    new table
    <!-- a:end -->
    Notes.
    """
    path = pathlib.Path(path)
    begin, end = section_markers(name)
    block = f"{begin}\n{body.strip(chr(10))}\n{end}"
    if not path.exists():
        text = block + "\n"
    else:
        old = path.read_text(encoding="utf-8")
        start, stop = _marker_offsets(old, path, begin, end)
        text = old[:start] + block + old[stop:]
    atomic_files.write_text(path, text)
    return text


def read_section(path, name):
    """The text between the markers of section `name` in the page at `path` (without the
    markers); `""` when the page does not exist yet. Raises ValueError as `replace_section`.

    Example:
    >>> import pathlib, tempfile
    >>> page = pathlib.Path(tempfile.mkdtemp()) / "results.md"
    >>> _ = page.write_text("Notes.\\n<!-- a:begin -->\\n| row |\\n<!-- a:end -->\\n")
    >>> read_section(page, "a")
    '| row |'
    """
    path = pathlib.Path(path)
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    begin, end = section_markers(name)
    start, stop = _marker_offsets(text, path, begin, end)
    return text[start + len(begin): stop - len(end)].strip("\n")


def _marker_offsets(text, path, begin, end):
    """`(start of begin marker, end of end marker)` in `text`, or a ValueError saying how
    to fix the page."""
    counts = {marker: text.count(marker) for marker in (begin, end)}
    if counts != {begin: 1, end: 1}:
        missing = [m for m, count in counts.items() if count == 0]
        repeated = [m for m, count in counts.items() if count > 1]
        how = (f"add the line(s) {' and '.join(missing)} where the section belongs"
               if missing else f"keep one of each of {' and '.join(repeated)}")
        raise ValueError(f"{path}: the generated section needs exactly one {begin} and one "
                         f"{end}; {how}. Received: {counts}")
    start, stop = text.index(begin), text.index(end)
    if stop < start:
        raise ValueError(f"{path}:{text[:stop].count(chr(10)) + 1}: {end} comes before "
                         f"{begin}; swap them.")
    return start, stop + len(end)
