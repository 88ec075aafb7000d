"""`TranslationOnnx`: the ONNX pair of a translation export (`translation_encoder*.onnx`, the
encoder with the cross-attention keys and values out, and `translation_decoder_step*.onnx`,
one decoding step with the self-attention cache in and `present_self_attention_cache` out:
the encoder + decoder-with-past route of transformers.js) on onnxruntime, decoded by the same
greedy and beam search as the Keras model (`TranslationRuntime`). ONNX has dynamic axes, so
the whole batch (every beam) runs in one call, at the source's own length."""

import json
import pathlib

import onnxruntime

from keras_attn.export.tflite.translation_file import TranslationFileError
from keras_attn.export.tflite.translation_file import TranslationRuntime
from keras_attn.runs.export_directory import CARD_FILE
from keras_attn.runs.export_directory import VOCAB_FILE

ENCODER_NAME, STEP_NAME = "translation_encoder", "translation_decoder_step"
PRESENT_CACHE = "present_self_attention_cache"  # the step's updated cache (ONNX: no output
# may share an input's name)


def step_path(encoder_path):
    """The decoding step file beside an encoder file (`translation_encoder{suffix}.onnx` ->
    `translation_decoder_step{suffix}.onnx`)."""
    path = pathlib.Path(encoder_path)
    return path.with_name(path.name.replace(ENCODER_NAME, STEP_NAME, 1))


class TranslationOnnx(TranslationRuntime):
    """The ONNX pair of a translation export as an encoder-decoder model for
    `greedy_decode` and `beam_search`.

    Args:
        path: the encoder file (`translation_encoder*.onnx`, which carries the card and
            vocabulary); the step file is found beside it (`step_path`).
        num_threads: optional int, onnxruntime's intra-op threads.
    """

    def __init__(self, path, num_threads=None):
        self.path = pathlib.Path(path)
        step = step_path(self.path)
        if not self.path.name.startswith(ENCODER_NAME) or not step.is_file():
            raise TranslationFileError(
                f"{self.path}: an ONNX translation model is a {ENCODER_NAME}*.onnx file with "
                f"its {STEP_NAME}*.onnx beside it (keras-attn export of a seq2seq run)")
        options = onnxruntime.SessionOptions()
        if num_threads:
            options.intra_op_num_threads = num_threads
        self._encoder, self._decoder = (
            onnxruntime.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
            for p in (self.path, step))
        files = self._encoder.get_modelmeta().custom_metadata_map
        if CARD_FILE not in files or VOCAB_FILE not in files:
            raise TranslationFileError(f"{self.path}: no embedded {CARD_FILE} and "
                                       f"{VOCAB_FILE}; export the seq2seq run again")
        self.card = json.loads(files[CARD_FILE])
        self.vocabulary = files[VOCAB_FILE].splitlines()
        cache = next(i for i in self._decoder.get_inputs() if i.name == "self_attention_cache")
        self._cache_shape = tuple(cache.shape[1:])  # (N, 2, M, h, dk)
        self.max_length = int(self._cache_shape[2])

    def _encode(self, ids, mask):
        return self._encoder.run(None, {"encoder_token_ids": ids,
                                        "encoder_padding_mask": mask})[0]

    def _step(self, inputs):
        return self._decoder.run(["logits", PRESENT_CACHE], inputs)
