"""Look inside a trained BERT model: attention maps of every layer and head for a sentence.

    attention_maps(model, inputs)  ->  (L, B, H, S, S) numpy probabilities
    explain(run_dir, text, "explain.png")  ->  one PNG: the prediction on top, then one row
        of heatmaps per layer, one column per head, word pieces on both axes.

The maps come from the model's own layers: the backbone's embedding layers and each
`TransformerEncoderBlock` are called in order with `return_attention_scores=True`, so the
masking and softmax are exactly the ones of `MultiHeadAttention` (no re-implementation that
could drift from it). The replay is checked against the backbone's `sequence_output`.
"""

import pathlib

import numpy as np
from keras import ops

from keras_attn.errors import KerasAttnError
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.runs.export_directory import ExportDirectory
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import RunDirectoryError
from keras_attn.runs.task_registry import DEPLOYABLE_TASKS
from keras_attn.runs.task_registry import task_spec
from keras_attn.stages.prediction_header import prediction_header
from keras_attn.text.entity_prediction import ner_model_inputs
from keras_attn.text.entity_prediction import predict_entities
from keras_attn.text.word_splitter import split_words
from keras_attn.visualization import plot_attention_grid
from keras_attn.visualization import plot_position_embeddings
from keras_attn.visualization import plot_position_encoding
from keras_attn.visualization import pyplot

# Replay vs. the backbone's own forward pass: the same layers run on the same inputs, so
# any difference beyond rounding means the backbone graph is not what the replay assumes.
_REPLAY_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}
# Entity highlight colours by type (the CoNLL ones first), then a cycle for other types.


class ExplainError(KerasAttnError, ValueError):
    """A run directory, text or option that `explain` cannot work with (message says why)."""


def find_backbone(model):
    """The `BertBackbone` of a BERT-family model (the model itself or its `.backbone`).

    Raises:
        ExplainError: the model has no `BertBackbone`.
    """
    if isinstance(model, BertBackbone):
        return model
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, BertBackbone):
        return backbone
    raise ExplainError(
        "attention maps are read from a BertBackbone (BertBackbone, BertClassifier, "
        "BertTokenClassifier, BertMaskedLM, ...), and this model has none. "
        f"Received: model={type(model).__name__}"
    )


