"""`file_budget`: the int8 budget held on the file that ships, with fake scorers whose
metrics are written by hand (a real export's file: `tests/test_run_exporter.py`)."""

import numpy as np
import pytest

from keras_attn.export.export_report import budget_markdown
from keras_attn.export.file_budget import file_budget
from keras_attn.export.file_budget import file_measures
from tests.quantized_bert import quantized_bert

pytestmark = pytest.mark.tensorflow

ORDER = ["all", "embeddings", "transformer_layer_0/qkv", "transformer_layer_0/intermediate",
         "logits"]


def _model(float_ops=()):
    model = quantized_bert(vocabulary_size=40, num_layers=1, num_heads=2, hidden_dim=8,
                           intermediate_dim=16, max_sequence_length=8, num_outputs=3,
                           float_residual=True, float_ops=float_ops)
    model.calibrate([{"token_ids": np.array([[2, 5, 9, 3]]),
                      "segment_ids": np.zeros((1, 4), "int32"),
                      "padding_mask": np.ones((1, 4), "int32")}])
    return model


def _scorer(metrics):
    """`QuantizedModel -> metric` in [0, 1] from `{frozenset(float_ops): points}`, and its calls."""
    calls = []

    def score(model):
        calls.append(tuple(model.float_ops))
        return metrics[frozenset(model.float_ops)] / 100

    return score, calls


def _budget(max_drop=0.5, float_ops=(), metric=89.9):
    """A quantize stage's record whose calibrated model is within the budget."""
    return {"max_accuracy_drop": max_drop, "float_metric": 90.0, "float_ops": list(float_ops),
            "within_budget": True, "examples": 200, "split": "dev",
            "steps": [{"float_ops": list(float_ops), "metric": metric,
                       "drop": round(90.0 - metric, 4)}]}


def test_a_file_that_misses_while_its_model_passes_moves_ops_until_it_is_within():
    model = _model()
    # The file loses 1.5, then 0.75 with the embeddings float, then 0.25 with qkv too.
    score_file, file_calls = _scorer({frozenset(): 88.5, frozenset(ORDER[1:2]): 89.25,
                                      frozenset(ORDER[1:3]): 89.75})
    score_twin, twin_calls = _scorer({frozenset(ORDER[1:2]): 90.0,
                                      frozenset(ORDER[1:3]): 89.5})
    chosen, record = file_budget(model, _budget(), score_file, score_twin, ORDER)
    assert record["moved"] == record["float_ops"] == ORDER[1:3]
    assert set(chosen.float_ops) == set(ORDER[1:3]) and model.float_ops == ()
    assert file_calls == [(), ("embeddings",), ("embeddings", "transformer_layer_0/qkv")]
    # The twin's own search scored the start (89.9): only the moved models are scored.
    assert twin_calls == file_calls[1:]
    assert [(s["file_drop"], s["twin_metric"]) for s in record["steps"]] == \
        [(1.5, 89.9), (0.75, 90.0), (0.25, 89.5)]
    assert record["within_budget"] and record["twin_within_budget"]
    assert record["size_cost_bytes"] == 3 * (model.op_weight_count("embeddings")
                                             + model.op_weight_count(ORDER[2])) > 0


def test_a_file_within_the_budget_keeps_the_model_and_measures_no_order():
    model = _model(float_ops=["logits"])
    score_file, _ = _scorer({frozenset(["logits"]): 89.6})
    chosen, record = file_budget(model, _budget(float_ops=["logits"]), score_file,
                                 lambda m: pytest.fail("the twin was scored already"),
                                 lambda: pytest.fail("no order needed"))
    assert chosen is model and record["moved"] == [] and record["size_cost_bytes"] == 0
    assert record["steps"] == [{"float_ops": ["logits"], "file_metric": 89.6,
                                "file_drop": 0.4, "twin_metric": 89.9, "twin_drop": 0.1}]
    assert record["within_budget"]


