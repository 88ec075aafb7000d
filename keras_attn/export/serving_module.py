"""A TF Serving SavedModel that takes raw text: tokenizer, word splitting and decoding in-graph.

`export_saved_model(model, tokenizer, label_vocabulary, directory)` writes a SavedModel with
three signatures:

- `serving_default`, input `text` (`tf.string`, `[None]`):
  - classification (`BertClassifier`): `label` `[B]` string, `label_id` `[B]` int32,
    `probabilities` `[B, C]` float32 (softmax of the logits), `num_truncated_tokens` `[B]`
    (word pieces cut to fit the sequence length) and `num_truncated_words` `[B]` (words whose
    first piece was cut: cut pieces not starting with `##`);
  - tagging (`BertTokenClassifier`, with or without CRF): words cut by BERT's rules
    (`keras_attn.text.word_splitter`), each word tagged from its first piece (argmax, or the
    CRF's Viterbi path over the first pieces), tags repaired to IOB2 (conlleval rule) and
    read as entities. Outputs, padded to the longest row of the batch: `entity_type`,
    `entity_text` `[B, E]` string (`""`), `entity_start`, `entity_end` `[B, E]` int32
    code-point offsets into the text (`-1`), `entity_start_word`, `entity_end_word`
    `[B, E]` (`-1`), `num_entities` `[B]`; `words`, `word_tags` `[B, W]` string (`""`),
    `word_start`, `word_end` `[B, W]` (`-1`), `num_words` `[B]`; `num_truncated_words` `[B]`
    (words past the sequence length, tagged `O`).
- `predict_ids`: `token_ids`, `segment_ids`, `padding_mask` int32 `[None, None]` (and
  `label_mask` for a CRF model) -> `logits` (and `tags` for a CRF model).
- `metadata`: no input -> `labels` `[C]` string, `sequence_length`, `task`
  (`"classification"` / `"tagging"`), `lowercase`, `strip_accents`.

Texts longer than the tokenizer's `sequence_length` are truncated, never an error. `labels.txt`
and `vocab.txt` are also written to the SavedModel's `assets/`. The graph uses tensorflow-text
ops: `import tensorflow_text` before `tf.saved_model.load` (TF Serving needs a build with
tf-text ops, e.g. the `tensorflow/serving` image plus the tf-text custom op library).
"""

import os
import tempfile

import tensorflow as tf
import tensorflow_text  # noqa: F401 - registers FastBertNormalize & co. for load_saved_model

from keras_attn import atomic_files
from keras_attn.models.deployable_models import TAGGERS
from keras_attn.models.deployable_models import check_deployable_model
from keras_attn.runs.run_directory import output_count
from keras_attn.runs.task_head import ID_INPUTS
from keras_attn.text.ner import IOB_TAG
from keras_attn.text.ner import align_word_labels
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.word_splitter import split_words_tf

_OUTSIDE, _BEGIN, _INSIDE = 0, 1, 2


def _check_arguments(model, tokenizer, label_vocabulary):
    check_deployable_model(model, "")
    if not isinstance(tokenizer, WordPieceTokenizer):
        raise ValueError(
            "`tokenizer` must be a WordPieceTokenizer. "
            f"Received: tokenizer={type(tokenizer).__name__}"
        )
    labels = list(getattr(label_vocabulary, "labels", ()))
    num_classes = output_count(model)
    if len(labels) != num_classes:
        raise ValueError(
            f"`label_vocabulary` must have one label per model output ({num_classes}). "
            f"Received: label_vocabulary={label_vocabulary!r}"
        )
    if isinstance(model, TAGGERS):
        bad = [label for label in labels if not IOB_TAG.match(label)]
        if bad or "O" not in labels:
            raise ValueError(
                "A tagger's labels must be IOB tags ('O', 'B-X', 'I-X') including 'O'. "
                f"Received: labels={labels}"
            )
        if tokenizer.sequence_length < 3:
            raise ValueError(
                "Tagging needs a tokenizer `sequence_length` >= 3. "
                f"Received: sequence_length={tokenizer.sequence_length}"
            )


