"""benchmarks/tflite_interleaved_latency.py on two tiny exported models."""

import keras
import pytest

from keras_attn.export.tflite_export import export_tflite
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
