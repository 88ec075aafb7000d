"""A directory built once per test session and shared by every pytest-xdist worker.

`pytest -n 2` runs each session fixture once per worker; an expensive tiny run (training and
a full export) built through `cached_directory` is built by the first worker that asks and
read by the others. The session's root is set by the autouse fixture in `conftest.py`
(`set_session_root`); without it (the module used outside pytest) every call builds afresh.
"""

import contextlib
import fcntl
import pathlib
import shutil
import tempfile

_ROOT = {"path": None}
_DONE = ".complete"


def set_session_root(path):
    """Where this session's shared directories go (one path for all workers)."""
    _ROOT["path"] = pathlib.Path(path)
    _ROOT["path"].mkdir(parents=True, exist_ok=True)


def cached_directory(key, build):
    """The directory `build(directory)` fills, built once per session under `key`.

    Args:
        key: str. A name that fixes what `build` makes (its arguments).
        build: callable. Fills the (new, empty) directory it is given.

    Returns:
        pathlib.Path of the filled directory. Callers copy what they change.

    Example:
    >>> path = cached_directory("example", lambda d: (d / "a.txt").write_text("a"))
    >>> (path / "a.txt").read_text()
    'a'
    """
    root = _ROOT["path"]
    if root is None:
        directory = pathlib.Path(tempfile.mkdtemp(prefix=f"{key}_"))
        build(directory)
        return directory
    directory = root / key
    with _locked(root / f"{key}.lock"):
        if not (directory / _DONE).is_file():
            shutil.rmtree(directory, ignore_errors=True)  # a build that failed part-way
            directory.mkdir()
            build(directory)
            (directory / _DONE).touch()
    return directory


@contextlib.contextmanager
def _locked(path):
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def copy_into(source, target):
    """`source`'s files copied into `target` (created), the completion mark left out."""
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(_DONE))
    return pathlib.Path(target)


