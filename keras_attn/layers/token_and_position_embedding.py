import math

import keras
from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.quantized_dense import fake_quantize_weight
from keras_attn.layers.quantized_dense import frozen_bound
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import clone_initializer

POSITION_ENCODINGS = ("learned", "sinusoidal")
# The settings of `quantization` and their defaults.
QUANTIZATION_DEFAULTS = dict(quantize=True, decay=0.999, quantize_output=None)


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token + segment + position embeddings: the input representation of BERT.

        E(x_t) = TokenEmb(x_t) * s + SegmentEmb(seg_t) + PosEmb(t)

    BERT (Devlin et al., 2019, §3 and Fig. 2) sums learned token, segment (sentence A/B)
    and position embeddings. The original Transformer (Vaswani et al., 2017, §3.4–3.5)
    uses no segments, fixed sinusoidal positions and scales token embeddings by
    `s = sqrt(d_model)`; set `position_encoding="sinusoidal"` and
    `scale_token_embeddings=True` for that. Otherwise `s = 1`.

    Args:
        vocabulary_size: int, number of token ids.
        sequence_length: int, longest sequence (size of the learned position table).
            Optional with sinusoidal positions.
        embedding_dim: int, `d_model`.
        num_segments: int, number of segment types (2 for BERT's sentence A/B; 0 for none).
        position_encoding: `"learned"` (BERT, GPT) or `"sinusoidal"` (Transformer).
        scale_token_embeddings: bool, multiply token embeddings by `sqrt(embedding_dim)`.
        mask_zero: bool, token id 0 is padding: emit a Keras mask for downstream layers.
        embeddings_initializer: initializer of the token, segment and position tables.
            Defaults to `TruncatedNormal(stddev=0.02)` as in BERT.
        quantization: optional dict of int8 settings (keys of `QUANTIZATION_DEFAULTS`:
            `quantize`, `decay`, `quantize_output`), for quantization-aware training in
            the layout of the int8 TFLite file: the tables are fake-quantized per tensor
            (the one symmetric scale of TFLite's GATHER, `QuantizedEmbedding`), and each
            sum (and the scaled token rows) gets an `ActivationQuantizer`; the output is
            rounded unless `quantize_output=False`. Same weights as the float layer;
            `keras_attn.quantization.quantize_model` sets it. Defaults to `None` (float).

    Call arguments:
        token_ids: `(B, T)` int tensor.
        segment_ids: optional `(B, T)` int tensor; zeros (all sentence A) when omitted.
        start_index: int or scalar tensor, position of the first token (decoding).

    Returns:
        `(B, T, embedding_dim)` tensor in the layer's compute dtype.

    Example:
    >>> embed = TokenAndPositionEmbedding(100, 16, 8, num_segments=2)
    >>> ids = keras.ops.array([[5, 6, 7, 0]])
    >>> tuple(embed(ids, segment_ids=keras.ops.array([[0, 0, 1, 1]])).shape)
    (1, 4, 8)
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        num_segments=0,
        position_encoding="learned",
        scale_token_embeddings=False,
        mask_zero=False,
        embeddings_initializer=None,
        quantization=None,
        **kwargs,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("embedding_dim", embedding_dim)
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {POSITION_ENCODINGS}. "
                f"Received: position_encoding={position_encoding!r}"
            )
        if position_encoding == "learned":
            check_positive_int(
                "sequence_length", sequence_length, "the size of the learned position table"
            )
        check_int("num_segments", num_segments, low=0)
        quantization = _check_quantization(quantization)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.sequence_length = sequence_length
        self.embedding_dim = embedding_dim
        self.num_segments = num_segments
        self.position_encoding = position_encoding
        self.scale_token_embeddings = scale_token_embeddings
        self.mask_zero = mask_zero
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )
        self.supports_masking = mask_zero
        self.quantization = quantization
        self.quantizers = {}
        self.frozen_position_bound = None  # `max|P|` as a constant (export)
        if quantization is not None:
            quantize, decay = quantization["quantize"], quantization["decay"]
            names = (["token_quantizer"] if scale_token_embeddings else []) + (
                ["token_segment_quantizer"] if num_segments else [])
            self.quantizers = {name: ActivationQuantizer(decay=decay, quantize=quantize,
                                                         name=name) for name in names}
            self.quantizers["output_quantizer"] = ActivationQuantizer(
                decay=decay, quantize=quantization["quantize_output"], name="output_quantizer")

    def build(self, token_ids_shape, segment_ids_shape=None):
        rounds = self.quantization is not None and self.quantization["quantize"]
        embedding = QuantizedEmbedding if rounds else keras.layers.Embedding
        self.token_embedding = embedding(
            self.vocabulary_size, self.embedding_dim,
            embeddings_initializer=clone_initializer(self.embeddings_initializer),
            dtype=self.dtype_policy, name="token_embedding",
        )
        self.token_embedding.build(token_ids_shape)
        self.segment_embedding = None
        if self.num_segments:
            self.segment_embedding = embedding(
                self.num_segments, self.embedding_dim,
                embeddings_initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy, name="segment_embedding",
            )
            self.segment_embedding.build(token_ids_shape)
        embedded_shape = tuple(token_ids_shape) + (self.embedding_dim,)
        if self.position_encoding == "learned":
            self.position_embedding = PositionEmbedding(
                self.sequence_length,
                initializer=clone_initializer(self.embeddings_initializer),
                dtype=self.dtype_policy, name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding(
                dtype=self.dtype_policy, name="position_embedding"
            )
        self.position_embedding.build(embedded_shape)
        for quantizer in self.quantizers.values():
            quantizer.build(())
        self.built = True

    def call(self, token_ids, segment_ids=None, start_index=0, training=None):
        if segment_ids is not None and not self.num_segments:
            raise ValueError(
                "`segment_ids` were given but the layer has no segment embeddings. "
                "Create it with `num_segments=2` (BERT) or drop `segment_ids`. "
                f"Received: num_segments={self.num_segments}"
            )
        embedded = self.token_embedding(token_ids)  # (B, T, d)
        if self.scale_token_embeddings:
            embedded = embedded * ops.cast(math.sqrt(self.embedding_dim), embedded.dtype)
            embedded = self._round("token_quantizer", embedded, training)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = ops.zeros_like(token_ids)
            embedded = embedded + self.segment_embedding(segment_ids)  # (B, T, d)
            embedded = self._round("token_segment_quantizer", embedded, training)
        if self.quantization is not None and self.quantization["quantize"]:
            positions = self._quantized_positions(embedded, start_index)  # (B, T, d)
        else:
            positions = self.position_embedding(embedded, start_index=start_index)
        outputs = embedded + ops.cast(positions, embedded.dtype)  # (B, T, d)
        return self._round("output_quantizer", outputs, training)

    def _round(self, name, x, training):
        return self.quantizers[name](x, training=training) if name in self.quantizers else x

    def _quantized_positions(self, embedded, start_index):
        """The position rows at the one int8 scale of the whole table (the file stores the
        table, sinusoidal or learned, as one int8 constant). A learned table is rounded
        whole, then sliced: with frozen ranges the rounding is of a constant, which graph
        converters fold even when the length is dynamic (an ONNX file's)."""
        if self.position_encoding != "learned":
            positions = self.position_embedding(embedded, start_index=start_index)
            return fake_quantize_weight(positions, bound=self.frozen_position_bound)
        table = self.position_embedding.embeddings  # (P, d)
        bound = self.frozen_position_bound
        if bound is None:
            bound = ops.maximum(ops.max(ops.abs(table)), 1e-8)
        table = ops.cast(fake_quantize_weight(table, bound=bound), embedded.dtype)
        shape = ops.shape(embedded)
        rows = ops.slice(table, (start_index, 0), (shape[1], table.shape[-1]))  # (T, d)
        return ops.broadcast_to(rows[None], (shape[0], shape[1], table.shape[-1]))

    def freeze_weight_ranges(self, frozen=True):
        """The tables' bounds as constants of the traced graph (export) or computed
        again."""
        for layer in (self.token_embedding, self.segment_embedding):
            if isinstance(layer, QuantizedEmbedding):
                layer.freeze_weight_ranges(frozen)
        self.frozen_position_bound = (
            frozen_bound(self.position_embedding.embeddings)
            if frozen and self.position_encoding == "learned" else None)

    def compute_mask(self, token_ids, previous_mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, token_ids_shape, segment_ids_shape=None):
        return tuple(token_ids_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            sequence_length=self.sequence_length,
            embedding_dim=self.embedding_dim,
            num_segments=self.num_segments,
            position_encoding=self.position_encoding,
            scale_token_embeddings=self.scale_token_embeddings,
            mask_zero=self.mask_zero,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        if self.quantization is not None:
            config["quantization"] = dict(self.quantization)
        return config


def _check_quantization(quantization):
    """`quantization` with every setting filled in, or an error naming the unknown ones."""
    if quantization is None:
        return None
    if not isinstance(quantization, dict) or set(quantization) - set(QUANTIZATION_DEFAULTS):
        raise ValueError(
            "`quantization` must be None or a dict of the int8 settings "
            f"{tuple(QUANTIZATION_DEFAULTS)}. Received: quantization={quantization!r}")
    settings = {**QUANTIZATION_DEFAULTS, **quantization}
    if settings["quantize_output"] is None:
        settings["quantize_output"] = settings["quantize"]
    return settings
