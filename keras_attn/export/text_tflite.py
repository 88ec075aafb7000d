"""`model_text.tflite`: raw text in, model outputs out, the tokenizer inside (tf-text custom ops).

The graph holds the WordPiece tokenizer as tensorflow-text custom ops, so it runs only where
those ops are registered: in Python with `text_interpreter` (LiteRT's
`InterpreterWithCustomOps` and `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`). Stock
Android LiteRT has no tf-text ops: the phone runs the ids-in artifacts behind a Kotlin
tokenizer. One text per call: the input `text` is a `tf.string` tensor `[1]`; its word pieces
are cut to the tokenizer's `sequence_length` `L` (`[CLS]` and `[SEP]` included) and padded,
so the network itself runs on static `(1, L)` shapes.

Signature `serving_default`, input `text`, outputs:

- classification (`BertClassifier`): `logits`, `probabilities` (softmax of the logits)
  float32 `[1, C]`; `num_truncated_tokens` int32 `[1]` (word pieces cut to fit `L`).
  Custom ops: `CLASSIFICATION_CUSTOM_OPS`.
- tagging (`BertTokenClassifier`, with or without CRF): `logits` float32 `[1, L, C]` (for a
  CRF model the emissions: its Viterbi decoding runs outside, `decode_text_entities`);
  int32 `[1, L]`: `token_ids`, `word_ids` (word index of each piece, `-1` at `[CLS]`, `[SEP]`
  and padding; a word's first piece is where `word_ids` changes), `token_start`,
  `token_end` (`[start, end)` of each piece in Unicode code points of the text, `-1` at
  specials and padding: Python `str` indices; on the JVM convert UTF-16 indices with
  `String.offsetByCodePoints`; characters normalization removes after a piece's last letter,
  such as combining accents, fall outside it), `word_start`, `word_end` (`[start, end)` of
  word `w` at index `w`, from its first piece's start to its last piece's end, also for a
  word cut by `L`; the kept words, then `-1`); int32 `[1]`: `num_words` (words in the whole
  text) and `num_truncated_words` (words whose first piece was cut, to be tagged `O`). A
  word's tag is the prediction at its first piece; `decode_text_entities` turns the outputs
  into entity spans.
  Custom ops: `TAGGING_CUSTOM_OPS`.

Tokenizer. TFLite runs only builtin and tf-text ops, so the graph holds tf-text's fused
`FastBertTokenizer` kernels (NFKC case folding) and not `WordPieceTokenizer`'s BERT tables:
ids and offsets equal `WordPieceTokenizer` (and HF `tokenizers`) on text made only of the
characters of `keras_attn.text.fused_bert_path.FUSED_SAFE_UNCASED` (ASCII, Latin-1 and Latin
Extended-A letters, Vietnamese; `FUSED_SAFE_CASED` for cased models), and differ elsewhere
as docs/text.md lists ("…" three "." pieces, "ß" -> "ss", words over 100 bytes). The ids-in
files, the SavedModel and the phone and web tokenizers have no such difference.

Words. The graph tokenizes the whole text with tf-text's `FastBertTokenizer` and numbers words
by their pieces (a piece not starting with `##` starts a word). The Python NER path
(`keras_attn.text.entity_prediction`) and the SavedModel cut words by BERT's rules first
(`keras_attn.text.word_splitter`) and tokenize each word alone. Both give the same pieces,
words and offsets on ordinary text, accents (precomposed or combining), CJK, emoji, Hangul,
kana, Arabic, Devanagari and truncated long texts (52 of the 58 texts of
`keras_attn.text.hard_cases`), but differ where tf-text's word boundaries differ from
BERT's, the characters listed in `keras_attn.text.word_splitter`: control characters other
than TAB/LF/CR inside a word (tf-text splits there, BERT removes them), private-use and
unassigned code points (tf-text keeps them, usually making the word `[UNK]`) and, in uncased
mode, compatibility characters that normalize to punctuation ("…" becomes three "." words).

Conversion: the variables are frozen into constants (tracked Keras 3 variables stay
VAR_HANDLE / READ_VARIABLE ops in a TFLite model and read as NaN), the tf-text ops are called
without their ragged wrappers (whose `RaggedRange`/ragged gathers are neither builtins nor
tf-text custom ops), and the converter (builtins plus `allow_custom_ops`) runs in the child
process of `keras_attn.export.tflite.converter_process`: it leaks memory when it runs many times in
one process.
"""

