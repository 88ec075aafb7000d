"""Tests of `keras_attn.export.tflite.converter_process`: the child process conversions run in."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from keras_attn.export.tflite import converter_process
from keras_attn.export.tflite.converter_process import JobResult
from keras_attn.export.tflite.converter_process import run_job

HERE = "tests.converter_jobs"  # a module the child imports without Keras


@pytest.fixture(autouse=True)
def no_child_yet():
    """Each test starts without a child: one left by an earlier test of this worker (an
    export) may be a job short of its share and be replaced in the middle of a test."""
    converter_process._stop_child()


def pid_of_job(tmp_path):
    path = tmp_path / "pid"
    assert run_job(f"{HERE}:write_pid", [str(path)]).ok
    return int(path.read_text())


def test_jobs_share_one_child_until_it_has_run_its_share(tmp_path, monkeypatch):
    first = pid_of_job(tmp_path)
    assert first != os.getpid()
    assert pid_of_job(tmp_path) == first
    monkeypatch.setattr(converter_process, "JOBS_PER_PROCESS", 1)
    assert pid_of_job(tmp_path) != first


def test_a_failing_job_gives_its_output_and_traceback_and_the_child_goes_on(tmp_path):
    before = pid_of_job(tmp_path)
    result = run_job(f"{HERE}:fail", ["the converter said no"])
    assert not result.ok
    assert result.log.strip() == "some converter output"
    assert result.detail.strip().splitlines()[-1] == "ValueError: the converter said no"
    assert result.failure().startswith("(ValueError: the converter said no):\n")
    assert pid_of_job(tmp_path) == before


def test_a_failure_names_how_it_ended_and_keeps_the_error_lines():
    dump = "\n".join(f"mlir line {i}" for i in range(100))
    result = JobResult(False, f"{dump}\nloc(3): error: 'tfl.gather' op failed\n{dump}",
                       "the converter process died (exit code 6)")
    assert result.failure() == ("(the converter process died (exit code 6)):\n"
                                "loc(3): error: 'tfl.gather' op failed")
    tail = JobResult(False, dump, "").failure(lines=2)
    assert tail == "(no detail):\nmlir line 98\nmlir line 99"


def test_a_dead_or_slow_child_is_reported_and_replaced(tmp_path):
    before = pid_of_job(tmp_path)
    result = run_job(f"{HERE}:die", [3])
    assert not result.ok and result.detail == "the converter process died (exit code 3)"
    after = pid_of_job(tmp_path)
    assert after != before
    result = run_job(f"{HERE}:sleep", [30], timeout=0.5)
    assert not result.ok and result.detail == "the converter process timed out after 0.5 s"
    assert pid_of_job(tmp_path) not in (before, after)


def test_each_job_starts_from_a_clear_keras_session(tmp_path):
    names = []
    for _ in range(2):
        assert run_job(f"{HERE}:write_layer_name", [str(tmp_path / "name")]).ok
        names.append((tmp_path / "name").read_text())
    assert names == ["dense", "dense"]


def running(pid):
    try:
        return "\nState:\tZ" not in pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_the_child_dies_with_its_parent(tmp_path):
    path = tmp_path / "pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "from keras_attn.export.tflite.converter_process import run_job; "
        f"run_job('{HERE}:write_pid_and_sleep', [{str(path)!r}])")])
    try:
        deadline = time.time() + 120
        while not path.is_file() or not path.read_text():
            assert time.time() < deadline and parent.poll() is None
            time.sleep(0.1)
        child = int(path.read_text())
        assert running(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.time() + 10
    while running(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not running(child)