def attention_maps(model, inputs):
    """Attention probabilities of every layer and head of a BERT-family model.

    `A[l, b, h] = softmax(Q K^T / sqrt(d_k) + M)` of head `h` in block `l` for example `b`,
    with `M` the padding mask (padded keys get probability 0; padded query rows are the
    model's own, normally uniform over the real keys). Dropout is off (inference).

    Args:
        model: a `BertBackbone` or a model holding one as `.backbone` (`BertClassifier`,
            `BertTokenClassifier`, ...).
        inputs: dict of `(B, S)` ints: `token_ids`, `segment_ids`, `padding_mask` (extra
            keys such as a CRF's `label_mask` are ignored).

    Returns:
        float32 numpy array `(L, B, H, S, S)`: layer, example, head, query, key.

    Raises:
        ExplainError: no `BertBackbone`, or a missing input.
        RuntimeError: the replayed layers do not reproduce the backbone's output.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=30, num_layers=2, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    >>> maps = attention_maps(backbone, {"token_ids": np.array([[2, 7, 9, 3]]),
    ...                                  "segment_ids": np.zeros((1, 4), "int32"),
    ...                                  "padding_mask": np.ones((1, 4), "int32")})
    >>> maps.shape, bool(np.allclose(maps.sum(-1), 1.0, atol=1e-5))
    ((2, 1, 2, 4, 4), True)
    """
    backbone = find_backbone(model)
    missing = [k for k in ("token_ids", "segment_ids", "padding_mask") if k not in inputs]
    if missing:
        raise ExplainError(
            f"`inputs` needs the keys token_ids, segment_ids and padding_mask; missing "
            f"{missing}. Received: keys={sorted(inputs)}"
        )
    token_ids = ops.convert_to_tensor(np.asarray(inputs["token_ids"]), "int32")  # (B, S)
    segment_ids = ops.convert_to_tensor(np.asarray(inputs["segment_ids"]), "int32")  # (B, S)
    padding_mask = ops.convert_to_tensor(np.asarray(inputs["padding_mask"]), "int32")  # (B, S)

    # The backbone's forward pass, layer by layer (see BertBackbone's functional graph).
    x = backbone.get_layer("embeddings")(token_ids, segment_ids=segment_ids)  # (B, S, d)
    x = backbone.get_layer("embeddings_layer_norm")(x)
    x = backbone.get_layer("embeddings_dropout")(x, training=False)  # (B, S, d)
    maps = []
    for block in backbone.transformer_layers:
        x, scores = block(x, padding_mask=padding_mask, return_attention_scores=True,
                          training=False)  # (B, S, d), (B, H, S, S)
        maps.append(ops.convert_to_numpy(ops.cast(scores, "float32")))

    reference = backbone({"token_ids": token_ids, "segment_ids": segment_ids,
                          "padding_mask": padding_mask}, training=False)["sequence_output"]
    difference = float(np.max(np.abs(
        ops.convert_to_numpy(ops.cast(x, "float32"))
        - ops.convert_to_numpy(ops.cast(reference, "float32"))
    )))
    tolerance = _REPLAY_TOLERANCE.get(backbone.compute_dtype, 1e-4)
    if not difference <= tolerance:
        raise RuntimeError(
            "Replaying the backbone's layers one by one gave a different output than the "
            f"backbone itself (max |difference| {difference:.3g} > {tolerance}): its layer "
            "graph is not embeddings -> LayerNorm -> encoder blocks, so the attention maps "
            "would not be the model's. Update keras_attn/stages/explain.py:attention_maps to match "
            "BertBackbone."
        )
    return np.stack(maps)  # (L, B, H, S, S)


# === Loading a run ===


class ExplainedModel:
    """A BERT model ready to explain: the Keras model, its tokenizer and labels.

    Attributes:
        model: the Keras model (`BertClassifier`, `BertTokenClassifier`, ...).
        task: the run's task, as its `RunDirectory` records it (`"classification"`,
            `"ner"`, `"mlm"`, ...).
        tokenizer: `WordPieceTokenizer` with the run's tokenizer settings (the ones in
            effect after continuing another run) and sequence length.
        labels: `LabelVocabulary` of a task in `DEPLOYABLE_TASKS` (its prediction is
            drawn), else `None` (attention maps only).
        run_dir: `pathlib.Path` of the training run the model came from.
        notes: list of str, what was resolved on the way (export directory -> run).
    """

    def __init__(self, model, task, tokenizer, labels, run_dir, notes):
        self.model = model
        self.task = task
        self.tokenizer = tokenizer
        self.labels = labels
        self.run_dir = run_dir
        self.notes = notes


def _resolve_run_dir(path):
    """The run directory behind `path` (a run directory, its model.keras, or an export
    directory), and notes on how it was found."""
    path = pathlib.Path(path)
    if not path.exists():
        raise ExplainError(
            f"{path} does not exist: pass a run directory (the output_dir of `keras-attn "
            "train CONFIG`, or the model.keras inside one) or an export directory made from "
            "one by `keras-attn export RUN`"
        )
    if path.is_file():
        if path.suffix != ".keras":
            raise ExplainError(
                f"{path} is a file but not a .keras model: pass a training run directory "
                "(or the model.keras inside one)"
            )
        path = path.parent
    if ExportDirectory(path).is_export() and not RunDirectory(path).is_run():
        return _source_run(path)
    return path, []  # its RunDirectory names any file it lacks


