"""Crash-safe writes: a result file is written to a temporary file in the same directory and
renamed into place, so a reader sees the old file or the whole new one, never a part.

A process killed while writing (SIGKILL, out of memory, a preempted machine) leaves at most
a temporary `.tmp-<pid>-<name>` beside the result, which readers never open (no keras-attn
reader lists hidden files) and `remove_stale_temporaries` deletes on the next run. The
rename is atomic on POSIX file systems (`os.replace`); the data is flushed to disk
(`fsync`) before it, so a power loss cannot leave a renamed but empty file either.

Every stage writes its results through this module: the run directory (model, weights,
metrics, config, lineage, tokenizer, vocabulary, labels), the export directory (every
artifact, the model card, vocab/labels, golden vectors, reports) and the demo's summary.
Step checkpoints (`keras_attn.training.step_checkpoints`) are whole directories renamed the
same way.

Example:
>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.json"
>>> write_text(path, '{"accuracy": 0.9}\\n')
>>> with atomic_path(path) as temporary:
...     _ = temporary.write_text("{", encoding="utf-8")   # a writer that fails half-way
...     raise RuntimeError("killed")
Traceback (most recent call last):
...
RuntimeError: killed
>>> path.read_text(encoding="utf-8"), sorted(p.name for p in path.parent.iterdir())
('{"accuracy": 0.9}\\n', ['metrics.json'])
"""

import contextlib
import os
import pathlib
import shutil

TEMPORARY_PREFIX = ".tmp-"


def temporary_path(path):
    """The temporary name of `path` for this process: `.tmp-<pid>-<name>` in the same
    directory (it keeps the name's suffix, which Keras and the converters check)."""
    path = pathlib.Path(path)
    return path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-{path.name}")


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path beside `path` (file or directory) for a writer; when the block
    ends without an error, the written file (or directory) replaces `path`; otherwise it is
    removed and `path` is left as it was.

    Args:
        path: str or path-like, the result's final path.

    Yields:
        `pathlib.Path`, where to write.
    """
    path = pathlib.Path(path)
    temporary = temporary_path(path)
    remove(temporary)
    try:
        yield temporary
        if not temporary.exists():
            raise FileNotFoundError(f"{temporary}: the writer of {path} wrote nothing")
        _sync(temporary)
        _replace(temporary, path)
    finally:
        remove(temporary)


def write_text(path, text):
    """Writes `text` (UTF-8) to `path` crash-safely."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path, data):
    """Writes `data` to `path` crash-safely."""
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)


def copy_file(source, destination):
    """Copies `source` to `destination` crash-safely."""
    with atomic_path(destination) as temporary:
        shutil.copyfile(source, temporary)


def remove_stale_temporaries(directory):
    """Deletes the `.tmp-<pid>-*` files and directories in `directory` (not below it) left by
    processes that no longer run; returns their names.

    Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / ".tmp-999999999-model.keras").write_bytes(b"PK")
    >>> remove_stale_temporaries(folder), list(folder.iterdir())
    (['.tmp-999999999-model.keras'], [])
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in sorted(directory.glob(f"{TEMPORARY_PREFIX}*")):
        pid = path.name[len(TEMPORARY_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not process_running(int(pid)):
            remove(path)
            removed.append(path.name)
    return removed


def process_running(pid):
    """Whether process `pid` of this host is alive (another user's counts as alive)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _sync(path):
    """Flushes a file, or every file of a directory, to disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        with open(file, "rb+") as handle:
            os.fsync(handle.fileno())


def _replace(temporary, path):
    """Renames `temporary` to `path`; a directory in the way is moved aside first and removed
    after (the one moment without `path` is between two renames)."""
    if temporary.is_dir() and path.exists():
        old = path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-old-{path.name}")
        remove(old)
        os.replace(path, old)
        os.replace(temporary, path)
        remove(old)
    else:
        os.replace(temporary, path)
    _sync_directory(path.parent)


def _sync_directory(directory):
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # file systems that cannot sync a directory
    finally:
        os.close(descriptor)


def remove(path):
    """Removes the file, link or directory tree at `path` (a `pathlib.Path`), if any."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
