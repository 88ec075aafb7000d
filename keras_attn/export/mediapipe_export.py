"""MediaPipe-ready classifiers: `model_int8_mediapipe.tflite` and `model_fp32_mediapipe.tflite`,
scored with MediaPipe's own `TextClassifier` against the Keras float model.

MediaPipe Tasks (`com.google.mediapipe:tasks-text` on Android, `@mediapipe/tasks-text` on the
web, `mediapipe.tasks.python.text` in Python; one C++ core) classifies text with a `.tflite`
file that carries TFLite metadata: a BERT tokenizer process unit with the vocabulary, input
tensor metadata named `ids` / `mask` / `segment_ids`, labels on the output. Its output must be
one float32 (or uint8) tensor, which it reports as the scores as is. So the MediaPipe files are
our exported `model_int8.tflite` / `model_fp32.tflite` (static batch 1, fixed length) with one
`SOFTMAX` appended after the logits (a float op after the int8 model's final `DEQUANTIZE`) and
the MediaPipe flavour of `keras_attn.export.tflite_metadata`:

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

import numpy as np

from keras_attn.export.tflite_metadata import embed_metadata

MEDIAPIPE_VARIANTS = ("int8", "fp32")
# Same file, same ids: LiteRT and MediaPipe run the same kernels (measured max |dp| ~1e-7).
SAME_IDS_TOLERANCE = 1e-5


def append_softmax(source, destination):
    """Copies a classifier `.tflite` with one `SOFTMAX` appended to its single float32
    `(1, C)` output; the new output tensor and signature output are named `probabilities`."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

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


def _litert_probabilities(path, tokenizer, texts):
    """The file's output on our tokenizer's ids, run with LiteRT."""
    from keras_attn.export.tflite_export import run_tflite

    if not texts:
        return np.zeros((0, 0))
    packed = tokenizer(list(texts))
    inputs = {name: np.asarray(packed[name]).astype("int32")
              for name in ("token_ids", "segment_ids", "padding_mask")}
    return run_tflite(path, inputs).astype("float64")


def score_with_mediapipe(path, texts, keras_probabilities, labels, tokenizer):
    """Agreement of MediaPipe's `TextClassifier` on `path` with the Keras float model.

    Args:
        path: a MediaPipe `.tflite` file (`write_mediapipe_artifacts`).
        texts: list of str.
        keras_probabilities: `(N, C)` softmax of the Keras float model's logits on `texts`.
        labels: list of str, in output order.
        tokenizer: the export's `WordPieceTokenizer` (our ids, for the tokenization check).

    Returns:
        dict: `texts`, `label_agreement` (MediaPipe's top label equals Keras'),
        `max_abs_probability_diff`, `tokenized_differently` (texts whose MediaPipe scores
        differ from the same file run by LiteRT on our ids by more than
        `SAME_IDS_TOLERANCE`), `tokenized_differently_non_ascii` (how many of those contain
        a non-ASCII character), `max_abs_probability_diff_same_tokens` (over the other
        texts) and `examples` (up to 5 texts tokenized differently).
    """
    texts = list(texts)
    reference = np.asarray(keras_probabilities, "float64")
    if reference.shape != (len(texts), len(labels)):
        raise ValueError(f"`keras_probabilities` must have shape ({len(texts)}, {len(labels)})"
                         f" (texts, labels). Received: shape={reference.shape}")
    with mediapipe_classifier(path) as classifier:
        scores = mediapipe_probabilities(classifier, texts, labels)
    ours = _litert_probabilities(path, tokenizer, texts)
    differs = np.abs(scores - ours).max(-1, initial=0.0) > SAME_IDS_TOLERANCE
    different = [t for t, d in zip(texts, differs) if d]
    same = ~differs
    return {
        "texts": len(texts),
        "label_agreement": float(np.mean(scores.argmax(-1) == reference.argmax(-1)))
        if texts else 1.0,
        "max_abs_probability_diff": float(np.abs(scores - reference).max(initial=0.0)),
        "tokenized_differently": len(different),
        "tokenized_differently_non_ascii": sum(not t.isascii() for t in different),
        "max_abs_probability_diff_same_tokens": float(
            np.abs(scores[same] - reference[same]).max(initial=0.0)),
        "examples": different[:5],
    }


def write_mediapipe_artifacts(export_dir, card, vocabulary, texts, keras_probabilities,
                              tokenizer):
    """Writes `model_{int8,fp32}_mediapipe.tflite` beside the export's `model_int8.tflite`
    and `model_fp32.tflite`, and scores each with MediaPipe's `TextClassifier`.

    Args:
        export_dir: a `keras-attn export` directory of a classifier.
        card: its model card dict.
        vocabulary: list of str, the `vocab.txt` lines.
        texts: list of str, the texts to score (evaluation set and golden texts).
        keras_probabilities: `(N, C)` Keras float probabilities on `texts`.
        tokenizer: the export's `WordPieceTokenizer`.

    Returns:
        The report section: dict file name -> `score_with_mediapipe` dict (plus `size_bytes`).
    """
    if card["task"] != "classification":
        raise ValueError("MediaPipe Tasks has a text classifier, no token classifier: only "
                         f"classification exports get MediaPipe files. Received: task="
                         f"{card['task']!r}")
    export_dir = pathlib.Path(export_dir)
    section = {}
    for variant in MEDIAPIPE_VARIANTS:
        source = export_dir / f"model_{variant}.tflite"
        if not source.is_file():
            continue
        path = append_softmax(source, export_dir / f"model_{variant}_mediapipe.tflite")
        embed_metadata(path, card, vocabulary, card["labels"], mediapipe=True)
        section[path.name] = {"size_bytes": path.stat().st_size,
                              **score_with_mediapipe(path, texts, keras_probabilities,
                                                     card["labels"], tokenizer)}
    return section
