"""One interface over every artifact of a classification or NER run: texts in, labels or
entities out.

`load_predictor(path)` recognises (and reads beside it):

- a `keras-attn train` run directory or its `model.keras`: the Keras model (the run's
  `config.json` for lower-casing and `data.max_length`, `vocab.txt`, `labels.txt`);
- a `keras-attn export` directory: its `saved_model/`;
- a `saved_model/` directory: `serving_default`, text in, tokenizer and decoding in-graph
  (labels and task from its `metadata` signature);
- `model_<variant>.tflite` with token-id inputs: LiteRT, one text at a time (`vocab.txt`,
  `model_card.json`, or without them the copies embedded in the file's TFLite metadata,
  `keras_attn.export.tflite.tflite_metadata`); a file with length buckets
  (`model_<variant>_buckets.tflite`) runs each text on the shortest signature that holds
  its tokens (`keras_attn.export.tflite.tflite_runtime.BucketedTFLite`);
- `model_text.tflite` (text input): LiteRT with the tf-text custom ops (`model_card.json`);
- `model.onnx`, `model_dynamic_int8.onnx`: onnxruntime (`vocab.txt`, `model_card.json`).

Every predictor returns one dict per text:

- classification: `{"label": str, "probabilities": {label: float}}`;
- NER: `{"entities": [{"type", "start", "end", "text"}], "words": [{"text", "start", "end",
  "tag"}], "num_truncated_words": int}`; `start`/`end` are code-point offsets into the text
  (Python `str` indices, end exclusive).

The ids-in artifacts are tokenized in Python (`WordPieceTokenizer` with the model card's
settings) and decoded by the same code as the Python reference path and the golden vectors
(`keras_attn.text.entity_prediction.predict_entities`: BERT word splitting, first-piece tags,
the CRF's Viterbi path with the card's transitions for a CRF tagger, IOB2 repair, entity
spans). `model_text.tflite` cuts words with tf-text inside the graph: its `words` are the
words the graph located (words wholly past the sequence length are counted in
`num_truncated_words`, not listed), and on the rare characters listed in
`keras_attn.export.text_tflite` its word boundaries differ from BERT's.
"""

import pathlib

import keras
import numpy as np
import tensorflow as tf

from keras_attn.errors import first_line
from keras_attn.export.artifacts import ArtifactLoadError
from keras_attn.export.artifacts import load_artifact
from keras_attn.export.artifacts import load_saved_model
from keras_attn.layers.validation import check_int
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.export_directory import ExportDirectoryError
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import load_keras_model
from keras_attn.runs.run_directory import output_count
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import task_spec
from keras_attn.stages.inference.ids_predictor import IdsPredictor
from keras_attn.stages.inference.predictor_base import Predictor
from keras_attn.stages.inference.predictor_base import PredictorError
from keras_attn.stages.inference.predictor_base import classification_result
from keras_attn.stages.inference.predictor_base import ner_result
from keras_attn.stages.inference.predictor_base import python_ner_results
from keras_attn.stages.inference.predictor_base import softmax
from keras_attn.stages.inference.text_tflite_predictor import TextTFLitePredictor
from keras_attn.text.label_vocabulary import LabelVocabulary

TASKS = DEPLOYABLE_TASKS
__all__ = ["IdsPredictor", "KerasPredictor", "Predictor", "PredictorError",
           "SavedModelPredictor", "TextTFLitePredictor", "load_predictor"]


# --- Keras run ------------------------------------------------------------------------------


class KerasPredictor(Predictor):
    """The float Keras model of a `keras-attn train` run, with the run's tokenizer settings.

    Args:
        model: a `BertClassifier` or `BertTokenClassifier` (or any model taking the three id
            inputs and returning logits, e.g. a `quantize_model` copy).
        tokenizer: its `WordPieceTokenizer`.
        labels: its `LabelVocabulary`.
        task: `"classification"` or `"ner"`.
        path: where the model came from.
    """

    def __init__(self, model, tokenizer, labels, task, path):
        super().__init__(path, "keras", task, labels)
        self.model = model
        self.tokenizer = tokenizer

    def _predict(self, texts):
        if not texts:
            return []
        if self.task == "ner":
            return python_ner_results(self.model, self.tokenizer, self.labels, texts)
        packed = self.tokenizer(texts)
        x = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
        logits = keras.ops.convert_to_numpy(self.model(x, training=False))
        return [classification_result(self.labels, p) for p in softmax(logits)]


