import keras

from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.backbone import Backbone
from keras_attn.models.model_arguments import check_transformer_sizes

# Architectures of the published GPT-2 family (Radford et al., 2019, Table 2, with the
# widths of OpenAI's released checkpoints: 768 / 1024 / 1280 / 1600). `gpt2_tiny` is the
# architecture of the test fixture `tests/fixtures/gpt2_tiny` (random weights).
GPT_PRESETS = {
    "gpt2_tiny": dict(
        vocabulary_size=100, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=128,
        max_sequence_length=32,
    ),
    "gpt2_small": dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072),
    "gpt2_medium": dict(num_layers=24, num_heads=16, hidden_dim=1024, intermediate_dim=4096),
    "gpt2_large": dict(num_layers=36, num_heads=20, hidden_dim=1280, intermediate_dim=5120),
    "gpt2_xl": dict(num_layers=48, num_heads=25, hidden_dim=1600, intermediate_dim=6400),
}
for _name, _config in GPT_PRESETS.items():
    if _name != "gpt2_tiny":
        _config.update(vocabulary_size=50257, max_sequence_length=1024)
del _name, _config


def gpt_kernel_initializer():
    """GPT-2's initializer for every weight matrix and table: `N(0, 0.02^2)`."""
    return keras.initializers.RandomNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="keras_attn")
class GPTBackbone(Backbone):
    """GPT-2 decoder-only Transformer (Radford et al., 2019, "Language Models are
    Unsupervised Multitask Learners", §2.3; GPT: Radford et al., 2018).

        h_0 = Dropout(TokenEmb(x) + PosEmb(t))                       (B, T, H)
        h_l = h_{l-1}' + Dropout(FFN(LN(h_{l-1}')))                  pre-LN blocks,
        h_{l-1}' = h_{l-1} + Dropout(CausalSelfAttn(LN(h_{l-1})))    l = 1..L
        sequence_output = LN_f(h_L)                                  (B, T, H)

    Unlike the original Transformer and BERT, the layer normalization sits at the input
    of each sublayer and a final one (`ln_f`) follows the last block. The feed-forward
    activation is the tanh approximation of GELU.

    A functional `keras.Model` whose layers carry the names the checkpoint importer looks
    up: `embeddings` (a `TokenAndPositionEmbedding` with sublayers `token_embedding`
    (`wte`) and `position_embedding` (`wpe`)), `embeddings_dropout`,
    `transformer_layer_{i}` (pre-LN `TransformerDecoderBlock`s without cross-attention,
    one fused Q/K/V kernel as GPT-2's `c_attn`) and `final_layer_norm` (`ln_f`).
    `GPTCausalLM` adds the tied output projection, the KV cache and decoding.

    Args:
        vocabulary_size: int, number of token ids.
        num_layers: int, number of decoder blocks `L`.
        num_heads: int, attention heads per block; must divide `hidden_dim`.
        hidden_dim: int, model width `H`.
        intermediate_dim: int, feed-forward width (`4H` in GPT-2).
        max_sequence_length: int, size of the learned position table (the context).
            Defaults to `1024`.
        dropout: float in [0, 1), dropout on embeddings, attention probabilities and
            residual branches. Defaults to `0.1`.
        activation: feed-forward activation. Defaults to `"gelu_approximate"` (GPT-2's).
        layer_norm_epsilon: float > 0. Defaults to `1e-5` (GPT-2's).
        layer_position_embeddings: bool, add a learned position embedding of its own to
            the input of every block, `h_{l-1} + P_l[t]` (Al-Rfou et al., 2018, §3: deep
            character Transformers keep the position signal this way). Layers
            `layer_position_embedding_{i}`. Defaults to `False`.
        dtype: dtype policy of the layers. Defaults to the global policy.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        A dict of `(B, T)` int tensors: `token_ids`; `padding_mask` (1 for real tokens,
        0 for padding; with the causal mask, right padding never changes the outputs
        of real tokens).

    Returns:
        `(B, T, H)` `sequence_output`, after the final layer normalization.

    Example:
    >>> model = GPTBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                     hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> out = model({"token_ids": np.array([[2, 7, 9, 0]]),
    ...              "padding_mask": np.array([[1, 1, 1, 0]])})
    >>> tuple(out.shape)
    (1, 4, 8)
    >>> GPTBackbone.from_preset("gpt2_tiny").count_params()
    29696
    """

    presets = GPT_PRESETS
    preset_family = "GPT"
    token_embedding_path = "embeddings.token_embedding"  # `wte`, tied to the LM head

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=1024,
        dropout=0.1,
        activation="gelu_approximate",
        layer_norm_epsilon=1e-5,
        layer_position_embeddings=False,
        dtype=None,
        **kwargs,
    ):
        check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                                intermediate_dim)
        check_positive_int("max_sequence_length", max_sequence_length)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)

        # === Layers ===
        embeddings = TokenAndPositionEmbedding(
            vocabulary_size, max_sequence_length, hidden_dim,
            embeddings_initializer=gpt_kernel_initializer(), dtype=dtype, name="embeddings",
        )
        embeddings_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="embeddings_dropout"
        )
        blocks = [
            TransformerDecoderBlock(
                num_heads=num_heads, intermediate_dim=intermediate_dim, dropout=dropout,
                activation=activation, layer_norm_epsilon=layer_norm_epsilon,
                norm_first=True, fused_qkv=True,
                kernel_initializer=gpt_kernel_initializer(), dtype=dtype,
                name=f"transformer_layer_{i}",
            )
            for i in range(num_layers)
        ]
        final_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="final_layer_norm"
        )
        layer_positions = [
            PositionEmbedding(max_sequence_length, initializer=gpt_kernel_initializer(),
                              dtype=dtype, name=f"layer_position_embedding_{i}")
            for i in range(num_layers)
        ] if layer_position_embeddings else []

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        x = embeddings_dropout(embeddings(token_ids))  # (B, T, H)
        for i, block in enumerate(blocks):
            if layer_positions:
                x = x + layer_positions[i](x)  # (B, T, H), P_l[t] added
            x = block(x, decoder_padding_mask=padding_mask)  # (B, T, H), causal
        x = final_layer_norm(x)  # (B, T, H)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=x,
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.store_arguments(locals())



def gpt_parameter_count(
    vocabulary_size, num_layers, hidden_dim, intermediate_dim, num_heads=None,
    max_sequence_length=1024,
):
    """Closed-form parameter count of a `GPTBackbone` (= `GPTCausalLM`, whose output
    projection is tied to the token embedding).

    Takes the constructor's size arguments (so `**GPT_PRESETS[name]` works); the count
    does not depend on `num_heads`.

        embeddings: (V + P) H                      (wte, wpe)
        per layer:  4 (H^2 + H) + 2 H F + F + H + 4H   (c_attn, c_proj; c_fc, c_proj; ln_1, ln_2)
        final:      2H                             (ln_f)

    Example:
    >>> gpt_parameter_count(**GPT_PRESETS["gpt2_small"])
    124439808
    """
    H, F = hidden_dim, intermediate_dim
    embeddings = (vocabulary_size + max_sequence_length) * H
    layer = 4 * (H * H + H) + 2 * H * F + F + H + 4 * H
    return embeddings + num_layers * layer + 2 * H