import logging
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from ai_edge_litert.interpreter import InterpreterWithCustomOps
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_attn import atomic_files
from keras_attn.export.tflite.converter_process import run_job
from keras_attn.export.tflite.tflite_export import TFLiteExportError
from keras_attn.export.tflite.tflite_export import tflite_op_report
from keras_attn.models.deployable_models import TAGGERS
from keras_attn.models.deployable_models import check_deployable_model
from keras_attn.runs.task_head import check_length
from keras_attn.runs.task_head import crf_word_tags
from keras_attn.runs.task_head import max_sequence_length
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_spans
from keras_attn.text.ner import repair_iob2
from keras_attn.text.tokenizer import MAX_CHARS_PER_WORD
from keras_attn.text.tokenizer import WordPieceTokenizer

logger = logging.getLogger(__name__)

CLASSIFICATION_CUSTOM_OPS = ("FastBertNormalize", "FastWordpieceTokenizeWithOffsets")
# ByteSplit gives the text's UTF-8 bytes, to turn the tokenizer's byte offsets into code points.
TAGGING_CUSTOM_OPS = CLASSIFICATION_CUSTOM_OPS + ("TFText>ByteSplitWithOffsets",)
_TEXT_SPEC = tf.TensorSpec([1], tf.string, name="text")


def _check_arguments(model, tokenizer):
    check_deployable_model(model, " (the text TFLite graph packs `[CLS] text [SEP]` for them)")
    if not isinstance(tokenizer, WordPieceTokenizer):
        raise ValueError(
            "`tokenizer` must be a WordPieceTokenizer. "
            f"Received: tokenizer={type(tokenizer).__name__}"
        )
    if tokenizer.lowercase != tokenizer.strip_accents:
        raise ValueError(
            "The text TFLite model needs the tokenizer's fused normalization (`lowercase` and "
            "`strip_accents` both true, BERT uncased, or both false, cased): the extra "
            "normalization step of the mixed modes has no TFLite op. Received: "
            f"lowercase={tokenizer.lowercase}, strip_accents={tokenizer.strip_accents}"
        )
    backbone = model.backbone
    if tokenizer.vocabulary_size() != backbone.vocabulary_size:
        raise ValueError(
            f"The tokenizer's vocabulary ({tokenizer.vocabulary_size()} tokens) must match the "
            f"model's embedding table. Received: vocabulary_size={backbone.vocabulary_size}"
        )
    minimum = 3 if isinstance(model, TAGGERS) else 2
    # XLNet's relative positions have no table, so no longest length.
    limit = max_sequence_length(model)
    if tokenizer.sequence_length < minimum:
        raise ValueError(
            f"The tokenizer's `sequence_length` must be at least {minimum} "
            f"({'[CLS], a piece, [SEP]' if minimum == 3 else '[CLS], [SEP]'}). "
            f"Received: sequence_length={tokenizer.sequence_length}"
        )
    check_length(tokenizer.sequence_length, limit, "The tokenizer's sequence_length",
                 fix=f"build the tokenizer with sequence_length={limit} or less")


def text_function(model, tokenizer):
    """The batch-1 raw-text `tf.function` that becomes `model_text.tflite`.

    Callable eagerly (`fn(tf.constant(["some text"]))`) with the outputs of the module
    docstring; `export_text_tflite` freezes and converts it.

    Args:
        model: a float classifier or tagger (`deployable_models`; a BERT tagger optionally
            with CRF).
        tokenizer: its `WordPieceTokenizer`, uncased or cased (see the module docstring).

    Returns:
        A `tf.function` with the input signature `text`: `tf.string` `[1]`.
    """
    _check_arguments(model, tokenizer)
    if isinstance(model, TAGGERS):
        return tf.function(_tagging_function(model, tokenizer), input_signature=[_TEXT_SPEC])
    return tf.function(_classification_function(model, tokenizer), input_signature=[_TEXT_SPEC])


