"""Questions asked of a `quantize_model` copy by the stages that train, calibrate and
convert it: its quantizers, which of them have no range yet, its layout settings, its longest
input, and a batch in the form its inputs take."""

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from keras_attn.layers.xlnet_block import XLNetBlock
from keras_attn.runs.task_head import max_sequence_length  # noqa: F401 - re-exported

# keras-attn's blocks with an int8 layout (`EncoderInt8Layout`).
BLOCKS = (TransformerEncoderBlock, TransformerDecoderBlock, XLNetBlock, TransformerXLBlock)


def activation_quantizers(model):
    """Every `ActivationQuantizer` of `model`, sublayers included, in graph order."""
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, ActivationQuantizer)]


def uncalibrated_quantizers(model):
    """The paths of the `ActivationQuantizer`s of `model` without a range (neither
    calibrated nor trained, nor fixed), in graph order."""
    return [q.path for q in activation_quantizers(model)
            if float(q.initialized.numpy()) < 0.5 and q.fixed_range is None]


def quantized_layer(layer, kind):
    """A layer of class `kind` (a class or tuple) with its int8 layout (`quantization` set)."""
    return isinstance(layer, kind) and layer.quantization is not None


def quantized_block(layer):
    """A block with its int8 layout (`quantization` set)."""
    return isinstance(layer, BLOCKS) and layer.quantization is not None


def model_layout(model):
    """`{"float_residual", "feedforward_float_channels"}` of a `quantize_model` copy: the
    settings its encoder blocks were laid out with (the first block's; `False` and `0`
    without a block)."""
    for layer in model._flatten_layers(include_self=False):
        if quantized_block(layer):
            return {"float_residual": bool(layer.float_residual),
                    "feedforward_float_channels": int(layer.feedforward_float_channels)}
    return {"float_residual": False, "feedforward_float_channels": 0}


def model_inputs(model, x):
    """`x` as `model` takes it: a dict batch keeps the inputs the model has, and a
    `label_mask` it lacks (a CRF tagger's: only the decoding of the tags reads it) is its
    `padding_mask`; any other batch as it is."""
    names = getattr(model, "model", model).input
    if not isinstance(x, dict) or not isinstance(names, dict):
        return x
    inputs = {name: value for name, value in x.items() if name in names}
    if "label_mask" in names and "label_mask" not in inputs and "padding_mask" in x:
        inputs["label_mask"] = x["padding_mask"]
    return inputs
