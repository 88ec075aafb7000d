"""The settings of the int8 layout of a Transformer block (`EncoderInt8Layout`): its
quantizers, its weight matmuls and the checks of `quantization={...}`."""

from keras_attn.layers.validation import check_int

# TFLite's int8 SOFTMAX has a fixed output scale of 1/256 (zero point -128).
SOFTMAX_RANGE = (0.0, 255.0 / 256.0)

QUANTIZER_NAMES = (
    "qkv_quantizer", "context_quantizer", "attention_output_quantizer",
    "attention_residual_quantizer", "attention_layer_norm_quantizer",
    "intermediate_quantizer", "activation_quantizer", "feedforward_output_quantizer",
    "feedforward_residual_quantizer", "feedforward_layer_norm_quantizer",
)
# The cross-attention sublayer of an encoder-decoder block (`TransformerDecoderBlock` built
# with an encoder sequence): its quantizers besides those of `QUANTIZER_NAMES`.
CROSS_QUANTIZER_NAMES = (
    "encoder_quantizer", "cross_query_quantizer", "cross_key_value_quantizer",
    "cross_context_quantizer", "cross_attention_output_quantizer", "cross_residual_quantizer",
    "cross_layer_norm_quantizer",
)
# The residual stream: float with `float_residual=True`.
RESIDUAL_QUANTIZER_NAMES = ("attention_residual_quantizer", "feedforward_residual_quantizer",
                            "cross_residual_quantizer")
# The weight matmuls, each with the quantizers of its int8 input (when the block produces
# it) and output, which a float matmul (`float_matmuls`) switches off.
MATMULS = {
    "qkv": ("qkv_quantizer",),
    "attention_output": ("context_quantizer", "attention_output_quantizer"),
    "intermediate": ("attention_layer_norm_quantizer", "intermediate_quantizer"),
    "feedforward_output": ("activation_quantizer", "feedforward_output_quantizer"),
}
# The same for a pre-LN block, whose LayerNorm outputs are what the qkv and intermediate
# matmuls read.
PRE_LN_MATMULS = {
    "qkv": ("attention_layer_norm_quantizer", "qkv_quantizer"),
    "attention_output": ("context_quantizer", "attention_output_quantizer"),
    "intermediate": ("feedforward_layer_norm_quantizer", "intermediate_quantizer"),
    "feedforward_output": ("activation_quantizer", "feedforward_output_quantizer"),
}
# The same for a block with cross-attention (post-LN, then pre-LN): the encoder output is
# rounded by the block (`encoder_quantizer`) for its key/value matmul.
CROSS_MATMULS = {
    "qkv": ("qkv_quantizer",),
    "attention_output": ("context_quantizer", "attention_output_quantizer"),
    "cross_query": ("attention_layer_norm_quantizer", "cross_query_quantizer"),
    "cross_key_value": ("encoder_quantizer", "cross_key_value_quantizer"),
    "cross_attention_output": ("cross_context_quantizer", "cross_attention_output_quantizer"),
    "intermediate": ("cross_layer_norm_quantizer", "intermediate_quantizer"),
    "feedforward_output": ("activation_quantizer", "feedforward_output_quantizer"),
}
PRE_LN_CROSS_MATMULS = {
    **PRE_LN_MATMULS,
    "cross_query": ("cross_layer_norm_quantizer", "cross_query_quantizer"),
    "cross_key_value": ("encoder_quantizer", "cross_key_value_quantizer"),
    "cross_attention_output": ("cross_context_quantizer", "cross_attention_output_quantizer"),
}
PRE_LN_CROSS_MATMULS = {name: PRE_LN_CROSS_MATMULS[name] for name in CROSS_MATMULS}
# The settings of the layout (`TransformerEncoderBlock(quantization={...})` takes these
# keys), with their defaults.
LAYOUT_DEFAULTS = dict(
    weight_quantization="per_channel", quantize=True, decay=0.999,
    attention_mask_margin=12.0, masked_score=-1e9, float_residual=False,
    feedforward_float_channels=0, float_matmuls=(), quantize_output=None,
    quantize_input=False, input_producer=None,
)


def check_layout_settings(settings):
    """`settings` (a dict of `LAYOUT_DEFAULTS` keys, or `None`) as a new dict, or an error
    naming the unknown keys."""
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise ValueError("`quantization` must be a dict of int8 layout settings "
                         f"({', '.join(LAYOUT_DEFAULTS)}) or None. Received: "
                         f"quantization={settings!r}")
    unknown = sorted(set(settings) - set(LAYOUT_DEFAULTS))
    if unknown:
        raise ValueError(f"Unknown int8 layout setting(s) {unknown} in `quantization`; the "
                         f"settings are {', '.join(LAYOUT_DEFAULTS)}. Received: "
                         f"quantization={settings!r}")
    return dict(settings)


def check_float_matmuls(float_matmuls):
    """`float_matmuls` as a tuple of `CROSS_MATMULS` names (in graph order; the cross
    ones only for a block with cross-attention), or an error naming the argument."""
    if isinstance(float_matmuls, str) or not all(m in CROSS_MATMULS for m in float_matmuls):
        raise ValueError(f"`float_matmuls` must be a list of {tuple(MATMULS)} (and "
                         f"{tuple(m for m in CROSS_MATMULS if m not in MATMULS)} in a block "
                         f"with cross-attention). Received: float_matmuls={float_matmuls!r}")
    return tuple(m for m in CROSS_MATMULS if m in float_matmuls)


def check_feedforward_float_channels(feedforward_float_channels, intermediate_dim,
                                     float_residual):
    """Raises unless `feedforward_float_channels` is an int in `[0, intermediate_dim)`,
    and above 0 only with `float_residual` (the float channels' output is added in
    float)."""
    k = feedforward_float_channels
    check_int("feedforward_float_channels", k, 0, intermediate_dim,
              meaning="the feed-forward channels kept in float", high_name="intermediate_dim")
    if k and float_residual is not True:
        raise ValueError(
            "`feedforward_float_channels` > 0 needs `float_residual=True`: the float "
            f"channels' output is added to the residual in float. Received: "
            f"feedforward_float_channels={k}, float_residual={float_residual!r}"
        )
