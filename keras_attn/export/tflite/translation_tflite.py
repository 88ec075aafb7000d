"""`export_translation_tflite`: one `.tflite` file that translates, for Python LiteRT, phones
and the page: per source length bucket `S`

- an `encode_{S}` signature: `encoder_token_ids`, `encoder_padding_mask` `(1, S)` int32 ->
  `cross_attention_cache` `(1, 2N, S, h, d_k)`, every decoder block's keys and values of the
  encoder outputs, projected once per sentence
  (`Seq2SeqTransformer.encoder_model(cross_attention_cache=True)`);
- a `decode_step_{S}` signature: one target token `decoder_token_ids` `(1, 1)`, its position
  `cache_update_index` `(1,)`, the self-attention cache `(1, N, 2, M, h, d_k)` (zeros at the
  start), the cross cache and the source mask -> the next token's `logits` `(1, V)` and the
  updated `self_attention_cache` (`decoder_step_model(M, cross_attention_cache=True)`).

and, with `beams=K`, a `decode_step_{S}_beams_{K}` signature: the step of `K` rows, a beam
search's in one call. Static shapes, batch 1 (K), the caches plain float tensors, builtin
ops only; greedy and beam search run outside the file
(`keras_attn.export.tflite.translation_file`), over the same `keras_attn.generation` code as the
Keras model. Variants (`export_signatures_tflite`): `fp32`, `dynamic_int8` (int8 weights,
float activations) and `int8` from the `quantize_model` copies of the two graphs in the int8
recipe's layout.
"""

from keras_attn.export.tflite.signature_tflite import SIGNATURE_VARIANTS
from keras_attn.export.tflite.signature_tflite import export_signatures_tflite
from keras_attn.layers.validation import check_positive_int

TRANSLATION_VARIANTS = SIGNATURE_VARIANTS
ENCODE_SIGNATURE = "encode_{}"
DECODE_STEP_SIGNATURE = "decode_step_{}"
# The step of `beams` rows at once (one call per step for a beam search of one sentence).
BEAMS_STEP_SIGNATURE = "decode_step_{}_beams_{}"


def translation_graphs(model, max_length):
    """The float `(encoder, decoder step)` functional models of a `Seq2SeqTransformer` that
    the file holds: the encoder with the cross-attention cache out, the step reading it,
    with a self-attention cache of `max_length` positions (BOS + generated tokens)."""
    check_positive_int("max_length", max_length)
    return (model.encoder_model(cross_attention_cache=True),
            model.decoder_step_model(max_length, cross_attention_cache=True))


def export_translation_tflite(encoder, step, output_path, source_lengths, variant="fp32",
                              beams=None):
    """Converts the two translation graphs to one `.tflite` file with an `encode_{S}` and a
    `decode_step_{S}` signature per source length `S` (module docstring).

    Args:
        encoder: `translation_graphs`' encoder, or its `quantize_model` copy (`int8`).
        step: `translation_graphs`' decoder step, or its `quantize_model` copy (`int8`).
        output_path: str or path of the `.tflite` file.
        source_lengths: increasing ints, the source length buckets.
        variant: one of `TRANSLATION_VARIANTS`. `int8` takes calibrated `quantize_model`
            copies in the int8 recipe's layout (a float residual stream); the others the
            float graphs.
        beams: optional int > 1: also a `decode_step_{S}_beams_{K}` signature per length,
            the step of `K` rows (a beam search of one sentence in one call per step; the
            weights are shared, the file grows by its graph only).

    Returns:
        Dict `{"path", "size_bytes", "signatures"}` plus `tflite_op_report`.

    Raises:
        ValueError: an unknown variant, graphs of the wrong kind for it, bad lengths.
        TFLiteExportError: the conversion failed, or a Flex/custom op appeared.
    """
    lengths = list(source_lengths)
    if beams is not None:
        check_positive_int("beams", beams)
    for length in lengths:
        check_positive_int("source_lengths", length)
    if not lengths or lengths != sorted(set(lengths)):
        raise ValueError("`source_lengths` must be increasing positive ints. "
                         f"Received: source_lengths={source_lengths!r}")
    signatures = {}
    for length in lengths:
        signatures[ENCODE_SIGNATURE.format(length)] = ("encoder", length, 1)
        signatures[DECODE_STEP_SIGNATURE.format(length)] = ("step", length, 1)
    if beams and beams > 1:
        for length in lengths:
            signatures[BEAMS_STEP_SIGNATURE.format(length, beams)] = ("step", length, beams)
    return export_signatures_tflite({"encoder": encoder, "step": step}, signatures,
                                    output_path, variant)
