"""Self-describing `.tflite` files: TFLite metadata with the vocabulary, the labels and the
model card embedded, so one file is enough to tokenize, run and decode.

The TFLite convention (the `metadata_schema.fbs` of TFLite Support / MediaPipe Tasks) has two
parts, both inside the `.tflite` file:

- a `ModelMetadata` flatbuffer (file identifier `M001`) stored in one of the model's buffers
  and named by a `Model.metadata` entry `"TFLITE_METADATA"`: per input and output tensor a
  name, a description and the associated files it uses (`vocab.txt` on the token ids as
  `VOCABULARY`, `labels.txt` on the output as `TENSOR_AXIS_LABELS`; in `model_text.tflite`
  the vocabulary on the `text` input, whose tokenizer is in the graph, one entry per output
  and the labels on `logits` and `probabilities`), and at model level
  `model_card.json` (`DESCRIPTIONS`: task, sequence length, tokenizer settings such as
  lower-casing, special ids and, for a CRF tagger, the transition scores);
- the associated files themselves, as a zip archive appended after the flatbuffer (entries
  stored, offsets counted from the start of the file), so any zip reader opens the
  `.tflite` file as an archive: `zipfile.ZipFile("model_int8.tflite").namelist()`.

The MediaPipe flavour (`mediapipe=True`, for `TextClassifier`) also names the input tensors'
metadata `ids`, `mask`, `segment_ids` (what MediaPipe's BERT preprocessor looks up) and puts
a BERT tokenizer process unit with the vocabulary on the subgraph; it is written only into
files whose output is a probability (`keras_attn.export.mediapipe_export`), because MediaPipe
reports the output tensor as the scores as is.

The metadata flatbuffer is written by `_serialize`, a serializer of the schema's tables we
use (`_SCHEMA_FIELDS`, with the `flatbuffers` package TensorFlow depends on), so every export
writes it; it is read back with the generated code of the schema that the `mediapipe` wheel
ships (`mediapipe.tasks.metadata.metadata_schema_py_generated`, Google's `flatc` output for
`metadata_schema.fbs`), a maintained reader (`read_metadata`, the optional `mediapipe`
extra), and by MediaPipe Tasks itself. The model is read with TensorFlow's
`tensorflow.lite.tools.flatbuffer_utils` and written with
`keras_attn.export.tflite.tflite_sharing.pack_model` (each quantization table once).
`settings_from_tflite`, which `keras-attn predict` uses, reads the zip part only and needs
nothing beyond the standard library.
"""

import dataclasses
import io
import json
import pathlib
import zipfile

import flatbuffers
import numpy as np
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite.tflite_sharing import pack_model
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import LABELS_FILE
from keras_attn.runs.export_directory import VOCAB_FILE
from keras_attn.runs.export_directory import ExportDirectoryError
from keras_attn.runs.export_directory import ModelCard
from keras_attn.runs.task_registry import task_spec

METADATA_NAME = "TFLITE_METADATA"
METADATA_IDENTIFIER = b"M001"
# BertTokenizerOptions and associated files in process units need metadata parser 1.1.0.
MIN_PARSER_VERSION = "1.1.0"
_DESCRIPTIONS = {
    "token_ids": "Word-piece ids of [CLS] text [SEP], padded with the [PAD] id.",
    "segment_ids": "0 for every position (one sentence).",
    "padding_mask": "1 for real tokens, 0 for padding.",
    "text": "One UTF-8 text; the WordPiece tokenizer runs inside the graph (tf-text ops).",
}
# The outputs of `model_text.tflite` (keras_attn.export.text_tflite), by signature name.
_TEXT_OUTPUTS = {
    "logits": "Logits over the labels (per word piece for a tagger).",
    "probabilities": "Softmax of the logits.",
    "num_truncated_tokens": "Word pieces cut to fit the sequence length.",
    "token_ids": "Word-piece ids the model ran on.",
    "word_ids": "Word index of each piece, -1 at [CLS], [SEP] and padding.",
    "token_start": "Start of each piece in code points of the text, -1 at specials.",
    "token_end": "End (exclusive) of each piece in code points, -1 at specials.",
    "word_start": "Start of each kept word in code points, then -1.",
    "word_end": "End (exclusive) of each kept word in code points, then -1.",
    "num_words": "Words in the whole text.",
    "num_truncated_words": "Words whose first piece was cut (tagged O).",
}
_LABELLED_OUTPUTS = ("logits", "probabilities")
# MediaPipe's BERT preprocessor finds its three inputs by these metadata names.
MEDIAPIPE_INPUT_NAMES = {"token_ids": "ids", "padding_mask": "mask", "segment_ids": "segment_ids"}


