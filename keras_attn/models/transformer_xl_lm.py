import math

import keras
import numpy as np
from keras import ops

from keras_attn.layers.transformer_xl_block import TransformerXLBlock
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.backbone import Backbone
from keras_attn.models.model_arguments import check_transformer_sizes

# Sizes of Dai et al. (2019): the 12-layer enwik8 model of Table 2 (41M parameters;
# 204 byte symbols, segments and memories of 512 tokens in training), and a tiny
# configuration for unit tests and toy tasks.
TRANSFORMER_XL_PRESETS = {
    "transformer_xl_tiny": dict(
        vocabulary_size=256, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, memory_length=16, dropout=0.0,
    ),
    "transformer_xl_enwik8_12l": dict(
        vocabulary_size=204, num_layers=12, num_heads=8, hidden_dim=512,
        intermediate_dim=2048, memory_length=512, dropout=0.1,
    ),
}


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerXLLM(Backbone):
    """Transformer-XL language model (Dai et al., 2019, "Transformer-XL: Attentive
    Language Models Beyond a Fixed-Length Context", §3).

    A long text is read in segments of `T` tokens; every layer `n` keeps the last `M`
    hidden states `m^{n-1}` it received and attends over `[SG(m^{n-1}) ∘ h^{n-1}]` with
    relative positions (`TransformerXLBlock`), so information flows across segments:

        h^0 = Dropout(sqrt(d) W_emb[x])                                   (B, T, d)
        h^n = XLBlock_n(h^{n-1}, memory=m^{n-1})                          n = 1 .. L
        logits = Dropout(h^L) W_out                                       (B, T, V)
        m'^{n-1} = SG([m^{n-1} ∘ h^{n-1}])[-M:]      (the next segment's memory)

    The memories are explicit inputs and outputs, stacked as one `(B, L, M, d)` tensor
    (layer `n` reads `memory[:, n-1]`), with a `(B, M)` `memory_padding_mask` marking
    the slots that hold real states (zeros at the start of a text; the output mask
    shifts in ones as segments are read). A masked memory is exactly no memory, so the
    first segment needs no special case. The memory length is read from the memory
    tensor at call time: the model trained with `M = memory_length` evaluates with a
    longer memory by being given one (the paper's evaluation trick, §3.2, possible
    because positions are relative), and the memory it returns has the length it was
    given. With `M` at least the number of tokens read before a segment, the segment's
    outputs equal those of one causal pass over the whole text.

    `W_out = W_emb^T` when `tie_embeddings` (one `keras.layers.ReversibleEmbedding`, as
    the official code ties its adaptive input and softmax); otherwise a separate
    `(d, V)` kernel of the same layer. No adaptive softmax: the output is a full
    softmax. The embedding is scaled by `sqrt(d)` as in the official code and
    initialised with `N(0, d^-1/2)`. With `norm_first=True` (pre-LN) a final
    `LayerNorm` follows the last block.

    `memory_length` is the training memory length, the default of `initial_memory`,
    `train_on_segments` and `predict_segments`; it does not fix the graph.

    Layer names: `token_embedding`, `embedding_dropout`, `transformer_xl_layer_{i}`
    (`transformer_layers`),
    `final_layer_norm` (pre-LN only), `output_dropout`, `memory_update`,
    `memory_padding_mask_update`.

    Args:
        vocabulary_size: int, number of token ids `V`.
        num_layers: int, number of Transformer-XL blocks `L`.
        num_heads: int, attention heads.
        hidden_dim: int, `d_model`, must be even (relative sinusoids).
        intermediate_dim: int, feed-forward width.
        memory_length: int, the training memory length `M`.
        key_dim: int, size of each head. Defaults to `hidden_dim // num_heads`.
        dropout: float in [0, 1), on the embeddings, attention probabilities, residual
            branches and the final states. Defaults to `0.1`.
        tie_embeddings: bool, output projection = transposed embedding. Defaults to
            `True`.
        activation: feed-forward activation. Defaults to `"relu"`.
        layer_norm_epsilon: float > 0. Defaults to `1e-5`.
        norm_first: bool, pre-LN blocks and a final LayerNorm. Defaults to `False`.
        dtype: dtype policy of the layers. Defaults to the global policy.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        A dict: `token_ids` `(B, T)` int; `memory` `(B, L, M, d)` float (any `M >= 0`);
        `memory_padding_mask` `(B, M)` int, 1 for memory slots holding real states.

    Returns:
        A dict: `logits` `(B, T, V)`; `memory` `(B, L, M, d)` and `memory_padding_mask`
        `(B, M)` for the next segment (no gradient flows through the memory).

    Example:
    >>> model = TransformerXLLM(vocabulary_size=20, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, memory_length=4)
    >>> state = model.initial_memory(batch_size=1)
    >>> out = model({"token_ids": np.array([[3, 4, 5]]), **state})
    >>> tuple(out["logits"].shape), tuple(out["memory"].shape)
    ((1, 3, 20), (1, 1, 4, 8))
    >>> keras.ops.convert_to_numpy(out["memory_padding_mask"]).tolist()
    [[0, 1, 1, 1]]
    >>> model = TransformerXLLM.from_preset("transformer_xl_tiny", vocabulary_size=50)
    >>> len(model.transformer_layers), model.memory_length
    (2, 16)
    """

    presets = TRANSFORMER_XL_PRESETS
    preset_family = "TransformerXLLM"
    transformer_layer_prefixes = ("transformer_xl_layer_",)

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        memory_length,
        key_dim=None,
        dropout=0.1,
        tie_embeddings=True,
        activation="relu",
        layer_norm_epsilon=1e-5,
        norm_first=False,
        dtype=None,
        **kwargs,
    ):
        check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                                intermediate_dim, key_dim, sinusoids="the relative sinusoids")
        check_positive_int("memory_length", memory_length)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)

        # === Layers ===
        token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size, hidden_dim, tie_weights=tie_embeddings,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype, name="token_embedding",
        )
        embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        blocks = [
            TransformerXLBlock(
                num_heads=num_heads, intermediate_dim=intermediate_dim, key_dim=key_dim,
                dropout=dropout, activation=activation,
                layer_norm_epsilon=layer_norm_epsilon, norm_first=norm_first, dtype=dtype,
                name=f"transformer_xl_layer_{i}",
            )
            for i in range(num_layers)
        ]
        final_layer_norm = None
        if norm_first:
            final_layer_norm = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="final_layer_norm"
            )
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")
        memory_update = MemoryUpdate(dtype=dtype, name="memory_update")
        mask_update = AppendToMemory(dtype=dtype, name="memory_padding_mask_update")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        memory = keras.Input(shape=(num_layers, None, hidden_dim), name="memory")
        memory_padding_mask = keras.Input(
            shape=(None,), dtype="int32", name="memory_padding_mask"
        )
        # Keys of every layer are [memory; segment]: the (B, M + T) mask covers both,
        # and its last M entries are the next segment's memory mask.
        segment_mask = ops.ones_like(token_ids)  # (B, T), every token of a segment is real
        key_padding_mask, next_memory_padding_mask = mask_update(
            memory_padding_mask, segment_mask
        )  # (B, M + T), (B, M)
        x = token_embedding(token_ids) * math.sqrt(hidden_dim)  # (B, T, d)
        x = embedding_dropout(x)
        states = []  # h^{n-1}: what each layer receives, its next memory's newest rows
        for i, block in enumerate(blocks):
            # memory[:, i] (B, M, d): the states layer i received before; `state` is its
            # input x (B, T, d), as an int8 layout of the block reads it.
            x, state = block(x, memory=memory[:, i], padding_mask=key_padding_mask)
            states.append(state)
        if final_layer_norm is not None:
            x = final_layer_norm(x)
        logits = token_embedding(output_dropout(x), reverse=True)  # (B, T, V)
        next_memory = memory_update(memory, states)  # (B, L, M, d)
        inputs = {"token_ids": token_ids, "memory": memory,
                  "memory_padding_mask": memory_padding_mask}
        outputs = {"logits": logits, "memory": next_memory,
                   "memory_padding_mask": next_memory_padding_mask}
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)

        # === Config ===
        self.store_arguments(locals())

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`keras.Model.export`; for `format="onnx"` the returned state is named
        `next_memory` and `next_memory_padding_mask`, since ONNX names must be unique and
        the state goes in and comes out under the same dict keys (tf2onnx otherwise fails
        with "graph input 'memory' not exist"). Other formats keep the model's names."""
        model = self
        if format == "onnx":
            outputs = self(self.input)  # fresh symbolic outputs on the model's own inputs
            model = keras.Model(self.input, {
                f"next_{name}" if name in self.input else name: value
                for name, value in outputs.items()
            }, name=self.name)
            model(self.input)  # Keras exports only models that were called
        return keras.Model.export(model, filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)

    # === Segment-level recurrence ===

    def initial_memory(self, batch_size, memory_length=None):
        """The empty memory a text starts with: `{"memory", "memory_padding_mask"}`.

        Args:
            batch_size: int, number of parallel texts `B`.
            memory_length: int >= 0, memory slots `M`. Defaults to `self.memory_length`.
                `0` means no memory at all.

        Returns:
            A dict of numpy arrays: `memory` float32 zeros `(B, L, M, d)` and
            `memory_padding_mask` int32 zeros `(B, M)` (no slot holds a real state yet);
            merge it into the inputs.
        """
        return empty_memory(self, batch_size, self._memory_length(memory_length))

    def train_on_segments(self, token_ids, segment_length, memory_length=None):
        """One pass of segment-level recurrent training over `(B, N)` token streams.

        The streams are cut into consecutive segments of `segment_length` inputs (the
        last one may be shorter); segment `k` is trained on predicting the next token
        with the memory left by segment `k - 1` (no gradient into it, §3.2). Each
        segment's memory is computed by an inference pass with the weights of the step
        that follows it, so it equals the training pass' memory when `dropout = 0`.
        Compile the model first with a loss for the `"logits"` output, e.g.
        `compile(optimizer, loss={"logits": SparseCategoricalCrossentropy(from_logits=
        True)})`.

        Args:
            token_ids: `(B, N)` int array, `B` independent streams, `N >= 2`.
            segment_length: int, tokens per segment `T`.
            memory_length: int >= 0, memory length `M`. Defaults to `self.memory_length`.

        Returns:
            A list of the training losses (floats), one per segment.
        """
        token_ids = _check_streams(token_ids, minimum_length=2)
        check_positive_int("segment_length", segment_length)
        state = self.initial_memory(token_ids.shape[0], memory_length)
        inputs, labels = token_ids[:, :-1], token_ids[:, 1:]
        losses = []
        for start in range(0, inputs.shape[1], segment_length):
            segment = {"token_ids": inputs[:, start : start + segment_length], **state}
            outputs = self.predict_on_batch(segment)
            result = self.train_on_batch(
                segment, {"logits": labels[:, start : start + segment_length]},
                return_dict=True,
            )
            losses.append(float(result["loss"]))
            state = {
                "memory": outputs["memory"],
                "memory_padding_mask": outputs["memory_padding_mask"],
            }
        return losses

    def predict_segments(self, token_ids, segment_length, memory_length=None):
        """Logits of `(B, N)` token streams read segment by segment with memory.

        Evaluation may use a longer memory than training (`memory_length` larger than
        the model's): with `memory_length >= N - segment_length` every segment sees the
        whole past and the result equals one causal pass over the streams.

        Args:
            token_ids: `(B, N)` int array.
            segment_length: int, tokens per segment (the last one may be shorter).
            memory_length: int >= 0, memory length. Defaults to `self.memory_length`.

        Returns:
            `(B, N, V)` numpy logits: position `t` predicts token `t + 1`.
        """
        token_ids = _check_streams(token_ids, minimum_length=1)
        check_positive_int("segment_length", segment_length)
        state = self.initial_memory(token_ids.shape[0], memory_length)
        logits = []
        for start in range(0, token_ids.shape[1], segment_length):
            outputs = self.predict_on_batch(
                {"token_ids": token_ids[:, start : start + segment_length], **state}
            )
            logits.append(outputs["logits"])  # (B, T, V)
            state = {
                "memory": outputs["memory"],
                "memory_padding_mask": outputs["memory_padding_mask"],
            }
        return np.concatenate(logits, axis=1)  # (B, N, V)

    def _memory_length(self, memory_length):
        if memory_length is None:
            return self.memory_length
        check_int("memory_length", memory_length, low=0, meaning="0 for no memory")
        return memory_length


