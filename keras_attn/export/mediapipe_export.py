"""MediaPipe-ready classifiers: `model_int8_mediapipe.tflite` and `model_fp32_mediapipe.tflite`,
scored with MediaPipe's own `TextClassifier` against the Keras float model.

MediaPipe Tasks (`com.google.mediapipe:tasks-text` on Android, `@mediapipe/tasks-text` on the
web, `mediapipe.tasks.python.text` in Python; one C++ core) classifies text with a `.tflite`
file that carries TFLite metadata: a BERT tokenizer process unit with the vocabulary, input
tensor metadata named `ids` / `mask` / `segment_ids`, labels on the output. Its output must be
one float32 (or uint8) tensor, which it reports as the scores as is. So the MediaPipe files are
our exported `model_int8.tflite` / `model_fp32.tflite` (static batch 1, fixed length) with one
`SOFTMAX` appended after the logits (a float op after the int8 model's final `DEQUANTIZE`) and
the MediaPipe flavour of `keras_attn.export.tflite.tflite_metadata`:

    p = softmax(logits) = exp(logits - max) / sum(exp(logits - max))

MediaPipe tokenizes with its own BERT tokenizer, which lower-cases ASCII letters only and
neither strips accents nor case-folds other letters (its metadata has no option for that);
our models lower-case and strip accents the way BERT's uncased tokenizer does (NFD, drop
combining marks, full Unicode lower-casing). Texts made of ASCII get the same ids; texts with
accented or non-Latin cased letters ("Café", "ÉTÉ", "Ärger", "ß") get different ids, hence
different scores. `score_with_mediapipe` counts those texts: it runs the same file with LiteRT
on our tokenizer's ids, so any difference from MediaPipe's scores is the tokenization.
"""

import pathlib

import keras
import numpy as np
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from keras_attn.export.onnx.onnx_metadata import embed_onnx_metadata
from keras_attn.export.tflite.tflite_metadata import embed_metadata
from keras_attn.export.tflite.tflite_runtime import run_tflite
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.text.batching import PREDICT_BATCH_SIZE

MEDIAPIPE_VARIANTS = ("fp32", "int8")  # fp32 first: it finds the texts tokenized differently
# Same float file, same ids: MediaPipe and LiteRT agree within 6e-8 (measured; int8: 2e-3).
SAME_IDS_TOLERANCE = 1e-5


def append_softmax(source, destination):
    """Copies a classifier `.tflite` with one `SOFTMAX` appended to its single float32
    `(1, C)` output; the new output tensor and signature output are named `probabilities`."""
    model = flatbuffer_utils.read_model_from_bytearray(
        bytearray(pathlib.Path(source).read_bytes()))
    graph = model.subgraphs[0]
    logits = graph.tensors[graph.outputs[0]] if len(graph.outputs) == 1 else None
    if logits is None or logits.type != schema.TensorType.FLOAT32 or len(logits.shape) != 2:
        raise ValueError(
            f"{source}: MediaPipe's TextClassifier needs one float32 (1, labels) output to "
            "append a softmax to; this file has "
            f"{[(graph.tensors[i].shape.tolist(), graph.tensors[i].type) for i in graph.outputs]}")
    buffer = schema.BufferT()
    model.buffers.append(buffer)
    probabilities = schema.TensorT()
    probabilities.name, probabilities.type = b"probabilities", schema.TensorType.FLOAT32
    probabilities.shape, probabilities.buffer = np.array(logits.shape), len(model.buffers) - 1
    graph.tensors.append(probabilities)
    code = next((i for i, c in enumerate(model.operatorCodes)
                 if c.builtinCode == schema.BuiltinOperator.SOFTMAX), None)
    if code is None:
        opcode = schema.OperatorCodeT()
        opcode.builtinCode = opcode.deprecatedBuiltinCode = schema.BuiltinOperator.SOFTMAX
        opcode.version = 1
        model.operatorCodes.append(opcode)
        code = len(model.operatorCodes) - 1
    softmax = schema.OperatorT()
    softmax.opcodeIndex, softmax.inputs = code, [graph.outputs[0]]
    softmax.outputs = [len(graph.tensors) - 1]
    softmax.builtinOptionsType = schema.BuiltinOptions.SoftmaxOptions
    softmax.builtinOptions = schema.SoftmaxOptionsT()
    softmax.builtinOptions.beta = 1.0
    graph.operators.append(softmax)
    graph.outputs = [len(graph.tensors) - 1]
    for signature in model.signatureDefs or []:
        (output,) = signature.outputs
        output.name, output.tensorIndex = b"probabilities", len(graph.tensors) - 1
    flatbuffer_utils.write_model(model, str(destination))
    return pathlib.Path(destination)


def mediapipe_classifier(path):
    """MediaPipe's `TextClassifier` on a `.tflite` file (every label's score returned)."""
    # The optional `mediapipe` extra (keras-attn[mediapipe]), ~1.9 s to import.
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_classifier

    options = text_classifier.TextClassifierOptions(
        base_options=BaseOptions(model_asset_path=str(path)), max_results=-1)
    return text_classifier.TextClassifier.create_from_options(options)