class ServingModule(tf.Module):
    """The `tf.Module` behind `export_saved_model`: its signatures as `tf.function`s.

    Args:
        model: a float classifier or tagger (`deployable_models`; a BERT tagger optionally
            with CRF).
        tokenizer: its `WordPieceTokenizer` (vocabulary, case handling, sequence length).
        label_vocabulary: its `LabelVocabulary` (IOB tags with `"O"` for a tagger).

    Attributes:
        serve_text, predict_ids, metadata: the three signature functions (see the module
            docstring), callable eagerly too.
    """

    def __init__(self, model, tokenizer, label_vocabulary, name=None):
        _check_arguments(model, tokenizer, label_vocabulary)
        super().__init__(name=name)
        # Only the variables are tracked: the Keras model object itself is not saved.
        self.model_variables = list(model.variables)
        labels = list(label_vocabulary.labels)
        is_tagger = isinstance(model, TAGGERS)
        use_crf = is_tagger and getattr(model, "use_crf", False)
        length = tokenizer.sequence_length

        def run_model(inputs):
            outputs = model(inputs, training=False)
            if use_crf:
                return tf.cast(outputs["logits"], tf.float32), outputs["tags"]
            return tf.cast(outputs, tf.float32), None

        id_names = list(ID_INPUTS)
        id_names += ["label_mask"] if use_crf else []
        id_specs = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in id_names}

        @tf.function(input_signature=[id_specs])
        def predict_ids(inputs):
            logits, tags = run_model(inputs)
            return {"logits": logits} if tags is None else {"logits": logits, "tags": tags}

        @tf.function(input_signature=[])
        def metadata():
            return {
                "labels": tf.constant(labels),
                "sequence_length": tf.constant(length, tf.int32),
                "task": tf.constant("tagging" if is_tagger else "classification"),
                "lowercase": tf.constant(tokenizer.lowercase),
                "strip_accents": tf.constant(tokenizer.strip_accents),
            }

        text_spec = tf.TensorSpec([None], tf.string, name="text")
        if is_tagger:
            serve = _tagging_function(run_model, tokenizer, labels, use_crf)
        else:
            serve = _classification_function(run_model, tokenizer, labels)
        self.serve_text = tf.function(serve, input_signature=[text_spec])
        self.predict_ids = predict_ids
        self.metadata = metadata

    def signatures(self):
        """The signature dict for `tf.saved_model.save`."""
        return {
            "serving_default": self.serve_text,
            "predict_ids": self.predict_ids,
            "metadata": self.metadata,
        }


def _trim_to_longest_row(inputs):
    """Right-padded id inputs `(B, L)` cut to `(B, L')`, L' the longest row of the batch: the
    tokenizer pads every row to `sequence_length`, a Transformer's cost grows with the padded
    length, and the padding mask keeps the real tokens' outputs the same."""
    lengths = tf.reduce_sum(inputs["padding_mask"], axis=1)  # (B,)
    width = tf.reduce_max(tf.concat([lengths, [1]], axis=0))  # at least 1 column
    return {name: value[:, :width] for name, value in inputs.items()}  # (B, width)


def _classification_function(run_model, tokenizer, labels):
    # A piece starts a word unless it is a `##` continuation.
    starts_word = tf.constant([not token.startswith("##") for token in tokenizer.vocabulary])
    label_table = tf.constant(labels)
    budget = tokenizer.sequence_length - 2

    def serve(text):
        packed = tokenizer(text, return_num_truncated=True)
        logits, _ = run_model(_trim_to_longest_row({
            "token_ids": packed["token_ids"],
            "segment_ids": packed["segment_ids"],
            "padding_mask": tf.cast(packed["padding_mask"], tf.int32),
        }))  # (B, C)
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (B,)
        cut = tokenizer.tokenize(text)[:, budget:]  # (B, None) pieces past the budget
        cut_words = tf.reduce_sum(
            tf.cast(tf.gather(starts_word, cut), tf.int32), axis=1
        )  # (B,)
        return {
            "label": tf.gather(label_table, label_id),
            "label_id": label_id,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "num_truncated_tokens": packed["num_truncated"],
            "num_truncated_words": tf.cast(cut_words, tf.int32),
        }

    return serve


class _TagTables:
    """The label ids of a tagger as tensors: each label's kind (O / B / I) and entity type.

    Types are numbered in order of first appearance; "O" has type `no_type`, the "" entry
    after the real types in `type_names`.
    """

    def __init__(self, labels):
        kinds, types, type_names = [], [], []
        for label in labels:
            if label == "O":
                kinds.append(_OUTSIDE)
                types.append(-1)
                continue
            kinds.append(_BEGIN if label.startswith("B-") else _INSIDE)
            if label[2:] not in type_names:
                type_names.append(label[2:])
            types.append(type_names.index(label[2:]))
        self.no_type = len(type_names)
        self.label_kind = tf.constant(kinds, tf.int32)  # (num_labels,)
        self.label_type = tf.constant([self.no_type if t < 0 else t for t in types],
                                      tf.int32)  # (num_labels,)
        self.type_names = tf.constant(type_names + [""])  # (num_types + 1,)
        self.outside_id = labels.index("O")


