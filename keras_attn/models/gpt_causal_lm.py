import keras
from keras import ops

from keras_attn import generation
from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.quantized_dense import fake_quantize_weight
from keras_attn.layers.quantized_dense import frozen_bound
from keras_attn.layers.validation import check_int
from keras_attn.models.block_copies import block_copies
from keras_attn.models.block_copies import copy_block_weights
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.task_model import TaskModel


@keras.saving.register_keras_serializable(package="keras_attn")
class TiedEmbeddingLogits(keras.layers.Layer):
    """Output projection tied to a token embedding: `logits = h E^T` (Press & Wolf, 2017,
    "Using the Output Embedding to Improve Language Models"), as GPT-2's LM head.

    Not a public layer: `GPTCausalLM` creates it around its backbone's token embedding,
    whose `(V, H)` matrix it reads at every call, so it owns no weights of its own.

    With `quantization` (a dict of `decay`, `quantize`; `quantize_model` sets it) the table
    is fake-quantized per tensor and symmetrically, the one int8 scale of the embedding's
    GATHER (`QuantizedEmbedding`), and the logits get an `ActivationQuantizer`: the int8
    file's FULLY_CONNECTED on the transposed table. Its config and `.keras` file hold the
    embedding and its table: a loaded copy reads a table of its own with the same values
    (enough to convert it; not to train it tied). A float head saves the table only with
    `saves_table=True` (a graph outside `GPTCausalLM`, whose config does not tie it again:
    `GPTCausalLM.decoder_step_model`'s).
    """

    def __init__(self, embedding, quantization=None, saves_table=False, **kwargs):
        super().__init__(**kwargs)
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        if quantization is not None and set(quantization) - {"decay", "quantize"}:
            raise ValueError("`quantization` takes `decay` and `quantize`. Received: "
                             f"quantization={quantization!r}")
        # Not tracked as a sublayer: the table belongs to the embedding's owner (saved
        # there once); a quantized head saves it again itself (`save_own_variables`).
        self._embedding = _Reference(embedding)
        self.quantization = quantization
        self.saves_table = saves_table
        self.frozen_bound = None  # `max|E|` as a constant (export), or computed each call
        self.output_quantizer = None
        if quantization is not None:
            self.output_quantizer = ActivationQuantizer(
                decay=quantization.get("decay", 0.999),
                quantize=quantization.get("quantize", True), name="output_quantizer")

    def embedding(self):
        """The token `Embedding` whose table the head reads (a method: Keras' saving walks
        attributes, and the table is saved by its owner)."""
        return self._embedding.layer

    def build(self, hidden_shape):
        if not self.embedding().built:  # a copy loaded from its config
            self.embedding().build((None,))
        if self.output_quantizer is not None:
            self.output_quantizer.build(())
        self.built = True

    def call(self, hidden, training=None):
        table = ops.transpose(ops.cast(self.embedding().embeddings, self.compute_dtype))  # (H, V)
        if self.output_quantizer is None:
            return ops.matmul(hidden, table)  # (B, T, V)
        if self.output_quantizer.quantize:
            table = fake_quantize_weight(table, bound=self.frozen_bound)
        return self.output_quantizer(ops.matmul(hidden, table), training=training)

    def freeze_weight_ranges(self, frozen=True):
        """The table's bound as a constant of the traced graph (export) or computed again."""
        self.frozen_bound = frozen_bound(self.embedding().embeddings) if frozen else None

    def compute_output_shape(self, hidden_shape):
        return tuple(hidden_shape[:-1]) + (self.embedding().input_dim,)

    def get_config(self):
        return {**super().get_config(),
                "embedding": keras.saving.serialize_keras_object(self.embedding()),
                "quantization": self.quantization, "saves_table": self.saves_table}

    def save_own_variables(self, store):
        if self.quantization is not None or self.saves_table:  # a `.keras` copy loads a
            store["table"] = self.embedding().embeddings.numpy()  # table of its own

    def load_own_variables(self, store):
        if self.quantization is not None or self.saves_table:
            self.embedding().embeddings.assign(store["table"])