class TFLiteMetadataError(KerasAttnError, ValueError):
    """A `.tflite` file whose metadata is missing, unreadable or inconsistent."""


def _schema():
    """The generated metadata schema module of the `mediapipe` wheel (the reader)."""
    try:  # imported on use: the optional `mediapipe` extra (keras-attn[mediapipe])
        from mediapipe.tasks.metadata import metadata_schema_py_generated
    except ImportError as error:
        raise ImportError(
            "Reading TFLite metadata flatbuffers with the generated schema code needs the "
            f"`mediapipe` extra (pip install 'keras-attn[mediapipe]'): {error}") from None
    return metadata_schema_py_generated


# The tables of `metadata_schema.fbs` we write, with their fields in declaration order: a
# field's vtable slot is its position, a union takes two slots (its type, then the table).
_SCHEMA_FIELDS = {
    "AssociatedFile": ("name", "description", "type"),
    "FeatureProperties": (),
    "Content": ("content_properties_type", "content_properties"),
    "BertTokenizerOptions": ("vocab_file",),
    "ProcessUnit": ("options_type", "options"),
    "TensorMetadata": ("name", "description", "dimension_names", "content", "process_units",
                       "stats", "associated_files"),
    "SubGraphMetadata": ("name", "description", "input_tensor_metadata",
                         "output_tensor_metadata", "associated_files", "input_process_units"),
    "ModelMetadata": ("name", "description", "version", "subgraph_metadata", "author",
                      "license", "associated_files", "min_parser_version"),
}
# Enum values of the schema: AssociatedFileType, and the member indices of the unions
# ContentProperties and ProcessUnitOptions.
_TYPE_DESCRIPTIONS, _TYPE_TENSOR_AXIS_LABELS, _TYPE_VOCABULARY = 1, 2, 5
_FEATURE_PROPERTIES, _BERT_TOKENIZER_OPTIONS = 1, 4


@dataclasses.dataclass(frozen=True)
class _Table:
    """One table of `_SCHEMA_FIELDS`: `fields` maps field names to str, int (an enum or a
    union's type, one byte), `_Table` or a list of str or `_Table`."""

    kind: str
    fields: dict


def _table(kind, **fields):
    unknown = set(fields) - set(_SCHEMA_FIELDS[kind])
    if unknown:
        raise ValueError(f"the schema's {kind} has no fields {sorted(unknown)}")
    return _Table(kind, {name: value for name, value in fields.items() if value is not None})


def _serialize(builder, value):
    """The offset of `value` (str, `_Table` or list) in `builder`; children are written
    before their parent, as flatbuffers requires."""
    if isinstance(value, str):
        return builder.CreateString(value)
    if isinstance(value, list):
        offsets = [_serialize(builder, item) for item in value]
        builder.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            builder.PrependUOffsetTRelative(offset)
        return builder.EndVector()
    fields = _SCHEMA_FIELDS[value.kind]
    children = {name: _serialize(builder, child) for name, child in value.fields.items()
                if not isinstance(child, int)}
    builder.StartObject(len(fields))
    for name, child in value.fields.items():
        if isinstance(child, int):
            builder.PrependUint8Slot(fields.index(name), child, 0)
        else:
            builder.PrependUOffsetTRelativeSlot(fields.index(name), children[name], 0)
    return builder.EndObject()


def _input_names(model):
    """Our input names (`token_ids`, ...) in the subgraph's input order, from the tensor names
    the converter gives them (`serving_default_token_ids:0`)."""
    graph = model.subgraphs[0]
    names = []
    for index in graph.inputs:
        tensor_name = graph.tensors[index].name.decode()
        name = next((n for n in _DESCRIPTIONS if f"_{n}:" in tensor_name
                     or tensor_name == n), None)
        if name is None:
            raise TFLiteMetadataError(
                f"input tensor {tensor_name!r} is none of {list(_DESCRIPTIONS)}: only "
                "keras-attn token-id and text models get this metadata")
        names.append(name)
    return names


