"""The int8 accuracy budget on the file that ships: `model_int8.tflite` itself, on LiteRT's
default (XNNPACK) kernels, scored on the budget's held-out examples.

    start:  the calibrated model the quantize stage chose (`quantization_budget`), its
            file f_0 (converted, or the one an earlier export wrote)
    step k: the next op of the sensitivity order moved to float, the file converted again:
            f_k (the calibrated model beside it scored too)
    stop:   at the first k with  m_float - metric(f_k) <= max_drop, or after `max_moves`
            moves (each one conversion more); the record then says the file misses

Each step's file is measured as it is scored: its size (the network; a file an earlier
export wrote carries its metadata too) and its p50 latency (1 thread, one held-out example at
the file's length), so a move's price is read beside what it wins back.

The quantize stage's search scores the calibrated Keras model (the twin), which computes
what its file computes up to the runtime's roundings (`twin_agreement`): the two disagree
on 1-2 % of examples, and the same file differs by as much on LiteRT's two kernel sets
(docs/export.md: 0.69 points apart on SST-2 dev). So the verdict that ships is the file's,
on the kernels it ships with; the twin's stays beside it.
"""

import os
import time

import numpy as np

from keras_attn.layers.validation import check_int
from keras_attn.quantization.quantization_budget import cost_order
from keras_attn.quantization.quantization_budget import size_cost

MAX_FILE_MOVES = 3  # ops the file may move beyond the twin's choice (conversions)
LATENCY_RUNS = 20  # timed runs of each step's file (after 3 warm-up runs)


def file_budget(model, budget, score_file, score_twin, order, max_moves=MAX_FILE_MOVES,
                log=None, measure_file=None):
    """The calibrated model whose `model_int8.tflite` is within the budget, and the record.

    Args:
        model: the calibrated `QuantizedModel` the quantize stage chose (not changed).
        budget: its `quantization_budget` record: `max_accuracy_drop` and `float_metric`
            (points) and the `steps` (`float_ops`, `metric`) the twin's search scored.
        score_file: callable `QuantizedModel -> metric` in [0, 1]: the model's file (converted, or
            for `model` itself the one already written) scored on LiteRT with XNNPACK on
            the budget's held-out examples.
        score_twin: callable `QuantizedModel -> metric` in [0, 1] of the Keras model on the same
            examples (`held_out_score`); called only for ops the twin's search did not score.
        order: op names, most sensitive first (`quantization_sensitivity` rows' `op`), or a
            callable returning them, called only if the file misses.
        max_moves: int >= 0, the most ops moved to float for the file.
        log: callable receiving a line per step.
        measure_file: optional callable `QuantizedModel -> {"size_bytes", "p50_ms"}` of the
            file `score_file` scored for it (`file_measures`), recorded in each step.

    Returns:
        `(model, record)`: the chosen `QuantizedModel` (`model` itself when its file is within the
        budget) and `{"max_accuracy_drop", "float_metric", "steps": [{"float_ops",
        "file_metric", "file_drop", "twin_metric", "twin_drop"}], "float_ops", "moved",
        "within_budget", "twin_within_budget", "max_moves", "size_cost_bytes"}` (metrics in
        points; `within_budget` is the last file's, `twin_within_budget` its twin's;
        `size_cost_bytes` what the `moved` ops add, their weights in float32).

    Example:

        chosen, record = file_budget(qat, budget, score_file, held_out_score(...), order)
    """
    check_int("max_moves", max_moves, low=0)
    log = log or (lambda message: None)
    max_drop, float_metric = budget["max_accuracy_drop"], budget["float_metric"]
    earlier = budget.get("file")  # an earlier export's search, which chose `model`
    if not earlier or set(earlier["float_ops"]) != set(model.float_ops):
        earlier = {"steps": [], "moved": []}
    scored = {frozenset(s["float_ops"]): s["metric"] for s in budget.get("steps", [])}
    scored.update({frozenset(s["float_ops"]): s["twin_metric"] for s in earlier["steps"]})
    chosen, float_ops, moved = model, list(model.float_ops), list(earlier["moved"])
    measure = measure_file or (lambda _: {})
    # Its file is scored again (this machine's kernels); its earlier tries are kept.
    steps = earlier["steps"][:-1] + [_step(float_ops, 100 * score_file(model),
                                          _twin_metric(model, scored, score_twin),
                                          float_metric, measure(model))]
    log(f"model_int8.tflite (XNNPACK) {steps[-1]['file_metric']:.2f}, calibrated model "
        f"{steps[-1]['twin_metric']:.2f}, float {float_metric:.2f}, budget {max_drop:g}"
        f"{_measures_text(steps[-1])}")
    if steps[-1]["file_drop"] > max_drop and len(moved) < max_moves and callable(order):
        order = order()  # the sensitivity order, needed only now
    remaining = [] if callable(order) else [
        op for op in cost_order(model, [op for op in order if op != "all"])
        if op not in float_ops]
    while steps[-1]["file_drop"] > max_drop and remaining and len(moved) < max_moves:
        moved.append(remaining.pop(0))
        float_ops.append(moved[-1])
        chosen = model.with_float_ops(float_ops)
        steps.append(_step(float_ops, 100 * score_file(chosen),
                           _twin_metric(chosen, scored, score_twin), float_metric,
                           measure(chosen)))
        log(f"  {moved[-1]} to float, file converted again: {steps[-1]['file_metric']:.2f} "
            f"({steps[-1]['file_drop']:+.2f} below float){_measures_text(steps[-1])}")
    return chosen, {"max_accuracy_drop": max_drop, "float_metric": float_metric,
                    "steps": steps, "float_ops": list(float_ops), "moved": moved,
                    "within_budget": steps[-1]["file_drop"] <= max_drop,
                    "twin_within_budget": steps[-1]["twin_drop"] <= max_drop,
                    "max_moves": max_moves,
                    "size_cost_bytes": size_cost(model, moved)}


def _twin_metric(model, scored, score_twin):
    """The twin's metric in points: as its search scored it, or scored now."""
    key = frozenset(model.float_ops)
    if key not in scored:
        scored[key] = round(100 * score_twin(model), 4)
    return scored[key]


def _step(float_ops, file_metric, twin_metric, float_metric, measures):
    return {"float_ops": list(float_ops), "file_metric": round(file_metric, 4),
            "file_drop": round(float_metric - file_metric, 4),
            "twin_metric": round(twin_metric, 4),
            "twin_drop": round(float_metric - twin_metric, 4), **measures}


def file_measures(path, call, runs=LATENCY_RUNS):
    """`{"size_bytes", "p50_ms"}` of a `.tflite` file: its size, and the p50 of `runs` timed
    calls of `call` (the file on one held-out example, XNNPACK, 1 thread; after 3 warm-up
    calls)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return {"size_bytes": os.path.getsize(path), "p50_ms": round(float(np.median(times)), 3)}


def _measures_text(step):
    if "size_bytes" not in step:
        return ""
    return f"; {step['size_bytes'] / 1e6:.2f} MB, p50 {step['p50_ms']:.2f} ms (1 thread)"
