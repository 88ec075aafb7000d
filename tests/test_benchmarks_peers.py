"""benchmarks/peers.py: the FLOP formula against a per-matmul count, equal parameter counts of
the three contenders, the synthetic data, the target verdicts, and (slow) the `--quick` run
end to end."""

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peers.py"

pytestmark = pytest.mark.tensorflow


peers = load_script("benchmarks/peers.py", "benchmarks_peers")
keras_hub_missing = importlib.util.find_spec("keras_hub") is None
needs_keras_hub = pytest.mark.skipif(
    keras_hub_missing, reason="keras-hub is not installed (pip install -e .[bench])")


def matmul_by_matmul_flops(L, H, A, F, T, B, C):
    """Every matmul the logits of a BERT classifier step need, listed on its own:
    2 m n k FLOPs each, backward = 2 x forward. The last block needs K and V for every
    token, everything else only for the [CLS] row."""
    d = H // A

    def layer(queries):
        return (
            2 * (B * queries) * H * H  # Q projection
            + 2 * 2 * (B * T) * H * H  # K, V projections, every token
            + A * B * 2 * queries * T * d  # Q K^T per head
            + A * B * 2 * queries * T * d  # A V per head
            + 2 * (B * queries) * H * H  # output projection
            + 2 * (B * queries) * H * F + 2 * (B * queries) * F * H  # FFN in and out
        )

    head = 2 * B * H * H + 2 * B * H * C  # pooler, classifier on [CLS]
    return 3 * ((L - 1) * layer(T) + layer(1) + head)


@pytest.mark.parametrize("sizes", [
    dict(L=1, H=4, A=2, F=8, T=3, B=2, C=2),
    dict(L=4, H=256, A=4, F=1024, T=128, B=32, C=2),
    dict(L=2, H=12, A=3, F=20, T=7, B=5, C=3),
])
def test_training_flops_match_a_per_matmul_count(sizes):
    config = peers.BenchConfig(num_layers=sizes["L"], hidden_dim=sizes["H"],
                               num_heads=sizes["A"], intermediate_dim=sizes["F"],
                               sequence_length=sizes["T"], batch_size=sizes["B"],
                               num_classes=sizes["C"])
    assert peers.training_flops_per_step(config) == matmul_by_matmul_flops(**sizes)


def test_default_config_flops_hand_computed():
    # First 3 blocks: 6 * 3 * (4 * 256^2 + 2 * 256 * 1024) * 4096 + 12 * 3 * 32 * 128^2 * 256
    #   = 57,982,058,496 + 4,831,838,208
    # last block: 12 * 256^2 * 4096 (K, V) + 6 * 32 * (2 * 256^2 + 2 * 256 * 1024)
    #   + 12 * 32 * 128 * 256 = 3,221,225,472 + 125,829,120 + 12,582,912
    # head: 6 * 32 * (256^2 + 512) = 12,681,216
    assert peers.training_flops_per_step(peers.BenchConfig()) == 66_186_215_424


@needs_keras_hub
def test_three_contenders_have_the_closed_form_parameter_count():
    config = peers.BenchConfig(num_layers=2, hidden_dim=8, num_heads=2, intermediate_dim=16,
                               vocabulary_size=50, max_sequence_length=12, num_classes=3)
    # (V + P + S) H + 2H + L (4 (H^2 + H) + 2 H F + F + H + 4H) + H^2 + H + H C + C
    expected = (50 + 12 + 2) * 8 + 16 + 2 * (4 * 72 + 256 + 16 + 8 + 32) + 72 + 27
    assert peers.expected_parameter_count(config) == expected == 1827
    for name in peers.CONTENDERS:
        assert peers.build_contender(name, config).count_params() == expected, name


@needs_keras_hub
def test_padding_does_not_change_any_contenders_logits():
    """Same inputs, same padding behaviour: padded positions do not change the logits of
    any contender (each applies the padding mask), a check that the hand-written
    keras.layers.MultiHeadAttention model masks like the others."""
    config = peers.BenchConfig(num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16,
                               vocabulary_size=50, max_sequence_length=12, dropout=0.0)
    inputs, _ = peers.synthetic_examples(config, 3, sequence_length=10)
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["token_ids"] = np.where(inputs["padding_mask"] == 1, inputs["token_ids"], 7)
    assert (changed["token_ids"] != inputs["token_ids"]).any()
    for name in peers.CONTENDERS:
        model = peers.build_contender(name, config)
        a = np.asarray(model(inputs, training=False))
        b = np.asarray(model(changed, training=False))
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)


