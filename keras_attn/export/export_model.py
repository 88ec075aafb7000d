"""`export_model`: a Keras model built and trained in the user's own script, exported as
`keras-attn export` exports a run: the int8 recipe (`quantize_model`, calibrated), an int8
accuracy budget checked on the file that ships, `model_fp32.tflite` and `model_int8.tflite`,
self-describing when a tokenizer and labels are given, and the report
(`export_report.json` / `.md`: metric, agreement with the float model, size and latency of
each file, the budget's steps and, when the recipe missed it, the sensitivity of each op).

    quantized = QuantizedModel.calibrated(model, calibration batches, **recipe.layout())
    budget    = quantization_budget(quantized, sensitivity rows, metric on validation_data)
    file      = file_budget(...): model_int8.tflite itself scored on LiteRT (XNNPACK), ops
                moved to float for it while it misses (at most MAX_FILE_MOVES)
"""

import json
import os
import pathlib
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from ai_edge_litert.interpreter import OpResolverType

from keras_attn import atomic_files
from keras_attn.export.artifact_scoring import interleaved_latency
from keras_attn.export.export_report import report_markdown
from keras_attn.export.file_budget import file_budget
from keras_attn.export.file_budget import file_measures
from keras_attn.export.tflite.model_int8_tflite import export_model_fp32_tflite
from keras_attn.export.tflite.model_int8_tflite import export_model_int8_tflite
from keras_attn.export.tflite.signature_tflite import batch_specs
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.layers.crf import CRF
from keras_attn.machine import cpu_description
from keras_attn.quantization.emissions_model import emissions_model
from keras_attn.quantization.quantization_budget import quantization_budget
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from keras_attn.quantization.quantize_model import float_layers
from keras_attn.quantization.quantized_model import QuantizedModel
from keras_attn.runs.export_directory import ModelCard
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_head import crf_tags
from keras_attn.version import __version__

IGNORED_LABEL = -100  # a token label the metric skips (special tokens, later word pieces)
LATENCY_RUNS = 50  # timed batch-1 runs of each file (after warm-up), in turns
REPORT_BATCH = 64  # examples per call of a Keras model when scoring
SENSITIVITY_BATCHES = 2  # calibration batches the sensitivity of each op is measured on


def export_model(model, output_dir, calibration_data, validation_data, tokenizer=None,
                 labels=None, sequence_length=None, recipe=None, log=None):
    """Exports a trained Keras model to `output_dir`: `model_int8.tflite` (the int8 recipe
    within its accuracy budget, measured on the file), `model_fp32.tflite`,
    `model_qat.keras` (the chosen quantization-aware model: `fit` it for QAT) and the
    report (`export_report.json`, `export_report.md`).

    Args:
        model: a functional or `Sequential` Keras model of keras-attn's layers and Keras'
            own (what `quantize_model` takes), returning logits (`(B, C)`, or `(B, T, C)`
            for a tagger), or a CRF tagger's `{"logits", "tags"}` (its files hold the
            emissions; the tags are decoded outside them, over the inputs' `label_mask`).
        output_dir: the directory written (created if needed).
        calibration_data: a list of model inputs (batches), real examples: the int8
            ranges are set on them.
        validation_data: `(x, y)`: model inputs and integer labels (`(B,)`, or `(B, T)`
            with -100 where no label), held out from training; the accuracy of every file
            and the budget are measured on them.
        tokenizer: optional `keras_attn.text.WordPieceTokenizer`; with `labels`, the
            `.tflite` files of a model whose inputs are named `token_ids` (and
            `segment_ids`, `padding_mask`) carry the vocabulary, the labels and a model
            card (TFLite metadata), like `keras-attn export`'s.
        labels: optional list of str, the label of each output class.
        sequence_length: the files' fixed length, for inputs built with a dynamic one;
            defaults to the length of the validation inputs.
        recipe: a `QuantizationRecipe` (its layout and `max_accuracy_drop`); defaults to
            the measured best, with the default budget.
        log: callable receiving progress lines.

    Returns:
        The report dict (also written as `export_report.json`).

    Example:

        report = export_model(model, "export/", calibration_batches, (x_dev, y_dev),
                              tokenizer=tokenizer, labels=["negative", "positive"],
                              sequence_length=128)
    """
    recipe = recipe or QuantizationRecipe()
    log = log or (lambda message: None)
    x, y = _check_validation_data(validation_data)
    batches = list(calibration_data)
    _check_settings(recipe, batches, tokenizer, labels)
    _check_labels(model, labels)
    sequence_length = file_length(model, x, sequence_length)
    output = pathlib.Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    examples = _examples(x)
    task = Predictions(model)
    quantized = QuantizedModel.calibrated(model, batches, **recipe.layout())
    log(f"int8 recipe calibrated on {len(batches)} batches: {recipe.describe()}")
    rows = []

    def sensitivity():  # measured only if the recipe misses the budget
        if not rows:
            rows.extend(quantization_sensitivity(quantized, batches[:SENSITIVITY_BATCHES]))
        return rows

    points = recipe.budget_points(len(examples))
    chosen, budget = quantized, None
    if points is not None:
        chosen, budget = _within_budget(quantized, sensitivity, _scorer(examples, y, task),
                                        (examples, y, points, task), batches,
                                        sequence_length, output, log)
    else:
        export_model_int8_tflite(chosen.model, output / "model_int8.tflite", batches,
                                 sequence_length)
    export_model_fp32_tflite(model, output / "model_fp32.tflite", sequence_length)
    chosen.model.save(output / "model_qat.keras")
    report = _report(model, chosen, output, (examples, y, task), rows, budget, recipe,
                     sequence_length)
    if tokenizer is not None and labels is not None:
        report["self_describing_tflite"] = _self_describing(model, output, tokenizer, labels,
                                                            report)
    atomic_files.write_text(output / "export_report.json", json.dumps(report, indent=2))
    atomic_files.write_text(output / "export_report.md", report_markdown(report))
    log(f"wrote {output}: model_int8.tflite, model_fp32.tflite, export_report.md")
    return report