def copy_head_tables(source, target):
    """Gives the `TiedEmbeddingLogits` heads of `target`, a `from_config` copy of `source`
    (`set_weights` done), the tables of `source`'s: a copy's quantized or table-saving head
    reads a table of its own, which `set_weights` does not reach (it belongs to no layer of
    the graph)."""
    heads = [[layer for layer in model._flatten_layers(include_self=False)
              if isinstance(layer, TiedEmbeddingLogits)] for model in (source, target)]
    for original, copy in zip(*heads):
        if copy.embedding() is not original.embedding():
            copy.embedding().embeddings.assign(original.embedding().embeddings)


class _Reference:
    """Holds a layer without Keras tracking it (no second owner of its weights)."""

    def __init__(self, layer):
        self.layer = layer


@keras.saving.register_keras_serializable(package="keras_attn")
class GPTCausalLM(TaskModel):
    """GPT-2 language model: a `GPTBackbone` and the tied output projection, plus cached
    decoding (greedy, sampling, beam search).

        p(x_t | x_<t) = softmax(LN_f(h_L)_{t-1} W_te^T)      (B, T, V) logits

    Train it with a next-token loss: inputs `token_ids[:, :-1]`, targets
    `token_ids[:, 1:]`, `sample_weight = padding_mask[:, 1:]` so padding is ignored
    (`SparseCategoricalCrossentropy(from_logits=True)`).

    Decoding keeps every block's keys and values in one cache tensor
    `(B, num_layers, 2, S_max, num_heads, head_dim)` (`[:, l, 0]` keys, `[:, l, 1]`
    values of block `l`), so a new token costs one length-1 call through the blocks
    instead of re-running the whole prefix. `generate` and `beam_search` hand
    `next_token_logits` to `keras_attn.generation`; all of it traces under
    `tf.function`.

    Args:
        backbone: a `GPTBackbone`.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The backbone's dict: `token_ids` and `padding_mask`, `(B, T)` ints.

    Returns:
        `(B, T, vocabulary_size)` next-token logits.

    Example:
    >>> backbone = GPTBackbone(vocabulary_size=20, num_layers=1, num_heads=2,
    ...                        hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> lm = GPTCausalLM(backbone)
    >>> logits = lm({"token_ids": np.array([[3, 4, 5]]), "padding_mask": np.ones((1, 3))})
    >>> tuple(logits.shape)
    (1, 3, 20)
    >>> tuple(lm.generate(np.array([[3, 4, 5]]), max_new_tokens=4).shape)
    (1, 7)
    """

    backbone_class = GPTBackbone

    def __init__(self, backbone, **kwargs):
        if not isinstance(backbone, GPTBackbone):
            raise ValueError(
                f"`backbone` must be a GPTBackbone. Received: backbone={backbone!r}"
            )

        # === Layers ===
        lm_head = TiedEmbeddingLogits(
            backbone.token_embedding, dtype=backbone.dtype_policy, name="lm_head"
        )

        # === Functional Model ===
        inputs = backbone.input
        logits = lm_head(backbone(inputs))  # (B, T, V)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone

    # === Cached decoding ===

    def build_cache(self, batch_size, max_length):
        """An empty KV cache `(B, num_layers, 2, max_length, num_heads, head_dim)`.

        Args:
            batch_size: int or scalar tensor.
            max_length: int, positions the cache holds (prompt + new tokens), at most
                the backbone's `max_sequence_length`.
        """
        self._check_length("max_length", max_length)
        b = self.backbone
        shape = (batch_size, b.num_layers, 2, max_length, b.num_heads,
                 b.hidden_dim // b.num_heads)
        return ops.zeros(shape, dtype=self.compute_dtype)

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Runs `token_ids` through the model with the KV cache.

        Args:
            token_ids: `(B, t)` int tensor, the tokens at positions
                `cache_update_index .. cache_update_index + t - 1`.
            cache: `(B, num_layers, 2, S_max, num_heads, head_dim)` from `build_cache`.
            cache_update_index: int or scalar int tensor, the number of tokens already
                in the cache.

        Returns:
            `(logits, cache)`: `(B, t, V)` logits of those positions and the cache with
            their keys/values written.
        """
        b = self.backbone
        x = b.get_layer("embeddings")(token_ids, start_index=cache_update_index)  # (B, t, H)
        layer_caches = []
        for i, block in enumerate(b.transformer_layers):
            if b.layer_position_embeddings:  # P_l[t] of these positions, as in `call`
                x = x + b.get_layer(f"layer_position_embedding_{i}")(
                    x, start_index=cache_update_index)  # (B, t, H)
            x, layer_cache = block(
                x, self_attention_cache=cache[:, i],
                self_attention_cache_update_index=cache_update_index,
            )  # (B, t, H), (B, 2, S_max, heads, head_dim)
            layer_caches.append(layer_cache)
        x = b.get_layer("final_layer_norm")(x)  # (B, t, H)
        logits = self.get_layer("lm_head")(x)  # (B, t, V)
        return logits, ops.stack(layer_caches, axis=1)

    def next_token_logits(self, token_ids, cache, index):
        """The `keras_attn.generation` callback: logits `(B, V)` of the last position."""
        logits, cache = self.call_with_cache(token_ids, cache, index)
        return logits[:, -1, :], cache

    def decoder_step_model(self, max_length):
        """One decoding step as a functional model on this model's layers, `call_with_cache`
        with the cache as a tensor in and out, so that a fixed-shape file (TFLite) runs it:
        inputs `"token_ids"` `(B, 1)` (the token at position `index`),
        `"cache_update_index"` `(B,)` int32 (`index`, the same in every row) and `"cache"`
        `(B, N, 2, max_length, h, d_k)` (zeros at the start); outputs `{"logits": (B, V),
        "cache": ...}`, the next token's logits and the cache with this step's keys and
        values. A prompt runs through it one token at a time. The embeddings, final
        LayerNorm and LM head are this model's; the blocks are copies with its weights as
        they are now (a functional model reads a layer's outputs by its first call, and
        the blocks' first returned one tensor). `quantize_model` gives its int8 form.

        Args:
            max_length: int, the positions of the cache (prompt + generated tokens), at
                most `max_sequence_length`.

        Returns:
            A `keras.Model`.

        Example:
        >>> lm = GPTCausalLM(GPTBackbone(vocabulary_size=20, num_layers=1, num_heads=2,
        ...                              hidden_dim=8, intermediate_dim=16,
        ...                              max_sequence_length=16))
        >>> step = lm.decoder_step_model(max_length=6)
        >>> cache = np.zeros((1, 1, 2, 6, 2, 4), "float32")
        >>> logits = []
        >>> for index, token in enumerate([3, 4, 5]):
        ...     out = step({"token_ids": np.array([[token]]),
        ...                 "cache_update_index": np.array([index]), "cache": cache})
        ...     cache = np.asarray(out["cache"])
        ...     logits.append(np.asarray(out["logits"]))
        >>> full = lm({"token_ids": np.array([[3, 4, 5]]), "padding_mask": np.ones((1, 3))})
        >>> bool(np.allclose(np.concatenate(logits), full[0], atol=1e-5))
        True
        """
        self._check_length("max_length", max_length)
        b = self.backbone
        head_dim = b.hidden_dim // b.num_heads
        inputs = {
            "token_ids": keras.Input((1,), dtype="int32", name="token_ids"),
            "cache_update_index": keras.Input((), dtype="int32", name="cache_update_index"),
            "cache": keras.Input((b.num_layers, 2, max_length, b.num_heads, head_dim),
                                 name="cache"),
        }
        index = inputs["cache_update_index"][0]  # () the position of this step's token
        # (B, N*2, max_length, h, dk): TFLite slices tensors of up to 5 dimensions.
        cache_in = ops.reshape(inputs["cache"],
                               (-1, 2 * b.num_layers, max_length, b.num_heads, head_dim))
        x = b.get_layer("embeddings")(inputs["token_ids"], start_index=index)  # (B, 1, H)
        blocks = block_copies(b.transformer_layers)
        caches = []
        for i, block in enumerate(blocks):
            if b.layer_position_embeddings:
                x = x + b.get_layer(f"layer_position_embedding_{i}")(x, start_index=index)
            x, cache = block(x, self_attention_cache=cache_in[:, 2 * i:2 * i + 2],
                             self_attention_cache_update_index=index)  # (B, 1, H), cache
            caches.append(cache)
        x = b.get_layer("final_layer_norm")(x)  # (B, 1, H)
        # A head of its own that saves the table: a loaded copy of this graph is not a
        # GPTCausalLM, whose config would tie it to the token embedding again.
        head = TiedEmbeddingLogits(b.token_embedding, saves_table=True,
                                   dtype=self.dtype_policy, name="lm_head")
        outputs = {"logits": head(x)[:, -1],  # (B, V)
                   "cache": ops.reshape(ops.concatenate(caches, axis=1), (
                       -1, b.num_layers, 2, max_length, b.num_heads, head_dim))}
        copy_block_weights(blocks, b.transformer_layers)
        return keras.Model(inputs, outputs, name=f"{self.name}_decoder_step")

    def generate(
        self,
        prompt_ids,
        max_new_tokens,
        sampler="greedy",
        stop_token_ids=(),
        pad_token_id=0,
        seed=None,
        temperature=1.0,
        top_k=None,
        top_p=None,
    ):
        """Greedy or sampled continuation of `prompt_ids` (see `generation.generate`).

        Args:
            prompt_ids: `(B, P)` int tensor; every row has `P` real tokens (batch
                prompts of equal length together).
            max_new_tokens: int; `P + max_new_tokens` must fit `max_sequence_length`.
            sampler, stop_token_ids, pad_token_id, seed, temperature, top_k, top_p: as
                in `keras_attn.generation.generate`.

        Returns:
            `(B, P + max_new_tokens)` int32 token ids.
        """
        prompt_ids = ops.convert_to_tensor(prompt_ids, "int32")
        cache = self._cache_for(prompt_ids, max_new_tokens)
        return generation.generate(
            self.next_token_logits, prompt_ids, cache, max_new_tokens, sampler=sampler,
            stop_token_ids=stop_token_ids, pad_token_id=pad_token_id, seed=seed,
            temperature=temperature, top_k=top_k, top_p=top_p,
        )

    def beam_search(
        self,
        prompt_ids,
        max_new_tokens,
        num_beams,
        length_penalty=1.0,
        stop_token_ids=(),
        pad_token_id=0,
    ):
        """Beam-search continuation of `prompt_ids` (see `generation.beam_search`).

        Returns:
            `(sequences, scores)`: `(B, P + max_new_tokens)` int32 and `(B,)` float32.
        """
        prompt_ids = ops.convert_to_tensor(prompt_ids, "int32")
        cache = self._cache_for(prompt_ids, max_new_tokens)
        return generation.beam_search(
            self.next_token_logits, prompt_ids, cache, max_new_tokens, num_beams=num_beams,
            length_penalty=length_penalty, stop_token_ids=stop_token_ids,
            pad_token_id=pad_token_id,
        )

    def _cache_for(self, prompt_ids, max_new_tokens):
        if len(prompt_ids.shape) != 2 or prompt_ids.shape[1] is None:
            raise ValueError(
                "`prompt_ids` must be a (batch, prompt_length) tensor with a static "
                f"prompt_length. Received: prompt_ids.shape={tuple(prompt_ids.shape)}"
            )
        check_int("max_new_tokens", max_new_tokens, low=0)
        total = prompt_ids.shape[1] + max_new_tokens
        self._check_length("prompt_length + max_new_tokens", total)
        return self.build_cache(ops.shape(prompt_ids)[0], total)

    def _check_length(self, name, length):
        limit = self.backbone.max_sequence_length
        if not 1 <= length <= limit:
            raise ValueError(
                f"`{name}` must be in [1, max_sequence_length={limit}]: the model has "
                f"learned positions 0..{limit - 1} only. Received: {name}={length}"
            )
