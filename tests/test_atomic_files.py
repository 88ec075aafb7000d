"""Crash-safe writes (`keras_attn.atomic_files`): a reader sees the old file or the whole new
one, also when the writing process is SIGKILLed at a random moment."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_attn import atomic_files

REPO = pathlib.Path(__file__).resolve().parents[1]
# A writer that rewrites one file in a loop, alternating two contents of a few MB; it loads
# atomic_files.py by path, without importing keras_attn (and Keras), so it starts at once.
WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("atomic_files", sys.argv[1])
atomic_files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic_files)
contents = [bytes([65]) * 3_000_000, bytes([66]) * 5_000_000]
print("ready", flush=True)
for i in range(10_000_000):
    atomic_files.write_bytes(sys.argv[2], contents[i % 2])
"""


def test_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "metrics.json"
    atomic_files.write_text(path, "one\n")
    atomic_files.write_text(path, "two\n")
    assert path.read_text(encoding="utf-8") == "two\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_writer_that_fails_leaves_the_old_file(tmp_path):
    path = tmp_path / "model.keras"
    atomic_files.write_bytes(path, b"old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_files.atomic_path(path) as temporary:
            temporary.write_bytes(b"ne")
            raise OSError("disk full")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_the_temporary_name_keeps_the_suffix_keras_checks(tmp_path):
    temporary = atomic_files.temporary_path(tmp_path / "best.weights.h5")
    assert temporary.parent == tmp_path
    assert temporary.name.startswith(".tmp-") and temporary.name.endswith("best.weights.h5")


def test_a_writer_that_writes_nothing_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wrote nothing"):
        with atomic_files.atomic_path(tmp_path / "model.onnx"):
            pass
    assert not list(tmp_path.iterdir())


def test_a_directory_is_replaced_whole(tmp_path):
    target = tmp_path / "saved_model"
    for version in ("1", "2"):
        with atomic_files.atomic_path(target) as temporary:
            (temporary / "variables").mkdir(parents=True)
            (temporary / "saved_model.pb").write_text(version)
            (temporary / "variables" / "data").write_text(version * 3)
    assert (target / "saved_model.pb").read_text() == "2"
    assert (target / "variables" / "data").read_text() == "222"
    assert [p.name for p in tmp_path.iterdir()] == ["saved_model"]


def test_copy_file(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    atomic_files.copy_file(tmp_path / "vocab.txt", tmp_path / "export_vocab.txt")
    assert (tmp_path / "export_vocab.txt").read_text() == "[PAD]\n[UNK]\n"


def test_stale_temporaries_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".tmp-{dead}-model.keras").write_bytes(b"PK\x03")
    (tmp_path / f".tmp-{dead}-saved_model").mkdir()
    (tmp_path / f".tmp-{os.getpid()}-metrics.json").write_text("{")  # this process: alive
    (tmp_path / "model.keras").write_bytes(b"kept")
    removed = atomic_files.remove_stale_temporaries(tmp_path)
    assert removed == [f".tmp-{dead}-model.keras", f".tmp-{dead}-saved_model"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".tmp-{os.getpid()}-metrics.json", "model.keras"])
    assert atomic_files.remove_stale_temporaries(tmp_path / "missing") == []


def test_sigkill_at_random_moments_never_leaves_a_partial_file(tmp_path):
    """20 writers killed at random moments of a loop of 3 MB / 5 MB rewrites: the file is
    always one whole version, and the next writer removes the killed one's temporary."""
    path = tmp_path / "model_int8.tflite"
    rng = np.random.default_rng(0)
    sizes = {3_000_000: b"A", 5_000_000: b"B"}
    for kill in range(20):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(REPO / "keras_attn" / "atomic_files.py"),
             str(path)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.0, 0.3)))
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        if not path.exists():  # killed before its first rename
            continue
        data = path.read_bytes()
        assert len(data) in sizes, (kill, len(data))
        assert data == sizes[len(data)] * len(data), kill
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != path.name]
        assert all(name.startswith(".tmp-") for name in leftovers), leftovers
        atomic_files.remove_stale_temporaries(tmp_path)
        assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert path.exists()  # some kill came after a whole write