def _source_run(export_dir):
    """The run an export directory was made from (its model card's `source_run`)."""
    source = ExportDirectory(export_dir).source_run()
    if source and RunDirectory(source).is_run():
        note = (f"{export_dir} is an export directory: its TFLite/ONNX/SavedModel graphs do "
                f"not output attention, so the float Keras model of its source run {source} "
                "is explained")
        return pathlib.Path(source), [note]
    raise ExplainError(
        f"{export_dir} is an export directory, and the float model.keras of the run it was "
        f"exported from (model_card.json source_run={source!r}) is not there: pass that "
        "training run directory instead (the export holds no float Keras model; "
        "qat/model.keras is fake-quantized)"
    )


def load_explained_model(path):
    """Loads a training run (or the run behind an export directory) for `explain`.

    Everything is read through the run's `RunDirectory`: its task, its tokenizer settings
    (those in effect, after continuing another run), its labels and its model, which must
    output one score per label in the task's `TaskSpec.logits_layout`.

    Args:
        path: a `keras-attn train` output directory, the `model.keras` inside one, or a
            `keras-attn export` output directory whose source run still exists.

    Returns:
        `ExplainedModel`.

    Raises:
        ExplainError: the path is not a run, a file is missing (the message names it and
            the command that writes it), a quantization-aware run, a model that does not
            match the run's task and labels, or a model without a `BertBackbone`.
    """
    run_dir, notes = _resolve_run_dir(path)
    run = RunDirectory(run_dir)
    try:
        run.require("model.keras", "vocab.txt", "config.json", needed_for="explaining a run")
        _check_float_run(run)
        labels = run.labels() if run.task in DEPLOYABLE_TASKS else None
        model = run.load_model()
        backbone = find_backbone(model)
        tokenizer = run.tokenizer(run.sequence_length(limit=backbone.max_sequence_length))
    except RunDirectoryError as error:
        raise ExplainError(str(error)) from None
    if labels is None:
        notes.append(f"task {run.task!r} has no labelled outputs (the "
                     f"{' and '.join(DEPLOYABLE_TASKS)} tasks have): only the attention maps "
                     "are drawn")
    else:
        _check_task_model(run, model, labels)
    return ExplainedModel(model, run.task, tokenizer, labels, run_dir, notes)


def _check_float_run(run):
    """A quantization-aware run's model is fake-quantized and has no `BertBackbone`: its
    float run (from its lineage) is the one to explain."""
    lineage = run.lineage()
    if lineage.quantization is not None:
        raise ExplainError(
            f"{run.path} is a quantization-aware run (lineage.json: {lineage.quantization}); "
            "its fake-quantized model.keras has no BertBackbone to read attention from: "
            f"explain the float run it was made from, {lineage.source}"
        )


def _check_task_model(run, model, labels):
    """The model must output the logits of the run's task: `TaskSpec.logits_layout` with one
    score per line of `labels.txt`."""
    spec = task_spec(run.task)
    outputs = model.output
    logits = outputs.get("logits") if isinstance(outputs, dict) else outputs  # CRF: a dict
    shape = None if logits is None else tuple(logits.shape)
    if shape is None or len(shape) != spec.logits_rank or shape[-1] != len(labels):
        raise ExplainError(
            f"{run.path / 'model.keras'} ({type(model).__name__}) outputs logits of shape "
            f"{shape}, but {run.path / 'config.json'} says task {run.task!r}, logits "
            f"{spec.logits_layout}, and {run.path / 'labels.txt'} lists {len(labels)} labels: "
            "the files come from different runs; re-run the `keras-attn train CONFIG` that "
            "made the run"
        )


# === One sentence ===


