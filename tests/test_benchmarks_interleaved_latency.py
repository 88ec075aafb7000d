"""benchmarks/tflite_interleaved_latency.py on two tiny exported models."""

import shutil

import keras
import pytest

from keras_attn.export.tflite.tflite_export import export_tflite
from keras_attn.machine import cpu_description
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from tests.scripts import load_script

pytestmark = pytest.mark.tensorflow

bench = load_script("benchmarks/tflite_interleaved_latency.py")


def test_models_are_timed_in_turns_and_tabled(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=200, num_layers=1, num_heads=2, hidden_dim=8,
                            intermediate_dim=16, max_sequence_length=8)
    results = export_tflite(BertClassifier(backbone, num_classes=2), str(tmp_path),
                            variants=["fp32", "fp16"], sequence_length=8)
    paths = [results["fp32"]["path"], results["fp16"]["path"]]
    times = bench.measure(paths, 8, rounds=2, runs=3, warmup=1)
    assert [len(times[path]) for path in paths] == [6, 6]
    assert all(t > 0 for path in paths for t in times[path])
    bench.main([*paths, "--sequence-length", "8", "--rounds", "1", "--runs", "2"])
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[0] == f"CPU: {cpu_description()}, 1 thread(s)" and lines[1] == ""
    assert lines[2] == "| model | p50 ms | p90 ms | × first | XNNPACK partitions |"
    assert len(lines) == 6
    # XNNPACK takes a BERT classifier in pieces around the ops it has no kernel for (the
    # embedding GATHERs, the mask's SELECT_V2, ...).
    fp32_partitions = bench.xnnpack_partitions(paths[0])
    assert fp32_partitions >= 2 and bench.xnnpack_partitions(paths[1]) >= 2
    assert lines[4].endswith(f"| 1.00 | {fp32_partitions} |")
    assert bench.table(times).split("\n")[0] == "| model | p50 ms | p90 ms | × first |"
    with pytest.raises(SystemExit):
        bench.main([paths[0], "--sequence-length", "0"])


def test_a_model_with_other_inputs_is_refused(tmp_path):
    import tensorflow as tf

    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec((1, 8), tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * 2.0}

    module = Doubler()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    path = tmp_path / "doubler.tflite"
    path.write_bytes(tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "sm")).convert())
    with pytest.raises(ValueError, match=r"inputs \['x'\] are not token ids"):
        bench.measure([str(path)], 8)


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory):
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=200, num_layers=1, num_heads=2, hidden_dim=8,
                            intermediate_dim=16, max_sequence_length=8)
    return export_tflite(BertClassifier(backbone, num_classes=2),
                         str(tmp_path_factory.mktemp("tiny")), variants=["fp32"],
                         sequence_length=8)["fp32"]["path"]


# Lines as callgrind_annotate 3.19 prints them (--auto=no), two runs of one model.
ANNOTATE_ONE = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
649,046,242 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
158,923,952 (24.49%)  ???:xnn_f32_gemm_minmax_ukernel_6x16__asm_amd64_fma3_broadcast [/x/litert.so]
 49,894,338 ( 7.69%)  ceval.c:_PyEval_EvalFrameDefault'2 [/x/py.so]
  1,000,000 ( 0.15%)  ???:xnn_f32_vgelu_ukernel__fma3_rational_12_10_div_u16 [/x/litert.so]
"""
ANNOTATE_FOUR = ANNOTATE_ONE.replace("649,046,242", "1,159,046,242").replace(
    "158,923,952", "635,695,808").replace("  1,000,000", "  4,000,000")


def test_instruction_counts_are_the_difference_of_two_runs(tiny_fp32, tmp_path, monkeypatch):
    path = tiny_fp32
    counts = bench.function_counts(ANNOTATE_ONE)
    assert counts["PROGRAM TOTALS"] == 649_046_242
    assert counts["xnn_f32_gemm_minmax_ukernel_6x16__asm_amd64_fma3_broadcast"] == 158_923_952
    assert counts["_PyEval_EvalFrameDefault'2"] == 49_894_338 and len(counts) == 4
    runs = {"1": counts, "4": bench.function_counts(ANNOTATE_FOUR)}
    monkeypatch.setattr(bench, "_callgrind", lambda arguments, directory: runs[arguments[-1]])
    total, kernels = bench.count_instructions(path, 8, 3, str(tmp_path))
    assert total == 170_000_000  # (1,159,046,242 - 649,046,242) / 3
    assert kernels == {"xnn_f32_gemm_minmax_ukernel_6x16__asm_amd64_fma3_broadcast": 158_923_952,
                       "xnn_f32_vgelu_ukernel__fma3_rational_12_10_div_u16": 1_000_000}
    table = bench.instruction_table({"a.tflite": (total, kernels), "b.tflite": (85e6, {})})
    assert table.split("\n")[2] == (
        "| `a.tflite` | 170.0 M | 1.00 | `xnn_f32_gemm_minmax_ukernel_6x16__asm_amd64_fma3_"
        "broadcast` 93%, `xnn_f32_vgelu_ukernel__fma3_rational_12_10_div_u16` 1% |")
    assert table.split("\n")[3] == "| `b.tflite` | 85.0 M | 0.50 |  |"


@pytest.mark.slow
def test_instructions_under_valgrind_use_avx2_kernels(tiny_fp32, tmp_path, capsys):
    """The real run: valgrind hides AVX-512 and VNNI, so XNNPACK's kernels are AVX2 / FMA3
    ones on any x86 machine, and the count of one binary, model and input repeats exactly."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (.ci/run installs it)")
    path = tiny_fp32
    first = bench.count_instructions(path, 8, 2, str(tmp_path))
    assert first == bench.count_instructions(path, 8, 2, str(tmp_path))
    total, kernels = first
    assert total > 0 and kernels and all(n >= 0 for n in kernels.values())
    assert not any("avx512" in name for name in kernels)
    assert any("fma3" in name or "avx2" in name for name in kernels)
    bench.main([path, "--sequence-length", "8", "--instructions", "--runs", "1"])
    lines = capsys.readouterr().out.strip().split("\n")
    assert lines[0].startswith("Instructions (valgrind callgrind; the CPU seen has AVX2 and FMA")
    assert lines[2] == "| model | instructions per inference | × first | top XNNPACK kernels |"
    assert len(lines) == 5
