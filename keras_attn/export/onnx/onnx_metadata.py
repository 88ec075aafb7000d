"""The model card, vocabulary and labels inside an ONNX file: its `metadata_props` (keys
`model_card.json`, `vocab.txt`, `labels.txt`, the names of the side files), so one `.onnx`
file is enough to tokenize, run and decode."""

import os

import onnx

from keras_attn import atomic_files
from keras_attn.export.tflite.tflite_metadata import settings_from_files
from keras_attn.export.tflite.tflite_metadata import side_files


def embed_onnx_metadata(path, card, vocabulary, labels):
    """Writes the model card, vocabulary and labels into an ONNX file's `metadata_props`.

    Each is one string entry named after its side file (`model_card.json`, `vocab.txt`,
    `labels.txt`, with the same text); entries already there under those names are
    replaced, other entries (`keras_attn.model_class`, ...) kept, and a file whose entries
    are already these is left untouched. onnxruntime reads them back without parsing the
    graph: `InferenceSession(path).get_modelmeta().custom_metadata_map`.

    Args:
        path: str or path-like, a keras-attn ONNX file.
        card: the export's model card dict (`keras_attn.runs.ModelCard.card_dict`).
        vocabulary: list of str, the `vocab.txt` lines.
        labels: list of str, in output order.

    Returns:
        str, `path`.

    Example:
    >>> import tempfile
    >>> from keras_attn.export.onnx.onnx_runner import OnnxRunner
    >>> from keras_attn.export.onnx.onnx_export import export_onnx
    >>> from keras_attn.models.bert_backbone import BertBackbone
    >>> from keras_attn.models.bert_classifier import BertClassifier
    >>> classifier = BertClassifier(BertBackbone(
    ...     vocabulary_size=4, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16), num_classes=2)
    >>> path = export_onnx(classifier, os.path.join(tempfile.mkdtemp(), "model.onnx"))["path"]
    >>> card = {"task": "classification", "labels": ["neg", "pos"], "sequence_length": 16,
    ...         "tokenizer": {"vocabulary_size": 4, "lowercase": True, "strip_accents": True}}
    >>> _ = embed_onnx_metadata(path, card, ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], ["neg", "pos"])
    >>> onnx_settings(OnnxRunner(path).session, path).labels
    ['neg', 'pos']
    """
    path = os.fspath(path)
    model_proto = onnx.load(path)
    files = {name: data.decode("utf-8")
             for name, data in side_files(card, vocabulary, labels).items()}
    kept = [(entry.key, entry.value) for entry in model_proto.metadata_props
            if entry.key not in files]
    del model_proto.metadata_props[:]
    for key, value in kept + sorted(files.items()):
        model_proto.metadata_props.add(key=key, value=value)
    data = model_proto.SerializeToString()
    with open(path, "rb") as f:
        unchanged = f.read() == data
    if not unchanged:
        atomic_files.write_bytes(path, data)
    return path


def onnx_settings(session, path):
    """The `ModelCard` (card, vocabulary, labels) that `embed_onnx_metadata` wrote
    into the model of an onnxruntime `session`, or `None` when it has no model card.

    Raises:
        TFLiteMetadataError: a card without the vocabulary or labels, or disagreeing with
            them.
    """
    entries = session.get_modelmeta().custom_metadata_map
    return settings_from_files({key: value.encode("utf-8") for key, value in entries.items()},
                               path)