def _parse_indices(name, values, count, what):
    """`values` (None = all) as a sorted list of valid indices in `range(count)`."""
    if values is None:
        return list(range(count))
    if isinstance(values, str):
        try:
            values = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ExplainError(
                f"`{name}` must be comma-separated integers like 0,5. Received: {name}="
                f"{values!r}"
            ) from None
    values = list(values)
    bad = [v for v in values if not isinstance(v, (int, np.integer)) or not 0 <= v < count]
    if bad or not values:
        raise ExplainError(
            f"`{name}` must list {what} indices from 0 to {count - 1} (the model has {count} "
            f"{what}s). Received: {name}={values}"
        )
    return sorted(set(int(v) for v in values))


def _sentence_inputs(explained, text):
    """Model inputs for one text, its word pieces, and how many pieces were cut."""
    tokenizer = explained.tokenizer
    pieces = tokenizer.tokenize([text]).to_list()[0]
    if not pieces:
        raise ExplainError(
            f"the text has no word pieces once normalized (control characters and spaces "
            f"only?). Received: text={text!r}"
        )
    truncated = max(0, len(pieces) - (tokenizer.sequence_length - 2))
    if _is_tagger(explained):
        words = [word for word, _, _ in split_words(text, tokenizer.strip_accents)]
        inputs, _, _ = ner_model_inputs(tokenizer, [words],
                                        bool(getattr(explained.model, "use_crf", False)))
    else:
        packed = tokenizer([text])
        inputs = {"token_ids": np.asarray(packed["token_ids"], "int32"),
                  "segment_ids": np.asarray(packed["segment_ids"], "int32"),
                  "padding_mask": np.asarray(packed["padding_mask"]).astype("int32")}
    length = int(inputs["padding_mask"][0].sum())
    vocabulary = tokenizer.get_vocabulary()
    tokens = [vocabulary[i] for i in inputs["token_ids"][0, :length]]
    return inputs, tokens, truncated, len(pieces)


def _prediction(explained, text, inputs):
    """The model's answer for the text: label + probabilities, entity spans, or `None`
    (a run without labels)."""
    if explained.labels is None:
        return None
    if not _is_tagger(explained):
        logits = np.asarray(ops.convert_to_numpy(
            explained.model(inputs, training=False)), "float64")[0]  # (C,)
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        labels = list(explained.labels.labels)
        return {"label": labels[int(probabilities.argmax())],
                "probabilities": dict(zip(labels, probabilities.round(6).tolist()))}
    result = predict_entities(explained.model, explained.tokenizer, explained.labels,
                              [text])[0]
    return {"entities": result["entities"], "words": result["words"],
            "tags": result["tags"], "num_truncated_words": result["num_truncated_words"]}


def _is_tagger(explained):
    """Whether the run's labels name word pieces (`TaskSpec.token_labels`: NER)."""
    return explained.labels is not None and task_spec(explained.task).token_labels


