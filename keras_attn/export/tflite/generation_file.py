"""`GenerationFile`: a language model's `.tflite` file (`keras-attn export` of a `causal_lm`
run) on Python LiteRT, decoded by the same `keras_attn.generation` code as the Keras model.

The file's `decode_step` signature is `GPTCausalLM.decoder_step_model`: one token
`token_ids` `(1, 1)`, its position `cache_update_index` `(1,)` and the key/value cache
`(1, N, 2, M, h, d_k)` in, the next token's `logits` `(1, V)` and the updated `cache` out.
`GenerationFile` offers it as `next_token_logits` and `build_cache`, the two things
`TextGenerator` (and `keras_attn.generation.generate`) ask of a `GPTCausalLM`: a prompt runs
through the step one token at a time, each row on its own (the file has batch 1). The file
carries its card and vocabulary (`model_card.json`, `characters.json` or `vocab.txt` in its
zip part), so it alone generates (`file_generator`).
"""

import json
import pathlib

import numpy as np
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from keras_attn.export.tflite.numpy_call import numpy_call
from keras_attn.export.tflite.tflite_metadata import associated_files
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.text_generation import GENERATION_TASK
from keras_attn.text_generation import GenerationError
from keras_attn.text_generation import TextCodec
from keras_attn.text_generation import TextGenerator

DECODE_STEP_SIGNATURE = "decode_step"


class GenerationFile:
    """A language model's `.tflite` file as a `next_token_logits` callback.

    Args:
        path: str or path of the file.
        num_threads: optional int, LiteRT's threads.

    Attributes:
        card: the embedded `model_card.json` (dict).
        codec: the `TextCodec` of the embedded vocabulary.
        max_length: the positions of the file's cache (prompt + generated tokens).
    """

    def __init__(self, path, num_threads=None):
        self.path = pathlib.Path(path)
        files = associated_files(self.path) if self.path.is_file() else {}
        card = json.loads(files[CARD_FILE]) if CARD_FILE in files else {}
        if card.get("task") != GENERATION_TASK or card.get("vocabulary_file") not in files:
            raise GenerationError(
                f"{self.path}: not a language model file of `keras-attn export` (no embedded "
                f"{CARD_FILE} of task {GENERATION_TASK!r} with its vocabulary); export the "
                "causal_lm run again")
        self.card = card
        self.codec = TextCodec.from_files(files, card["tokenizer"], card.get("lowercase", True))
        self.interpreter = Interpreter(model_path=str(self.path), num_threads=num_threads)
        self._step = self.interpreter.get_signature_runner(DECODE_STEP_SIGNATURE)
        inputs = self._step.get_input_details()
        self._cache_shape = tuple(inputs["cache"]["shape"][1:])  # (N, 2, M, h, dk)
        self.max_length = int(self._cache_shape[2])
        self.vocabulary_size = int(self._step.get_output_details()["logits"]["shape"][-1])

    def build_cache(self, batch_size, max_length):
        """The empty cache of `batch_size` rows (`max_length`: the positions needed, at most
        the file's)."""
        if max_length > self.max_length:
            raise GenerationError(f"{max_length} positions asked for, {self.path.name} holds "
                                  f"{self.max_length}")
        return tf.zeros((batch_size, *self._cache_shape))

    def next_token_logits(self, token_ids, cache, index):
        """`(logits (B, V), cache)` after `token_ids` `(B, t)` at positions `index ..
        index + t - 1` (the `keras_attn.generation` callback; a prompt of `t` tokens takes
        `t` calls of the file)."""
        logits, cache = numpy_call(self._steps, [token_ids, index, cache],
                                   [tf.float32, tf.float32])
        logits.set_shape([None, self.vocabulary_size])
        cache.set_shape([None, *self._cache_shape])
        return logits, cache

    def sequence_logits(self, ids):
        """The `(T, V)` next-token logits after each of the ids `(T,)` (T <= `max_length`),
        the file called once per token (what the model's full pass gives at once)."""
        logits, _ = self._row_steps(np.asarray(ids), 0, np.zeros((1, *self._cache_shape),
                                                                 "float32"))
        return logits.astype("float64")

    def _steps(self, tokens, index, cache):
        """`(logits (B, V), cache)` after each row's `tokens`, one row at a time."""
        rows = [self._row_steps(tokens[row], int(index), cache[row:row + 1])
                for row in range(len(tokens))]
        return (np.stack([logits[-1] for logits, _ in rows]).astype("float32"),
                np.concatenate([row_cache for _, row_cache in rows]).astype("float32"))

    def _row_steps(self, tokens, index, cache):
        """The `(t, V)` logits after each of one row's `tokens` `(t,)` from position
        `index`, and the row's cache `(1, ...)` after the last."""
        logits = []
        for t, token in enumerate(tokens):
            out = self._step(token_ids=np.array([[token]], "int32"),
                             cache_update_index=np.array([index + t], "int32"), cache=cache)
            cache = out["cache"]
            logits.append(out["logits"][0])
        return np.stack(logits), cache


def file_generator(path, num_threads=None):
    """The `TextGenerator` of a language model's `.tflite` file."""
    runtime = GenerationFile(path, num_threads=num_threads)
    return TextGenerator(runtime, runtime.codec, runtime.max_length)
