"""`TranslationFile`: a translation `.tflite` file
(`keras_attn.export.tflite.translation_tflite`) on Python LiteRT, decoded by the same greedy
and beam search as the Keras model.

The file's `encode_{S}` signature projects a source into the decoder blocks' cross-attention
keys and values; its `decode_step_{S}` signature takes one token and the self-attention cache
and returns the next token's logits and the cache. `TranslationFile` offers them as the two
callbacks of `keras_attn.generation` (`initial_decoding_cache`, `next_token_logits`), so
`greedy_decode` and `beam_search` are `EncoderDecoderDecoding`'s, the code that decodes a
`Seq2SeqTransformer`: the search runs around the file (eagerly, or as the `Translator`'s
`tf.function` with the file called through `tf.numpy_function`), one interpreter call per row
and step (the file has batch 1), or one per step for the rows of a `decode_step_{S}_beams_{K}`
signature. The file carries its vocabulary and card (`vocab.txt`,
`model_card.json` in its zip part), so it alone translates (`runtime_translator`).
"""

import json
import pathlib

import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from keras import ops

from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite.numpy_call import numpy_call
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.models.seq2seq_decoding import EncoderDecoderDecoding
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import VOCAB_FILE
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.translation import Translator

ENCODE_PREFIX, DECODE_STEP_PREFIX = "encode_", "decode_step_"


class TranslationFileError(KerasAttnError, ValueError):
    """A file that is not a translation `.tflite` file, or a source it cannot hold."""


class TranslationRuntime(EncoderDecoderDecoding):
    """An exported translation model as an encoder-decoder model for `greedy_decode` and
    `beam_search` (`EncoderDecoderDecoding`): subclasses run the two graphs of a runtime
    (`_encode`: ids and mask `(B, L)` -> the cross cache `(B, 2N, L, h, d_k)`; `_step`: the
    decoding step's input dict -> `(logits, self_attention_cache)`) and set `card`,
    `vocabulary`, `source_lengths` (`None`: any length), `max_length` and `_cache_shape`
    `(N, 2, M, h, d_k)`."""

    source_lengths = None

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    def bucket(self, length):
        """The shortest source length of the file that holds `length` tokens (`length`
        itself for a runtime of any length)."""
        if self.source_lengths is None:
            return length
        for n in self.source_lengths:
            if n >= length:
                return n
        raise TranslationFileError(
            f"a source of {length} tokens is longer than {self.path.name}'s longest source "
            f"length {self.source_lengths[-1]}: cut it (Translator cuts to the card's "
            "max_length) or export with a longer data.max_length")

    def initial_decoding_cache(self, encoder_token_ids, encoder_padding_mask, max_length):
        """Encodes the sources (padded to their bucket) and starts an empty self-attention
        cache: `{"self_attention_cache", "cross_attention_cache", "encoder_padding_mask"}`,
        batch first (what beam search repeats and reorders). Eagerly, or inside a
        `tf.function` (the runtime called through `tf.numpy_function`)."""
        if max_length > self.max_length:
            raise TranslationFileError(
                f"{max_length} decoder positions asked for, {self.path.name}'s cache holds "
                f"{self.max_length} (1 + the card's target_max_length)")
        cross, mask = numpy_call(self._encode_bucket, [encoder_token_ids, ops.cast(
            encoder_padding_mask, "int32")], [tf.float32, tf.int32])
        cross.set_shape([None, 2 * self._cache_shape[0], None, *self._cache_shape[3:]])
        mask.set_shape([None, None])
        return {"self_attention_cache": tf.zeros(
                    tf.concat([tf.shape(cross)[:1], self._cache_shape], axis=0)),
                "cross_attention_cache": cross, "encoder_padding_mask": mask}

    def _encode_bucket(self, ids, mask):
        """`(cross cache, mask)` of the sources `ids`, `mask` `(B, S)` in their bucket."""
        used = int(np.max(np.nonzero(mask.any(0))[0], initial=0)) + 1  # columns with tokens
        length = self.bucket(used)
        ids, mask = _fit(ids, length), _fit(mask, length)  # (B, L)
        return self._encode(ids, mask).astype("float32"), mask

    def next_token_logits(self, token_ids, cache, index):
        """One decoding step of every row (the `keras_attn.generation` callback):
        `(logits (B, V), cache)` for the last token of `token_ids` at position
        `index + t - 1`."""
        if token_ids.shape[1] != 1:
            raise TranslationFileError("the file decodes one token a step; the prompt is "
                                       "the BOS token alone")
        logits, self_cache = numpy_call(self._numpy_step, [
            token_ids, index, cache["self_attention_cache"], cache["cross_attention_cache"],
            cache["encoder_padding_mask"]], [tf.float32, tf.float32])
        logits.set_shape([None, self.vocabulary_size])
        self_cache.set_shape([None, *self._cache_shape])
        return logits, {**cache, "self_attention_cache": self_cache}

    def _numpy_step(self, tokens, index, self_cache, cross, mask):
        inputs = {"decoder_token_ids": tokens.astype("int32"),
                  "cache_update_index": np.full((len(tokens),), int(index), "int32"),
                  "self_attention_cache": self_cache, "cross_attention_cache": cross,
                  "encoder_padding_mask": mask}
        logits, self_cache = self._step(inputs)
        return logits.astype("float32"), self_cache.astype("float32")

    def _full_pass_next_token_logits(self, token_ids, cache, index):
        raise TranslationFileError("a translation file decodes through its cache only "
                                   "(use_cache=True)")