def explain(run_or_model_path, text, output_png, layers=None, heads=None,
            position_encoding_png=None, log=None):
    """Draws the attention maps and the prediction of a trained BERT model for one text.

    One PNG: a top panel with the prediction (the label and every class probability, or
    the text with its entities highlighted by type), then a grid of heatmaps, one row per
    layer and one column per head, on one colour scale (probability 0 to 1), with the
    word pieces the model read on both axes (queries down, keys across).

    Args:
        run_or_model_path: a `keras-attn train` run directory (or its `model.keras`), or a
            `keras-attn export` directory whose source run still exists.
        text: str, the sentence. Longer than the run's sequence length: cut, and said so.
        output_png: path of the PNG to write.
        layers: optional list of layer indices (or `"0,5"`). Defaults to all.
        heads: optional list of head indices (or `"0,3"`). Defaults to all.
        position_encoding_png: optional path; also write the position plots there (see
            `plot_model_position_encodings`).
        log: optional callable receiving notes (truncation, export -> run).

    Returns:
        dict: `path`, `tokens` (the pieces on the axes), `layers`, `heads`, `panels`
        (heatmaps drawn), `prediction` (`None` for a task without labels),
        `num_truncated_pieces`, `task` (the run's),
        `run_dir`, `maps` (`(len(layers), len(heads), S, S)` numpy probabilities drawn),
        `position_encoding_files` (dict, empty without `position_encoding_png`).

    Raises:
        ExplainError: bad path or run directory (see `load_explained_model`), empty text,
            or bad `layers` / `heads`.
        ImportError: matplotlib is not installed (`pip install keras-attn[docs]`).

    Example (on a trained run; the tests run it on tiny ones):

        summary = explain("runs/sst2", "a gripping, funny film", "explain.png")
        summary["prediction"]["label"], summary["panels"]  # ("positive", 72) for 6 x 12
    """
    log = log or (lambda message: None)
    if not isinstance(text, str) or not text.strip():
        raise ExplainError(f"the text to explain is empty. Received: text={text!r}")
    pyplot()  # fail before loading the model when matplotlib is missing
    explained = load_explained_model(run_or_model_path)
    for note in explained.notes:
        log(note)
    backbone = find_backbone(explained.model)
    layer_ids = _parse_indices("layers", layers, backbone.num_layers, "layer")
    head_ids = _parse_indices("heads", heads, backbone.num_heads, "head")

    inputs, tokens, truncated, num_pieces = _sentence_inputs(explained, text)
    if truncated:
        log(f"the text has {num_pieces} word pieces; the model reads "
            f"{explained.tokenizer.sequence_length} tokens ([CLS] + "
            f"{explained.tokenizer.sequence_length - 2} pieces + [SEP]), so the last "
            f"{truncated} were cut")
    maps = attention_maps(explained.model, inputs)  # (L, 1, H, S, S)
    n = len(tokens)
    drawn = maps[layer_ids][:, 0][:, head_ids][..., :n, :n]  # (l, h, n, n)
    prediction = _prediction(explained, text, inputs)


    figure = plot_attention_grid(
        output_png, drawn, tokens, row_labels=[f"layer {i}" for i in layer_ids],
        column_labels=[f"head {j}" for j in head_ids],
        header=prediction_header(prediction, text, truncated),
    )
    files = {}
    if position_encoding_png is not None:
        files = plot_model_position_encodings(explained.model, position_encoding_png)
    return {
        "position_encoding_files": files,
        "path": str(output_png), "tokens": tokens, "layers": layer_ids, "heads": head_ids,
        "panels": figure["panels"], "image_size": figure["image_size"],
        "prediction": prediction, "num_truncated_pieces": truncated,
        "task": explained.task, "run_dir": str(explained.run_dir), "maps": drawn,
    }


def plot_model_position_encodings(model, path, max_positions=128):
    """The sinusoidal PE matrix at the model's width, and the model's own position table.

    BERT learns its position embeddings instead of using the sinusoids of Vaswani et al.;
    both are drawn so they can be compared: `path` gets the sinusoidal matrix
    (`plot_position_encoding`), `<path stem>_learned.png` the learned table with the
    cosine similarity of its rows (`plot_position_embeddings`).

    Args:
        model: a BERT-family model (see `find_backbone`).
        path: PNG path of the sinusoidal plot.
        max_positions: int, number of positions drawn (capped at the model's table).

    Returns:
        dict naming the files written: `"sinusoidal position encoding"` and, for a model
        with a learned table, `"learned position embeddings"`.
    """
    backbone = find_backbone(model)
    length = min(backbone.max_sequence_length, max_positions)
    plot_position_encoding(path, length=length, dim=backbone.hidden_dim)
    files = {"sinusoidal position encoding": str(path)}
    table = getattr(backbone.get_layer("embeddings").position_embedding, "embeddings", None)
    if table is not None:
        learned = pathlib.Path(path).with_name(pathlib.Path(path).stem + "_learned.png")
        plot_position_embeddings(
            learned, ops.convert_to_numpy(table)[:length],
            title=f"this model's learned position embeddings ({length} x "
                  f"{backbone.hidden_dim})",
        )
        files["learned position embeddings"] = str(learned)
    return files