@keras.saving.register_keras_serializable(package="keras_attn")
class MemoryUpdate(keras.layers.Layer):
    """The next segment's memory of every layer: the newest `M` rows of `[m^{n-1} ∘ h^{n-1}]`.

    Call arguments:
        memory: `(B, L, M, d)`, the memories the segment was read with.
        states: list of the `L` `(B, T, d)` inputs `h^{n-1}` of the layers.

    Returns:
        `(B, L, M, d)`, without gradient: layer `n`'s `[m ∘ h][T:]`.

    One layer for the whole stack, so that a `quantize_model` copy rounds the memory it
    returns once, at one int8 scale (its output quantizer; the int8 file's PACK and
    CONCATENATION take one). Each layer's rows are `[m[:, min(T, M):] ∘ h[:, max(T - M,
    0):]]`, which reads no row it drops: with `M = T` (a file at the training length) they
    are `h` alone. Part of `TransformerXLLM`'s graph, which its `__init__` rebuilds;
    registered because a `quantize_model` copy is a plain functional model that holds it.
    Not exported.
    """

    def call(self, memory, states):
        memory_length, segment_length = ops.shape(memory)[2], ops.shape(states[0])[1]
        # The memory rows dropped, min(T, M): a Python int where the shapes are (JAX slices
        # need one), a tensor where they are known at run time only (a TF graph).
        static = isinstance(memory_length, int) and isinstance(segment_length, int)
        kept = (min if static else ops.minimum)(segment_length, memory_length)
        newest = [
            ops.concatenate([memory[:, n, kept:],
                             ops.cast(state, memory.dtype)[:, segment_length - kept:]], axis=1)
            for n, state in enumerate(states)
        ]  # L x (B, M, d)
        return ops.stop_gradient(ops.stack(newest, axis=1))  # (B, L, M, d)

    def compute_output_spec(self, memory, states):
        return keras.KerasTensor(memory.shape, memory.dtype)

    def get_config(self):
        return super().get_config()  # no arguments (Keras' automatic one fails on a policy)


