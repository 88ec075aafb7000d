"""The process the TFLite converter runs in: one child Python process, kept and reused.

The converter leaks memory when it runs many times in one process, and a crash inside it must
not take the caller down, so every conversion runs in a child process. Starting one costs
several seconds (importing TensorFlow: about 7 s of a 2-core machine's 8 s per conversion
of a tiny model), which an export paid six times; the child is now kept for the next job
and started again after `JOBS_PER_PROCESS` jobs, when it dies, or after a timeout.

A job is a module-level function of a `keras_attn` module and JSON arguments; the child
runs it with its standard output and error in a log file of the job's own, clears Keras'
session first (layer names, and so the files' tensor names, do not depend on earlier jobs)
and dies with its parent (Linux: `PR_SET_PDEATHSIG`), so a killed export leaves no
converter writing behind it. The child imports only what its jobs import (Keras, for the
conversions, with the first of them).

Example:
>>> run_job("time:sleep", [0]).ok
True
"""

import atexit
import ctypes
import dataclasses
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

JOBS_PER_PROCESS = 16  # conversions in one child before a fresh one (the converter leaks)
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class JobResult:
    """How a job ended: `ok`, the job's own output (`log`), and for a failure `detail` (the
    Python traceback, or how the child died)."""

    ok: bool
    log: str
    detail: str = ""

    def failure(self, lines=30):
        """A failed job for an error message: how it ended (the exception's line of the
        traceback, or how the child died), then the converter's error lines (MLIR dumps are
        long; the last `lines`), else the end of its output."""
        ended = self.detail.strip().splitlines()
        output = (self.log + self.detail).strip().splitlines()
        errors = [line[:2000] for line in output if "error:" in line or "Error" in line]
        return (f"({ended[-1][:500] if ended else 'no detail'}):\n"
                + "\n".join((errors or output)[-lines:]))


class _Child:
    """One child process and the jobs it has run."""

    def __init__(self):
        # Started as a script, not with `-m`: importing the package would import Keras and
        # TensorFlow before the first job asks for them. `-P` keeps this file's directory
        # off the path; the child finds modules where its parent does.
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
            os.path.abspath(path or os.curdir) for path in sys.path))
        self.process = subprocess.Popen(
            [sys.executable, "-P", os.path.abspath(__file__)], env=environment,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.jobs = 0

    def alive(self):
        return self.process.poll() is None

    def stop(self):
        if self.alive():
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


_STATE = {"child": None}
_LOCK = threading.Lock()


def run_job(target, args, timeout=None):
    """Runs `target(*args)` in the converter process and says how it ended.

    Args:
        target: `"module:function"`, a function of an importable module.
        args: list of JSON values, the function's arguments.
        timeout: seconds the job may take, or `None` (no limit); past it the child is
            killed and the result says so.

    Returns:
        A `JobResult`.
    """
    with _LOCK, tempfile.NamedTemporaryFile("r", suffix=".log", prefix="keras_attn_job_") as log:
        child = _STATE["child"]
        if child is None or not child.alive() or child.jobs >= JOBS_PER_PROCESS:
            if child is not None:
                child.stop()
            child = _STATE["child"] = _Child()
        child.jobs += 1
        child.process.stdin.write(json.dumps({"target": target, "args": list(args),
                                              "log": log.name}) + "\n")
        child.process.stdin.flush()
        ready, _, _ = select.select([child.process.stdout], [], [], timeout)
        answer = child.process.stdout.readline() if ready else ""
        if not answer:
            detail = (f"the converter process timed out after {timeout} s" if not ready else
                      f"the converter process died (exit code {child.process.wait()})")
            child.stop()
            _STATE["child"] = None
            return JobResult(False, log.read(), detail)
        answer = json.loads(answer)
        return JobResult(answer["ok"], log.read(), answer.get("detail", ""))


@atexit.register
def _stop_child():
    if _STATE["child"] is not None:
        _STATE["child"].stop()
        _STATE["child"] = None


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux: the child ends when its stdin closes
        pass


def _serve():
    """The child's loop: one JSON job per line of stdin, one JSON answer per line out."""
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    for line in sys.stdin:
        job = json.loads(line)
        with open(job["log"], "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                if "keras" in sys.modules:  # a job before used Keras: names start afresh
                    sys.modules["keras"].backend.clear_session()
                module, function = job["target"].split(":")
                getattr(importlib.import_module(module), function)(*job["args"])
                answer = {"ok": True}
            except BaseException:  # noqa: B036 - reported to the parent, the loop goes on
                answer = {"ok": False, "detail": traceback.format_exc()}
            sys.stdout.flush()
            sys.stderr.flush()
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    _serve()