def test_the_moves_are_bounded_and_a_file_that_still_misses_says_so():
    model = _model()
    score_file, calls = _scorer({frozenset(ORDER[1:k]): 80.0 for k in range(1, 5)})
    score_twin, _ = _scorer({frozenset(ORDER[1:k]): 89.9 for k in range(1, 5)})
    lines = []
    chosen, record = file_budget(
        model, _budget(), score_file, score_twin, lambda: ORDER, max_moves=2, log=lines.append,
        measure_file=lambda m: {"size_bytes": 100_000 * (1 + len(m.float_ops)),
                                "p50_ms": 1.0 + 0.25 * len(m.float_ops)})
    assert len(calls) == 3 and record["moved"] == ORDER[1:3] and record["max_moves"] == 2
    # Each step's file measured beside its score: the price of each move.
    assert [(s["size_bytes"], s["p50_ms"]) for s in record["steps"]] == [
        (100_000, 1.0), (200_000, 1.25), (300_000, 1.5)]
    assert lines[-1].endswith("; 0.30 MB, p50 1.50 ms (1 thread)")
    assert not record["within_budget"] and record["twin_within_budget"]
    page = "\n".join(budget_markdown({**_budget(), "file": {
        **record, "split": "dev", "examples": 200, "builtin_kernels_metric": 79.5,
        "builtin_kernels_drop": 10.5}}))
    # The file's verdict comes first, the calibrated model's beside it, the builtin third.
    rows = [line for line in page.splitlines() if line.startswith("| `model_int8")
            or line.startswith("| calibrated Keras model")]
    assert rows == ["| `model_int8.tflite`, LiteRT + XNNPACK (ships) | 80.00 | 10.00 | "
                    "**NOT within** |",
                    "| calibrated Keras model | 89.90 | 0.10 | within |",
                    "| `model_int8.tflite`, LiteRT builtin kernels | 79.50 | 10.50 | "
                    "NOT within |"]
    assert "Verdict: `model_int8.tflite` is NOT within the budget" in page
    assert "| + `transformer_layer_0/qkv` | 80.00 | 10.00 | 89.90 | 0.10 | 0.30 MB | 1.50 |" \
        in page
    # No moves at all: the first score is the verdict.
    _, none = file_budget(model, _budget(), score_file, score_twin, ORDER, max_moves=0)
    assert none["moved"] == [] and not none["within_budget"]
    with pytest.raises(ValueError, match="max_moves"):
        file_budget(model, _budget(), score_file, score_twin, ORDER, max_moves=-1)


def test_an_earlier_exports_moves_are_kept_when_its_model_is_scored_again():
    """A re-run starts from the QAT run the first export wrote back (its moved ops): the
    file is scored again and the earlier tries stay in the record."""
    model = _model(float_ops=["embeddings"])
    earlier = {"float_ops": ["embeddings"], "moved": ["embeddings"],
               "steps": [{"float_ops": [], "file_metric": 88.0, "file_drop": 2.0,
                          "twin_metric": 89.9, "twin_drop": 0.1},
                         {"float_ops": ["embeddings"], "file_metric": 89.8,
                          "file_drop": 0.2, "twin_metric": 90.0, "twin_drop": 0.0}]}
    score_file, _ = _scorer({frozenset(["embeddings"]): 89.7})
    _, record = file_budget(model, {**_budget(), "file": earlier}, score_file,
                            lambda m: pytest.fail("scored by the earlier export"), ORDER)
    assert record["moved"] == ["embeddings"]
    assert [s["file_metric"] for s in record["steps"]] == [88.0, 89.7]
    assert record["steps"][-1]["twin_metric"] == 90.0 and record["within_budget"]


def test_a_file_is_measured_by_its_size_and_timed_calls(tmp_path):
    path = tmp_path / "model_int8.tflite"
    path.write_bytes(b"0" * 1234)
    calls = []
    measures = file_measures(path, lambda: calls.append(1), runs=7)
    assert measures["size_bytes"] == 1234 and len(calls) == 3 + 7  # warm-up, then timed
    assert 0 <= measures["p50_ms"] < 1
