"""A run or export directory has one writer: `run_lock`, held by every stage that writes one.

`keras-attn train` writes its run directory, `quantize` its QAT run directory and `export`
its export directory; `quantize` and `export` also read a run. Each holds, for as long as it
runs, an exclusive lock on what it writes and a shared lock on what it reads. A second
process that would write a directory another one reads or writes, or read one another
writes, gets a `RunLockedError` naming that process (pid, host, command, since when), which
`keras-attn` prints before exiting with status 2. Readers of finished artifacts (`predict`,
`serve`, `explain`) take no lock.

The lock is `fcntl.flock` on `DIR/.keras-attn.lock`, which the operating system releases when
its process ends, however it ends. Beside it each holder writes what it is in
`DIR/.keras-attn.lock.<host>.<pid>.json`: a process killed with SIGKILL leaves that file
behind, and the next process to hold the directory removes it and logs one warning on the
`keras_attn.runs.run_lock` logger ("took over ..."), which `keras-attn` prints on stderr.
When the last holder lets go, both files are removed (and the directory, if the lock made it
and nothing was written).

One process may hold a directory several times (`keras-attn demo` trains, quantizes and
exports in one process; `quantize` fine-tunes through `train`): the lock is counted per
process and released by the last exit. The lock is as reliable as the file system's `flock`:
local disks and NFSv4 honour it across processes and hosts.

Example:
>>> import pathlib, tempfile
>>> run = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> with run_lock(writes=[run]):
...     with run_lock(reads=[run]):  # the same process: counted, not refused
...         sorted(p.name for p in run.iterdir())[0]
'.keras-attn.lock'
>>> run.exists()  # made by the lock, left empty: removed with it
False
"""

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import pathlib
import shlex
import socket
import sys
import threading
import time

from keras_attn import atomic_files
from keras_attn.atomic_files import process_running
from keras_attn.errors import KerasAttnError

LOCK_FILE = ".keras-attn.lock"  # the holder files are LOCK_FILE + ".<host>.<pid>.json"

logger = logging.getLogger(__name__)

# This process's holds: real path of the directory -> `_Hold`.
_HOLDS = {}
_GUARD = threading.RLock()


class RunLockedError(KerasAttnError, RuntimeError):
    """Another live process writes the directory (or reads one this process would write)."""


@dataclasses.dataclass
class _Hold:
    descriptor: int
    exclusive: bool
    count: int = 1
    made: tuple = ()  # the directories the lock made, deepest first


@contextlib.contextmanager
def run_lock(writes=(), reads=()):
    """Holds `writes` exclusively and `reads` shared for the `with` block (see the module).

    Args:
        writes: paths of the directories the stage writes (made if missing).
        reads: paths of the run directories it reads (a missing one is not held: the
            stage's own check reports it).

    Raises:
        RunLockedError: another process holds one of them (nothing is held then).
    """
    directories = [(path, True) for path in writes] + [(path, False) for path in reads]
    for path, _ in directories:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"run_lock takes directory paths (str or path-like). "
                            f"Received: {path!r}")
    held = []
    try:
        for path, exclusive in directories:
            key = _acquire(path, exclusive)
            if key is not None:
                held.append(key)
        yield
    finally:
        for key in reversed(held):
            _release(key)


def _acquire(path, exclusive):
    """Holds `path`; returns the key `_release` takes, or `None` when nothing is held (a
    directory to read that does not exist or cannot be written to)."""
    made = _make_directory(path) if exclusive else ()
    key = os.path.realpath(path)
    with _GUARD:
        hold = _HOLDS.get(key)
        if hold is not None:
            if exclusive and not hold.exclusive:
                _upgrade(hold, key)
            hold.count += 1
            return key
        if not os.path.isdir(key):
            return None
        try:
            descriptor = _locked_file(key, exclusive)
        except OSError:
            if exclusive:
                raise
            return None  # a run on a read-only disk: no process writes it through us
        except RunLockedError:
            _remove_made(made)
            raise
        _HOLDS[key] = _Hold(descriptor, exclusive, made=made)
        try:
            _take_over(key, exclusive)
            _write_holder(key, exclusive)
        except BaseException:
            _release(key)
            raise
        return key


