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
  `keras_attn.export.tflite_metadata`); a file with length buckets
  (`model_<variant>_buckets.tflite`) runs each text on the shortest signature that holds
  its tokens (`keras_attn.export.tflite_runtime.BucketedTFLite`);
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

import abc
import pathlib

import keras
import numpy as np
import tensorflow as tf

from keras_attn.errors import KerasAttnError
from keras_attn.export.artifacts import onnx_logits
from keras_attn.export.artifacts import tflite_logits
from keras_attn.export.onnx_export import OnnxRunner
from keras_attn.export.onnx_metadata import onnx_settings
from keras_attn.export.serving_module import load_saved_model
from keras_attn.export.text_tflite import decode_text_entities
from keras_attn.export.text_tflite import text_interpreter
from keras_attn.export.tflite_metadata import TFLiteMetadataError
from keras_attn.export.tflite_metadata import settings_from_tflite
from keras_attn.export.tflite_runtime import default_signature_runner
from keras_attn.layers.crf import viterbi_decode
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.export_directory import ExportDirectoryError
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.run_directory import output_count
from keras_attn.text.batching import PREDICT_BATCH_SIZE
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.label_vocabulary import LabelVocabulary
from keras_attn.training.task_registry import DEPLOYABLE_TASKS
from keras_attn.training.task_registry import task_spec

ID_INPUTS = ("token_ids", "segment_ids", "padding_mask")
TASKS = DEPLOYABLE_TASKS


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


def _softmax(logits):
    logits = np.asarray(logits, "float64")
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def _classification_result(labels, probabilities):
    probabilities = np.asarray(probabilities, "float64")
    return {"label": labels.labels[int(np.argmax(probabilities))],
            "probabilities": {label: float(p) for label, p in zip(labels.labels, probabilities)}}


def _ner_result(entities, words, num_truncated_words):
    """`entities`: `entity_spans` dicts; `words`: `(text, start, end, tag)` tuples."""
    return {
        "entities": [{"type": e["type"], "start": int(e["start_char"]),
                      "end": int(e["end_char"]), "text": e["text"]} for e in entities],
        "words": [{"text": w, "start": int(s), "end": int(e), "tag": t} for w, s, e, t in words],
        "num_truncated_words": int(num_truncated_words),
    }


def _python_ner_results(model, tokenizer, labels, texts):
    results = []
    for item in predict_entities(model, tokenizer, labels, texts, batch_size=len(texts) or 1):
        words = [(w, s, e, t) for (w, s, e), t in zip(item["words"], item["tags"])]
        results.append(_ner_result(item["entities"], words, item["num_truncated_words"]))
    return results


# --- Keras run ------------------------------------------------------------------------------


class KerasPredictor(Predictor):
    """The float Keras model of a `keras-attn train` run, with the run's tokenizer settings.

    Args:
        model: a `BertClassifier` or `BertTokenClassifier` (or any model taking the three id
            inputs and returning logits, e.g. a `QatBert`).
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
            return _python_ner_results(self.model, self.tokenizer, self.labels, texts)
        packed = self.tokenizer(texts)
        x = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
        logits = keras.ops.convert_to_numpy(self.model(x, training=False))
        return [_classification_result(self.labels, p) for p in _softmax(logits)]


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
    except RunDirectoryError as error:
        raise PredictorError(str(error)) from None
    model = keras.models.load_model(model_path)
    outputs = output_count(model)
    if outputs is not None and outputs != len(labels):
        raise PredictorError(
            f"{model_path} has {outputs} outputs but {run.path / 'labels.txt'} lists "
            f"{len(labels)} labels: the files come from different runs")
    return KerasPredictor(model, tokenizer, labels, task, model_path)


# --- SavedModel -----------------------------------------------------------------------------


class SavedModelPredictor(Predictor):
    """The `serving_default` signature of a keras-attn SavedModel (text in)."""

    def __init__(self, path):
        try:
            self.saved_model = load_saved_model(path)
        except Exception as error:  # noqa: BLE001 - OSError, DecodeError, tf errors, ...
            raise PredictorError(f"{path}: TensorFlow cannot load this SavedModel "
                                 f"({_first_line(error)}); re-run `keras-attn export`") from None
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
            return [_classification_result(self.labels, p) for p in out["probabilities"]]
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
            results.append(_ner_result(entities, words, out["num_truncated_words"][row]))
        return results


# --- ids-in artifacts (TFLite, ONNX) --------------------------------------------------------


class _ArtifactModel:
    """Looks like a `BertTokenClassifier` to `predict_entities`: `use_crf`, and a call on the
    id inputs returning logits, or `{"logits", "tags"}` decoded with the card's CRF."""

    def __init__(self, run_logits, crf):
        self.run_logits = run_logits
        self.crf = crf
        self.use_crf = crf is not None

    def __call__(self, inputs, training=False):
        logits = self.run_logits({name: inputs[name] for name in ID_INPUTS})
        if self.crf is None:
            return logits
        tags = viterbi_decode(np.asarray(logits, "float32"), self.crf.transitions,
                              self.crf.start_transitions, self.crf.end_transitions,
                              mask=np.asarray(inputs["label_mask"]).astype(bool))
        return {"logits": logits, "tags": keras.ops.convert_to_numpy(tags)}