def _load_run(run_dir, model_path):
    run = RunDirectory(run_dir)
    try:
        run.require("config.json", "vocab.txt", "labels.txt",
                    needed_for=f"{model_path.name} is read with its run directory's files")
        task = run.task
        if task not in TASKS:
            raise PredictorError(
                f"{run.path / 'config.json'}: task {task!r} has no predictor; `keras-attn "
                f"predict` takes {' and '.join(TASKS)} runs")
        tokenizer, labels = run.tokenizer(), run.labels()
        model = load_keras_model(model_path)
    except RunDirectoryError as error:
        raise PredictorError(str(error)) from None
    outputs = output_count(model)
    if outputs is not None and outputs != len(labels):
        raise PredictorError(
            f"{model_path} has {outputs} outputs but {run.path / 'labels.txt'} lists "
            f"{len(labels)} labels: the files come from different runs")
    return KerasPredictor(model, tokenizer, labels, task, model_path)


# --- SavedModel ---------------------------------------------------------------------------


class SavedModelPredictor(Predictor):
    """The `serving_default` signature of a keras-attn SavedModel (text in)."""

    def __init__(self, path):
        try:
            self.saved_model = load_saved_model(path)
        except Exception as error:  # noqa: BLE001 - OSError, DecodeError, tf errors, ...
            raise PredictorError(f"{path}: TensorFlow cannot load this SavedModel "
                                 f"({first_line(error)}); re-run `keras-attn export`") from None
        signatures = self.saved_model.signatures
        if "metadata" not in signatures or "serving_default" not in signatures:
            raise PredictorError(
                f"{path} has signatures {sorted(signatures)}, not the `serving_default` and "
                "`metadata` of a keras-attn SavedModel: export it with `keras-attn export`")
        metadata = {k: v.numpy() for k, v in signatures["metadata"]().items()}
        task = {b"classification": "classification", b"tagging": "ner"}[bytes(metadata["task"])]
        labels = LabelVocabulary([label.decode("utf-8") for label in metadata["labels"]])
        super().__init__(path, "saved_model", task, labels)
        self.serve = signatures["serving_default"]

    def _predict(self, texts):
        if not texts:
            return []
        out = {k: v.numpy() for k, v in self.serve(text=tf.constant(texts, tf.string)).items()}
        if self.task == "classification":
            return [classification_result(self.labels, p) for p in out["probabilities"]]
        results = []
        for row in range(len(texts)):
            n, w = int(out["num_entities"][row]), int(out["num_words"][row])
            entities = [{"type": out["entity_type"][row, i].decode("utf-8"),
                         "start_char": out["entity_start"][row, i],
                         "end_char": out["entity_end"][row, i],
                         "text": out["entity_text"][row, i].decode("utf-8")} for i in range(n)]
            words = [(out["words"][row, i].decode("utf-8"), out["word_start"][row, i],
                      out["word_end"][row, i], out["word_tags"][row, i].decode("utf-8"))
                     for i in range(w)]
            results.append(ner_result(entities, words, out["num_truncated_words"][row]))
        return results


# --- model files (TFLite, ONNX) ------------------------------------------------------------


