"""The keras-attn layer library (one public layer or op per module)."""

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.alibi_bias import AlibiBias
from keras_attn.layers.alibi_bias import alibi_slopes
from keras_attn.layers.attention_mask import causal_mask
from keras_attn.layers.attention_mask import merge_attention_masks
from keras_attn.layers.attention_mask import query_key_positions
from keras_attn.layers.attention_mask import sliding_window_mask
from keras_attn.layers.crf import CRF
from keras_attn.layers.crf import viterbi_decode
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.layers.quantized_reversible_embedding import QuantizedReversibleEmbedding
from keras_attn.layers.relative_multi_head_attention import RelativeMultiHeadAttention
from keras_attn.layers.relative_multi_head_attention import relative_shift
from keras_attn.layers.rotary_embedding import RotaryEmbedding
from keras_attn.layers.scaled_dot_product_attention import masked_softmax
from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention
from keras_attn.layers.scored_attention import ScoredAttention
from keras_attn.layers.shaw_relative_attention import ShawRelativeAttention
from keras_attn.layers.shaw_relative_attention import clipped_relative_positions
from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.sinusoidal_position_encoding import sinusoidal_table
from keras_attn.layers.t5_relative_position_bias import T5RelativePositionBias
from keras_attn.layers.t5_relative_position_bias import relative_position_bucket
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from keras_attn.layers.two_stream_relative_attention import TwoStreamRelativeAttention
from keras_attn.layers.xlnet_block import XLNetBlock

__all__ = [
    "ActivationQuantizer",
    "AlibiBias",
    "CRF",
    "MultiHeadAttention",
    "PositionEmbedding",
    "QuantizedDense",
    "QuantizedEmbedding",
    "QuantizedReversibleEmbedding",
    "QuantizedLayerNormalization",
    "RelativeMultiHeadAttention",
    "RotaryEmbedding",
    "ScoredAttention",
    "ShawRelativeAttention",
    "SinusoidalPositionEncoding",
    "T5RelativePositionBias",
    "TokenAndPositionEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
    "TransformerXLBlock",
    "alibi_slopes",
    "causal_mask",
    "clipped_relative_positions",
    "masked_softmax",
    "merge_attention_masks",
    "query_key_positions",
    "relative_position_bucket",
    "relative_shift",
    "scaled_dot_product_attention",
    "sinusoidal_table",
    "sliding_window_mask",
    "viterbi_decode",
    "TwoStreamRelativeAttention",
    "XLNetBlock",
]