def test_synthetic_examples_are_seeded_and_consistent():
    config = peers.BenchConfig(vocabulary_size=100, sequence_length=20, num_classes=3)
    (a, labels_a), (b, labels_b) = (peers.synthetic_examples(config, 64) for _ in range(2))
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_array_equal(labels_a, labels_b)
    mask = a["padding_mask"].astype(bool)
    lengths = mask.sum(1)
    assert lengths.min() >= 10 and lengths.max() <= 20
    np.testing.assert_array_equal(mask, np.arange(20)[None] < lengths[:, None])  # prefix
    assert (a["token_ids"][:, 0] == 2).all()
    assert (a["token_ids"][~mask] == 0).all() and (a["token_ids"][mask][a["token_ids"][mask] != 2]
                                                   >= 5).all()
    assert (a["segment_ids"][~mask] == 0).all() and a["segment_ids"].max() == 1
    assert set(np.unique(labels_a)) <= {0, 1, 2}
    other, _ = peers.synthetic_examples(dataclasses.replace(config, seed=1), 64)
    assert (other["token_ids"] != a["token_ids"]).any()


def fake_results(ours_train, hub_train, latencies):
    """A results dict with the fields `compute_ratios` / `render_markdown` read."""
    def train(name, tokens):
        return {"contender": name, "precision": "fp32", "parameters": 10,
                "train_tokens_per_s": tokens, "predict_tokens_per_s": 2 * tokens,
                "train_step_ms_median": 1.0,
                "jit_compile_resolved": False, "train_window_tokens_per_s": [tokens]}

    return {
        "command": "python benchmarks/peers.py", "date": "today",
        "machine": {"cpu": "cpu", "logical_cpus": 2, "platform": "linux", "python": "3.11",
                    "load_average_start": (1.0, 1.0, 1.0), "load_average_end": (1.0, 1.0, 1.0)},
        "versions": {"keras": "3"}, "config": dataclasses.asdict(peers.BenchConfig()),
        "settings": {"tf_threads": 2, "latency_threads": 1, "jit_compile": False,
                     "warmup_steps": 1, "windows": 1, "window_steps": 1, "predict_batches": 1},
        "training_flops_per_step": 1e9, "expected_parameters": 10,
        "peak_start": {"fp32_gflops": 100.0}, "peak_end": {"fp32_gflops": 100.0},
        "train": [train("keras_attn", ours_train), train("keras_hub", hub_train)],
        "latency": [{"contender": c, "variant": v, "p50_ms": ms}
                    for (c, v), ms in latencies.items()],
    }


def test_target_verdicts_and_ratios():
    results = fake_results(1150.0, 1000.0, {
        ("keras_attn", "fp32"): 10.0, ("keras_hub", "fp32"): 12.0,
        ("keras_attn", "dynamic_int8"): 4.5, ("keras_attn", "int8"): 11.0})
    ratios = peers.compute_ratios(results)
    assert ratios["train_fp32"] == pytest.approx(1.15)
    assert ratios["predict_fp32"] == pytest.approx(1.15)
    assert ratios["tflite_fp32"] == pytest.approx(10 / 12)
    assert ratios["tflite_dynamic_int8"] == pytest.approx(0.45)
    assert ratios["tflite_int8"] == pytest.approx(1.1)
    assert ratios["onnx_fp32"] is None
    results["ratios"] = ratios
    text = peers.render_markdown(results)
    verdicts = {line.split("|")[1].strip(): line.split("|")[4].strip()
                for line in text.splitlines() if line.startswith("| ") and "×" in line
                and ("≥" in line or "≤" in line)}
    assert verdicts == {
        "training tokens/s, fp32: keras-attn / keras-hub": "met",  # 1.15 >= 1.15
        "predict tokens/s, fp32: keras-attn / keras-hub": "met",
        "LiteRT fp32 latency: keras-attn / keras-hub": "missed",  # 0.83 > 0.75
        "LiteRT dynamic int8 / keras-attn fp32 latency": "met",  # 0.45 <= 0.45
        "LiteRT full int8 (QAT path) / keras-attn fp32 latency": "missed",  # 1.1 > 1.0
    }
    # MFU = FLOPs/step x steps/s / peak: 1e9 x (1150 / 4096) / 100e9 = 0.28 %.
    assert "| keras_attn | fp32 | 10 | 1,150 | 1.15 | 1 | 0.3 % | 2,300 | 1.15 |" in text


def test_failed_job_is_reported_not_dropped():
    results = fake_results(1000.0, 1000.0, {})
    results["train"][0] = {"contender": "keras_attn", "precision": "fp32",
                           "error": "Traceback ...\nValueError: boom"}
    results["ratios"] = peers.compute_ratios(results)
    text = peers.render_markdown(results)
    assert "| keras_attn | fp32 | failed: ValueError: boom |" in text
    assert "not measured" in text