def _output_names(model):
    """The signature names of the subgraph's outputs, in the subgraph's output order."""
    graph = model.subgraphs[0]
    by_index = {entry.tensorIndex: entry.name.decode()
                for signature in (model.signatureDefs or [])[:1] for entry in signature.outputs}
    return [by_index.get(index, graph.tensors[index].name.decode()) for index in graph.outputs]


def _feature_content():
    return _table("Content", content_properties_type=_FEATURE_PROPERTIES,
                  content_properties=_table("FeatureProperties"))


def _output_metadata(model, input_names, card, mediapipe, labels):
    """Per output tensor, in order: one `logits` (`probability` in the MediaPipe flavour)
    output of a token-id model, or the outputs of `model_text.tflite`."""
    if input_names != ["text"]:
        # The MediaPipe flavour goes only into files whose output is a softmax.
        per_token = " of each token" if task_spec(card["task"]).token_labels else ""
        names = [("probability" if mediapipe else "logits",
                  "Probabilities of the labels (softmax in the graph)." if mediapipe
                  else f"Logits over the labels{per_token}.", True)]
    else:
        names = []
        for name in _output_names(model):
            if name not in _TEXT_OUTPUTS:
                raise TFLiteMetadataError(
                    f"output {name!r} of a text-input model is none of {list(_TEXT_OUTPUTS)}:"
                    " only keras-attn `model_text.tflite` files get this metadata")
            names.append((name, _TEXT_OUTPUTS[name], name in _LABELLED_OUTPUTS))
    return [_table("TensorMetadata", name=name, description=description,
                   content=_feature_content(), associated_files=[labels] if labelled else None)
            for name, description, labelled in names]


def _metadata_flatbuffer(model, card, mediapipe):
    """The serialized `ModelMetadata` of `model` (a flatbuffer `ModelT`) for `card`."""
    vocabulary = _table("AssociatedFile", name=VOCAB_FILE, type=_TYPE_VOCABULARY,
                        description="WordPiece vocabulary, one token per line; line i is id i.")
    labels = _table("AssociatedFile", name=LABELS_FILE, type=_TYPE_TENSOR_AXIS_LABELS,
                    description="Labels of the last output axis, one per line.")
    input_names = _input_names(model)
    inputs = []
    for name in input_names:
        inputs.append(_table(
            "TensorMetadata", name=MEDIAPIPE_INPUT_NAMES[name] if mediapipe else name,
            description=_DESCRIPTIONS[name], content=_feature_content(),
            associated_files=[vocabulary] if name in ("token_ids", "text") else None))
    units = [_table("ProcessUnit", options_type=_BERT_TOKENIZER_OPTIONS,
                    options=_table("BertTokenizerOptions", vocab_file=[vocabulary]))]
    subgraph = _table("SubGraphMetadata", input_tensor_metadata=inputs,
                      output_tensor_metadata=_output_metadata(model, input_names, card,
                                                               mediapipe, labels),
                      input_process_units=units if mediapipe else None)
    tokenizer = card["tokenizer"]
    metadata = _table(
        "ModelMetadata",
        name=f"keras-attn {card['task']}",
        description=(f"keras-attn {card['task']} model: {len(card['labels'])} labels, "
                     f"{card['sequence_length']} tokens, lowercase={tokenizer['lowercase']}, "
                     f"strip_accents={tokenizer['strip_accents']}. Settings in "
                     f"{CARD_FILE}."),
        version=str(card.get("keras_attn_version") or ""),
        subgraph_metadata=[subgraph], min_parser_version=MIN_PARSER_VERSION,
        associated_files=[_table("AssociatedFile", name=CARD_FILE, type=_TYPE_DESCRIPTIONS,
                                 description="keras-attn model card (JSON): task, labels, "
                                 "sequence length, tokenizer settings, CRF transitions.")])
    builder = flatbuffers.Builder(1024)
    builder.Finish(_serialize(builder, metadata), METADATA_IDENTIFIER)
    return bytes(builder.Output())


