"""A run or export directory has one writer (`keras_attn.runs.run_lock`).

The other process of each test is a real one: `HOLDER` below, a Python process that loads
`run_lock` without `keras_attn/__init__` (so without TensorFlow: it starts in ~0.1 s), holds
a directory and waits, or tries to hold one and exits 2 with the refusal, as `keras-attn`
does. The CLI itself is tested in this process (`cli.main`), and, with two real `keras-attn
train` processes, under the slow mark.
"""

import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from keras_attn import cli
from keras_attn.runs.overwrite_guard import check_export_output
from keras_attn.runs.run_lock import LOCK_FILE
from keras_attn.runs.run_lock import RunLockedError
from keras_attn.runs.run_lock import run_lock
from tests.test_training_cli import write_project

pytestmark = pytest.mark.tensorflow

REPO = pathlib.Path(__file__).resolve().parents[1]
HOLDER = """
import sys, time, types
for name in ("keras_attn", "keras_attn.runs"):  # the modules, not the packages' __init__
    module = types.ModuleType(name)
    module.__path__ = [sys.argv[1] + "/" + name.replace(".", "/")]
    sys.modules[name] = module
from keras_attn.runs.run_lock import RunLockedError, run_lock
mode, directory, seconds = sys.argv[2:]
try:
    with run_lock(**{mode: [directory]}):
        print("held", flush=True)
        time.sleep(float(seconds))
except RunLockedError as error:
    sys.stderr.write(f"error: {error}\\n")
    sys.exit(2)
"""