class IdsPredictor(Predictor):
    """A TFLite or ONNX artifact on token ids, tokenized and decoded in Python.

    Args:
        path: the artifact.
        kind: `"tflite"` or `"onnx"`.
        run_logits: callable, dict of `(B, L)` int32 arrays -> `(B, C)` or `(B, L, C)` logits.
        model_card: the export's `ModelCard` (task, labels, tokenizer settings, CRF).
    """

    def __init__(self, path, kind, run_logits, model_card):
        super().__init__(path, kind, model_card.task, model_card.label_vocabulary())
        self.run_logits = run_logits
        self.tokenizer = model_card.tokenizer()
        self.model = _ArtifactModel(run_logits, model_card.crf())

    def _predict(self, texts):
        if self.task == "ner":
            return _python_ner_results(self.model, self.tokenizer, self.labels, texts)
        if not texts:
            return []
        packed = self.tokenizer(texts)
        x = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
        return [_classification_result(self.labels, p) for p in _softmax(self.run_logits(x))]


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
    except (ExportDirectoryError, TFLiteMetadataError) as error:
        raise PredictorError(str(error)) from None
    if embedded is None:
        raise PredictorError(
            f"{path.parent / 'model_card.json'} is missing: {path.name} is decoded with the "
            "labels, task and tokenizer settings of the model_card.json that `keras-attn "
            "export` writes beside it (or embeds in the file)")
    return embedded


def _load_tflite(path, num_threads):
    try:
        interpreter = text_interpreter(path, num_threads=num_threads)
    except (ValueError, RuntimeError) as error:
        raise PredictorError(f"{path}: LiteRT cannot load it ({str(error).splitlines()[0]})") \
            from None
    runner = default_signature_runner(interpreter)
    inputs = runner.get_input_details()
    card = _model_card(path, lambda: settings_from_tflite(path))
    if set(inputs) == {"text"}:
        return TextTFLitePredictor(path, runner, card)
    if set(inputs) != set(ID_INPUTS):
        raise PredictorError(
            f"{path} has inputs {sorted(inputs)}; keras-attn TFLite models take `text` or "
            f"{list(ID_INPUTS)}")
    length = int(inputs["token_ids"]["shape"][1])
    if length != card.sequence_length:
        raise PredictorError(
            f"{path} takes {length} tokens but its model_card.json says sequence_length="
            f"{card.sequence_length}: the files come from different exports")
    (output,) = runner.get_output_details().values()
    _check_outputs(path, list(output["shape"]), card)
    return _ids_predictor(path, "tflite", tflite_logits(interpreter), card)


def _load_onnx(path, num_threads):
    try:
        runner = OnnxRunner(str(path), threads=num_threads)
    except Exception as error:  # noqa: BLE001 - onnxruntime's InvalidProtobuf, Fail, ...
        raise PredictorError(f"{path}: onnxruntime cannot load it ({_first_line(error)}); "
                             "re-run `keras-attn export`") from None
    card = _model_card(path, lambda: onnx_settings(runner.session, path))
    if len(runner.output_names) != 1 or not set(runner.input_names) <= set(ID_INPUTS):
        raise PredictorError(
            f"{path} has inputs {runner.input_names} and outputs {runner.output_names}; "
            f"keras-attn ONNX models take (a subset of) {list(ID_INPUTS)} and return `logits`")
    _check_outputs(path, runner.session.get_outputs()[0].shape, card)
    return _ids_predictor(path, "onnx", onnx_logits(runner), card)


def _ids_predictor(path, kind, run_logits, card):
    try:
        return IdsPredictor(path, kind, run_logits, card)
    except ExportDirectoryError as error:
        raise PredictorError(str(error)) from None


# --- model_text.tflite ----------------------------------------------------------------------


class TextTFLitePredictor(Predictor):
    """`model_text.tflite`: text in, tokenizer inside (tf-text custom ops), one text per call."""

    def __init__(self, path, runner, model_card):
        card, labels = model_card.card, model_card.label_vocabulary()
        super().__init__(path, "text_tflite", card["task"], labels)
        self.runner = runner
        self.crf = model_card.crf()
        outputs = runner.get_output_details()
        kind = "ner" if "word_ids" in outputs else "classification"
        if kind != card["task"]:
            raise PredictorError(
                f"{path} is a {kind} model but its model_card.json says task "
                f"{card['task']!r}: the files come from different exports")
        if outputs["logits"]["shape"][-1] != len(labels):
            raise PredictorError(
                f"{path} outputs {outputs['logits']['shape'][-1]} scores but model_card.json "
                f"lists {len(labels)} labels: the files come from different exports")

    def _predict(self, texts):
        results = []
        for text in texts:
            out = self.runner(text=np.array([text.encode("utf-8")], dtype=object))
            if self.task == "classification":
                results.append(_classification_result(self.labels, out["probabilities"][0]))
                continue
            decoded = decode_text_entities(out, text, self.labels, crf=self.crf)
            starts, ends = out["word_start"].reshape(-1), out["word_end"].reshape(-1)
            words = [(text[starts[i]:ends[i]], starts[i], ends[i], tag)
                     for i, tag in enumerate(decoded["tags"])
                     if i < len(starts) and starts[i] >= 0]
            results.append(_ner_result(decoded["entities"], words,
                                       decoded["num_truncated_words"]))
        return results


# --- loading --------------------------------------------------------------------------------


def _first_line(error):
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


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
    keras_attn.inference.predictor.PredictorError: nowhere/model.onnx does not exist...
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
    if suffix == ".tflite":
        return _load_tflite(path, num_threads or 1)
    if suffix == ".onnx":
        return _load_onnx(path, num_threads)
    raise PredictorError(
        f"{path}: unknown kind of artifact {suffix or '(no extension)'!r}; `keras-attn "
        "predict` runs .keras, .tflite and .onnx files and SavedModel, run and export "
        "directories")
