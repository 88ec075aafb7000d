"""benchmarks/gpu_check.py: its sizes against our presets, the GPT FLOP formula against a
per-matmul count, the report of failed and skipped rows, and (slow) the GPU test list
collected without TensorFlow and the `--quick` run end to end on JAX's CPU."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from keras_attn.models import BERT_PRESETS
from keras_attn.models import GPT_PRESETS
from tests.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

gpu_check = load_script("benchmarks/gpu_check.py", "benchmarks_gpu_check")
missing = [m for m in ("jax", "keras_hub") if importlib.util.find_spec(m) is None]
needs_jax_and_keras_hub = pytest.mark.skipif(
    bool(missing), reason=f"{missing} not installed (pip install -e .[bench])")


def test_sizes_are_our_presets():
    keys = ("num_layers", "hidden_dim", "num_heads", "intermediate_dim")
    for size, preset in (("minilm_l6", BERT_PRESETS["minilm_l6_h384"]),
                         ("bert_base", BERT_PRESETS["bert_base"]),
                         ("gpt2_small", GPT_PRESETS["gpt2_small"])):
        assert gpu_check.SIZES[size] == {k: preset[k] for k in keys}, size


@pytest.mark.parametrize("L, H, F, V, T, B", [(1, 4, 8, 10, 3, 2), (12, 768, 3072, 50257,
                                                                     1024, 8)])
def test_gpt_flops_match_a_per_matmul_count(L, H, F, V, T, B):
    per_layer = (3 * 2 * B * T * H * H  # Q, K, V projections
                 + 2 * B * T * T * H  # Q K^T, all heads together, full T x T
                 + 2 * B * T * T * H  # A V
                 + 2 * B * T * H * H  # output projection
                 + 2 * B * T * H * F + 2 * B * T * F * H)  # FFN in and out
    logits = 2 * B * T * H * V
    expected = 3 * (L * per_layer + logits)
    assert gpu_check.gpt_training_flops_per_step(L, H, F, V, T, B) == expected


def test_every_round_has_both_contenders_and_precisions():
    settings = gpu_check.full_settings()
    jobs = [job for models in settings.rounds for job in gpu_check.round_jobs(models, settings)]
    train = {(j["size"], j["sequence_length"], j["precision"], j["contender"])
             for j in jobs if j["kind"] == "train"}
    assert len(train) == 20  # (2 BERT sizes x 2 lengths + GPT-2) x 2 precisions x 2
    generation = [j for j in jobs if j["kind"] == "generate"]
    assert [j["batch_sizes"] for j in generation] == [[1, 32]]


def test_the_report_names_failed_and_skipped_rows():
    base = dict(family="bert", size="bert_tiny", sequence_length=16, batch_size=4,
                precision="float32")
    results = {
        "date": "2026-11-26", "command": "gpu_check.py", "seconds": 1.0, "gpu": "GPU X",
        "settings": {"peak_size": 8, "windows": 2, "window_steps": 2},
        "device": {"versions": {"jax": "0.11"}, "devices": ["cuda:0"], "python": "3.12"},
        "tests": {"files": 2, "summary": "3 passed in 1.0s"},
        "train": [
            dict(base, contender="keras_attn", parameters=2e6, step_ms=10.0,
                 tokens_per_s=2000.0, mfu=0.5, peak_memory_mb=1024.0),
            dict(base, contender="keras_hub", parameters=2e6, step_ms=20.0,
                 tokens_per_s=1000.0, mfu=0.25, peak_memory_mb=2048.0),
            dict(base, contender="keras_attn", precision="mixed_bfloat16",
                 error="exited before 'ready':\nValueError: bad | thing"),
            dict(base, contender="keras_hub", precision="mixed_bfloat16",
                 skipped="time budget"),
        ],
        "generation": [],
    }
    text = gpu_check.render_markdown(results)
    assert "| bert_tiny | 16 | 4 | float32 | keras_attn | 2.0 | 10.0 | 2,000 | 2.00× | " \
           "50.0 % | 1.00 |" in text
    assert "failed: ValueError: bad / thing |" in text
    assert "skipped (time budget) |" in text
    assert "GPU X" in text and "3 passed" in text


@pytest.mark.slow
@needs_jax_and_keras_hub
def test_gpu_tests_collect_without_tensorflow(tmp_path):
    # What the GPU machine has: no TensorFlow, KERAS_BACKEND=jax.
    blocked = gpu_check.block_tensorflow(tmp_path / "blocked")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([blocked, str(ROOT)]))
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *gpu_check.GPU_TESTS], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=300)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]


@pytest.mark.slow
@needs_jax_and_keras_hub
def test_quick_run_end_to_end(tmp_path):
    # ~1-2 min alone on 2 cores; the bound only stops a hung run.
    process = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path),
         "--wheels", str(tmp_path / "no_wheels")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND="jax"))
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())

    def positive(value):
        return isinstance(value, (int, float)) and math.isfinite(value) and value > 0

    assert results["device"]["platform"] == "cpu"
    assert all(positive(results["device"]["peak_tflops"][p]) for p in gpu_check.PRECISIONS)
    assert results["tests"]["passed"] > 0 and "failed" not in results["tests"]
    rows = {(r["family"], r["precision"], r["contender"]): r for r in results["train"]}
    assert set(rows) == {(f, p, c) for f in ("bert", "gpt") for p in gpu_check.PRECISIONS
                         for c in gpu_check.CONTENDERS}
    for key, row in rows.items():
        assert "error" not in row and "skipped" not in row, row
        for field in ("step_ms", "tokens_per_s", "mfu", "peak_memory_mb", "flops_per_step"):
            assert positive(row[field]), (key, field, row[field])
        assert len(row["window_tokens_per_s"]) == 2  # --quick: 2 windows
        assert row["tensorflow_imported"] is False
    for family in ("bert", "gpt"):  # the same network on both sides
        sides = {rows[(family, "float32", c)]["parameters"] for c in gpu_check.CONTENDERS}
        assert len(sides) == 1, (family, sides)
    generation = {r["batch_size"]: r for r in results["generation"]}
    assert set(generation) == {1, 32}
    for row in generation.values():
        assert positive(row["tokens_per_s"]) and positive(row["peak_memory_mb"]), row
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| model | T | batch | precision | contender |" in text
    assert "| gpt_tiny | mixed_bfloat16 | 32 | 4 + 8 |" in text