def mediapipe_probabilities(classifier, texts, labels):
    """`(N, C)` float64 scores of MediaPipe's `TextClassifier`, columns in `labels` order."""
    rows = []
    for text in texts:
        (head,) = classifier.classify(text).classifications
        scores = {c.category_name: c.score for c in head.categories}
        if set(scores) != set(labels):
            raise ValueError(f"MediaPipe reported labels {sorted(scores)}, the model has "
                             f"{sorted(labels)}: the file's labels.txt is not the export's")
        rows.append([scores[label] for label in labels])
    return np.asarray(rows, "float64").reshape(len(texts), len(labels))


def _litert_probabilities(path, tokenizer, texts, num_labels):
    """The file's output on our tokenizer's ids, run with LiteRT."""
    if not texts:
        return np.zeros((0, num_labels))
    packed = tokenizer(list(texts))
    inputs = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
    return run_tflite(path, inputs).astype("float64")


def score_with_mediapipe(path, texts, keras_probabilities, labels, tokenizer,
                         tokenized_differently=None):
    """Agreement of MediaPipe's `TextClassifier` on `path` with the Keras float model.

    Args:
        path: a MediaPipe `.tflite` file (`write_mediapipe_artifacts`).
        texts: list of str.
        keras_probabilities: `(N, C)` softmax of the Keras float model's logits on `texts`.
        labels: list of str, in output order.
        tokenizer: the export's `WordPieceTokenizer` (our ids, for the tokenization check).
        tokenized_differently: `(N,)` bool array from the fp32 file's score, or `None` to
            find it here: texts whose MediaPipe scores differ from the same file run by
            LiteRT on our ids by more than `SAME_IDS_TOLERANCE`. Only a float file tells:
            on the int8 file MediaPipe's and LiteRT's int8 kernels round differently
            (|dp| ~1e-2 on the same ids) and the int8 output hides small differences.

    Returns:
        dict: `texts`, `label_agreement` (MediaPipe's top label equals Keras'),
        `max_abs_probability_diff`, `tokenized_differently` (count),
        `tokenized_differently_non_ascii` (how many of those contain a non-ASCII
        character), `max_abs_probability_diff_same_tokens` (over the other texts),
        `max_abs_probability_diff_vs_litert_same_tokens` (MediaPipe vs LiteRT on the same
        file, over the other texts: the runtimes alone), `examples` (up to 5 texts
        tokenized differently) and `differs` (the `(N,)` mask).
    """
    texts = list(texts)
    reference = np.asarray(keras_probabilities, "float64")
    if reference.shape != (len(texts), len(labels)):
        raise ValueError(f"`keras_probabilities` must have shape ({len(texts)}, {len(labels)})"
                         f" (texts, labels). Received: shape={reference.shape}")
    with mediapipe_classifier(path) as classifier:
        scores = mediapipe_probabilities(classifier, texts, labels)
    litert = _litert_probabilities(path, tokenizer, texts, len(labels))
    differs = tokenized_differently
    if differs is None:
        differs = np.abs(scores - litert).max(-1, initial=0.0) > SAME_IDS_TOLERANCE
    different = [t for t, d in zip(texts, differs) if d]
    same = ~np.asarray(differs, bool)
    return {
        "texts": len(texts),
        "label_agreement": float(np.mean(scores.argmax(-1) == reference.argmax(-1)))
        if texts else 1.0,
        "max_abs_probability_diff": float(np.abs(scores - reference).max(initial=0.0)),
        "tokenized_differently": len(different),
        "tokenized_differently_non_ascii": sum(not t.isascii() for t in different),
        "max_abs_probability_diff_same_tokens": float(
            np.abs(scores[same] - reference[same]).max(initial=0.0)),
        "max_abs_probability_diff_vs_litert_same_tokens": float(
            np.abs(scores[same] - litert[same]).max(initial=0.0)),
        "examples": different[:5],
        "differs": differs,
    }


def write_mediapipe_artifacts(export_dir, card, vocabulary, texts, keras_probabilities,
                              tokenizer):
    """Writes `model_{fp32,int8}_mediapipe.tflite` beside the export's `model_fp32.tflite`
    and `model_int8.tflite`, and scores each with MediaPipe's `TextClassifier`.

    Args:
        export_dir: a `keras-attn export` directory of a classifier.
        card: its model card dict.
        vocabulary: list of str, the `vocab.txt` lines.
        texts: list of str, the texts to score (evaluation set and golden texts).
        keras_probabilities: `(N, C)` Keras float probabilities on `texts`.
        tokenizer: the export's `WordPieceTokenizer`.

    Returns:
        The report section: dict file name -> `score_with_mediapipe` dict (without
        `differs`, plus `size_bytes`); the texts tokenized differently are those of the fp32
        file.
    """
    if card["task"] != "classification":
        raise ValueError("MediaPipe Tasks has a text classifier, no token classifier: only "
                         f"classification exports get MediaPipe files. Received: task="
                         f"{card['task']!r}")
    export_dir = pathlib.Path(export_dir)
    section, differs = {}, None
    for variant in MEDIAPIPE_VARIANTS:
        source = export_dir / f"model_{variant}.tflite"
        if not source.is_file():
            continue
        path = append_softmax(source, export_dir / f"model_{variant}_mediapipe.tflite")
        embed_metadata(path, card, vocabulary, card["labels"], mediapipe=True)
        row = score_with_mediapipe(path, texts, keras_probabilities, card["labels"],
                                   tokenizer, differs)
        differs = row.pop("differs")
        section[path.name] = {"size_bytes": path.stat().st_size, **row}
    return section


