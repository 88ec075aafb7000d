"""The `Predictor` interface of `keras-attn predict` and the result dicts every predictor
returns (the format is in `keras_attn.stages.inference.predictor`'s docstring)."""

import abc
import pathlib

import numpy as np

from keras_attn.errors import KerasAttnError
from keras_attn.layers.validation import check_positive_int
from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.entity_prediction import predict_entities


class PredictorError(KerasAttnError, ValueError):
    """An artifact that cannot be loaded: unknown kind, missing or inconsistent side files."""


class Predictor(abc.ABC):
    """Texts -> one result dict per text (see the module docstring for the format).

    Subclasses implement `_predict(texts)` for a list of at most `batch_size` texts.

    Attributes:
        path: `pathlib.Path` of the artifact.
        kind: `"keras"`, `"saved_model"`, `"tflite"`, `"text_tflite"` or `"onnx"`.
        task: `"classification"` or `"ner"`.
        labels: the model's `LabelVocabulary`.
    """

    def __init__(self, path, kind, task, labels):
        self.path = pathlib.Path(path)
        self.kind = kind
        self.task = task
        self.labels = labels

    def predict(self, texts, batch_size=PREDICT_BATCH_SIZE):
        """Results for `texts`, in order.

        Args:
            texts: list of str (empty strings are allowed: no entities, or the model's label
                for an empty text).
            batch_size: int, texts per model call.

        Returns:
            list of result dicts, one per text.
        """
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise ValueError(
                f"`texts` must be a list of str. Received: texts={type(texts).__name__}"
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(
                    f"`texts` must be a list of str. Received: texts[{index}] of type "
                    f"{type(text).__name__}"
                )
        check_positive_int("batch_size", batch_size)
        results = []
        for start in range(0, len(texts), batch_size):
            results.extend(self._predict(list(texts[start:start + batch_size])))
        return results

    @abc.abstractmethod
    def _predict(self, texts):
        """Result dicts of at most `batch_size` texts, in order."""

    def __repr__(self):
        return f"{type(self).__name__}({str(self.path)!r}, task={self.task!r})"


# --- result dicts ---------------------------------------------------------------------------


def softmax(logits):
    logits = np.asarray(logits, "float64")
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def classification_result(labels, probabilities):
    probabilities = np.asarray(probabilities, "float64")
    return {"label": labels.labels[int(np.argmax(probabilities))],
            "probabilities": {label: float(p) for label, p in zip(labels.labels, probabilities)}}


def ner_result(entities, words, num_truncated_words):
    """`entities`: `entity_spans` dicts; `words`: `(text, start, end, tag)` tuples."""
    return {
        "entities": [{"type": e["type"], "start": int(e["start_char"]),
                      "end": int(e["end_char"]), "text": e["text"]} for e in entities],
        "words": [{"text": w, "start": int(s), "end": int(e), "tag": t} for w, s, e, t in words],
        "num_truncated_words": int(num_truncated_words),
    }


def python_ner_results(model, tokenizer, labels, texts):
    results = []
    for item in predict_entities(model, tokenizer, labels, texts, batch_size=len(texts) or 1):
        words = [(w, s, e, t) for (w, s, e), t in zip(item["words"], item["tags"])]
        results.append(ner_result(item["entities"], words, item["num_truncated_words"]))
    return results