def _check_validation_data(validation_data):
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
        raise ValueError("`validation_data` must be `(x, y)`: held-out model inputs and their "
                         "integer labels, the examples the files are scored on. Received: "
                         f"{type(validation_data).__name__}")
    x, y = validation_data
    y = np.asarray(y)
    count = len(keras.tree.flatten(x)[0])
    if len(y) != count:
        raise ValueError(f"`validation_data` has {count} inputs but {len(y)} labels: give one "
                         "label (or one row of token labels) per example.")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"`validation_data` labels must be integers (class ids, -100 where a "
                         f"token has none). Received: dtype {y.dtype}")
    return x, y


def _check_settings(recipe, batches, tokenizer, labels):
    if recipe.qat_epochs:
        raise ValueError("export_model calibrates; it runs no QAT epochs. Fit the model it "
                         "writes (`model_qat.keras`) with `fit` and export that, or pass a "
                         f"recipe with qat_epochs=0. Received: qat_epochs={recipe.qat_epochs}")
    if not batches:
        raise ValueError("`calibration_data` holds no batch: give a few batches of real "
                         "training inputs (the int8 ranges are set on them).")
    if (tokenizer is None) != (labels is None):
        raise ValueError("Self-describing files need both `tokenizer` and `labels` (the "
                         "vocabulary and the label names go into the files together). "
                         f"Received: tokenizer={type(tokenizer).__name__}, labels={labels!r}")


def _check_labels(model, labels):
    classes = emissions_model(model).outputs[0].shape[-1]
    if labels is not None and len(labels) != classes:
        raise ValueError(f"`labels` names {len(labels)} labels but the model has {classes} "
                         f"outputs per example (or token). Received: labels={list(labels)!r}")


def file_length(model, x, sequence_length=None):
    """The files' fixed length: `sequence_length`, or for a model with inputs of any length
    the length of the validation inputs `x` (`None` when every input has a fixed size);
    checked now, before any work, as the conversion will need it."""
    inputs = emissions_model(model).inputs
    if sequence_length is None and any(None in tuple(t.shape[1:2]) for t in inputs):
        sequence_length = int(np.shape(keras.tree.flatten(x)[0])[1])
    batch_specs(emissions_model(model), sequence_length)  # raises on an unknown size
    return sequence_length


def _examples(x):
    """The validation inputs, one batch-1 example each (the structure of `x`)."""
    count = len(keras.tree.flatten(x)[0])
    return [keras.tree.map_structure(lambda a, i=i: np.asarray(a)[i:i + 1], x)
            for i in range(count)]


def accuracy(predicted, y):
    """The share of labels predicted: per example, or per labelled token (labels -100
    skipped)."""
    kept = y != IGNORED_LABEL
    return float(np.mean(np.asarray(predicted)[kept] == y[kept]))