@keras.saving.register_keras_serializable(package="keras_attn")
class AppendToMemory(keras.layers.Layer):
    """A memory `(B, M, ...)` extended by a segment `(B, T, ...)`: `([m ∘ s], [m ∘ s][T:])`,
    the history of keys and its newest `M` entries (the memory for the next segment).

    A layer (rather than ops in the functional graph) because `M` and `T` are only known
    when the model runs; `M = 0` works. `TransformerXLLM`'s padding masks (integers, no
    rounding in a `quantize_model` copy); registered for that copy, not exported.
    """

    def call(self, memory, segment):
        segment = ops.cast(segment, memory.dtype)
        history = ops.concatenate([memory, segment], axis=1)  # (B, M + T, ...)
        newest = history[:, ops.shape(segment)[1]:]  # (B, M, ...)
        return history, ops.stop_gradient(newest)

    def compute_output_spec(self, memory, segment):
        memory_length, segment_length = memory.shape[1], segment.shape[1]
        history_length = None
        if memory_length is not None and segment_length is not None:
            history_length = memory_length + segment_length
        rest = tuple(memory.shape[2:])
        return (
            keras.KerasTensor((memory.shape[0], history_length) + rest, memory.dtype),
            keras.KerasTensor(memory.shape, memory.dtype),
        )

    def get_config(self):
        return super().get_config()  # no arguments (Keras' automatic one fails on a policy)