def _packed_inputs(tokenizer, pieces):
    """`(1, L)` model inputs for the first `L - 2` of the `(N,)` pieces, and how many fit."""
    length = tokenizer.sequence_length
    kept = pieces[: length - 2]  # (n,)
    count = tf.shape(kept)[0]
    body = tf.concat([[tokenizer.cls_token_id], kept, [tokenizer.sep_token_id]], 0)  # (n + 2,)
    token_ids = tf.reshape(
        tf.pad(body, [[0, length - 2 - count]], constant_values=tokenizer.pad_token_id),
        [1, length],
    )  # (1, L)
    padding_mask = tf.reshape(tf.cast(tf.range(length) < count + 2, tf.int32), [1, length])
    inputs = {
        "token_ids": token_ids,
        "segment_ids": tf.zeros([1, length], tf.int32),
        "padding_mask": padding_mask,
    }
    return inputs, count


def _fused_bert(tokenizer):
    """tf-text's fused BERT kernels for the tokenizer's vocabulary and mode (see "Words")."""
    return tf_text.FastBertTokenizer(
        vocab=tokenizer.get_vocabulary(),
        token_out_type=tf.int32,
        unknown_token=tokenizer.unknown_token,
        max_bytes_per_word=MAX_CHARS_PER_WORD,
        lower_case_nfd_strip_accents=tokenizer.lowercase,
    )


def _classification_function(model, tokenizer):
    fast_bert = _fused_bert(tokenizer)  # the kernels, without the ragged Python wrappers

    def serve(text):
        normalized = fast_bert._fast_bert_normalizer.normalize(text)  # (1,)
        pieces = fast_bert._fast_wordpiece_tokenizer.tokenize(normalized).flat_values  # (N,)
        inputs, count = _packed_inputs(tokenizer, tf.cast(pieces, tf.int32))
        logits = tf.cast(model(inputs, training=False), tf.float32)  # (1, C)
        return {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "num_truncated_tokens": tf.reshape(tf.shape(pieces)[0] - count, [1]),
        }

    return serve


def _tagging_function(model, tokenizer):
    fast_bert = _fused_bert(tokenizer)
    length = tokenizer.sequence_length
    # The CRF's Viterbi decoding stays outside the graph: only the emissions are computed.
    logits_layer = model.get_layer("logits")
    starts_word = tf.constant(
        [not token.startswith("##") for token in tokenizer.vocabulary]
    )  # (V,) a piece not continuing a word starts one

    def to_length(values, fill):  # (n + 2,) -> (1, L)
        padded = tf.pad(values, [[0, length - tf.shape(values)[0]]], constant_values=fill)
        return tf.reshape(padded, [1, length])

    def serve(text):
        normalized, normalized_to_text = (
            fast_bert._fast_bert_normalizer.normalize_with_offsets(text)
        )  # (1,), (1, bytes + 1) byte offset in `text` of each normalized byte
        pieces, starts, ends = fast_bert._fast_wordpiece_tokenizer.tokenize_with_offsets(
            normalized
        )  # (1, N) each, byte offsets into `normalized`
        pieces = tf.cast(pieces.flat_values, tf.int32)  # (N,)
        byte_map = tf.cast(normalized_to_text.flat_values, tf.int32)  # (bytes + 1,)
        # A piece spans the characters of `text` holding its first and its last normalized
        # byte: characters removed by normalization (accents, zero-width) after its last
        # byte stay out, as in BERT's word splitting.
        first_byte = tf.gather(byte_map, tf.cast(starts.flat_values, tf.int32))  # (N,)
        last_byte = tf.gather(byte_map, tf.cast(ends.flat_values, tf.int32) - 1)  # (N,)
        text_bytes = tf.cast(tf_text.ByteSplitter().split(text[0]), tf.int32)  # (T,)
        is_lead = tf.cast((text_bytes < 0x80) | (text_bytes >= 0xC0), tf.int32)  # (T,)
        characters_through = tf.cumsum(is_lead)  # (T,) characters begun at or before a byte
        piece_starts = tf.gather(characters_through, first_byte) - 1  # (N,) code points
        piece_ends = tf.gather(characters_through, last_byte)  # (N,)

        starts_word_piece = tf.gather(starts_word, pieces)  # (N,) bool
        first_piece = tf.cast(starts_word_piece, tf.int32)  # (N,)
        word_of_piece = tf.cumsum(first_piece) - 1  # (N,)
        num_words = tf.reduce_sum(first_piece)
        num_kept_words = tf.reduce_sum(first_piece[: length - 2])
        # Word spans over all pieces, so a word cut by the sequence length keeps its span.
        ends_word_piece = tf.concat([starts_word_piece, [True]], 0)[1:]  # (N,)
        word_starts = tf.gather(piece_starts, tf.where(starts_word_piece)[:, 0])  # (W,)
        word_ends = tf.gather(piece_ends, tf.where(ends_word_piece)[:, 0])  # (W,)

        inputs, count = _packed_inputs(tokenizer, pieces)
        sequence = model.backbone(inputs, training=False)["sequence_output"]  # (1, L, H)
        logits = tf.cast(logits_layer(sequence), tf.float32)  # (1, L, C)

        def per_token(values):  # (N,) -> (1, L): -1 at [CLS], [SEP] and padding
            return to_length(tf.concat([[-1], values[:count], [-1]], 0), -1)

        def per_word(values):  # (W,) -> (1, L): the kept words, then -1
            kept = values[:num_kept_words]
            padded = tf.pad(kept, [[0, length - num_kept_words]], constant_values=-1)
            return tf.reshape(padded, [1, length])

        return {
            "logits": logits,
            "token_ids": inputs["token_ids"],
            "word_ids": per_token(word_of_piece),
            "token_start": per_token(piece_starts),
            "token_end": per_token(piece_ends),
            "word_start": per_word(word_starts),
            "word_end": per_word(word_ends),
            "num_words": tf.reshape(num_words, [1]),
            "num_truncated_words": tf.reshape(num_words - num_kept_words, [1]),
        }

    return serve