class Predictions:
    """What a model's outputs predict, the same way for the Keras model and its files: the
    top-1 class of the logits (per example or per token), or for a model with a CRF the
    Viterbi tags of its emissions over the inputs' `label_mask` (`crf_tags`, the
    decoding outside the file)."""

    def __init__(self, model):
        crf = [layer for layer in model._flatten_layers(include_self=False)
               if isinstance(layer, CRF)]
        self.crf = crf[0] if crf else None

    @staticmethod
    def logits(outputs):
        """The logits (a CRF model's emissions) of a model's outputs, float32."""
        outputs = outputs["logits"] if isinstance(outputs, dict) else outputs
        return keras.ops.convert_to_numpy(outputs).astype("float32")

    def __call__(self, logits, inputs):
        if self.crf is None:
            return np.argmax(logits, -1)
        return crf_tags(logits, self.crf, np.asarray(inputs["label_mask"]).astype(bool))


def _batch(examples):
    return keras.tree.map_structure(lambda *a: np.concatenate(a), *examples)


def _keras_logits(model, examples, predictions):
    """The logits (a CRF model's emissions) of a Keras model on the examples,
    `REPORT_BATCH` at a time."""
    return np.concatenate([
        predictions.logits(model(_batch(examples[start:start + REPORT_BATCH]),
                                 training=False))
        for start in range(0, len(examples), REPORT_BATCH)])


def _scorer(examples, y, predictions):
    """`model -> accuracy` of a Keras model (float or quantized) on the examples."""
    batch = _batch(examples)

    def score(model):
        if hasattr(model, "freeze_ranges"):
            model.freeze_ranges()
        return accuracy(predictions(_keras_logits(model, examples, predictions), batch), y)

    return score


class ModelFile:
    """Runs a batch-1 `.tflite` file of `export_model` on one example (the model's input
    structure) and returns its output as a float32 array; `builtin_kernels=True` runs
    LiteRT's builtin kernels instead of XNNPACK."""

    def __init__(self, path, model, num_threads=1, builtin_kernels=False):
        model = emissions_model(model)
        resolver = (OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels
                    else OpResolverType.AUTO)
        self.runner = Interpreter(model_path=str(path), num_threads=num_threads,
                                  experimental_op_resolver_type=resolver).get_signature_runner()
        self.details = self.runner.get_input_details()
        self.names = [tensor.name for tensor in model.inputs]

    def __call__(self, example):
        values = example if isinstance(example, dict) else dict(
            zip(self.names, keras.tree.flatten(example)))
        (output,) = self.runner(**{name: np.asarray(values[name]).astype(
            self.details[name]["dtype"]) for name in self.details}).values()
        return np.asarray(output, "float32")


def _file_outputs(path, model, examples, builtin_kernels=False):
    run = ModelFile(path, model, builtin_kernels=builtin_kernels)
    return np.concatenate([run(example) for example in examples])


def _within_budget(quantized, rows, score, data, batches, sequence_length, output, log):
    """The twin's budget search (`quantization_budget`), then the file's (`file_budget`):
    `model_int8.tflite` itself on LiteRT (XNNPACK), ops moved to float for it while it
    misses; written to `output` for the chosen model. `rows`: a callable returning the
    sensitivity rows (the order ops move in). Returns `(chosen, budget record)`."""
    examples, y, points, predictions = data
    batch = _batch(examples)
    log(f"int8 budget: at most {points:g} points below float on {len(examples)} validation "
        "examples")
    chosen, budget = quantization_budget(quantized, rows, score, points,
                                         log=lambda message: log("  " + message))
    budget.update(split="validation_data", examples=len(examples), default_budget=False)
    work = pathlib.Path(tempfile.mkdtemp(prefix="keras_attn_export_model_"))
    files = {}

    def file_of(candidate):
        if candidate.float_ops not in files:
            files[candidate.float_ops] = work / f"model_{len(files)}.tflite"
            export_model_int8_tflite(candidate.model, files[candidate.float_ops], batches,
                                     sequence_length)
        return files[candidate.float_ops]

    def score_file(candidate, builtin_kernels=False):
        logits = _file_outputs(file_of(candidate), candidate.model, examples, builtin_kernels)
        return accuracy(predictions(logits, batch), y)

    def measure_file(candidate):
        path = file_of(candidate)
        return file_measures(path, _timed_call(path, candidate.model, examples, 1))

    try:
        chosen, record = file_budget(chosen, budget, score_file, score,
                                     lambda: [row["op"] for row in rows()],
                                     log=lambda message: log("  " + message),
                                     measure_file=measure_file)
        builtin = 100 * score_file(chosen, builtin_kernels=True)
        record.update(split="validation_data", examples=len(examples),
                      builtin_kernels_metric=round(builtin, 4),
                      builtin_kernels_drop=round(record["float_metric"] - builtin, 4))
        atomic_files.copy_file(file_of(chosen), output / "model_int8.tflite")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return chosen, {**budget, "file": record}


