"""Strict IOB2 entity precision / recall / F1 (CoNLL-2003 evaluation) and per-type scores.

The numbers equal seqeval's `mode="strict", scheme=IOB2` (micro average).
"""

from keras_attn.text.iob2 import iob2_entities


def _ratio(numerator, denominator):
    return numerator / denominator if denominator else 0.0


def _f1(precision, recall):
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def entity_scores(y_true, y_pred):
    """Strict IOB2 entity precision, recall and F1 (micro average) and per-type scores.

    An entity counts as correct only when its type, first and last word all match (CoNLL-2003
    evaluation). Entities are read with `iob2_entities` (strict: an `I-X` that continues no `X`
    entity is not part of any entity), which makes the numbers equal to
    `seqeval.metrics.{precision,recall,f1}_score(y_true, y_pred, mode="strict", scheme=IOB2)`.
    A ratio with a zero denominator is 0 (as seqeval's default `zero_division`).

    Args:
        y_true, y_pred: lists of sentences, each a list of tags (`O`, `B-X`, `I-X`); a sentence
            of `y_pred` must be as long as the same sentence of `y_true`.

    Returns:
        dict with `precision`, `recall`, `f1`, the counts `true_entities`, `predicted_entities`,
        `correct_entities`, and `per_type`: `{type: {"precision", "recall", "f1", "support"}}`.

    Example:
    >>> scores = entity_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "O"]])
    >>> scores["precision"], scores["recall"], round(scores["f1"], 4)
    (1.0, 0.5, 0.6667)
    """
    if len(y_true) != len(y_pred):
        raise ValueError(
            f"`y_true` and `y_pred` must hold the same number of sentences. Received: "
            f"{len(y_true)} and {len(y_pred)}"
        )
    true_set, pred_set = set(), set()
    for sentence, (true_tags, pred_tags) in enumerate(zip(y_true, y_pred)):
        if len(true_tags) != len(pred_tags):
            raise ValueError(
                f"Sentence {sentence} has {len(true_tags)} true tags but {len(pred_tags)} "
                "predicted tags."
            )
        for entity in iob2_entities(true_tags):
            true_set.add((sentence,) + tuple(entity))
        for entity in iob2_entities(pred_tags):
            pred_set.add((sentence,) + tuple(entity))
    correct = true_set & pred_set
    per_type = {}
    for entity_type in sorted({entity[1] for entity in true_set | pred_set}):
        n_true = sum(1 for entity in true_set if entity[1] == entity_type)
        n_pred = sum(1 for entity in pred_set if entity[1] == entity_type)
        n_correct = sum(1 for entity in correct if entity[1] == entity_type)
        precision, recall = _ratio(n_correct, n_pred), _ratio(n_correct, n_true)
        per_type[entity_type] = {"precision": precision, "recall": recall,
                                 "f1": _f1(precision, recall), "support": n_true}
    precision = _ratio(len(correct), len(pred_set))
    recall = _ratio(len(correct), len(true_set))
    return {
        "precision": precision,
        "recall": recall,
        "f1": _f1(precision, recall),
        "true_entities": len(true_set),
        "predicted_entities": len(pred_set),
        "correct_entities": len(correct),
        "per_type": per_type,
    }
