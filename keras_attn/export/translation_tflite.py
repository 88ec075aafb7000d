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
ops only; greedy and beam
search run outside the file (`keras_attn.inference.translation_file`), over the same
`keras_attn.generation` code as the Keras model. The signatures share their weights (the
converter stores a constant once). Variants: `fp32`, `dynamic_int8` (int8 weights, float
activations) and `int8` from the `quantize_model` copies of the two graphs (the int8 recipe's
layout: with a float residual stream only the fake-quantized tensors become int8, as in
`export_model_int8_tflite`). Conversion runs in the converter's child process.
"""

import os
import tempfile

import keras
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from keras_attn import atomic_files
from keras_attn.export.converter_process import run_job
from keras_attn.export.tflite_export import TFLiteExportError
from keras_attn.export.tflite_export import check_builtins_only
from keras_attn.export.tflite_export import tflite_op_report
from keras_attn.export.tflite_float_ops import run_in_float
from keras_attn.export.tflite_sharing import share_quantization_parameters
from keras_attn.layers.validation import check_positive_int
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.quantization.quantize_model import freeze_model_ranges

TRANSLATION_VARIANTS = ("fp32", "dynamic_int8", "int8")
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
    if variant not in TRANSLATION_VARIANTS:
        raise ValueError(f"`variant` must be one of {TRANSLATION_VARIANTS}. "
                         f"Received: variant={variant!r}")
    lengths = list(source_lengths)
    if beams is not None:
        check_positive_int("beams", beams)
    for length in lengths:
        check_positive_int("source_lengths", length)
    if not lengths or lengths != sorted(set(lengths)):
        raise ValueError("`source_lengths` must be increasing positive ints. "
                         f"Received: source_lengths={source_lengths!r}")
    quantized = [bool(activation_quantizers(graph)) for graph in (encoder, step)]
    if quantized != [variant == "int8"] * 2:
        wanted = "the quantize_model copies" if variant == "int8" else "the float graphs"
        raise ValueError(
            f"variant {variant!r} takes {wanted} of `translation_graphs`; received graphs "
            f"with quantizers: encoder {quantized[0]}, step {quantized[1]}")
    if variant == "int8" and not all(model_layout(g)["float_residual"] for g in (encoder, step)):
        raise ValueError("the int8 translation file takes the int8 recipe's layout "
                         "(quantize_model(..., float_residual=True)): an all-int8 step "
                         "needs the converter's calibration per signature, not supported")
    output_path = os.path.abspath(os.fspath(output_path))
    os.makedirs(os.path.dirname(output_path), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keras_attn_translation_tflite_") as work:
        paths = [os.path.join(work, name) for name in ("encoder.keras", "step.keras")]
        encoder.save(paths[0])
        step.save(paths[1])
        result = run_job("keras_attn.export.translation_tflite:_convert_job",
                         [paths, work, output_path, lengths, variant, beams])
        if not result.ok:
            raise TFLiteExportError(f"{variant} translation TFLite conversion failed "
                                    f"{result.failure()}")
    report = tflite_op_report(output_path)
    check_builtins_only(report, output_path)
    signatures = [name.format(n) for n in lengths
                  for name in (ENCODE_SIGNATURE, DECODE_STEP_SIGNATURE)]
    if beams and beams > 1:
        signatures += [BEAMS_STEP_SIGNATURE.format(n, beams) for n in lengths]
    return {"path": output_path, "size_bytes": os.path.getsize(output_path),
            "signatures": signatures, **report}


def signature_specs(model, source_length, batch=1):
    """The `(batch, ...)` `tf.TensorSpec` of each input of `model`, named after it, every
    dynamic dimension (the source length) set to `source_length`."""
    return [tf.TensorSpec((batch, *(source_length if size is None else size
                                for size in tensor.shape[1:])),
                          tensor.dtype, name=tensor.name) for tensor in model.inputs]


def _frozen_signature(model, specs):
    """A `tf.function` of `model` on `specs` with its variables as constants, returning
    its outputs by name."""
    @tf.function(input_signature=specs)
    def serve(*inputs):
        return model(keras.tree.pack_sequence_as(model.input, list(inputs)), training=False)

    concrete = serve.get_concrete_function()
    frozen = convert_variables_to_constants_v2(concrete)
    names = sorted(concrete.structured_outputs)

    @tf.function(input_signature=specs)
    def named(*inputs):
        # A frozen function returns its outputs as a list (sorted by name): named again.
        return dict(zip(names, keras.tree.flatten(frozen(*inputs))))

    return named


def _convert_job(model_paths, work, output_path, lengths, variant, beams=None):
    """The conversion, in the converter's child process."""
    encoder, step = (keras.saving.load_model(path) for path in model_paths)
    if variant == "int8":
        for graph in (encoder, step):
            freeze_model_ranges(graph)
    signatures = {}
    for length in lengths:
        signatures[ENCODE_SIGNATURE.format(length)] = _frozen_signature(
            encoder, signature_specs(encoder, length))
        signatures[DECODE_STEP_SIGNATURE.format(length)] = _frozen_signature(
            step, signature_specs(step, length))
        if beams and beams > 1:
            signatures[BEAMS_STEP_SIGNATURE.format(length, beams)] = _frozen_signature(
                step, signature_specs(step, length, beams))
    saved = os.path.join(work, "saved_model")
    tf.saved_model.save(tf.Module(), saved, signatures=signatures)
    converter = tf.lite.TFLiteConverter.from_saved_model(saved,
                                                         signature_keys=list(signatures))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if variant != "fp32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    content = converter.convert()
    # The recipe's float ops (as export_model_int8_tflite's file), or each quantization
    # table once (the signatures repeat them: dynamic int8 +11 % with a beams step).
    content = run_in_float(content) if variant == "int8" else share_quantization_parameters(
        content)
    atomic_files.write_bytes(output_path, content)