def _report(model, chosen, output, data, rows, budget, recipe, sequence_length):
    """The report dict (`report_markdown`'s keys): one row per artifact (the Keras float
    model first), latencies timed in turns, the sensitivity and the budget."""
    examples, y, predictions = data
    batch = _batch(examples)
    reference = _keras_logits(model, examples, predictions)
    expected = predictions(reference, batch)
    artifacts = [_row("model.keras (float)", (reference, expected), (reference, expected), y,
                      _saved_size(model))]
    files = {}
    for name, source in (("model_fp32.tflite", model), ("model_int8.tflite", chosen.model)):
        path = output / name
        logits = _file_outputs(path, source, examples)
        files[name] = (path, source)
        artifacts.append({**_row(name, (logits, predictions(logits, batch)),
                                 (reference, expected), y, path.stat().st_size),
                          **_ops(path)})
    latency = interleaved_latency(
        {name: (lambda threads, path=path, source=source: _timed_call(path, source, examples,
                                                                      threads))
         for name, (path, source) in files.items()}, (1,), LATENCY_RUNS)
    for row in artifacts[1:]:
        row["latency"] = latency[row["artifact"]]
    length = sequence_length or int(model.inputs[0].shape[1] or 0)
    return {"task": _task(model), "source_run": f"Keras model {model.name!r} (export_model)",
            "metric": "accuracy", "eval_examples": len(examples),
            "eval_split": "validation_data", "sequence_length": length,
            "machine": {"cpu": cpu_description(), "cpu_count": os.cpu_count(),
                        "tensorflow": tf.__version__, "keras": keras.__version__},
            "quantization": recipe.to_dict(), "float_ops": list(chosen.float_ops),
            "float_layers": float_layers(chosen.model),
            "artifacts": artifacts, "quantization_sensitivity": rows,
            "quantization_budget": budget}


def _row(name, outputs, reference, y, size):
    """An artifact's row: its accuracy, the agreement of its predictions with the float
    model's (over the labelled positions) and the largest logit difference."""
    (logits, predicted), (reference_logits, expected) = outputs, reference
    kept = y != IGNORED_LABEL
    return {"artifact": name, "metric": accuracy(predicted, y),
            "agreement": float(np.mean(predicted[kept] == expected[kept])),
            "max_abs_logit_diff": float(np.abs(logits - reference_logits).max()),
            "size_bytes": int(size)}


def _ops(path):
    report = tflite_op_report(path)
    return {"ops": report["ops"], "non_int8_ops": report["non_int8_ops"]}


def _saved_size(model):
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "model.keras")
        model.save(path)
        return os.path.getsize(path)


def _timed_call(path, model, examples, threads):
    """A call running the file on the first example (a fixed-length file: every example
    costs the same)."""
    run = ModelFile(path, model, num_threads=threads)
    return lambda: run(examples[0])


def _task(model):
    """A token tagger (`(B, T, C)` logits) or a classifier."""
    return "ner" if len(emissions_model(model).outputs[0].shape) == 3 else "classification"


def _self_describing(model, output, tokenizer, labels, report):
    """Vocabulary, labels and model card (a CRF's transitions included) in both `.tflite`
    files (TFLite metadata), for a model whose inputs are token-id inputs; otherwise the
    reason why not."""
    names = [tensor.name for tensor in emissions_model(model).inputs]
    if not names or any(name not in ID_INPUTS for name in names):
        return {"metadata": [], "mediapipe": {}, "error": (
            f"No metadata: the model's inputs {names} are not token-id inputs named "
            f"{list(ID_INPUTS)}, so the files carry no vocabulary")}
    crf = Predictions(model).crf
    crf = None if crf is None else ModelCard.crf_section(*[
        keras.ops.convert_to_numpy(w) for w in (crf.transitions, crf.start_transitions,
                                                crf.end_transitions)])
    card = ModelCard.card_dict(report["task"], labels, report["sequence_length"], tokenizer,
                      tokenizer.lowercase, metric="accuracy", crf=crf,
                      metrics={row["artifact"]: row["metric"] for row in report["artifacts"]},
                      source_run=report["source_run"], version=__version__,
                      quantization={"recipe": report["quantization"]})
    card["inputs"] = [entry for entry in card["inputs"] if entry["name"] in names]
    vocabulary = tokenizer.get_vocabulary()
    for name in ("model_fp32.tflite", "model_int8.tflite"):
        embed_metadata(output / name, card, vocabulary, labels)
    atomic_files.write_text(output / "model_card.json", json.dumps(card, indent=2))
    return {"metadata": ["model_fp32.tflite", "model_int8.tflite"], "mediapipe": {},
            "error": None}
