import keras
from keras import ops

from keras_attn.layers.scored_attention import ScoredAttention
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.backbone import Backbone
from keras_attn.models.seq2seq_decoding import EncoderDecoderDecoding

# `attention_rnn_tiny` is for unit tests; `attention_rnn_small` is the Multi30k
# comparison of training/multi30k_rnn.yaml (Bahdanau et al. used 1000 GRU units and
# 620-dimensional embeddings on WMT'14; Multi30k's 29k pairs need far less).
ATTENTION_RNN_PRESETS = {
    "attention_rnn_tiny": dict(vocabulary_size=1000, embedding_dim=16, hidden_dim=16,
                               attention_units=16, dropout=0.1),
    "attention_rnn_small": dict(vocabulary_size=8000, embedding_dim=256, hidden_dim=256,
                                attention_units=256, dropout=0.3),
}


@keras.saving.register_keras_serializable(package="keras_attn")
class AttentionRNNSeq2Seq(EncoderDecoderDecoding, Backbone):
    """RNN encoder-decoder with additive attention (Bahdanau et al., 2015, "Neural
    Machine Translation by Jointly Learning to Align and Translate").

        h_i = [GRU_fwd(x)_i ; GRU_bwd(x)_i]                       (B, S, 2H), §3.2
        s_0 = tanh(W_b [h_fwd_S ; h_bwd_1])                       (B, H)
        s_t = GRU_dec(E y_{t-1}, s_{t-1})                         (B, T, H)
        e_ti = v_a^T tanh(W_s s_t + W_h h_i),  alpha_t = softmax_i(e_t)   §3.1, App. A.1.2
        c_t = sum_i alpha_ti h_i                                  (B, T, 2H)
        o_t = tanh(W_o [s_t ; c_t]);  logits = o_t E^T            (B, T, V)

    The encoder is a bidirectional GRU over the source embeddings; the score is
    `ScoredAttention(score="additive")`, Bahdanau's alignment model. One difference from
    the paper: the decoder state `s_t` attends after its recurrent step and the context
    joins the output layer (the arrangement of Luong et al., 2015, §3), where Bahdanau
    et al. feed `c_t` into the GRU at step `t` from `s_{t-1}`. It lets training run the
    decoder GRU over the whole target in one layer call; decoding still goes one step
    at a time, with the GRU state as the cache. One embedding matrix `E` embeds source
    and target tokens (a joint vocabulary) and is the output projection, as in
    `Seq2SeqTransformer`. Dropout is applied to the embeddings and to `o_t`.

    Layer names: `token_embedding`, `encoder`, `bridge`, `decoder`, `attention`,
    `combine`, `embedding_dropout`, `output_dropout`. Presets: `ATTENTION_RNN_PRESETS`
    (`from_preset`). `token_embedding` is the shared embedding; `transformer_layers` is
    empty.

    Args:
        vocabulary_size: int, size of the shared source/target vocabulary `V`.
        embedding_dim: int, size of the embeddings and of `o_t`.
        hidden_dim: int, `H`, GRU units of each encoder direction and of the decoder.
        attention_units: int, hidden size of the additive score.
        dropout: float in [0, 1). Defaults to `0.1`.
        dtype: dtype policy of the layers. Defaults to the global policy.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The dict of `Seq2SeqTransformer`: `encoder_token_ids`, `encoder_padding_mask`
        `(B, S)`, `decoder_token_ids`, `decoder_padding_mask` `(B, T)`.

    Returns:
        `(B, T, V)` next-token logits of every decoder position.

    Example:
    >>> model = AttentionRNNSeq2Seq(vocabulary_size=20, embedding_dim=8, hidden_dim=8,
    ...                             attention_units=8)
    >>> ids = np.array([[5, 6, 7, 0]])
    >>> tuple(model({"encoder_token_ids": ids, "encoder_padding_mask": ids != 0,
    ...              "decoder_token_ids": ids, "decoder_padding_mask": ids != 0}).shape)
    (1, 4, 20)
    >>> model = AttentionRNNSeq2Seq.from_preset("attention_rnn_tiny", vocabulary_size=50)
    >>> model.hidden_dim, model.transformer_layers
    (16, [])
    """

    presets = ATTENTION_RNN_PRESETS
    preset_family = "AttentionRNNSeq2Seq"
    transformer_layer_prefixes = ()  # GRUs, no Transformer blocks

    def __init__(self, vocabulary_size, embedding_dim, hidden_dim, attention_units,
                 dropout=0.1, dtype=None, **kwargs):
        for name, value in (("vocabulary_size", vocabulary_size),
                            ("embedding_dim", embedding_dim), ("hidden_dim", hidden_dim),
                            ("attention_units", attention_units)):
            check_positive_int(name, value)
        check_rate("dropout", dropout)

        # === Layers ===
        token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size, embedding_dim, tie_weights=True, dtype=dtype,
            name="token_embedding")
        embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        encoder = keras.layers.Bidirectional(
            keras.layers.GRU(hidden_dim, return_sequences=True, return_state=True,
                             dtype=dtype, name="gru"), dtype=dtype, name="encoder")
        bridge = keras.layers.Dense(hidden_dim, activation="tanh", dtype=dtype, name="bridge")
        decoder = keras.layers.GRU(hidden_dim, return_sequences=True, return_state=True,
                                   dtype=dtype, name="decoder")
        attention = ScoredAttention(score="additive", units=attention_units, dtype=dtype,
                                    name="attention")
        combine = keras.layers.Dense(embedding_dim, activation="tanh", dtype=dtype,
                                     name="combine")
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")

        # === Functional Model ===
        inputs = {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in (
            "encoder_token_ids", "encoder_padding_mask", "decoder_token_ids",
            "decoder_padding_mask")}
        source_mask = ops.cast(inputs["encoder_padding_mask"], "bool")  # (B, S)
        x = embedding_dropout(token_embedding(inputs["encoder_token_ids"]))  # (B, S, E)
        encoder_outputs, forward, backward = encoder(x, mask=source_mask)  # (B, S, 2H)
        state = bridge(ops.concatenate([forward, backward], axis=-1))  # (B, H)
        y = embedding_dropout(token_embedding(inputs["decoder_token_ids"]))  # (B, T, E)
        states, _ = decoder(y, initial_state=state,
                            mask=ops.cast(inputs["decoder_padding_mask"], "bool"))  # (B, T, H)
        context = attention(states, encoder_outputs, padding_mask=source_mask)  # (B, T, 2H)
        outputs = combine(ops.concatenate([states, context], axis=-1))  # (B, T, E)
        logits = token_embedding(output_dropout(outputs), reverse=True)  # (B, T, V)
        super().__init__(inputs=inputs, outputs=logits, dtype=dtype, **kwargs)

        # === Config ===
        self.store_arguments(locals())

    # === Inference ===

    def initial_decoding_cache(self, encoder_token_ids, encoder_padding_mask, max_length):
        """Encodes the source: `{"state": (B, H) s_0, "encoder_outputs": (B, S, 2H),
        "encoder_padding_mask": (B, S) bool}` (`max_length` is not needed: the GRU state
        is the whole decoder cache)."""
        source_mask = ops.cast(encoder_padding_mask, "bool")  # (B, S)
        x = self.get_layer("token_embedding")(ops.convert_to_tensor(encoder_token_ids,
                                                                    "int32"))  # (B, S, E)
        encoder_outputs, forward, backward = self.get_layer("encoder")(
            x, mask=source_mask, training=False)  # (B, S, 2H), (B, H), (B, H)
        state = self.get_layer("bridge")(ops.concatenate([forward, backward], -1))  # (B, H)
        return {"state": state, "encoder_outputs": encoder_outputs,
                "encoder_padding_mask": source_mask}

    def next_token_logits(self, token_ids, cache, index):
        """One decoding step (the `keras_attn.generation` callback): `(logits (B, V),
        cache)` after the tokens `(B, t)`, the GRU state advanced over them."""
        logits, cache, _ = self._decode_step(token_ids, cache)
        return logits, cache

    def alignment(self, token_ids, cache):
        """Attention weights `alpha` `(B, t, S)` of the decoder reading `token_ids`
        `(B, t)` (BOS + target) from the cache of `initial_decoding_cache`."""
        return self._decode_step(token_ids, cache)[2]

    def _decode_step(self, token_ids, cache):
        y = self.get_layer("token_embedding")(ops.convert_to_tensor(token_ids, "int32"))
        states, state = self.get_layer("decoder")(
            y, initial_state=cache["state"], training=False)  # (B, t, H), (B, H)
        context, alpha = self.get_layer("attention")(
            states, cache["encoder_outputs"], padding_mask=cache["encoder_padding_mask"],
            return_attention_scores=True, training=False)  # (B, t, 2H), (B, t, S)
        outputs = self.get_layer("combine")(ops.concatenate([states[:, -1], context[:, -1]],
                                                            axis=-1))  # (B, E)
        logits = self.get_layer("token_embedding")(outputs, reverse=True)  # (B, V)
        return logits, {**cache, "state": state}, alpha