def _tagging_function(run_model, tokenizer, labels, use_crf):
    tables = _TagTables(labels)

    def serve(text):
        words, word_starts, word_ends = split_words_tf(text, tokenizer.strip_accents)  # (B, W)
        aligned, word_ids, first_piece, inputs = _tagger_inputs(words, tokenizer, use_crf)
        logits, tags = run_model(_trim_to_longest_row(inputs))  # (B, L', ...), L' <= L
        predicted = tags if use_crf else tf.argmax(logits, axis=-1, output_type=tf.int32)
        word_tags, num_words = _word_tags(predicted, words, word_ids, first_piece,
                                          tables.outside_id)  # (B, W), (B,)
        real = tf.sequence_mask(num_words, tf.shape(word_tags)[1])  # (B, W)
        kind, entity_type, tag_strings = _repaired_tags(word_tags, real, tables)
        dense_starts = word_starts.to_tensor(-1)  # (B, W)
        dense_ends = word_ends.to_tensor(-1)  # (B, W)
        entities = _entities(text, kind, entity_type, real, dense_starts, dense_ends, tables)
        return {
            **entities,
            "words": words.to_tensor(""),
            "word_tags": tag_strings,
            "word_start": dense_starts,
            "word_end": dense_ends,
            "num_words": num_words,
            "num_truncated_words": aligned["num_truncated_words"],
        }

    return serve


def _tagger_inputs(words, tokenizer, use_crf):
    """The model inputs of `words` (B, W): `(aligned, word_ids, first_piece, inputs)`, with
    `word_ids` (B, L) each piece's word (-1: special or padding) and `first_piece` (B, L)
    whether a piece starts its word (a CRF tagger's `label_mask`)."""
    length = tokenizer.sequence_length
    aligned = align_word_labels(
        tokenizer.tokenize_words(words),
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        sequence_length=length,
    )
    shape = [None, length]
    token_ids = aligned["token_ids"].to_tensor(tokenizer.pad_token_id, shape=shape)  # (B, L)
    word_ids = aligned["word_ids"].to_tensor(-1, shape=shape)  # (B, L)
    previous = tf.pad(word_ids[:, :-1], [[0, 0], [1, 0]], constant_values=-1)  # (B, L)
    first_piece = (word_ids >= 0) & (word_ids != previous)  # (B, L)
    inputs = {
        "token_ids": tf.cast(token_ids, tf.int32),
        "segment_ids": tf.zeros_like(token_ids, tf.int32),
        "padding_mask": tf.cast(
            aligned["padding_mask"].to_tensor(False, shape=shape), tf.int32
        ),
    }
    if use_crf:
        inputs["label_mask"] = tf.cast(first_piece, tf.int32)
    return aligned, word_ids, first_piece, inputs


def _word_tags(predicted, words, word_ids, first_piece, outside_id):
    """Word tags: each word's first piece; words without one (truncated, or no piece) "O".

    Returns `(word_tags, num_words)`: (B, W) label ids and (B,) words per row.
    """
    batch_size = tf.shape(word_ids)[0]
    num_words = tf.cast(words.row_lengths(), tf.int32)  # (B,)
    max_words = tf.reduce_max(tf.concat([num_words, [0]], axis=0))
    positions = tf.where(first_piece)  # (N, 2) [row, position]
    word_index = tf.stack(
        [tf.cast(positions[:, 0], tf.int32), tf.gather_nd(word_ids, positions)], axis=1
    )  # (N, 2) [row, word]
    word_tags = tf.tensor_scatter_nd_update(
        tf.fill([batch_size, max_words], outside_id),
        word_index,
        tf.gather_nd(tf.cast(predicted, tf.int32), positions),
    )  # (B, W) label ids
    return word_tags, num_words


def _repaired_tags(word_tags, real, tables):
    """conlleval repair: an I-X that does not follow an X tag becomes B-X. The repair never
    changes a type, so "the previous tag" can be read before repairing.

    Returns `(kind, entity_type, tag_strings)`, each (B, W): O / B / I, the type id
    (`no_type` for O) and the tag ("" past a row's words).
    """
    kind = tf.gather(tables.label_kind, word_tags)  # (B, W)
    entity_type = tf.gather(tables.label_type, word_tags)  # (B, W), no_type for O
    previous_type = tf.pad(
        entity_type[:, :-1], [[0, 0], [1, 0]], constant_values=tables.no_type
    )  # (B, W)
    kind = tf.where((kind == _INSIDE) & (previous_type != entity_type), _BEGIN, kind)
    type_names_per_word = tf.gather(tables.type_names, entity_type)  # (B, W), "" for O
    prefix = tf.gather(tf.constant(["O", "B-", "I-"]), kind)
    tag_strings = tf.where(kind == _OUTSIDE, "O", prefix + type_names_per_word)
    return kind, entity_type, tf.where(real, tag_strings, "")