def _frozen_saved_model(function, directory):
    """Saves `function` with its variables frozen into constants (see the module docstring)."""
    concrete = function.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)

    # The frozen function returns a flat list: name its outputs again.
    @tf.function(input_signature=[_TEXT_SPEC])
    def serve(text):
        return tf.nest.pack_sequence_as(concrete.structured_outputs, frozen(text))

    tf.saved_model.save(tf.Module(), directory, signatures={"serving_default": serve})
    return directory


def export_text_tflite(model, tokenizer, output_path, timeout=1800):
    """Writes `model_text.tflite` (raw text in, see the module docstring), converted in the
    converter's child process (`keras_attn.export.tflite.converter_process`).

    Args:
        model: a float classifier or tagger (`deployable_models`; a BERT tagger optionally
            with CRF).
        tokenizer: its `WordPieceTokenizer`, uncased or cased (`lowercase` equal to
            `strip_accents`); its `sequence_length` is the model's fixed length.
        output_path: str or path of the `.tflite` file (its directory is created).
        timeout: seconds the conversion may take.

    Returns:
        Dict `{"path", "size_bytes"}` plus `tflite_op_report` (`ops`, `custom_ops`, ...).

    Raises:
        ValueError: a bad argument (named). TFLiteExportError: the conversion failed, or the
        artifact holds a custom or Flex op other than the expected tf-text ones.

    Example:
    >>> from keras_attn.models import BertBackbone, BertClassifier
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie"]
    >>> backbone = BertBackbone(vocabulary_size=8, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         intermediate_dim=16, max_sequence_length=8)
    >>> model = BertClassifier(backbone, num_classes=2)
    >>> tokenizer = WordPieceTokenizer(vocab, sequence_length=8)
    >>> report = export_text_tflite(model, tokenizer, tempfile.mkdtemp() + "/model_text.tflite")
    >>> report["custom_ops"]
    ['FastBertNormalize', 'FastWordpieceTokenizeWithOffsets']
    >>> outputs = run_text_tflite(text_interpreter(report["path"]), "good movie")
    >>> tuple(outputs["probabilities"].shape)
    (1, 2)
    """
    function = text_function(model, tokenizer)
    expected = (
        TAGGING_CUSTOM_OPS if isinstance(model, TAGGERS) else CLASSIFICATION_CUSTOM_OPS
    )
    output_path = os.path.abspath(os.fspath(output_path))
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras_attn_text_tflite_") as work, \
            atomic_files.atomic_path(output_path) as converted:
        saved = _frozen_saved_model(function, os.path.join(work, "saved_model"))
        started = time.perf_counter()
        result = run_job("keras_attn.export.text_tflite:_convert_saved_model",
                         [saved, str(converted)], timeout=timeout)
        if not result.ok or not converted.is_file():
            raise TFLiteExportError(f"Text TFLite conversion failed {result.failure()}")
        logger.info("Converted the text TFLite model in %.1f s", time.perf_counter() - started)
        report = tflite_op_report(converted)
        unexpected = sorted(set(report["custom_ops"]) - set(expected))
        if unexpected:  # the file is not kept
            raise TFLiteExportError(
                f"{output_path} holds custom ops {unexpected} beyond the tf-text ones "
                f"{list(expected)}: they have no registered kernel. Keep them out of the text "
                "graph.")
    return {"path": output_path, "size_bytes": os.path.getsize(output_path), **report}


