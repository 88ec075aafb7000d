"""`Seq2SeqStepGraphs`: the functional graphs of `Seq2SeqTransformer`'s two halves, the
encoder and one decoding step, that export and int8 quantization take."""

import math

import keras
from keras import ops

from keras_attn.layers.sinusoidal_position_encoding import sinusoidal_table
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_positive_int
from keras_attn.models.block_copies import block_copies
from keras_attn.models.block_copies import copy_block_weights


class Seq2SeqStepGraphs:
    """`encoder_model` and `decoder_step_model` of `Seq2SeqTransformer` (mixed into it).

    Reads the model's `token_embedding`, `position_encoding` layer, `encoder_layers`,
    `decoder_layers`, `num_layers`, `num_heads` and `hidden_dim`.
    """

    def encoder_model(self, cross_attention_cache=False):
        """The encoder as a functional model on this model's layers (shared weights):
        `{"encoder_token_ids", "encoder_padding_mask"}` `(B, S)` -> the `(B, S, d)`
        encoder outputs that `decoder_step_model` reads. `quantize_model` gives its int8
        form; a TFLite file of it is the first half of on-device translation.

        With `cross_attention_cache=True` the model goes one step further and returns
        `{"cross_attention_cache": (B, 2 N, S, h, d_k)}`: each decoder block's keys and
        values of the encoder outputs (`initial_decoding_cache`'s cross cache, the
        blocks' pairs concatenated: 5 dimensions, what TFLite slices), projected
        once per source instead of at every decoding step. Each block projects them in a
        call on one zero token (the functional form of `compute_cross_attention_cache`,
        which also lays them out in int8); the converter drops the rest of that call.

        Example:
        >>> from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
        >>> model = Seq2SeqTransformer(vocabulary_size=20, num_layers=1, num_heads=2,
        ...                            hidden_dim=8, intermediate_dim=16)
        >>> encoder = model.encoder_model()
        >>> ids = np.array([[5, 6, 7, 0]])
        >>> outputs = encoder({"encoder_token_ids": ids, "encoder_padding_mask": ids > 0})
        >>> bool(np.allclose(outputs, model.encode(ids, ids > 0), atol=1e-6))
        True
        >>> caches = model.encoder_model(cross_attention_cache=True)(
        ...     {"encoder_token_ids": ids, "encoder_padding_mask": ids > 0})
        >>> cache = model.initial_decoding_cache(ids, ids > 0, max_length=3)
        >>> bool(np.allclose(caches["cross_attention_cache"], np.reshape(
        ...     np.asarray(cache["cross_attention_cache"]), (1, 2, 4, 2, 4)), atol=1e-6))
        True
        """
        check_bool("cross_attention_cache", cross_attention_cache)
        inputs = {name: keras.Input((None,), dtype="int32", name=name)
                  for name in ("encoder_token_ids", "encoder_padding_mask")}
        x = _embed(self.token_embedding, self.get_layer("position_encoding"),
                   inputs["encoder_token_ids"])  # (B, S, d)
        for block in self.encoder_layers:
            x = block(x, padding_mask=inputs["encoder_padding_mask"])  # (B, S, d)
        if not cross_attention_cache:
            return keras.Model(inputs, x, name=f"{self.name}_encoder")
        head_dim = self.hidden_dim // self.num_heads
        token = ops.expand_dims(ops.zeros_like(x[:, 0]), 1)  # (B, 1, d), the 1 static
        # An empty self-attention cache of 2 slots (2 keys: no softmax over one value).
        empty = ops.zeros_like(ops.reshape(ops.concatenate([token, token], axis=1),
                                           (-1, 1, 2, self.num_heads, head_dim)))
        caches, blocks = [], block_copies(self.decoder_layers)
        for block in blocks:
            _, _, cache = block(
                token, x, encoder_padding_mask=inputs["encoder_padding_mask"],
                self_attention_cache=ops.concatenate([empty, empty], axis=1),
                self_attention_cache_update_index=0,
            )  # (B, 2, S, h, dk)
            caches.append(cache)
        copy_block_weights(blocks, self.decoder_layers)
        outputs = {"cross_attention_cache": ops.concatenate(caches, axis=1)}  # (B, 2N, S, h, dk)
        return keras.Model(inputs, outputs, name=f"{self.name}_encoder")

    def decoder_step_model(self, max_length, cross_attention_cache=False):
        """One decoding step as a functional model on this model's layers (shared
        weights), `next_token_logits` with the caches as tensors in and out, so that a
        fixed-shape file (TFLite) runs it: inputs

        - `"decoder_token_ids"` `(B, 1)`: the token at position `index`;
        - `"cache_update_index"` `(B,)` int32: `index`, the same in every row;
        - `"self_attention_cache"` `(B, N, 2, max_length, h, d_k)`: the keys and values
          of the positions before (zeros at the start);
        - `"encoder_outputs"` `(B, S, d)` and `"encoder_padding_mask"` `(B, S)`:
          `encoder_model`'s outputs and its padding mask; with
          `cross_attention_cache=True`, `"cross_attention_cache"` `(B, 2 N, S, h, d_k)`
          (`encoder_model(cross_attention_cache=True)`'s) instead of the encoder outputs;

        outputs `{"logits": (B, V), "self_attention_cache": ...}`, the logits of the next
        token and the cache with this step's keys and values written. Without the cross
        cache each block projects the encoder outputs into its cross-attention keys and
        values at every step (`N * 2 * S * d^2` multiply-adds a step, more than the rest
        of the step at `S > 8`). The token embedding is this model's; the decoder blocks
        are copies with its weights as they are now (`block_copies`). `quantize_model`
        gives its int8 form.

        Args:
            max_length: int, the decoder positions of the cache (BOS + generated tokens).
            cross_attention_cache: bool, read the projected cross-attention keys and
                values instead of the encoder outputs. Defaults to `False`.

        Returns:
            A `keras.Model`.

        Example:
        >>> from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
        >>> model = Seq2SeqTransformer(vocabulary_size=20, num_layers=1, num_heads=2,
        ...                            hidden_dim=8, intermediate_dim=16)
        >>> ids = np.array([[5, 6, 7, 0]])
        >>> step = model.decoder_step_model(max_length=6)
        >>> out = step({"decoder_token_ids": np.array([[1]]),
        ...             "cache_update_index": np.array([0]),
        ...             "self_attention_cache": np.zeros((1, 1, 2, 6, 2, 4), "float32"),
        ...             "encoder_outputs": np.asarray(model.encode(ids, ids > 0)),
        ...             "encoder_padding_mask": ids > 0})
        >>> cache = model.initial_decoding_cache(ids, ids > 0, max_length=6)
        >>> logits, _ = model.next_token_logits(np.array([[1]]), cache, 0)
        >>> bool(np.allclose(out["logits"], logits, atol=1e-5))
        True
        >>> cached = model.decoder_step_model(max_length=6, cross_attention_cache=True)
        >>> out = cached({"decoder_token_ids": np.array([[1]]),
        ...               "cache_update_index": np.array([0]),
        ...               "self_attention_cache": np.zeros((1, 1, 2, 6, 2, 4), "float32"),
        ...               "cross_attention_cache": np.reshape(
        ...                   np.asarray(cache["cross_attention_cache"]), (1, 2, 4, 2, 4)),
        ...               "encoder_padding_mask": ids > 0})
        >>> bool(np.allclose(out["logits"], logits, atol=1e-5))
        True
        """
        check_positive_int("max_length", max_length)
        check_bool("cross_attention_cache", cross_attention_cache)
        head_dim = self.hidden_dim // self.num_heads
        inputs = self._decoder_step_inputs(max_length, cross_attention_cache)
        index = inputs["cache_update_index"][0]  # () the position of this step's token
        # (B, N*2, length, h, dk): TFLite slices tensors of up to 5 dimensions.
        cache_in = ops.reshape(inputs["self_attention_cache"],
                               (-1, 2 * self.num_layers, max_length, self.num_heads, head_dim))
        cross_in = inputs.get("cross_attention_cache")  # (B, 2N, S, h, dk)
        x = self._decoder_step_embedding(inputs, max_length)  # (B, 1, d)
        caches, blocks = [], block_copies(self.decoder_layers)
        for i, block in enumerate(blocks):
            x, cache, _ = block(
                x, inputs.get("encoder_outputs"),
                encoder_padding_mask=inputs["encoder_padding_mask"],
                self_attention_cache=cache_in[:, 2 * i:2 * i + 2],
                self_attention_cache_update_index=index,
                cross_attention_cache=None if cross_in is None else cross_in[:, 2 * i:2 * i + 2],
            )  # (B, 1, d), (B, 2, max_length, h, dk)
            caches.append(cache)
        outputs = {"logits": self.token_embedding(x[:, -1], reverse=True),  # (B, V)
                   "self_attention_cache": ops.reshape(
                       ops.concatenate(caches, axis=1),
                       (-1, self.num_layers, 2, max_length, self.num_heads, head_dim))}
        copy_block_weights(blocks, self.decoder_layers)
        return keras.Model(inputs, outputs, name=f"{self.name}_decoder_step")

    def _decoder_step_inputs(self, max_length, cross_attention_cache):
        """The `keras.Input`s of `decoder_step_model`."""
        head_dim = self.hidden_dim // self.num_heads
        encoder = {"cross_attention_cache": keras.Input(
            (2 * self.num_layers, None, self.num_heads, head_dim),
            name="cross_attention_cache")} if cross_attention_cache else {
            "encoder_outputs": keras.Input((None, self.hidden_dim), name="encoder_outputs")}
        return {
            "decoder_token_ids": keras.Input((1,), dtype="int32", name="decoder_token_ids"),
            "cache_update_index": keras.Input((), dtype="int32", name="cache_update_index"),
            "self_attention_cache": keras.Input(
                (self.num_layers, 2, max_length, self.num_heads, head_dim),
                name="self_attention_cache"),
            **encoder,
            "encoder_padding_mask": keras.Input((None,), dtype="int32",
                                                name="encoder_padding_mask"),
        }

    def _decoder_step_embedding(self, inputs, max_length):
        """`sqrt(d) W_emb[x] + PE(index)` `(B, 1, d)` of a step: the position's row of a
        constant sinusoid table (a GATHER in the file, where sin and cos of a position
        computed in the graph would not quantize)."""
        table = ops.convert_to_numpy(sinusoidal_table(
            max_length, self.hidden_dim,
            self.get_layer("position_encoding").max_wavelength))  # (max_length, d)
        x = self.token_embedding(inputs["decoder_token_ids"])  # (B, 1, d)
        return x * math.sqrt(self.hidden_dim) + ops.take(
            table, inputs["cache_update_index"], axis=0)[:, None]  # (B, 1, d)


def _embed(token_embedding, position_encoding, token_ids, start_index=0):
    """`sqrt(d) W_emb[x] + PE(pos)` (§3.4-3.5), positions from `start_index`."""
    x = token_embedding(token_ids)  # (B, T, d)
    x = x * math.sqrt(token_embedding.output_dim)
    return x + position_encoding(x, start_index=start_index)  # (B, T, d)

