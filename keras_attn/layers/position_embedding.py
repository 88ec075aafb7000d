import keras
from keras import ops

from keras_attn.layers.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class PositionEmbedding(keras.layers.Layer):
    """Learned absolute position embedding (Gehring et al., 2017; BERT, Devlin et al., 2019).

        PE(pos) = E[pos],   E a trainable (sequence_length, d_model) table

    Vaswani et al. (2017, §3.5) report that learned embeddings and the fixed sinusoids give
    nearly identical results; learned ones cannot represent positions beyond
    `sequence_length`, so longer inputs are an error. As with the sinusoids, the layer
    returns the encodings and the caller adds them (`x + PositionEmbedding(512)(x)`).

    Args:
        sequence_length: int, the number of positions the table holds (the maximum
            sequence length).
        initializer: initializer of the table. Defaults to `"glorot_uniform"`.

    Call arguments:
        inputs: `(B, T, d_model)` tensor; only its shape is used (it sets `d_model` when
            the layer is built).
        start_index: int or scalar tensor, position of the first token (incremental
            decoding). Defaults to `0`.

    Returns:
        `(B, T, d_model)` tensor: rows `start_index .. start_index + T - 1` of the table,
        the same for every batch element, in the layer's compute dtype.

    Example:
    >>> x = keras.ops.zeros((2, 5, 8))
    >>> tuple(PositionEmbedding(sequence_length=16)(x).shape)
    (2, 5, 8)
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        check_positive_int(
            "sequence_length", sequence_length, "the number of learned positions"
        )
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.initializer = keras.initializers.get(initializer)
        # Encodings are aligned with the input positions, so the input mask still applies.
        self.supports_masking = True

    def build(self, inputs_shape):
        dim = inputs_shape[-1]
        if dim is None:
            raise ValueError(
                "PositionEmbedding needs a known feature size (the last axis of `inputs`). "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.sequence_length, dim),
            initializer=self.initializer, trainable=True,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        length = inputs.shape[1]
        if isinstance(start_index, int) and length is not None \
                and start_index + length > self.sequence_length:
            raise ValueError(
                f"PositionEmbedding holds `sequence_length={self.sequence_length}` "
                f"positions, but positions {start_index}..{start_index + length - 1} were "
                f"requested (start_index={start_index}, inputs.shape={tuple(inputs.shape)}). "
                "Raise `sequence_length` or use a relative/sinusoidal encoding. "
                f"Received: sequence_length={self.sequence_length}"
            )
        shape = ops.shape(inputs)
        dim = self.embeddings.shape[-1]
        rows = ops.slice(
            ops.cast(self.embeddings, self.compute_dtype), (start_index, 0), (shape[1], dim)
        )  # (T, d)
        return ops.broadcast_to(rows[None], (shape[0], shape[1], dim))  # (B, T, d)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            sequence_length=self.sequence_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