def holder(mode, directory, seconds=60):
    """A process holding `directory` (`mode` "writes" or "reads"), once it says so."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPO), mode, str(directory),
                                str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline() == "held\n", process.communicate()
    return process


def other_process(mode, directory):
    """`(exit status, stderr)` of another process trying to hold `directory` briefly."""
    done = subprocess.run([sys.executable, "-c", HOLDER, str(REPO), mode, str(directory), "0"],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


def stopped(process):
    process.kill()
    process.communicate()


def holder_files(directory):
    return sorted(p.name for p in pathlib.Path(directory).glob(f"{LOCK_FILE}*"))


def test_a_directory_being_written_is_refused_to_writers_and_readers(tmp_path):
    run = tmp_path / "run"
    first = holder("writes", run)
    try:
        started = time.time()
        for mode in ("writes", "reads"):
            with pytest.raises(RunLockedError) as refused:
                with run_lock(**{mode: [run]}):
                    pytest.fail("held a directory another process writes")
            message = str(refused.value)
            assert f"pid {first.pid} on host {socket.gethostname()}" in message
            assert "writing since" in message and "python -c" in message
            since = time.strptime(message.split("writing since ")[1][:19], "%Y-%m-%d %H:%M:%S")
            assert abs(time.mktime(since) - started) < 30
        code, err = other_process("writes", run)  # a third process: the same refusal
        assert code == 2 and f"pid {first.pid} " in err, err
    finally:
        stopped(first)
    with run_lock(writes=[run]):  # its lock went with it
        pass


def test_readers_share_a_run_and_a_writer_waits_for_them(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    reader = holder("reads", run)
    try:
        with run_lock(reads=[run]):
            assert other_process("reads", run)[0] == 0  # a third reader too
            code, err = other_process("writes", run)
            assert code == 2 and "is reading it" in err and f"pid {os.getpid()} " in err, err
        with pytest.raises(RunLockedError, match=f"reading it: pid {reader.pid} "):
            with run_lock(writes=[run]):
                pass
    finally:
        stopped(reader)


class Notes(logging.Handler):
    """The records of the `run_lock` logger (the CLI stops them propagating to caplog's)."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_lock_left_by_a_killed_process_is_taken_over_with_one_note(tmp_path):
    run = tmp_path / "run"
    killed = holder("writes", run)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    left = holder_files(run)
    assert left == [LOCK_FILE, f"{LOCK_FILE}.{socket.gethostname()}.{killed.pid}.json"]
    logger, handler = logging.getLogger("keras_attn.runs.run_lock"), Notes()
    logger.addHandler(handler)
    try:
        with run_lock(writes=[run]):
            assert holder_files(run) == [
                LOCK_FILE, f"{LOCK_FILE}.{socket.gethostname()}.{os.getpid()}.json"]
        with run_lock(writes=[run]):
            pass
    finally:
        logger.removeHandler(handler)
    notes = handler.messages
    assert len(notes) == 1, notes
    assert f"took over the lock of pid {killed.pid} " in notes[0] and "killed?" in notes[0]
    assert holder_files(run) == []


def test_one_process_holds_a_directory_in_nested_stages(tmp_path):
    run, export = tmp_path / "run", tmp_path / "run" / "export"
    with run_lock(writes=[run]):  # train
        with run_lock(reads=[run], writes=[export]):  # export
            with run_lock(reads=[run], writes=[export / "qat"]):  # its quantize stage
                (export / "qat" / "model.keras").parent.mkdir(exist_ok=True)
                (export / "qat" / "model.keras").write_text("x")
        assert other_process("reads", run)[0] == 2  # still held after the inner stages
        assert holder_files(export) == []
    assert other_process("writes", run)[0] == 0
    assert holder_files(run) == [] and (export / "qat" / "model.keras").is_file()

    with run_lock(reads=[run]):  # read first, then written by the same process
        with run_lock(writes=[run]):
            assert json.loads((run / f"{LOCK_FILE}.{socket.gethostname()}.{os.getpid()}.json")
                              .read_text())["mode"] == "writing"
            assert other_process("reads", run)[0] == 2
    assert holder_files(run) == []


def test_a_failing_stage_releases_and_leaves_no_directory_it_did_not_fill(tmp_path):
    run = tmp_path / "new" / "run"
    with pytest.raises(ZeroDivisionError):
        with run_lock(writes=[run]):
            assert holder_files(run)
            1 / 0
    assert not (tmp_path / "new").exists()
    assert other_process("writes", run)[0] == 0
    with pytest.raises(TypeError, match="Received: 3"):
        with run_lock(writes=[3]):
            pass


def test_a_refused_lock_holds_nothing(tmp_path):
    free, busy = tmp_path / "free", tmp_path / "busy"
    other = holder("writes", busy)
    try:
        with pytest.raises(RunLockedError):
            with run_lock(writes=[free, busy]):
                pass
        assert not free.exists()  # released and removed again
        assert other_process("writes", free)[0] == 0
    finally:
        stopped(other)


def test_export_overwrite_keeps_the_lock_it_runs_under(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "export_report.json").write_text(json.dumps({"source_run": "/elsewhere"}))
    (export / "model.tflite").write_text("x")
    with run_lock(writes=[export]):
        check_export_output(export, tmp_path / "run", overwrite=True, log=lambda line: None)
        assert sorted(p.name for p in export.iterdir()) == holder_files(export)
        assert other_process("writes", export)[0] == 2


@pytest.mark.parametrize("command", ["train", "quantize", "export"])
def test_the_cli_exits_2_naming_the_process_that_writes_the_run(tmp_path, capsys, command):
    config = write_project(tmp_path)
    run = tmp_path / "run"
    other = holder("writes", run)
    try:
        arguments = {"train": ["train", str(config), "--output-dir", str(run)],
                     "quantize": ["quantize", str(run)], "export": ["export", str(run)]}
        assert cli.main(arguments[command]) == 2
    finally:
        stopped(other)
    err = capsys.readouterr().err
    assert err.startswith(f"keras-attn {command}: error: {run.resolve()} is in use"), err
    assert f"is writing it: pid {other.pid} on host {socket.gethostname()}" in err
    assert not (run / "qat").exists() and not (run / "export").exists()


def test_the_cli_notes_a_lock_taken_over_on_stderr(tmp_path, capsys):
    run = tmp_path / "run"
    killed = holder("writes", run)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert cli.main(["quantize", str(run)]) == 2  # then stops: run holds no trained model
    err = capsys.readouterr().err
    assert err.count("note:") == 1, err
    assert err.startswith(f"keras-attn quantize: note: {run.resolve()}: took over the lock "
                          f"of pid {killed.pid} "), err
    assert "keras-attn quantize: error:" in err and "model.keras is missing" in err


@pytest.mark.slow
def test_two_trains_on_one_directory_the_second_exits_2(tmp_path):
    """Two real `keras-attn train` processes: the second is refused while the first runs;
    once the first is killed, the second takes over, says so, and trains to the end."""
    config = write_project(tmp_path)
    train = [sys.executable, "-m", "keras_attn.cli", "train", str(config),
             "--set", "train.epochs=2000", "--set", "train.log_every_steps=1000000"]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    first = subprocess.Popen(train, cwd=REPO, env=environment, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:  # after TF's start-up lines: training, the lock held
            if line.startswith("strategy:"):
                break
        else:
            pytest.fail(f"the first train ended with status {first.wait()}")
        second = subprocess.run(train, cwd=REPO, env=environment, capture_output=True,
                                text=True, timeout=300)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"is writing it: pid {first.pid} on host {socket.gethostname()} " \
           f"(python -m keras_attn.cli train {config}" in second.stderr, second.stderr
    third = subprocess.run([*train[:-4], "--epochs", "1"], cwd=REPO, env=environment,
                           capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"note: {(tmp_path / 'run').resolve()}: took over the lock of pid {first.pid} " \
           in third.stderr, third.stderr
    assert (tmp_path / "run" / "metrics.json").is_file()