def empty_memory(model, batch_size, memory_length):
    """`{"memory": zeros (B, L, M, d), "memory_padding_mask": zeros (B, M)}` for a model with
    `TransformerXLLM`'s `memory` input (its `quantize_model` copy too, which has no
    `initial_memory`): no slot holds a real state yet."""
    check_positive_int("batch_size", batch_size)
    check_int("memory_length", memory_length, low=0, meaning="0 for no memory")
    _, layers, _, hidden_dim = model.input["memory"].shape
    return {"memory": np.zeros((batch_size, layers, memory_length, hidden_dim), "float32"),
            "memory_padding_mask": np.zeros((batch_size, memory_length), "int32")}


def _check_streams(token_ids, minimum_length):
    token_ids = np.asarray(ops.convert_to_numpy(token_ids))
    if token_ids.ndim != 2 or token_ids.shape[1] < minimum_length:
        raise ValueError(
            "`token_ids` must be a (batch, length) int array of streams with length >= "
            f"{minimum_length}. Received: token_ids.shape={token_ids.shape}"
        )
    if not np.issubdtype(token_ids.dtype, np.integer):
        raise ValueError(
            f"`token_ids` must hold integer ids. Received: token_ids.dtype={token_ids.dtype}"
        )
    return token_ids.astype("int32")