def _load_file(path, num_threads):
    """The predictor of a `.tflite` or `.onnx` file, decoded with its model card."""
    try:
        artifact = load_artifact(path, num_threads)
        card = _model_card(path, artifact.embedded_card)
    except ArtifactLoadError as error:
        raise PredictorError(str(error)) from None
    if artifact.kind == "text_tflite":
        return TextTFLitePredictor(artifact, card)
    if artifact.run_logits is None or not set(artifact.input_names) <= set(ID_INPUTS) \
            or len(artifact.output_shapes) != 1:
        raise PredictorError(
            f"{path} has inputs {list(artifact.input_names)} and outputs "
            f"{list(artifact.output_shapes)}; keras-attn models take `text` (TFLite) or (a "
            f"subset of) {list(ID_INPUTS)} and return `logits`")
    if artifact.length is not None and artifact.length != card.sequence_length:
        raise PredictorError(
            f"{path} takes {artifact.length} tokens but its model_card.json says "
            f"sequence_length={card.sequence_length}: the files come from different exports")
    _check_outputs(path, next(iter(artifact.output_shapes.values())), card)
    try:
        return IdsPredictor(path, artifact.kind, artifact.run_logits, card)
    except ExportDirectoryError as error:
        raise PredictorError(str(error)) from None


def _check_outputs(artifact, shape, model_card):
    """The artifact's logits must have the card task's `TaskSpec.logits_layout` (`(B, C)`
    for classification, `(B, L, C)` for NER) with one score per label of the card."""
    card, labels = model_card.card, model_card.labels
    spec = task_spec(card["task"])
    layout = spec.logits_layout
    if len(shape) != spec.logits_rank or shape[-1] != len(labels):
        raise PredictorError(
            f"{artifact} outputs logits of shape {list(shape)}, but its model_card.json "
            f"describes a {card['task']} model with {len(labels)} labels, logits {layout}: "
            "the files come from different exports; copy them from the same export directory")


def _model_card(path, read_embedded):
    """The `ModelCard` of a model file: the export directory's side files beside it, else
    the copies embedded in the file (`read_embedded()`, `None` when it has none)."""
    export = ExportDirectory(path.parent)
    try:
        if export.is_export():
            return export.model_card(f"{path.name} is decoded with the labels, task and "
                                     "tokenizer settings of its export directory")
        embedded = read_embedded()
    except ExportDirectoryError as error:
        raise PredictorError(str(error)) from None
    if embedded is None:
        raise PredictorError(
            f"{path.parent / 'model_card.json'} is missing: {path.name} is decoded with the "
            "labels, task and tokenizer settings of the model_card.json that `keras-attn "
            "export` writes beside it (or embeds in the file)")
    return embedded


# --- loading ------------------------------------------------------------------------------



def load_predictor(path, num_threads=None):
    """The predictor of any keras-attn artifact (see the module docstring).

    Args:
        path: str or path-like: a run directory or its `model.keras`, an export directory,
            a `saved_model/` directory, a `.tflite` or an `.onnx` file.
        num_threads: int or `None`: CPU threads of LiteRT / onnxruntime (their default when
            `None`: 1 thread for LiteRT, one per core for onnxruntime).

    Returns:
        A `Predictor`.

    Raises:
        PredictorError: unknown kind of path, a missing or inconsistent side file.

    Example:
    >>> load_predictor("nowhere/model.onnx")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    keras_attn.stages.inference.predictor_base.PredictorError: nowhere/model.onnx does not exist...
    """
    path = pathlib.Path(path)
    check_int("num_threads", num_threads, low=1, optional=True)
    if not path.exists():
        raise PredictorError(
            f"{path} does not exist: give a run directory or its model.keras, an export "
            "directory, a saved_model/ directory, a .tflite or an .onnx file")
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return SavedModelPredictor(path)
        if (path / "model.keras").is_file():
            return _load_run(path, path / "model.keras")
        if (path / "saved_model" / "saved_model.pb").is_file():
            return SavedModelPredictor(path / "saved_model")
        raise PredictorError(
            f"{path} is not a run directory (no model.keras), a SavedModel (no "
            "saved_model.pb) or an export directory (no saved_model/): point at one of those "
            "or at a .keras, .tflite or .onnx file")
    suffix = path.suffix.lower()
    if suffix == ".keras":
        return _load_run(path.parent, path)
    if suffix in (".tflite", ".onnx"):
        return _load_file(path, num_threads)
    raise PredictorError(
        f"{path}: unknown kind of artifact {suffix or '(no extension)'!r}; `keras-attn "
        "predict` runs .keras, .tflite and .onnx files and SavedModel, run and export "
        "directories")
