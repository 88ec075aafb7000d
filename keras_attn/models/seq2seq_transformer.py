"""`Seq2SeqTransformer`, the encoder-decoder Transformer, and `make_teacher_forcing_batch`."""

import keras
from keras import ops

from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.backbone import Backbone
from keras_attn.models.model_arguments import check_transformer_sizes
from keras_attn.models.seq2seq_decoding import EncoderDecoderDecoding
from keras_attn.models.seq2seq_step_graphs import Seq2SeqStepGraphs
from keras_attn.models.seq2seq_step_graphs import _embed

# Sizes of Vaswani et al. (2017), Table 3: "base" (65M parameters) and "big" (213M), with
# the 37,000-token byte-pair vocabulary shared by source and target (WMT14 En-De).
# `transformer_tiny` is the same architecture at a size for unit tests and toy tasks.
SEQ2SEQ_TRANSFORMER_PRESETS = {
    "transformer_tiny": dict(
        vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, dropout=0.1,
    ),
    "transformer_base": dict(
        vocabulary_size=37000, num_layers=6, num_heads=8, hidden_dim=512,
        intermediate_dim=2048, dropout=0.1,
    ),
    "transformer_big": dict(
        vocabulary_size=37000, num_layers=6, num_heads=16, hidden_dim=1024,
        intermediate_dim=4096, dropout=0.3,
    ),
}


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqTransformer(EncoderDecoderDecoding, Seq2SeqStepGraphs, Backbone):
    """The encoder-decoder Transformer (Vaswani et al., 2017, "Attention Is All You
    Need", §3 and Fig. 1).

        E(x) = sqrt(d) W_emb[x] + PE(pos)                         (B, *, d), §3.4-3.5
        enc_0 = Dropout(E(src));  enc_l = EncoderBlock_l(enc_{l-1}, src_mask)
        dec_0 = Dropout(E(tgt_in)); dec_l = DecoderBlock_l(dec_{l-1}, enc_N, tgt_mask, src_mask)
        logits = dec_N W_emb^T                                    (B, T, V)

    One embedding matrix `W_emb` (a `keras.layers.ReversibleEmbedding`) embeds the source
    and the target tokens and is the pre-softmax projection (§3.4: "we share the same
    weight matrix between the two embedding layers and the pre-softmax linear
    transformation"), so source and target use one shared vocabulary. The embedding
    layer is called three times in the graph (source, target, reversed for the logits),
    which is how one variable is shared; `TokenAndPositionEmbedding` has no reverse
    (logits) mode, so the model composes the embedding, the `sqrt(d)` scale and a
    `SinusoidalPositionEncoding` itself. The embeddings are initialised with
    `N(0, d^-1/2)` so that the scaled embeddings have unit variance (tensor2tensor).

    The blocks are the paper's post-LN `TransformerEncoderBlock`s and encoder-decoder
    `TransformerDecoderBlock`s (causal self-attention, cross-attention to `enc_N`, FFN).
    Dropout (`P_drop = 0.1` in the base model) is applied to the embedding sums and to
    every sublayer output before its residual addition (§5.4); the paper mentions no
    dropout on attention probabilities, hence `attention_dropout=0.0`.

    Training uses teacher forcing: the decoder reads the target shifted right behind a
    BOS token and predicts the target (`make_teacher_forcing_batch`), with the
    label-smoothed loss
    `MaskedSparseCategoricalCrossentropy(ignore_class=pad, label_smoothing=0.1)` (§5.4).
    Inference encodes the source once, projects each block's cross-attention keys and
    values once, and decodes token by token with per-layer self-attention caches
    (`next_token_logits`, and `greedy_decode`, `beam_search` of
    `EncoderDecoderDecoding`; `use_cache=False` decodes with full passes instead).
    `encoder_model` and `decoder_step_model` (`Seq2SeqStepGraphs`) give the two halves
    as functional graphs for export and int8 quantization.

    Layer names: `token_embedding`, `position_encoding`, `encoder_embedding_dropout`,
    `decoder_embedding_dropout`, `encoder_layer_{i}`, `decoder_layer_{i}`
    (`transformer_layers`: the encoder blocks, then the decoder blocks).
    `SEQ2SEQ_TRANSFORMER_PRESETS` holds the paper's sizes (`from_preset`).

    Args:
        vocabulary_size: int, size of the shared source/target vocabulary `V`.
        num_layers: int, `N`, number of encoder blocks and of decoder blocks.
        num_heads: int, attention heads `h`; must divide `hidden_dim`.
        hidden_dim: int, `d_model`.
        intermediate_dim: int, `d_ff`, feed-forward width.
        dropout: float in [0, 1), `P_drop`. Defaults to `0.1`.
        attention_dropout: float in [0, 1), dropout on attention probabilities.
            Defaults to `0.0`.
        activation: feed-forward activation. Defaults to `"relu"` (the paper).
        layer_norm_epsilon: float > 0. Defaults to `1e-6` (tensor2tensor's).
        fused_qkv: bool, one fused Q/K/V kernel in every attention. Defaults to `False`.
        dtype: dtype policy of the layers. Defaults to the global policy.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        A dict: `encoder_token_ids` `(B, S)` int, `encoder_padding_mask` `(B, S)`
        (1 for real source tokens), `decoder_token_ids` `(B, T)` int (BOS + target
        shifted right), `decoder_padding_mask` `(B, T)` (1 for real positions).

    Returns:
        `(B, T, V)` next-token logits of every decoder position.

    Example:
    >>> model = Seq2SeqTransformer(vocabulary_size=20, num_layers=1, num_heads=2,
    ...                            hidden_dim=8, intermediate_dim=16)
    >>> inputs, labels = make_teacher_forcing_batch(
    ...     np.array([[5, 6, 7, 0]]), np.array([[8, 9, 2, 0]]), bos_token_id=1)
    >>> tuple(model(inputs).shape), keras.ops.convert_to_numpy(labels).tolist()
    ((1, 4, 20), [[8, 9, 2, 0]])
    >>> model = Seq2SeqTransformer.from_preset("transformer_tiny", vocabulary_size=50)
    >>> tuple(model.token_embedding.embeddings.shape)
    (50, 32)
    """

    presets = SEQ2SEQ_TRANSFORMER_PRESETS
    preset_family = "Seq2SeqTransformer"
    transformer_layer_prefixes = ("encoder_layer_", "decoder_layer_")

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        fused_qkv=False,
        dtype=None,
        **kwargs,
    ):
        check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                                intermediate_dim, sinusoids="the sinusoidal position encodings")
        check_rate("dropout", dropout)
        check_rate("attention_dropout", attention_dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)

        # === Layers ===
        token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size, hidden_dim, tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype, name="token_embedding",
        )
        position_encoding = SinusoidalPositionEncoding(dtype=dtype, name="position_encoding")
        encoder_embedding_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="encoder_embedding_dropout"
        )
        decoder_embedding_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="decoder_embedding_dropout"
        )
        block_kwargs = dict(
            num_heads=num_heads, intermediate_dim=intermediate_dim, dropout=dropout,
            attention_dropout=attention_dropout, activation=activation,
            layer_norm_epsilon=layer_norm_epsilon, fused_qkv=fused_qkv, dtype=dtype,
        )
        encoder_blocks = [
            TransformerEncoderBlock(**block_kwargs, name=f"encoder_layer_{i}")
            for i in range(num_layers)
        ]
        decoder_blocks = [
            TransformerDecoderBlock(**block_kwargs, name=f"decoder_layer_{i}")
            for i in range(num_layers)
        ]

        # === Functional Model ===
        # encoder_token_ids, encoder_padding_mask (B, S); decoder_... (B, T)
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in (
            "encoder_token_ids", "encoder_padding_mask", "decoder_token_ids",
            "decoder_padding_mask")}
        encoder_padding_mask = inputs["encoder_padding_mask"]
        x = _embed(token_embedding, position_encoding, inputs["encoder_token_ids"])  # (B, S, d)
        x = encoder_embedding_dropout(x)
        for block in encoder_blocks:
            x = block(x, padding_mask=encoder_padding_mask)  # (B, S, d)
        encoder_outputs = x
        y = _embed(token_embedding, position_encoding, inputs["decoder_token_ids"])  # (B, T, d)
        y = decoder_embedding_dropout(y)
        for block in decoder_blocks:
            y = block(
                y, encoder_outputs, decoder_padding_mask=inputs["decoder_padding_mask"],
                encoder_padding_mask=encoder_padding_mask,
            )  # (B, T, d)
        logits = token_embedding(y, reverse=True)  # (B, T, V)
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.store_arguments(locals())

    # === Sublayers ===

    # `token_embedding` (`Backbone`'s): the shared `ReversibleEmbedding` (source, target
    # and output projection).

    @property
    def encoder_layers(self):
        """The `N` encoder blocks, first to last."""
        return self._numbered_layers("encoder_layer_")

    @property
    def decoder_layers(self):
        """The `N` decoder blocks, first to last."""
        return self._numbered_layers("decoder_layer_")

    # === Inference ===

    def encode(self, encoder_token_ids, encoder_padding_mask):
        """Runs the encoder (inference mode) on a `(B, S)` source.

        Args:
            encoder_token_ids: `(B, S)` int source ids.
            encoder_padding_mask: `(B, S)`, 1/True for real source tokens.

        Returns:
            `(B, S, d_model)` encoder outputs `enc_N`.
        """
        encoder_token_ids = ops.convert_to_tensor(encoder_token_ids, "int32")
        x = _embed(
            self.token_embedding, self.get_layer("position_encoding"), encoder_token_ids
        )  # (B, S, d)
        for block in self.encoder_layers:
            x = block(x, padding_mask=encoder_padding_mask, training=False)  # (B, S, d)
        return x

    def initial_decoding_cache(self, encoder_token_ids, encoder_padding_mask, max_length):
        """Encodes the source and allocates the decoder's caches for `max_length` tokens.

        Everything the decoder needs lives in one dict of batch-first tensors, so beam
        search can repeat and reorder it along axis 0:

        - `"self_attention_cache"`: `(B, N, 2, max_length, h, d_k)` zeros, the keys and
          values of each decoder block's self-attention (filled while decoding);
        - `"cross_attention_cache"`: `(B, N, 2, S, h, d_k)`, each block's projection of
          the encoder outputs (`compute_cross_attention_cache`), computed once here;
        - `"encoder_padding_mask"`: `(B, S)` bool.

        Args:
            encoder_token_ids: `(B, S)` int source ids.
            encoder_padding_mask: `(B, S)`, 1/True for real source tokens.
            max_length: int, decoder positions to allocate (BOS + generated tokens).

        Returns:
            The cache dict, the input of `next_token_logits`.
        """
        check_positive_int("max_length", max_length)
        encoder_padding_mask = ops.cast(encoder_padding_mask, "bool")  # (B, S)
        encoder_outputs = self.encode(encoder_token_ids, encoder_padding_mask)  # (B, S, d)
        cross_caches = [
            block.compute_cross_attention_cache(encoder_outputs)  # (B, 2, S, h, dk)
            for block in self.decoder_layers
        ]
        cross_cache = ops.stack(cross_caches, axis=1)  # (B, N, 2, S, h, dk)
        head_dim = self.hidden_dim // self.num_heads
        batch = ops.shape(encoder_outputs)[0]
        self_cache = ops.zeros(
            (batch, self.num_layers, 2, max_length, self.num_heads, head_dim),
            dtype=cross_cache.dtype,
        )  # (B, N, 2, max_length, h, dk)
        return {
            "self_attention_cache": self_cache,
            "cross_attention_cache": cross_cache,
            "encoder_padding_mask": encoder_padding_mask,
        }

    def next_token_logits(self, token_ids, cache, index):
        """One decoding step, the callback of `keras_attn.generation`.

        Args:
            token_ids: `(B, t)` int decoder ids at positions `index .. index + t - 1`
                (the BOS token at `index = 0`, then one token per call).
            cache: the dict of `initial_decoding_cache`.
            index: int or scalar int tensor, number of decoder tokens already cached.

        Returns:
            `(logits, cache)`: `(B, V)` logits of the token after the last of
            `token_ids`, and the cache with this call's keys/values written.
        """
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        x = _embed(
            self.token_embedding, self.get_layer("position_encoding"), token_ids,
            start_index=index,
        )  # (B, t, d)
        self_caches = []
        for i, block in enumerate(self.decoder_layers):
            x, self_cache, _ = block(
                x, encoder_padding_mask=cache["encoder_padding_mask"],
                self_attention_cache=cache["self_attention_cache"][:, i],
                self_attention_cache_update_index=index,
                cross_attention_cache=cache["cross_attention_cache"][:, i],
                training=False,
            )  # (B, t, d), (B, 2, max_length, h, dk)
            self_caches.append(self_cache)
        logits = self.token_embedding(x[:, -1], reverse=True)  # (B, V)
        new_cache = dict(cache)
        new_cache["self_attention_cache"] = ops.stack(self_caches, axis=1)
        return logits, new_cache