class TranslationFile(TranslationRuntime):
    """A translation `.tflite` file as an encoder-decoder model for `greedy_decode` and
    `beam_search`: each row runs on its own (the file has batch 1), every source in the
    shortest of the file's length buckets that holds the batch.

    Args:
        path: str or path of the file.
        num_threads: optional int, LiteRT's threads.

    Attributes:
        source_lengths: the file's source length buckets.
        max_length: decoder positions of the file's cache (BOS + generated tokens).
        card: the embedded `model_card.json` (dict), `vocabulary`: the embedded tokens.
    """

    def __init__(self, path, num_threads=None):
        self.path = pathlib.Path(path)
        files = associated_files(self.path) if self.path.is_file() else {}
        if CARD_FILE not in files or VOCAB_FILE not in files:
            raise TranslationFileError(
                f"{self.path}: not a translation file of `keras-attn export` (no embedded "
                f"{CARD_FILE} and {VOCAB_FILE}); export the seq2seq run again")
        self.card = json.loads(files[CARD_FILE].decode("utf-8"))
        self.vocabulary = files[VOCAB_FILE].decode("utf-8").splitlines()
        self.interpreter = Interpreter(model_path=str(self.path), num_threads=num_threads)
        names = self.interpreter.get_signature_list()
        self.source_lengths = sorted(int(name[len(ENCODE_PREFIX):]) for name in names
                                     if name.startswith(ENCODE_PREFIX))
        if not self.source_lengths:
            raise TranslationFileError(f"{self.path}: no {ENCODE_PREFIX}<length> signature")
        self._encoders = {n: self.interpreter.get_signature_runner(f"{ENCODE_PREFIX}{n}")
                          for n in self.source_lengths}
        self._steps = {n: self.interpreter.get_signature_runner(f"{DECODE_STEP_PREFIX}{n}")
                       for n in self.source_lengths}
        # `decode_step_{S}_beams_{K}`: K rows in one call ({(S, K): runner}).
        self._row_steps = {
            (int(name.split("_")[2]), int(name.split("_")[4])):
                self.interpreter.get_signature_runner(name)
            for name in names if name.startswith(DECODE_STEP_PREFIX) and "_beams_" in name}
        inputs = self._steps[self.source_lengths[0]].get_input_details()
        self._cache_shape = tuple(inputs["self_attention_cache"]["shape"][1:])  # (N, 2, M, h, dk)
        self.max_length = int(self._cache_shape[2])

    def _encode(self, ids, mask):
        encode = self._encoders[ids.shape[1]]
        return np.concatenate([
            encode(encoder_token_ids=ids[row:row + 1],
                   encoder_padding_mask=mask[row:row + 1])["cross_attention_cache"]
            for row in range(len(ids))])  # (B, 2N, L, h, dk)

    def _step(self, inputs):
        rows, length = inputs["encoder_padding_mask"].shape
        if (length, rows) in self._row_steps:  # every beam in one call
            out = self._row_steps[length, rows](**inputs)
            return out["logits"], out["self_attention_cache"]
        step = self._steps[length]
        outputs = [step(**{name: value[row:row + 1] for name, value in inputs.items()})
                   for row in range(rows)]
        return (np.concatenate([out["logits"] for out in outputs]),
                np.concatenate([out["self_attention_cache"] for out in outputs]))


def runtime_translator(runtime, num_beams=None, **kwargs):
    """The `Translator` of a `TranslationRuntime` (a file, or the ONNX pair): its card gives
    the lengths, the tokenizer and the decoding defaults (`num_beams`, `length_penalty`),
    which `num_beams` and `kwargs` may override."""
    card = runtime.card
    tokenizer = WordPieceTokenizer(runtime.vocabulary, lowercase=card["lowercase"])
    kwargs.setdefault("length_penalty", card["length_penalty"])
    return Translator(runtime, JoinedWordPieces(tokenizer), card["max_length"],
                      card["target_max_length"], num_beams or card["num_beams"], **kwargs)


def _fit(array, length):
    """`array` `(B, S)` cut or zero-padded to `(B, length)` columns."""
    out = np.zeros((len(array), length), "int32")
    out[:, :min(length, array.shape[1])] = array[:, :length]
    return out
