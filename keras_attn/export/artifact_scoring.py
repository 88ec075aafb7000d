"""How `keras-attn export` scores and times its artifacts: every artifact's outputs on the
evaluation examples against the Keras float model's (task metric, agreement, max |Δlogit|),
and batch-1 latency with the artifacts timed in turns."""

import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_head import ClassificationHead
from keras_attn.runs.task_head import TaggingHead
from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.labelled_examples import id_inputs

LATENCY_ROUNDS = 5  # turns the artifacts take at each latency thread count
WARMUP_RUNS = 5


def percentiles(times_ms):
    return {"p50_ms": round(float(np.percentile(times_ms, 50)), 3),
            "p90_ms": round(float(np.percentile(times_ms, 90)), 3), "runs": len(times_ms)}


def compare(outputs, reference):
    """Top-1 (classification) or token (NER) agreement and max |Δlogit|."""
    agree, total, delta = 0, 0, 0.0
    for a, b in zip(outputs, reference):
        agree += int(np.sum(np.argmax(a, -1) == np.argmax(b, -1)))
        total += int(np.size(np.argmax(a, -1)))
        delta = max(delta, float(np.max(np.abs(a - b))))
    return {"agreement": agree / total, "max_abs_logit_diff": delta}


def traced_predict(model):
    """`x -> numpy logits` of a Keras task model, traced once for every batch and length (a
    shape-generic signature) into one concrete function that every call runs: nothing is
    retraced, and TensorFlow's frequent-retracing detector, which counts the first trace of
    each model under the one code object of `call`, never sees the calls. A CRF
    tagger gives its emissions (`logits`; the tags are decoded outside the network), and its
    `label_mask` input, which only the tags read, is filled with the padding mask."""
    crf = isinstance(model.output, dict)
    signature = {name: tf.TensorSpec([None, None], tf.int32) for name in ID_INPUTS}

    @tf.function(input_signature=[signature])
    def call(x):
        if crf:
            x = dict(x, label_mask=x["padding_mask"])
        outputs = model(x, training=False)
        return outputs["logits"] if crf else outputs

    concrete = call.get_concrete_function()

    def predict(x):
        x = {name: tf.constant(np.asarray(x[name], "int32")) for name in signature}
        return keras.ops.convert_to_numpy(concrete(x))

    return predict


class ArtifactScorer:
    """Scores artifacts on one evaluation set, padded to the export's length.

    Args:
        examples: the evaluation examples (`RunDirectory.examples`).
        length: the export's fixed sequence length.
        model: the float Keras model (its CRF weights decode a CRF tagger's emissions).
        labels: the run's `LabelVocabulary`.
        tagger: whether the outputs are per word piece.

    `on(examples)` gives a scorer of other examples that shares this one's traced models.
    """

    def __init__(self, examples, length, model, labels, tagger):
        self.examples, self.length = examples, length
        self.model, self.labels, self.tagger = model, labels, tagger
        self.use_crf = bool(getattr(model, "use_crf", False))
        self._predictors = {}  # id(model) -> (model, its traced predict), made once each

    def on(self, examples):
        """A scorer of `examples` for the same model, reusing the Keras models traced here."""
        scorer = ArtifactScorer(examples, self.length, self.model, self.labels, self.tagger)
        scorer._predictors = self._predictors
        return scorer

    def keras_predict(self, model):
        """`traced_predict(model)`, made once per model and kept (tracing is the slow part)."""
        if id(model) not in self._predictors:
            self._predictors[id(model)] = (model, traced_predict(model))
        return self._predictors[id(model)][1]

    def collect(self, predict_fixed, batch_size=PREDICT_BATCH_SIZE):
        """Per-example raw outputs of `predict_fixed(x)` (fixed-length batches): `(C,)`
        logits, or `(n, C)` token logits over the example's `n` real tokens."""
        outputs = [None] * len(self.examples)
        # Sorted by length in batches, as training evaluates: the Keras model's batches
        # hold the same examples as in the run's own evaluation.
        order = np.argsort([len(e["token_ids"]) for e in self.examples], kind="stable")
        for start in range(0, len(order), batch_size):
            indices = order[start: start + batch_size]
            x = id_inputs([self.examples[i] for i in indices], self.length)
            logits = np.asarray(predict_fixed(x), "float32")
            for row, index in enumerate(indices):
                n = len(self.examples[index]["token_ids"])
                outputs[index] = logits[row, :n] if self.tagger else logits[row]
        return outputs

    def score(self, outputs):
        """The task's metrics of per-example outputs (a CRF tagger's emissions decoded with
        the float model's transitions)."""
        crf = self.model.get_layer("crf") if self.use_crf else None
        head = TaggingHead(self.labels, crf) if self.tagger else ClassificationHead()
        return head.score(self.examples, [head.decode(output, example) for example, output
                                          in zip(self.examples, outputs)])

    def inputs(self, example):
        """One example's batch-1 inputs at the export's length."""
        return id_inputs([example], self.length)

    def latency_input(self):
        """The longest evaluation example: the one input every timed call runs."""
        return self.inputs(max(self.examples, key=lambda e: len(e["token_ids"])))


def interleaved_latency(calls, thread_counts, runs):
    """`{name: [percentiles per thread count]}` of `calls` (`{name: threads -> call}`).

    Per thread count the artifacts take turns: `runs` timed runs each (after
    `WARMUP_RUNS`), in up to `LATENCY_ROUNDS` rounds, so a busy moment of a shared machine
    lands on every artifact alike and the ratios between them hold (as in
    `benchmarks/tflite_interleaved_latency.py`).
    """
    results = {name: [] for name in calls}
    rounds = np.array_split(np.arange(runs), min(LATENCY_ROUNDS, runs))
    for threads in thread_counts:
        ready = {name: make(threads) for name, make in calls.items()}
        for call in ready.values():
            for _ in range(WARMUP_RUNS):
                call()
        times = {name: [] for name in ready}
        for chunk in rounds:
            for name, call in ready.items():
                for _ in chunk:
                    start = time.perf_counter()
                    call()
                    times[name].append((time.perf_counter() - start) * 1000)
        for name in ready:
            results[name].append({**percentiles(times[name]), "num_threads": threads})
    return results
