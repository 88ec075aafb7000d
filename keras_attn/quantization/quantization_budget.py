"""An int8 model within an accuracy budget: the most sensitive ops move to float until the
calibrated model loses at most `max_drop` points against the float model.

    start:  the recipe's model (`QuantizationRecipe`), metric m_0 on held-out data
    step k: move the next op of the sensitivity order (`quantization_sensitivity`, lowest
            SNR first; an op with over 4 times the weights of the median op after
            the others, `cost_order`) to float (`with_float_ops`), metric m_k and the bytes it adds
    stop:   at the first k with  m_float - m_k <= max_drop  (k = 0: the recipe as it is)

The metric is the task's (accuracy or strict entity F1, in points) of the calibrated Keras
model with frozen ranges, which computes what its int8 file computes (`EncoderInt8Layout`),
on held-out examples: the run's dev split (without one, training examples the calibration
did not use), never the test split. The greedy order is the
one the LiteRT / AI Edge quantizer's per-op error report and OpenVINO's accuracy-aware
quantization use; with every op float the model is the float model, so the loop always ends.
"""

import numpy as np

from keras_attn.quantization.quantization_sensitivity import logits_of
from keras_attn.runs.task_head import ClassificationHead
from keras_attn.runs.task_head import TaggingHead
from keras_attn.text.labelled_examples import id_inputs

BUDGET_BATCH = 64  # examples per call of the model
BUDGET_TRAIN_EXAMPLES = 1000  # training examples scoring a budget when a run has no dev split
# An op with more than this many times the weights of the median op moves to float last.
EXPENSIVE_FACTOR = 4


def quantization_budget(model, rows, score, max_drop, log=None):
    """The recipe's model with the fewest sensitive ops in float that loses at most
    `max_drop` points, and the record of the search.

    Args:
        model: a calibrated `QuantizedModel` (the recipe; not changed).
        rows: `quantization_sensitivity(model, ...)` rows (the order ops move in), or a
            callable returning them, called only if the recipe misses the budget.
        score: callable `model -> metric` in [0, 1] on the held-out examples
            (`held_out_score`; the float model too: `model.with_quantization(False)`).
        max_drop: float >= 0, the largest loss allowed, in points (accuracy or F1 x 100).
        log: callable receiving a line per step.

    Returns:
        `(model, record)`: the chosen model (`model` itself when the recipe is within the
        budget) and `{"max_accuracy_drop", "float_metric", "steps": [{"float_ops",
        "metric", "drop", "size_cost_bytes"}], "float_ops", "within_budget",
        "size_cost_bytes"}` (metrics in points; the bytes the moved ops add to the int8
        file, their weights in float32).

    Example:

        chosen, record = quantization_budget(qat, rows, held_out_score(...), 0.5)
    """
    log = log or (lambda message: None)
    float_metric = 100 * score(model.with_quantization(False))
    chosen, float_ops = model, list(model.float_ops)
    steps = [_step(float_ops, 100 * score(model), float_metric)]
    log(f"int8 budget {max_drop:g} points: float {float_metric:.2f}, recipe "
        f"{steps[-1]['metric']:.2f}")
    if steps[-1]["drop"] > max_drop and callable(rows):
        rows = rows()  # the sensitivity order, measured only now that it is needed
    order = [] if callable(rows) else cost_order(
        model, [row["op"] for row in rows if row["op"] != "all"])
    for op in order:
        if steps[-1]["drop"] <= max_drop:
            break
        float_ops.append(op)
        chosen = model.with_float_ops(float_ops)
        steps.append(_step(float_ops, 100 * score(chosen), float_metric,
                           size_cost(model, float_ops[len(model.float_ops):])))
        log(f"  {op} to float: {steps[-1]['metric']:.2f} ({steps[-1]['drop']:+.2f} below "
            f"float; +{steps[-1]['size_cost_bytes'] / 1e6:.2f} MB)")
    return chosen, {"max_accuracy_drop": max_drop, "float_metric": round(float_metric, 4),
                    "steps": steps, "float_ops": list(float_ops),
                    "within_budget": steps[-1]["drop"] <= max_drop,
                    "size_cost_bytes": size_cost(model, float_ops[len(model.float_ops):])}


def cost_order(model, ops):
    """`ops` (most sensitive first) with the costly ones last: an op with more than
    `EXPENSIVE_FACTOR` times the weights of the model's median op (BERT's embedding tables:
    12-30 times, +35 MB in float on a 23 MB file) moves only after every cheaper op."""
    costs = {op: model.op_weight_count(op) for op in model.quantization_ops()}
    limit = EXPENSIVE_FACTOR * float(np.median(list(costs.values())))
    return [op for op in ops if costs[op] <= limit] + [op for op in ops if costs[op] > limit]


def size_cost(model, moved):
    """Bytes the `moved` ops add to the int8 file: float32 instead of int8 weights, 3 more
    bytes each."""
    return 3 * sum(model.op_weight_count(op) for op in moved)


def _step(float_ops, metric, float_metric, size_cost_bytes=0):
    return {"float_ops": list(float_ops), "metric": round(metric, 4),
            "drop": round(float_metric - metric, 4), "size_cost_bytes": size_cost_bytes}


def held_out_score(examples, length, labels, tagger, crf=None):
    """`QuantizedModel -> metric` (accuracy, or strict entity F1 for a tagger) on encoded examples
    (`RunDirectory.examples("dev", length)`), at the export's fixed `length`; a CRF
    tagger's emissions are decoded with `crf` (the float model's `CRF` layer), as the export
    decodes its files'."""
    batches = [id_inputs(examples[start:start + BUDGET_BATCH], length)
               for start in range(0, len(examples), BUDGET_BATCH)]
    head = TaggingHead(labels, crf) if tagger else ClassificationHead()

    def score(model):
        logits = np.concatenate(logits_of(model, batches))  # ranges frozen once
        outputs = [head.decode(logits[row, :len(example["token_ids"])] if tagger
                               else logits[row], example)
                   for row, example in enumerate(examples)]
        return head.score(examples, outputs)[head.metric]

    return score


def held_out_examples(source, recipe, length):
    """`(split, examples)` a budget is measured on: the run's dev split, or without one
    up to `BUDGET_TRAIN_EXAMPLES` training examples the calibration did not use, or when it
    used them all, those (said in the split's name); never the test split.

    Args:
        source: the float run (`RunDirectory`).
        recipe: the `QuantizationRecipe` (its `calibration_examples` were not held out).
        length: the export's fixed sequence length.

    Returns:
        `(split, examples)`: the split's name as the report states it, and the examples
        (`RunDirectory.examples`).

    Example:

        split, examples = held_out_examples(RunDirectory("runs/sst2"), QuantizationRecipe(), 64)
    """
    if source.data_file("dev"):
        return "dev", source.examples("dev", length)
    examples = source.examples("train", length, sample=BUDGET_TRAIN_EXAMPLES,
                               beside_sample=recipe.calibration_examples)
    if examples:
        return "train (not used for calibration)", examples
    return ("train (also the calibration examples: no dev split, every training example "
            "calibrated)", source.examples("train", length, sample=BUDGET_TRAIN_EXAMPLES))