def embed_metadata(path, card, vocabulary, labels, mediapipe=False, output_path=None):
    """Writes TFLite metadata and the associated files into a `.tflite` file.

    Metadata already in the file (a previous call) is replaced, so calling it again is safe.

    Args:
        path: the `.tflite` file (a keras-attn token-id model or `model_text.tflite`).
        card: the export's model card dict (`keras_attn.runs.ModelCard.card_dict`).
        vocabulary: list of str, the `vocab.txt` lines.
        labels: list of str, in output order.
        mediapipe: bool, the MediaPipe `TextClassifier` flavour (the output must be
            probabilities; see the module docstring).
        output_path: where to write; defaults to `path` (in place).

    Returns:
        The `pathlib.Path` written.
    """
    path = pathlib.Path(path)
    if list(card["labels"]) != list(labels):
        raise TFLiteMetadataError(
            f"the model card lists labels {card['labels']} but `labels` is {list(labels)}: "
            "pass the labels of the same export")
    if len(vocabulary) != card["tokenizer"]["vocabulary_size"]:
        raise TFLiteMetadataError(
            f"`vocabulary` has {len(vocabulary)} tokens but the model card says "
            f"vocabulary_size={card['tokenizer']['vocabulary_size']}")
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(path.read_bytes()))
    content = _metadata_flatbuffer(model, card, mediapipe)
    model.metadata = model.metadata or []
    entry = next((m for m in model.metadata if m.name == METADATA_NAME.encode()), None)
    if entry is None:  # else the earlier metadata's buffer is overwritten
        model.buffers.append(schema.BufferT())
        entry = schema.MetadataT()
        entry.name, entry.buffer = METADATA_NAME.encode(), len(model.buffers) - 1
        model.metadata.append(entry)
    model.buffers[entry.buffer].data = np.frombuffer(content, "uint8")
    # Packed with each quantization table once, as the converter worker left it (the
    # plain `convert_object_to_bytearray` would write it again in every signature).
    flat = pack_model(model)
    output_path = pathlib.Path(output_path or path)
    data = append_associated_files(flat, side_files(card, vocabulary, labels))
    # Unchanged metadata leaves the file untouched (a re-run export reuses its artifacts).
    if not output_path.is_file() or output_path.read_bytes() != data:
        atomic_files.write_bytes(output_path, data)
    return output_path


def side_files(card, vocabulary, labels):
    """The associated files of a keras-attn model: name -> UTF-8 bytes, as the side files
    `keras-attn export` writes (`model_card.json`, `vocab.txt`, `labels.txt`)."""
    texts = {CARD_FILE: json.dumps(card, indent=1, ensure_ascii=False) + "\n",
             VOCAB_FILE: "\n".join(vocabulary) + "\n", LABELS_FILE: "\n".join(labels) + "\n"}
    return {name: text.encode("utf-8") for name, text in texts.items()}


def append_associated_files(flatbuffer, files):
    """`flatbuffer` (bytes of a model without a zip part) followed by a zip archive of
    `files` (name -> bytes), entries stored, offsets counted from the start of the file.

    Example:
    >>> data = append_associated_files(b"\\x08\\0\\0\\0TFL3", {"labels.txt": b"neg\\npos\\n"})
    >>> zipfile.ZipFile(io.BytesIO(data)).read("labels.txt")
    b'neg\\npos\\n'
    """
    stream = io.BytesIO(flatbuffer)
    stream.seek(0, io.SEEK_END)
    with zipfile.ZipFile(stream, "a", compression=zipfile.ZIP_STORED) as archive:
        for name, data in files.items():
            # A fixed date: the same files give the same bytes (a re-run export keeps them).
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return stream.getvalue()


