import keras
from keras import ops

from keras_attn.layers.transformer_block_base import get_activation
from keras_attn.layers.transformer_block_base import serialize_activation
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import clone_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedLMHead(keras.layers.Layer):
    """BERT's masked-language-model head (Devlin et al., 2019, §3.1 "Task #1: Masked LM";
    `cls/predictions` in the original code).

        h_p = sequence_output[b, mask_positions[b, p]]               (B, P, H)
        u_p = LayerNorm(act(W_t h_p + b_t))                          (B, P, H)
        logits_p = u_p E^T + b_out                                   (B, P, V)

    The output matrix is the token embedding table `E` itself — the same variable, not a
    copy (Press & Wolf, 2017): the head owns only the transform (`transform_dense`,
    `transform_layer_norm`) and the per-token `output_bias`. Without a token embedding
    (`vocabulary_size` given instead) it creates an untied `(H, V)` kernel.

    Args:
        token_embedding: the `keras.layers.Embedding` whose `(V, H)` table is the output
            matrix (`BertBackbone.token_embedding`). Not part of the config: the task
            model that creates the head passes it again when it is rebuilt.
        vocabulary_size: int, `V`, only for an untied head (no `token_embedding`).
        intermediate_activation: activation of the transform. Defaults to `"gelu"`.
        layer_norm_epsilon: float > 0. Defaults to `1e-12` (BERT's).
        kernel_initializer: initializer of the transform (and of an untied output
            kernel). Defaults to `TruncatedNormal(stddev=0.02)`.
        **kwargs: base layer arguments.

    Call arguments:
        sequence_output: `(B, T, H)` encoder states.
        mask_positions: `(B, P)` int positions to predict (e.g. of the `[MASK]` tokens).

    Returns:
        `(B, P, V)` logits.

    Example:
    >>> embedding = keras.layers.Embedding(20, 8)
    >>> embedding.build((None, None))
    >>> head = MaskedLMHead(token_embedding=embedding)
    >>> logits = head(np.ones((2, 5, 8), "float32"), mask_positions=np.array([[1, 3], [0, 0]]))
    >>> tuple(logits.shape), head.token_embedding.embeddings is embedding.embeddings
    ((2, 2, 20), True)
    """

    def __init__(
        self,
        token_embedding=None,
        vocabulary_size=None,
        intermediate_activation="gelu",
        layer_norm_epsilon=1e-12,
        kernel_initializer=None,
        **kwargs,
    ):
        if token_embedding is None and vocabulary_size is None:
            raise ValueError(
                "MaskedLMHead needs the `token_embedding` to tie its output matrix to, or "
                "a `vocabulary_size` for an untied output kernel. Received: "
                "token_embedding=None, vocabulary_size=None"
            )
        if token_embedding is not None:
            if vocabulary_size not in (None, token_embedding.input_dim):
                raise ValueError(
                    "`vocabulary_size` must match the tied token embedding "
                    f"({token_embedding.input_dim} ids) or be omitted. "
                    f"Received: vocabulary_size={vocabulary_size}"
                )
            vocabulary_size = token_embedding.input_dim
        check_positive_int("vocabulary_size", vocabulary_size)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        activation = get_activation(intermediate_activation)
        super().__init__(**kwargs)
        self.token_embedding = token_embedding
        self.vocabulary_size = vocabulary_size
        self.intermediate_activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, sequence_output_shape, mask_positions_shape=None):
        hidden_dim = sequence_output_shape[-1]
        if self.token_embedding is not None and hidden_dim != self.token_embedding.output_dim:
            raise ValueError(
                "The tied output matrix is the (V, H) token embedding, so the sequence "
                f"width must equal its H={self.token_embedding.output_dim}. "
                f"Received: sequence_output_shape={tuple(sequence_output_shape)}"
            )
        self.transform_dense = keras.layers.Dense(
            hidden_dim, kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name="transform_dense",
        )
        self.transform_dense.build((None, None, hidden_dim))
        self.transform_layer_norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
            name="transform_layer_norm",
        )
        self.transform_layer_norm.build((None, None, hidden_dim))
        self.output_kernel = None
        if self.token_embedding is None:
            self.output_kernel = self.add_weight(
                name="output_kernel", shape=(hidden_dim, self.vocabulary_size),
                initializer=clone_initializer(self.kernel_initializer),
            )
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocabulary_size,), initializer="zeros"
        )
        self.built = True

    def call(self, sequence_output, mask_positions):
        positions = ops.expand_dims(ops.cast(mask_positions, "int32"), 2)  # (B, P, 1)
        x = ops.take_along_axis(sequence_output, positions, axis=1)  # (B, P, H)
        x = self.transform_layer_norm(
            self.intermediate_activation(self.transform_dense(x))
        )  # (B, P, H)
        if self.token_embedding is not None:
            table = ops.cast(self.token_embedding.embeddings, self.compute_dtype)  # (V, H)
            logits = ops.matmul(x, ops.transpose(table))  # (B, P, V)
        else:
            logits = ops.matmul(x, ops.cast(self.output_kernel, self.compute_dtype))
        return logits + ops.cast(self.output_bias, self.compute_dtype)  # (B, P, V)

    def compute_output_shape(self, sequence_output_shape, mask_positions_shape):
        return tuple(mask_positions_shape) + (self.vocabulary_size,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size,
            intermediate_activation=serialize_activation(self.intermediate_activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