def text_interpreter(model, num_threads=1):
    """A LiteRT interpreter with the tf-text custom ops registered, tensors allocated.

    Args:
        model: path of a `.tflite` file, or its bytes.
        num_threads: int, CPU threads.
    """
    source = (
        {"model_content": bytes(model)} if isinstance(model, (bytes, bytearray))
        else {"model_path": os.fspath(model)}
    )
    interpreter = InterpreterWithCustomOps(
        custom_op_registerers=tf_text.tflite_registrar.SELECT_TFTEXT_OPS,
        num_threads=num_threads, **source,
    )
    interpreter.allocate_tensors()
    return interpreter


def run_text_tflite(interpreter, text):
    """The outputs of `model_text.tflite` for one text (a Python str), as numpy arrays."""
    if not isinstance(text, str):
        raise ValueError(f"`text` must be a str. Received: text={type(text).__name__}")
    runner = interpreter.get_signature_runner("serving_default")
    return runner(text=np.array([text.encode("utf-8")], dtype=object))


def decode_text_entities(outputs, text, label_vocabulary, crf=None):
    """Entity spans from the outputs of a tagging `model_text.tflite` for one text.

    Each word takes the tag at its first piece (argmax of the logits, or with `crf` the
    Viterbi path over the first pieces, as `BertTokenClassifier(use_crf=True)` decodes),
    words cut by the sequence length get `"O"`; tags are repaired to IOB2 (conlleval rule)
    and read as entities, the same steps as `keras_attn.text.entity_prediction`.

    Args:
        outputs: dict of numpy arrays from `run_text_tflite` (batch 1).
        text: the str the outputs came from (for the entities' `text`).
        label_vocabulary: the model's `LabelVocabulary` of IOB tags.
        crf: the model's `CRF` layer (`model.crf`) for a CRF model, else `None`.

    Returns:
        dict: `tags` (one per word of the text), `entities` (`entity_spans` dicts with
        `type`, `start_word`, `end_word`, `start_char`, `end_char`, `text`),
        `num_truncated_words`, `num_repairs`.
    """
    word_ids = np.asarray(outputs["word_ids"])  # (1, L)
    num_words = int(np.asarray(outputs["num_words"]).reshape(-1)[0])
    logits = np.asarray(outputs["logits"])  # (1, L, C)
    if logits.ndim != 3 or logits.shape[-1] != len(label_vocabulary):
        raise ValueError(
            f"`outputs['logits']` must be (1, L, {len(label_vocabulary)}) (one score per "
            f"label). Received: shape={logits.shape}"
        )
    predictions = logits
    if crf is not None:
        predictions = crf_word_tags(logits, crf, word_ids)  # (1, L)
    tags, _ = decode_word_labels(predictions, word_ids, [num_words], label_vocabulary)
    tags, repairs = repair_iob2(tags[0])
    word_starts = np.asarray(outputs["word_start"]).reshape(-1)  # (L,)
    word_ends = np.asarray(outputs["word_end"]).reshape(-1)  # (L,)
    # Words cut by the sequence length have no span in the outputs; they are tagged "O".
    offsets = [
        (int(word_starts[w]), int(word_ends[w])) if w < len(word_starts) and word_starts[w] >= 0
        else None
        for w in range(num_words)
    ]
    return {
        "tags": tags,
        "entities": entity_spans(tags, offsets, text),
        "num_truncated_words": int(np.asarray(outputs["num_truncated_words"]).reshape(-1)[0]),
        "num_repairs": repairs,
    }


def _convert_saved_model(saved_model_dir, output_path):
    """The converter's job (run by `converter_process.run_job`): the file of the SavedModel."""
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = True  # the tf-text ops, checked by `export_text_tflite`
    content = converter.convert()
    with open(output_path, "wb") as f:
        f.write(content)