def associated_files(path):
    """The files packed into a `.tflite` file (the zip part): dict name -> bytes, empty
    when the file carries none."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {name: archive.read(name) for name in archive.namelist()}
    except zipfile.BadZipFile:
        return {}


def read_metadata(path):
    """The metadata of a `.tflite` file, read with the generated schema code.

    Returns:
        dict: `name`, `description`, `min_parser_version`, `inputs` and `outputs` (lists of
        `{"name", "associated_files": [(file name, type name)]}` in tensor order),
        `process_units` (option type names), `associated_files` (model level, as `inputs`)
        and `files` (name -> bytes, from `associated_files(path)`), or `None` when the file
        has no `TFLITE_METADATA`.
    """
    fb = _schema()
    content = bytearray(pathlib.Path(path).read_bytes())
    model = schema.Model.GetRootAs(content, 0)
    index = next((model.Metadata(i).Buffer() for i in range(model.MetadataLength())
                  if model.Metadata(i).Name().decode() == METADATA_NAME), None)
    if index is None:
        return None
    data = model.Buffers(index).DataAsNumpy().tobytes()
    if not fb.ModelMetadata.ModelMetadataBufferHasIdentifier(data, 0):
        raise TFLiteMetadataError(f"{path}: the {METADATA_NAME} buffer is not a metadata "
                                  f"flatbuffer (identifier {METADATA_IDENTIFIER!r} missing)")
    metadata = fb.ModelMetadataT.InitFromPackedBuf(data, 0)
    type_names = {v: k for k, v in vars(fb.AssociatedFileType).items() if not k.startswith("_")}
    unit_names = {v: k for k, v in vars(fb.ProcessUnitOptions).items() if not k.startswith("_")}

    def files(owner):
        return [(f.name.decode(), type_names[f.type]) for f in owner.associatedFiles or []]

    def tensors(entries):
        return [{"name": t.name.decode(), "associated_files": files(t)} for t in entries or []]

    (subgraph,) = metadata.subgraphMetadata
    return {
        "name": metadata.name.decode(), "description": metadata.description.decode(),
        "min_parser_version": metadata.minParserVersion.decode(),
        "inputs": tensors(subgraph.inputTensorMetadata),
        "outputs": tensors(subgraph.outputTensorMetadata),
        "process_units": [unit_names[u.optionsType] for u in subgraph.inputProcessUnits or []],
        "associated_files": files(metadata),
        "files": associated_files(path),
    }


def settings_from_tflite(path):
    """The model card, vocabulary and labels embedded in a `.tflite` file by
    `embed_metadata` (standard library only: the zip part of the file).

    Returns:
        `ModelCard`, or `None` when the file embeds no model card.

    Raises:
        TFLiteMetadataError: the file embeds a card but not the vocabulary or labels, or
            they disagree with it.

    Example:
    >>> import tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.tflite"
    >>> card = {"task": "classification", "labels": ["neg", "pos"], "sequence_length": 16,
    ...         "tokenizer": {"vocabulary_size": 4, "lowercase": True, "strip_accents": True}}
    >>> _ = path.write_bytes(append_associated_files(
    ...     b"\\x08\\0\\0\\0TFL3", side_files(card, ["[PAD]", "[UNK]"], ["neg", "pos"])))
    >>> settings_from_tflite(path).labels
    ['neg', 'pos']
    """
    return settings_from_files(associated_files(path), path)


def settings_from_files(files, source):
    """`ModelCard` from the embedded files of a model (name -> bytes, as `side_files`
    makes them: a `.tflite` file's zip part, an ONNX file's `metadata_props`), or `None`
    when they hold no model card. `source` names the model in errors.

    Raises:
        TFLiteMetadataError: a card without the vocabulary or labels, or disagreeing with
            them.
    """
    if CARD_FILE not in files:
        return None
    missing = [name for name in (VOCAB_FILE, LABELS_FILE) if name not in files]
    if missing:
        raise TFLiteMetadataError(f"{source} embeds {CARD_FILE} but not {missing}: re-run "
                                  "`keras-attn export`")
    try:
        card = json.loads(files[CARD_FILE].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TFLiteMetadataError(f"{source}: the embedded {CARD_FILE} is not JSON ({error}); "
                                  "re-run `keras-attn export`") from None

    def lines(name):
        return files[name].decode("utf-8").rstrip("\n").split("\n")

    try:
        return ModelCard(card, lines(VOCAB_FILE), lines(LABELS_FILE),
                         source=f"{source} (embedded files)")
    except ExportDirectoryError as error:
        raise TFLiteMetadataError(str(error)) from None
