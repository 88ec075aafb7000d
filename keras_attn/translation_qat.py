"""`QATTranslation`: a quantization-aware `Seq2SeqTransformer` (the `quantize_model` copy that
`model.quantization_aware: true` trains) decoded by the same greedy and beam search as the
float model, through the int8 translation graphs in Keras.

The QAT copy is one functional model of the teacher-forced pass: no cache, no `beam_search`.
Its translations come from the two graphs of a translation file (`keras_attn.export.
translation_tflite.translation_graphs`: the
encoder with the cross-attention keys and values out, one decoding step with the
self-attention cache), quantized in the QAT model's layout and calibrated as the int8 file's
are (`calibrated_translation_graphs`: the encoder on training sources, the step on the float
graphs' greedy decoding of them), then given the QAT model's trained weights and ranges
(`copy_qat_weights`): only the step's two cache inputs, which the QAT model has no quantizer
for, keep their calibrated ranges. They then compute what the QAT model computes, token by
token (its decoder positions' rounding aside), and they are what the int8 file of a QAT run
holds (`keras_attn.stages.translation_exporter`).
"""

import numpy as np
from keras import ops

from keras_attn.models.seq2seq_decoding import EncoderDecoderDecoding
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.model_queries import model_layout
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantized_weights import copy_quantized_weights
from keras_attn.translation import TranslationError

CALIBRATION_SOURCES = 256
CALIBRATION_BATCH = 32
# The decoding step is calibrated on the first STEP_ROWS rows of each batch at every
# STEP_STRIDE-th position: each recorded step holds its own self-attention cache (at
# Multi30k's size 0.4 MB a row), all 32 rows at every position took 6.4 GB.
STEP_ROWS, STEP_STRIDE = 8, 2
# `quantize_model` numbers a layer's output quantizers by call: the QAT model's shared token
# embedding gathers the source (1st), the target (2nd) and projects the logits (3rd); the
# step graph gathers its token (1st) and projects (2nd). {step's name: the QAT model's}.
STEP_QUANTIZER_NAMES = {"token_embedding_output_quantizer": "token_embedding_output_quantizer_1",
                        "token_embedding_output_quantizer_1":
                            "token_embedding_output_quantizer_2"}


def calibrated_translation_graphs(encoder, step, sources, tokenizer, layout):
    """The `quantize_model` copies of the two translation graphs in `layout`, calibrated:
    the encoder on `sources`, the step on the inputs of the float graphs' greedy decoding
    of them (`STEP_ROWS` rows of each batch, every `STEP_STRIDE`-th position).

    Args:
        encoder: `translation_graphs`' float encoder.
        step: `translation_graphs`' float decoding step.
        sources: source id arrays (joined pieces plus `[SEP]`), e.g. training sources.
        tokenizer: the run's `WordPieceTokenizer` (its pad, BOS and EOS ids).
        layout: `quantize_model` keyword arguments (`QuantizationRecipe().layout()`, or a
            QAT model's `model_layout`).

    Returns:
        `(int8 encoder, int8 step, the number of recorded decoding steps)`.

    Example (the exporter's int8 graphs):
    >>> encoder, step = translation_graphs(model, 1 + target_max_length)  # doctest: +SKIP
    >>> calibrated_translation_graphs(encoder, step, sources, tokenizer,
    ...                               QuantizationRecipe().layout())  # doctest: +SKIP
    """
    batches = [_padded(sources[i:i + CALIBRATION_BATCH], tokenizer.pad_token_id)
               for i in range(0, len(sources), CALIBRATION_BATCH)]
    step_inputs = [inputs for batch in batches
                   for inputs in _greedy_step_inputs(encoder, step, batch, tokenizer)]
    int8_encoder, int8_step = quantize_model(encoder, **layout), quantize_model(step, **layout)
    calibrate_model(int8_encoder, batches)
    calibrate_model(int8_step, step_inputs)
    return int8_encoder, int8_step, len(step_inputs)


def _padded(sources, pad_token_id):
    length = max(len(s) for s in sources)
    ids = np.full((len(sources), length), pad_token_id, "int32")
    for row, source in enumerate(sources):
        ids[row, :len(source)] = source
    return {"encoder_token_ids": ids,
            "encoder_padding_mask": (ids != pad_token_id).astype("int32")}


def _greedy_step_inputs(encoder, step, batch, tokenizer):
    """The decoding step's inputs (`STEP_ROWS` rows, every `STEP_STRIDE`-th position, copies)
    during the float graphs' greedy decoding of `batch` (until every row has ended)."""
    cross = ops.convert_to_numpy(encoder(batch)["cross_attention_cache"])
    rows, cache_shape = len(cross), step.input["self_attention_cache"].shape[1:]
    cache = np.zeros((rows, *cache_shape), "float32")  # (B, N, 2, M, h, dk)
    token = np.full((rows, 1), tokenizer.cls_token_id, "int32")
    done = np.zeros(rows, bool)
    recorded, kept_cross = [], cross[:STEP_ROWS].copy()
    for index in range(cache_shape[2]):
        inputs = {"decoder_token_ids": token,
                  "cache_update_index": np.full((rows,), index, "int32"),
                  "self_attention_cache": cache, "cross_attention_cache": cross,
                  "encoder_padding_mask": batch["encoder_padding_mask"]}
        if index % STEP_STRIDE == 0:
            recorded.append({name: value[:STEP_ROWS].copy() if name != "cross_attention_cache"
                             else kept_cross for name, value in inputs.items()})
        outputs = step(inputs)
        cache = ops.convert_to_numpy(outputs["self_attention_cache"])
        token = ops.convert_to_numpy(outputs["logits"]).argmax(-1)[:, None].astype("int32")
        done |= token[:, 0] == tokenizer.sep_token_id
        if done.all():
            break
    return recorded