def _entities(text, kind, entity_type, real, word_starts, word_ends, tables):
    """Entities: a B starts one, the I's after it (same type after the repair) extend it.

    `word_starts` / `word_ends` are (B, W) character offsets. Returns the `entity_*`
    outputs, (B, E) each, and `num_entities` (B,).
    """
    batch_size = tf.shape(kind)[0]
    is_begin = (kind == _BEGIN) & real  # (B, W)
    in_entity = (kind != _OUTSIDE) & real  # (B, W)
    entity_id = tf.cumsum(tf.reshape(tf.cast(is_begin, tf.int32), [-1])) - 1  # (B*W,)
    entity_id = tf.reshape(entity_id, tf.shape(is_begin))  # (B, W) flat entity number
    num_entities_total = tf.reduce_sum(tf.cast(is_begin, tf.int32))
    member = tf.where(in_entity)  # (M, 2)
    member_word = tf.cast(member[:, 1], tf.int32)
    member_entity = tf.gather_nd(entity_id, member)
    end_word = tf.math.unsorted_segment_max(
        member_word, member_entity, num_entities_total
    ) + 1  # (E_total,)
    begins = tf.where(is_begin)  # (E_total, 2) in entity order
    entity_row = tf.cast(begins[:, 0], tf.int32)
    start_word = tf.cast(begins[:, 1], tf.int32)
    start_char = tf.gather_nd(word_starts, tf.stack([entity_row, start_word], axis=1))
    end_char = tf.gather_nd(word_ends, tf.stack([entity_row, end_word - 1], axis=1))
    entity_text = tf.strings.substr(
        tf.gather(text, entity_row), start_char, end_char - start_char, unit="UTF8_CHAR"
    )
    entity_names = tf.gather(tables.type_names, tf.gather_nd(entity_type, begins))

    def per_row(values, fill):
        ragged = tf.RaggedTensor.from_value_rowids(
            values, tf.cast(entity_row, tf.int64), nrows=tf.cast(batch_size, tf.int64)
        )
        return ragged.to_tensor(fill)  # (B, E)

    return {
        "entity_type": per_row(entity_names, ""),
        "entity_text": per_row(entity_text, ""),
        "entity_start": per_row(start_char, -1),
        "entity_end": per_row(end_char, -1),
        "entity_start_word": per_row(start_word, -1),
        "entity_end_word": per_row(end_word, -1),
        "num_entities": tf.math.bincount(
            entity_row, minlength=batch_size, maxlength=batch_size, dtype=tf.int32
        ),
    }


def export_saved_model(model, tokenizer, label_vocabulary, directory):
    """Writes the raw-text SavedModel (see the module docstring) to `directory`.

    Args:
        model: a float classifier or tagger (`deployable_models`; a BERT tagger optionally
            with CRF).
        tokenizer: its `WordPieceTokenizer`.
        label_vocabulary: its `LabelVocabulary`.
        directory: str or path, created (an existing SavedModel there is overwritten).

    Returns:
        The directory, as a str.

    Example:
    >>> from keras_attn.models import BertBackbone, BertClassifier
    >>> from keras_attn.text.label_vocabulary import LabelVocabulary
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie"]
    >>> backbone = BertBackbone(vocabulary_size=8, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         intermediate_dim=16, max_sequence_length=8)
    >>> model = BertClassifier(backbone, num_classes=2)
    >>> path = export_saved_model(model, WordPieceTokenizer(vocab, sequence_length=8),
    ...                           LabelVocabulary(["negative", "positive"]),
    ...                           tempfile.mkdtemp() + "/saved_model")
    >>> serving = load_saved_model(path).signatures["serving_default"]
    >>> out = serving(text=tf.constant(["Good movie!"]))
    >>> tuple(out["probabilities"].shape), out["label"].dtype.name
    ((1, 2), 'string')
    """
    _check_arguments(model, tokenizer, label_vocabulary)
    module = ServingModule(model, tokenizer, label_vocabulary)
    directory = os.fspath(directory)
    with tempfile.TemporaryDirectory() as side_files:
        labels_path = os.path.join(side_files, "labels.txt")
        vocab_path = os.path.join(side_files, "vocab.txt")
        with open(labels_path, "w", encoding="utf-8") as f:
            f.write("".join(label + "\n" for label in label_vocabulary.labels))
        with open(vocab_path, "w", encoding="utf-8") as f:
            f.write("".join(token + "\n" for token in tokenizer.vocabulary))
        module.labels_file = tf.saved_model.Asset(labels_path)
        module.vocab_file = tf.saved_model.Asset(vocab_path)
        with atomic_files.atomic_path(directory) as temporary:
            tf.saved_model.save(module, os.fspath(temporary), signatures=module.signatures())
    return directory


def load_saved_model(directory):
    """`tf.saved_model.load`; the tensorflow-text ops the graph uses (FastBertNormalize & co.)
    are registered by the `tensorflow_text` import at the top of this module."""
    return tf.saved_model.load(os.fspath(directory))