def test_report_keeps_the_hand_written_part_of_the_page(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# Method\nformulas\n" + peers.REPORT_MARKER + "\nold numbers\n")
    peers.write_report(page, "## new numbers\n")
    assert page.read_text() == ("# Method\nformulas\n" + peers.REPORT_MARKER
                                + "\n\n## new numbers\n")
    fresh = tmp_path / "sub" / "report.md"  # no marker, no file: the report alone
    peers.write_report(fresh, "## numbers\n")
    assert fresh.read_text() == "## numbers\n"


def test_bad_arguments_are_named():
    args = peers.parse_args(["--hidden-dim", "10", "--num-heads", "4"])
    with pytest.raises(SystemExit, match="--hidden-dim .10. must be divisible by --num-heads"):
        peers.config_from_args(args)
    args = peers.parse_args(["--vocabulary-size", "500"])
    with pytest.raises(SystemExit, match="--vocabulary-size must be at least 2000"):
        peers.config_from_args(args)


@pytest.mark.slow
@needs_keras_hub
def test_quick_run_end_to_end(tmp_path):
    out = tmp_path / "bench.md"
    # ~170 s alone on 2 cores; the slow stage runs two tests at once (it took > 240 s
    # beside another slow test and a demo): the bound only stops a hung run.
    process = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out),
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert process.returncode == 0, process.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())
    text = out.read_text()

    config = peers.BenchConfig(**results["config"])
    assert (config.num_layers, config.hidden_dim, config.sequence_length) == (1, 32, 16)
    # L=1: the only block is the last one, computed for [CLS] beyond its keys and values.
    assert results["training_flops_per_step"] == matmul_by_matmul_flops(
        L=1, H=32, A=2, F=64, T=16, B=4, C=2) == 984_576
    # (2048 + 64 + 2) 32 + 64 + [4 (32^2 + 32) + 2 (32) (64) + 64 + 32 + 128]
    # + (32^2 + 32) + (32 (2) + 2) = 67,712 + 8,544 + 1,056 + 66
    assert results["expected_parameters"] == 77_378
    trained = {entry["contender"]: entry for entry in results["train"]}
    assert set(trained) == set(peers.CONTENDERS)
    for name, entry in trained.items():
        assert "error" not in entry, entry
        assert entry["parameters"] == 77_378, name
        assert entry["train_tokens_per_s"] > 0 and entry["predict_tokens_per_s"] > 0
        assert entry["jit_compile_resolved"] is False
        assert len(entry["train_window_tokens_per_s"]) == 2  # --quick: 2 windows
        # --quick: 3 rounds of 2 batches, each batch one timed call; one predict loop a round
        assert len(entry["predict_call_seconds"]) == 6, name
        assert len(entry["predict_loop_call_seconds"]) == 3, name
        p10, p50, p90 = entry["predict_call_ms_p10_p50_p90"]
        assert 0 < p10 <= p50 <= p90, name
    assert {(m["contender"], m["sequence_length"]) for m in results["memory"]} == {
        (name, 64) for name in peers.CONTENDERS}
    assert all(m["peak_rss_mb"] >= m["rss_after_build_mb"] > 0 for m in results["memory"])
    latencies = {(e["contender"], e["variant"]): e for e in results["latency"]}
    assert set(latencies) == {("keras_attn", v) for v in
                              ("fp32", "dynamic_int8", "int8_ptq", "int8", "onnx")} | {
        ("keras_hub", v) for v in ("fp32", "dynamic_int8", "int8", "onnx")}
    assert all(e["p50_ms"] > 0 and len(e["round_p50_ms"]) == 3 for e in latencies.values())
    ours = results["export"]["keras_attn"]
    assert ours["fp32"]["ops"]["FULLY_CONNECTED"] >= 6  # Q/K/V fused, O, FFN x2, pooler, head
    assert "QUANTIZE" not in ours["fp32"]["ops"]
    assert results["ratios"]["tflite_fp32"] == pytest.approx(
        latencies[("keras_attn", "fp32")]["p50_ms"] / latencies[("keras_hub", "fp32")]["p50_ms"])
    assert results["peak_start"]["fp32_gflops"] > 0
    profile = results["profile"]["keras_attn"]
    assert profile["by_type"] and abs(sum(e["share"] for e in profile["by_type"].values())
                                      - 1.0) < 1e-6
    for heading in ("### Training and predict", "### Peak memory of training",
                    "### Exported artifacts, batch 1", "### Targets",
                    "### Where a training step's time goes"):
        assert heading in text
    assert text.count("| met |") + text.count("| missed |") == len(peers.TARGETS)