def _release(key):
    with _GUARD:
        hold = _HOLDS[key]
        hold.count -= 1
        if hold.count:
            return
        del _HOLDS[key]
        _remove(_holder_path(key, socket.gethostname(), os.getpid()))
        try:  # the last holder removes the lock file (an exclusive lock proves it is last)
            fcntl.flock(hold.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _is_lock_file(hold.descriptor, key):
                _remove(pathlib.Path(key, LOCK_FILE))
        except BlockingIOError:
            pass  # other readers hold it
        finally:
            os.close(hold.descriptor)
        _remove_made(hold.made)


def _upgrade(hold, key):
    """A directory this process reads, now also written by it: the shared lock made
    exclusive (refused while another process reads it; the shared lock is kept then)."""
    try:
        _lock(hold.descriptor, key, True)
    except RunLockedError:
        # flock drops the shared lock before trying the exclusive one: take it again.
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(hold.descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        raise
    hold.exclusive = True
    _write_holder(key, True)


def _remove_made(made):
    """Removes the directories a lock made (deepest first) while they are empty."""
    for directory in made:
        try:
            os.rmdir(directory)
        except OSError:
            break


def _make_directory(path):
    """Makes `path` and its missing parents; returns those it made, deepest first."""
    path = pathlib.Path(os.path.abspath(path))
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    return tuple(str(p) for p in missing)


def _locked_file(key, exclusive):
    """A descriptor of `key/LOCK_FILE`, locked. A lock file that its last holder removed
    between our open and our lock is opened again."""
    path = os.path.join(key, LOCK_FILE)
    for _ in range(100):
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _lock(descriptor, key, exclusive)
        except RunLockedError:
            os.close(descriptor)
            raise
        if _is_lock_file(descriptor, key):
            return descriptor
        os.close(descriptor)
    raise OSError(f"{path} was removed and made again 100 times while being locked")


def _lock(descriptor, key, exclusive):
    try:
        fcntl.flock(descriptor, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunLockedError(_refusal(key, exclusive)) from None


def _is_lock_file(descriptor, key):
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(os.path.join(key, LOCK_FILE)))
    except FileNotFoundError:
        return False


# --- who holds a directory ---------------------------------------------------------------

def _holder_path(key, host, pid):
    return pathlib.Path(key, f"{LOCK_FILE}.{host}.{pid}.json")


def _write_holder(key, exclusive):
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command(),
              "since": time.time(), "mode": "writing" if exclusive else "reading"}
    atomic_files.write_text(_holder_path(key, record["host"], record["pid"]),
                            json.dumps(record) + "\n")


def _holders(key):
    """`(path, record)` of every holder file in `key` (unreadable ones skipped: a holder
    being written)."""
    found = []
    for path in sorted(pathlib.Path(key).glob(f"{LOCK_FILE}.*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            found.append((path, {"pid": int(record["pid"]), "host": str(record["host"]),
                                 "command": str(record.get("command", "?")),
                                 "since": float(record.get("since", 0)),
                                 "mode": str(record.get("mode", "writing"))}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return found


def _take_over(key, exclusive):
    """Removes the holder files left by processes that no longer hold `key` (this process
    holds it exclusively, or shared while they were writing, or they ended); logs them."""
    host = socket.gethostname()
    for path, record in _holders(key):
        same_host = record["host"] == host
        stale = exclusive or record["mode"] == "writing" or (
            same_host and (record["pid"] == os.getpid() or not process_running(record["pid"])))
        if stale:
            _remove(path)
            logger.warning(f"{key}: took over the lock of {_described(record)}, which "
                           "ended without releasing it (killed?)")


def _refusal(key, exclusive):
    """The `RunLockedError` message: who holds `key` and what to do."""
    host = socket.gethostname()
    live = [r for _, r in _holders(key) if not (
        r["host"] == host and (r["pid"] == os.getpid() or not process_running(r["pid"])))]
    writing = [r for r in live if r["mode"] == "writing"]
    shown = writing or live
    if shown:
        who = "; ".join(_described(r) for r in shown)
        doing = "writing" if writing else "reading"
    else:
        who, doing = f"a process that has not yet said who it is ({LOCK_FILE} is locked)", "using"
    return (f"{key} is in use: another keras-attn process is {doing} it: {who}. A run or "
            "export directory has one writer and is not read while it is written: wait for "
            "that process to end (or stop it) and run this again, or use another directory. "
            f"Received: {'writes' if exclusive else 'reads'}={key!r}")


def _described(record):
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record["since"]))
    age = max(0, int(time.time() - record["since"]))
    return (f"pid {record['pid']} on host {record['host']} ({record['command']}), "
            f"{record['mode']} since {since} ({age} s ago)")


def _command():
    """This process's command line, as a user would type it (at most 300 characters)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    # `python -m keras_attn.cli` runs the package's `__main__` module: name what was typed.
    module = spec.name.removesuffix(".__main__") if spec is not None and spec.name else None
    program = f"python -m {module}" if module else \
        "python -c" if argv0 == "-c" else os.path.basename(argv0)
    text = " ".join([program, *map(shlex.quote, sys.argv[1:])])
    return text if len(text) <= 300 else text[:297] + "..."


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