def copy_qat_weights(qat_model, encoder, step):
    """Gives the quantized translation graphs the weights and activation ranges of
    `qat_model`, layer by layer name (`copy_quantized_weights`; the token embedding's
    output quantizers by `STEP_QUANTIZER_NAMES` in the step).

    Args:
        qat_model: the QAT copy of a `Seq2SeqTransformer`, trained or calibrated.
        encoder, step: `quantize_model` copies of its `translation_graphs` in its layout.

    Returns:
        The names of the graphs' weighted layers that `qat_model` has not (left as they
        were: the step's cache input quantizers).

    Raises:
        ValueError: the graphs are not of `qat_model`'s float model in its layout.
    """
    missing = copy_quantized_weights(qat_model, encoder)
    missing += copy_quantized_weights(qat_model, step)
    for name, source in STEP_QUANTIZER_NAMES.items():
        step.get_layer(name).set_weights(qat_model.get_layer(source).get_weights())
    return missing


class QATTranslation(EncoderDecoderDecoding):
    """A quantization-aware `Seq2SeqTransformer` as an encoder-decoder model for
    `greedy_decode` and `beam_search` (`Translator(QATTranslation(...), ...)`), over its
    quantized translation graphs (module docstring): the two callbacks of a
    `TranslationRuntime`, with the graphs run as Keras models inside the `Translator`'s
    `tf.function` (no NumPy round trip). `refresh()` copies the QAT model's weights again
    once it has trained on.

    Args:
        qat_model: the QAT copy (`quantize_model`) of `float_model`, trained or not.
        float_model: the `Seq2SeqTransformer` it copies (its graphs' layers and the
            calibration decoding; its weights are not decoded).
        sources: source id arrays the graphs are calibrated on (training sources).
        tokenizer: the run's `WordPieceTokenizer`.
        max_length: int, decoder positions of the self-attention cache (BOS + generated).
        graphs: optional `(int8 encoder, int8 step)` calibrated already (the exporter's);
            then `float_model` and `sources` are not read.

    Attributes:
        encoder, step: the quantized graphs (the int8 file's, once converted).
        calibrated_only: names of the graphs' layers whose ranges are calibrated, not the
            QAT model's.

    Example (what the `seq2seq` task's evaluation of a QAT run decodes):
    >>> runtime = QATTranslation(qat_model, float_model, training_sources, tokenizer,
    ...                          1 + target_max_length)  # doctest: +SKIP
    >>> Translator(runtime, JoinedWordPieces(tokenizer), max_length, target_max_length,
    ...            num_beams=4).translate(["Ein Hund rennt."])  # doctest: +SKIP
    ['A dog is running.']
    """

    def __init__(self, qat_model, float_model, sources, tokenizer, max_length, graphs=None):
        self.qat_model = qat_model
        self.vocabulary_size = tokenizer.vocabulary_size()
        if graphs is None:
            # `translation_graphs(float_model, max_length)` (not imported: the export
            # package imports the trainer, which imports this module's task)
            graphs = calibrated_translation_graphs(
                float_model.encoder_model(cross_attention_cache=True),
                float_model.decoder_step_model(max_length, cross_attention_cache=True),
                sources, tokenizer, model_layout(qat_model))[:2]
        self.encoder, self.step = graphs
        self._cache_shape = tuple(self.step.input["self_attention_cache"].shape[1:])
        self.max_length = int(self._cache_shape[2])  # (N, 2, M, h, dk)
        self.calibrated_only = self.refresh()

    def refresh(self):
        """Copies the QAT model's weights and ranges into the graphs (`copy_qat_weights`);
        returns the names of the layers it has not."""
        return copy_qat_weights(self.qat_model, self.encoder, self.step)

    def initial_decoding_cache(self, encoder_token_ids, encoder_padding_mask, max_length):
        """The encoder graph's cross cache of the sources `(B, 2N, S, h, d_k)` and an empty
        self-attention cache `(B, N, 2, M, h, d_k)`."""
        if max_length > self.max_length:
            raise TranslationError(
                f"{max_length} decoder positions asked for, the QAT graphs' cache holds "
                f"{self.max_length} (1 + the run's data.target_max_length)")
        mask = ops.cast(encoder_padding_mask, "int32")  # (B, S)
        cross = self.encoder({"encoder_token_ids": ops.cast(encoder_token_ids, "int32"),
                              "encoder_padding_mask": mask},
                             training=False)["cross_attention_cache"]
        batch = ops.shape(encoder_token_ids)[0]
        return {"self_attention_cache": ops.zeros((batch, *self._cache_shape)),
                "cross_attention_cache": cross, "encoder_padding_mask": mask}

    def _full_pass_next_token_logits(self, token_ids, cache, index):
        raise TranslationError("the QAT graphs decode through the cache only (use_cache=True)")

    def next_token_logits(self, token_ids, cache, index):
        """One step of the step graph for every row: `(logits (B, V), cache)`."""
        if token_ids.shape[1] != 1:
            raise TranslationError("the QAT graphs decode one token a step; the prompt is "
                                   "the BOS token alone")
        outputs = self.step({
            "decoder_token_ids": ops.cast(token_ids, "int32"),
            "cache_update_index": ops.full((ops.shape(token_ids)[0],), index, "int32"),
            "self_attention_cache": cache["self_attention_cache"],
            "cross_attention_cache": cache["cross_attention_cache"],
            "encoder_padding_mask": cache["encoder_padding_mask"]}, training=False)
        return outputs["logits"], {**cache,
                                   "self_attention_cache": outputs["self_attention_cache"]}

