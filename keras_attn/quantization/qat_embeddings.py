"""`QatEmbeddings`: BERT's token + segment + position embeddings and LayerNorm with fake
int8 quantization."""

import keras
from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.quantized_dense import fake_quantize_weight
from keras_attn.layers.quantized_dense import frozen_bound
from keras_attn.layers.quantized_layer_normalization import layer_norm
from keras_attn.layers.quantized_layer_normalization import layer_norm_quantizers
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class QatEmbeddings(keras.layers.Layer):
    """BERT's embeddings (Devlin et al., 2019, §3) for quantization-aware training.

        E = Q(LN(Q(Q(TokEmb[x] + SegEmb[s]) + PosEmb[0:T])))

    The three tables are int8 fake-quantized per tensor (TFLite GATHER takes one scale);
    each sum and the LayerNorm output get an `ActivationQuantizer`.

    Args:
        vocabulary_size: int. max_sequence_length: int. num_segments: int.
        hidden_dim: int. layer_norm_epsilon: float > 0.
        quantize: bool; `False` runs the same graph in float. decay: EMA factor.
        float_residual: bool; `True` leaves the sum with the positions and the LayerNorm
            in float (the token + segment sum and the output stay int8), as
            `QatEncoderBlock(float_residual=True)`: the int8 file adds the dequantized
            position rows and normalizes in float.
        quantize_output: bool, round the output to int8 (the first block's first matmul
            reads it). Defaults to `quantize`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        token_ids: `(B, T)` int. segment_ids: `(B, T)` int. training: bool.

    Returns:
        `(B, T, hidden_dim)` embeddings, layer-normalized.

    Example:
    >>> layer = QatEmbeddings(20, 8, 2, 4, 1e-12)
    >>> ids = np.array([[1, 2, 3]])
    >>> tuple(layer(ids, np.zeros_like(ids), training=True).shape)
    (1, 3, 4)
    """

    def __init__(self, vocabulary_size, max_sequence_length, num_segments, hidden_dim,
                 layer_norm_epsilon, quantize=True, decay=0.999, float_residual=False,
                 quantize_output=None, **kwargs):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("max_sequence_length", max_sequence_length)
        check_positive_int("num_segments", num_segments)
        check_positive_int("hidden_dim", hidden_dim)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        check_bool("float_residual", float_residual)
        quantize_output = quantize if quantize_output is None else quantize_output
        check_bool("quantize_output", quantize_output)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.max_sequence_length = max_sequence_length
        self.num_segments = num_segments
        self.hidden_dim = hidden_dim
        self.layer_norm_epsilon = layer_norm_epsilon
        self.quantize = quantize
        self.decay = decay
        self.frozen_bounds = None
        # With `float_residual` the sum with the positions starts the float residual stream.
        self.quantize_output = quantize_output
        self.quantizers = {
            "token_segment_quantizer": ActivationQuantizer(
                decay=decay, quantize=quantize, name="token_segment_quantizer"),
            "sum_quantizer": ActivationQuantizer(
                decay=decay, quantize=quantize and not float_residual, name="sum_quantizer"),
            "layer_norm_quantizer": ActivationQuantizer(
                decay=decay, quantize=quantize_output, name="layer_norm_quantizer"),
        }
        self.float_residual = float_residual
        self.layer_norm_quantizers = layer_norm_quantizers(
            "layer_norm", decay, quantize and not float_residual)

    def build(self, token_ids_shape, segment_ids_shape=None):
        H = self.hidden_dim
        self.token_embeddings = self.add_weight(
            name="token_embeddings", shape=(self.vocabulary_size, H))
        self.segment_embeddings = self.add_weight(
            name="segment_embeddings", shape=(self.num_segments, H))
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(self.max_sequence_length, H))
        self.gamma = self.add_weight(name="gamma", shape=(H,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(H,), initializer="zeros")
        for quantizer in list(self.quantizers.values()) + list(
                self.layer_norm_quantizers.values()):
            quantizer.build(())
        self.built = True

    def _table(self, table, name):
        if not self.quantize:
            return table
        return fake_quantize_weight(table, bound=(self.frozen_bounds or {}).get(name))

    def freeze_weight_ranges(self, frozen=True):
        """Table ranges as constants of the traced graph (export) or computed again."""
        self.frozen_bounds = {
            "token": frozen_bound(self.token_embeddings),
            "segment": frozen_bound(self.segment_embeddings),
            "position": frozen_bound(self.position_embeddings),
        } if frozen else None

    def call(self, token_ids, segment_ids, training=None):
        length = token_ids.shape[1]
        if length is not None and length > self.max_sequence_length:
            raise ValueError(
                f"Sequences of length {length} exceed the position table. Use "
                f"`sequence_length <= max_sequence_length`. Received: "
                f"max_sequence_length={self.max_sequence_length}"
            )
        length = ops.shape(token_ids)[1]
        q = self.quantizers
        tokens = ops.take(self._table(self.token_embeddings, "token"), token_ids,
                          axis=0)  # (B, T, H)
        segments = ops.take(self._table(self.segment_embeddings, "segment"), segment_ids, axis=0)
        x = q["token_segment_quantizer"](tokens + segments, training=training)  # (B, T, H)
        positions = ops.slice(self._table(self.position_embeddings, "position"), (0, 0),
                              (length, self.hidden_dim))  # (T, H)
        x = q["sum_quantizer"](x + positions[None], training=training)  # (B, T, H)
        x = layer_norm(x, self.gamma, self.beta, self.layer_norm_epsilon,
                       self.layer_norm_quantizers, training)
        return q["layer_norm_quantizer"](x, training=training)  # (B, T, H)

    def compute_output_shape(self, token_ids_shape, segment_ids_shape=None):
        return tuple(token_ids_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            max_sequence_length=self.max_sequence_length,
            num_segments=self.num_segments,
            hidden_dim=self.hidden_dim,
            layer_norm_epsilon=self.layer_norm_epsilon,
            quantize=self.quantize,
            decay=self.decay,
            float_residual=self.float_residual,
            quantize_output=self.quantize_output,
        )
        return config