def make_teacher_forcing_batch(source_ids, target_ids, bos_token_id, pad_token_id=0):
    """Model inputs and labels for teacher forcing from padded source/target ids.

    The decoder reads the target shifted right behind a BOS token and predicts the
    target itself, so position `t` sees `BOS, y_1 .. y_{t-1}` and is trained on `y_t`:

        source  x_1 .. x_S (pad)          -> encoder_token_ids, mask x != pad
        target  y_1 .. y_n EOS (pad)      -> labels
        decoder BOS y_1 .. y_n (pad)      -> decoder_token_ids = [BOS, labels[:-1]]

    A decoder position is real when its label is (`labels != pad`); the loss ignores the
    padded labels (`MaskedSparseCategoricalCrossentropy(ignore_class=pad)`). End the
    targets with an EOS token so that the model learns where to stop.

    Args:
        source_ids: `(B, S)` int, padded with `pad_token_id`.
        target_ids: `(B, T)` int, padded with `pad_token_id`.
        bos_token_id: int, the decoder start token (must differ from the padding id).
        pad_token_id: int. Defaults to `0`.

    Returns:
        `(inputs, labels)`: the model's input dict (int32 tensors) and `(B, T)` labels.

    Example:
    >>> inputs, labels = make_teacher_forcing_batch(
    ...     np.array([[5, 6, 0]]), np.array([[7, 2, 0]]), bos_token_id=1)
    >>> keras.ops.convert_to_numpy(inputs["decoder_token_ids"]).tolist()
    [[1, 7, 2]]
    >>> keras.ops.convert_to_numpy(inputs["decoder_padding_mask"]).tolist()
    [[1, 1, 0]]
    """
    if bos_token_id == pad_token_id:
        raise ValueError(
            "`bos_token_id` must differ from `pad_token_id`: the decoder's first "
            f"position would look like padding. Received: bos_token_id={bos_token_id}, "
            f"pad_token_id={pad_token_id}"
        )
    source_ids = ops.convert_to_tensor(source_ids, "int32")  # (B, S)
    labels = ops.convert_to_tensor(target_ids, "int32")  # (B, T)
    if len(source_ids.shape) != 2 or len(labels.shape) != 2:
        raise ValueError(
            "`source_ids` and `target_ids` must be (batch, length) int arrays. "
            f"Received: source_ids.shape={tuple(source_ids.shape)}, "
            f"target_ids.shape={tuple(labels.shape)}"
        )
    bos = ops.full((ops.shape(labels)[0], 1), bos_token_id, dtype="int32")  # (B, 1)
    decoder_token_ids = ops.concatenate([bos, labels[:, :-1]], axis=1)  # (B, T)
    inputs = {
        "encoder_token_ids": source_ids,
        "encoder_padding_mask": ops.cast(ops.not_equal(source_ids, pad_token_id), "int32"),
        "decoder_token_ids": decoder_token_ids,
        "decoder_padding_mask": ops.cast(ops.not_equal(labels, pad_token_id), "int32"),
    }
    return inputs, labels