def keras_probabilities(model, tokenizer, texts, batch_size=PREDICT_BATCH_SIZE):
    """Softmax of the Keras float classifier's logits on `texts`, `(N, C)` float64."""
    rows = []
    for start in range(0, len(texts), batch_size):
        packed = tokenizer(texts[start:start + batch_size])
        x = {name: np.asarray(packed[name]).astype("int32") for name in ID_INPUTS}
        logits = keras.ops.convert_to_numpy(model(x, training=False)).astype("float64")
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        rows.append(exp / exp.sum(-1, keepdims=True))
    return np.concatenate(rows)


def self_describing_artifacts(export_dir, model, tokenizer, texts, log=None):
    """What `keras-attn export` adds for issue 23, in one call: the export's
    `model_card.json`, `vocab.txt` and `labels.txt` embedded in every `.tflite` file of
    `export_dir` (TFLite metadata, `embed_metadata`; `model_text.tflite` included) and every
    `.onnx` file (`metadata_props`, `embed_onnx_metadata`), and for a classifier the
    MediaPipe files scored on `texts` (`write_mediapipe_artifacts`).

    Without the `mediapipe` extra (MediaPipe's `TextClassifier`, which scores the MediaPipe
    files) the metadata is still embedded; the MediaPipe files are not written and the
    section says why.

    Returns:
        The report section: `{"metadata": [file names], "mediapipe": {...} or None,
        "error": None or why the MediaPipe files were not written}`.
    """
    log = log or (lambda message: None)
    export_dir = pathlib.Path(export_dir)
    files = ExportDirectory(export_dir).model_card("the metadata embedded in every model file")
    card, vocabulary = files.card, files.vocabulary
    embedded = []
    for path in sorted(export_dir.glob("model_*.tflite")):
        if path.stem.endswith("_mediapipe"):
            continue  # MediaPipe files get their own flavour
        embed_metadata(path, card, vocabulary, card["labels"])
        embedded.append(path.name)
    for path in sorted(export_dir.glob("*.onnx")):
        embed_onnx_metadata(path, card, vocabulary, card["labels"])
        embedded.append(path.name)
    log(f"metadata (vocab.txt, labels.txt, model_card.json) embedded in {', '.join(embedded)}")
    if card["task"] != "classification":
        return {"metadata": embedded, "mediapipe": None, "error": None}
    try:
        # The optional `mediapipe` extra: MediaPipe's TextClassifier scores the files.
        import mediapipe  # noqa: F401
    except ImportError as error:
        message = (f"MediaPipe files not written: scoring them needs MediaPipe's "
                   f"TextClassifier ({error}; pip install 'keras-attn[mediapipe]')")
        log(message)
        return {"metadata": embedded, "mediapipe": None, "error": message}
    texts = list(texts)
    log(f"MediaPipe TextClassifier files, scored on {len(texts):,} texts")
    section = write_mediapipe_artifacts(
        export_dir, card, vocabulary, texts, keras_probabilities(model, tokenizer, texts),
        tokenizer)
    return {"metadata": embedded, "mediapipe": section, "error": None}


def self_describing_markdown(section):
    """Report lines of `self_describing_artifacts`'s section (empty for reports without it)."""
    if not section:
        return []
    lines = ["", "## Self-describing TFLite files and MediaPipe", "",
             "Vocabulary, labels and model card embedded (TFLite metadata, ONNX "
             "`metadata_props`) in: "
             + ", ".join(f"`{name}`" for name in section["metadata"]) + "."]
    if section["error"]:
        lines += ["", section["error"] + "."]
    if section["mediapipe"]:
        lines += ["", "MediaPipe `TextClassifier` vs the Keras float model (tokenized "
                  "differently: MediaPipe's scores differ from LiteRT's on our ids for the "
                  "same file; counted reliably on the fp32 file, the int8 output hides "
                  "small differences):", "",
                  "| file | texts | label agreement | max \\|Δp\\| | tokenized differently "
                  "(non-ASCII) | max \\|Δp\\| same tokens | vs LiteRT, same tokens | size |",
                  "| --- " * 8 + "|"]
        for name, row in section["mediapipe"].items():
            lines.append(
                f"| `{name}` | {row['texts']:,} | {row['label_agreement']:.4f} | "
                f"{row['max_abs_probability_diff']:.2e} | {row['tokenized_differently']} "
                f"({row['tokenized_differently_non_ascii']}) | "
                f"{row['max_abs_probability_diff_same_tokens']:.2e} | "
                f"{row['max_abs_probability_diff_vs_litert_same_tokens']:.2e} | "
                f"{row['size_bytes'] / 1e6:.1f} MB |")
    return lines
