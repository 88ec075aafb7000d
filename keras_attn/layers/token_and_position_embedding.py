import math

import keras
from keras import ops

from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import clone_initializer

POSITION_ENCODINGS = ("learned", "sinusoidal")


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

    def build(self, token_ids_shape, segment_ids_shape=None):
        self.token_embedding = keras.layers.Embedding(
            self.vocabulary_size, self.embedding_dim,
            embeddings_initializer=clone_initializer(self.embeddings_initializer),
            dtype=self.dtype_policy, name="token_embedding",
        )
        self.token_embedding.build(token_ids_shape)
        self.segment_embedding = None
        if self.num_segments:
            self.segment_embedding = keras.layers.Embedding(
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
        self.built = True

    def call(self, token_ids, segment_ids=None, start_index=0):
        if segment_ids is not None and not self.num_segments:
            raise ValueError(
                "`segment_ids` were given but the layer has no segment embeddings. "
                "Create it with `num_segments=2` (BERT) or drop `segment_ids`. "
                f"Received: num_segments={self.num_segments}"
            )
        embedded = self.token_embedding(token_ids)  # (B, T, d)
        if self.scale_token_embeddings:
            embedded = embedded * ops.cast(math.sqrt(self.embedding_dim), embedded.dtype)
        if self.segment_embedding is not None:
            if segment_ids is None:
                segment_ids = ops.zeros_like(token_ids)
            embedded = embedded + self.segment_embedding(segment_ids)  # (B, T, d)
        positions = self.position_embedding(embedded, start_index=start_index)  # (B, T, d)
        return embedded + ops.cast(positions, embedded.dtype)

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
        return config
