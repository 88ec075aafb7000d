"""`TranslationFile`: a translation `.tflite` file (`keras_attn.export.translation_tflite`) on
Python LiteRT, decoded by the same greedy and beam search as the Keras model.

The file's `encode_{S}` signature projects a source into the decoder blocks' cross-attention
keys and values; its `decode_step_{S}` signature takes one token and the self-attention cache
and returns the next token's logits and the cache. `TranslationFile` offers them as the two
callbacks of `keras_attn.generation` (`initial_decoding_cache`, `next_token_logits`), so
`greedy_decode` and `beam_search` are `EncoderDecoderDecoding`'s, the code that decodes a
`Seq2SeqTransformer`: the search runs in Python (eagerly) around the file, one interpreter call
per row and step (the file has batch 1). The file carries its vocabulary and card (`vocab.txt`,
`model_card.json` in its zip part), so it alone translates (`file_translator`).
"""

import json
import pathlib

import numpy as np
from ai_edge_litert.interpreter import Interpreter
from keras import ops

from keras_attn.errors import KerasAttnError
from keras_attn.export.tflite_metadata import associated_files
from keras_attn.models.seq2seq_decoding import EncoderDecoderDecoding
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import VOCAB_FILE
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.translation import Translator

ENCODE_PREFIX, DECODE_STEP_PREFIX = "encode_", "decode_step_"


class TranslationFileError(KerasAttnError, ValueError):
    """A file that is not a translation `.tflite` file, or a source it cannot hold."""


class TranslationFile(EncoderDecoderDecoding):
    """A translation `.tflite` file as an encoder-decoder model for `greedy_decode` and
    `beam_search` (`EncoderDecoderDecoding`).

    Args:
        path: str or path of the file.
        num_threads: optional int, LiteRT's threads.

    Attributes:
        source_lengths: the file's source length buckets (a source runs in the shortest
            one that holds it).
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
        self._encode = {n: self.interpreter.get_signature_runner(f"{ENCODE_PREFIX}{n}")
                        for n in self.source_lengths}
        self._step = {n: self.interpreter.get_signature_runner(f"{DECODE_STEP_PREFIX}{n}")
                      for n in self.source_lengths}
        inputs = self._step[self.source_lengths[0]].get_input_details()
        self._cache_shape = tuple(inputs["self_attention_cache"]["shape"][1:])  # (N, 2, M, h, dk)
        self.max_length = int(self._cache_shape[2])
        self.vocabulary_size = len(self.vocabulary)

    def bucket(self, length):
        """The shortest source length of the file that holds `length` tokens."""
        for n in self.source_lengths:
            if n >= length:
                return n
        raise TranslationFileError(
            f"a source of {length} tokens is longer than {self.path.name}'s longest source "
            f"length {self.source_lengths[-1]}: cut it (Translator cuts to the card's "
            "max_length) or export with a longer data.max_length")

    def initial_decoding_cache(self, encoder_token_ids, encoder_padding_mask, max_length):
        """Encodes each source row (padded to its bucket) and starts an empty self-attention
        cache: `{"self_attention_cache", "cross_attention_cache", "encoder_padding_mask"}`,
        batch first (what beam search repeats and reorders)."""
        if max_length > self.max_length:
            raise TranslationFileError(
                f"{max_length} decoder positions asked for, {self.path.name}'s cache holds "
                f"{self.max_length} (1 + the card's target_max_length)")
        ids = np.asarray(encoder_token_ids, "int32")  # (B, S)
        mask = np.asarray(encoder_padding_mask).astype("int32")  # (B, S)
        used = int(np.max(np.nonzero(mask.any(0))[0], initial=0)) + 1  # columns with tokens
        length = self.bucket(used)
        ids, mask = _fit(ids, length), _fit(mask, length)  # (B, L)
        cross = np.concatenate([
            self._encode[length](encoder_token_ids=ids[row:row + 1],
                                 encoder_padding_mask=mask[row:row + 1])["cross_attention_cache"]
            for row in range(len(ids))])  # (B, 2N, L, h, dk)
        return {"self_attention_cache": ops.zeros((len(ids), *self._cache_shape)),
                "cross_attention_cache": ops.convert_to_tensor(cross),
                "encoder_padding_mask": ops.convert_to_tensor(mask)}

    def next_token_logits(self, token_ids, cache, index):
        """One decoding step of every row (the `keras_attn.generation` callback):
        `(logits (B, V), cache)` for the last token of `token_ids` at position
        `index + t - 1`."""
        tokens = np.asarray(token_ids, "int32")
        position = int(index) + tokens.shape[1] - 1
        if tokens.shape[1] != 1:
            raise TranslationFileError("the file decodes one token a step; the prompt is "
                                       "the BOS token alone")
        self_cache = np.asarray(cache["self_attention_cache"])
        cross = np.asarray(cache["cross_attention_cache"])
        mask = np.asarray(cache["encoder_padding_mask"])
        step = self._step[mask.shape[1]]
        logits, caches = [], []
        for row in range(len(tokens)):
            out = step(decoder_token_ids=tokens[row:row + 1, -1:],
                       cache_update_index=np.array([position], "int32"),
                       self_attention_cache=self_cache[row:row + 1],
                       cross_attention_cache=cross[row:row + 1],
                       encoder_padding_mask=mask[row:row + 1])
            logits.append(out["logits"])
            caches.append(out["self_attention_cache"])
        return ops.convert_to_tensor(np.concatenate(logits)), {
            **cache, "self_attention_cache": ops.convert_to_tensor(np.concatenate(caches))}

    def _full_pass_next_token_logits(self, token_ids, cache, index):
        raise TranslationFileError("a translation file decodes through its cache only "
                                   "(use_cache=True)")


def file_translator(path, num_beams=None, num_threads=None, **kwargs):
    """The `Translator` of a translation file: its embedded card gives the lengths, the
    tokenizer and the decoding defaults (`num_beams`, `length_penalty`), which `num_beams`
    and `kwargs` may override."""
    model = TranslationFile(path, num_threads=num_threads)
    card = model.card
    tokenizer = WordPieceTokenizer(model.vocabulary, lowercase=card["lowercase"])
    kwargs.setdefault("length_penalty", card["length_penalty"])
    return Translator(model, JoinedWordPieces(tokenizer), card["max_length"],
                      card["target_max_length"], num_beams or card["num_beams"], **kwargs)


def _fit(array, length):
    """`array` `(B, S)` cut or zero-padded to `(B, length)` columns."""
    out = np.zeros((len(array), length), "int32")
    out[:, :min(length, array.shape[1])] = array[:, :length]
    return out
