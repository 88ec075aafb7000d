"""`export_translation_onnx`: the ONNX pair of a translation model, the encoder + decoder-with-
past route of transformers.js: `translation_encoder.onnx` (source ids and mask -> the decoder
blocks' cross-attention keys and values) and `translation_decoder_step.onnx` (one token, the
self-attention cache and the cross cache -> `logits` and `present_self_attention_cache`), with
dynamic batch and source axes, float32, and their onnxruntime dynamic-int8 versions
(`*_dynamic_int8.onnx`). The encoder file carries the card and vocabulary
(`metadata_props`); `keras_attn.export.onnx.translation_onnx.TranslationOnnx` runs the pair."""

import keras

from keras_attn.export.onnx.onnx_export import export_onnx
from keras_attn.export.onnx.onnx_metadata import embed_onnx_metadata
from keras_attn.export.onnx.onnx_quantization import quantize_onnx_dynamic
from keras_attn.export.onnx.translation_onnx import ENCODER_NAME
from keras_attn.export.onnx.translation_onnx import PRESENT_CACHE
from keras_attn.export.onnx.translation_onnx import STEP_NAME

ONNX_VARIANTS = {"onnx_fp32": "", "onnx_dynamic_int8": "_dynamic_int8"}  # file name suffixes


def export_translation_onnx(encoder, step, output_dir, card, vocabulary):
    """Writes the ONNX pairs of `translation_graphs`' float `encoder` and `step` into
    `output_dir`.

    Args:
        encoder, step: `keras_attn.export.tflite.translation_tflite.translation_graphs(...)`.
        output_dir: pathlib.Path, an existing directory.
        card: dict, the translation card embedded in each encoder file.
        vocabulary: list of str, the tokens embedded beside it.

    Returns:
        `{variant: encoder file path}` for `ONNX_VARIANTS` (each step file beside it).
    """
    # ONNX names each output once in a graph: the updated cache is not the input's name.
    step = keras.Model(step.input, {"logits": step.output["logits"],
                                    PRESENT_CACHE: step.output["self_attention_cache"]})
    paths = {}
    for variant, suffix in ONNX_VARIANTS.items():
        paths[variant] = output_dir / f"{ENCODER_NAME}{suffix}.onnx"
        step_file = output_dir / f"{STEP_NAME}{suffix}.onnx"
        if not suffix:
            export_onnx(encoder, paths[variant])
            export_onnx(step, step_file)
        else:
            quantize_onnx_dynamic(paths["onnx_fp32"], paths[variant])
            quantize_onnx_dynamic(output_dir / f"{STEP_NAME}.onnx", step_file)
        embed_onnx_metadata(paths[variant], card, vocabulary, [])
    return paths
