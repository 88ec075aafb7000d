import keras
from keras import ops

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import clone_initializer


@keras.saving.register_keras_serializable(package="keras_attn")
class CRF(keras.layers.Layer):
    """Linear-chain conditional random field over tag sequences (Lafferty et al., 2001).

    The head of BiLSTM-CRF and BERT-CRF taggers (Lample et al., 2016): the network gives
    emission scores `E[t, k]` (tag `k` at token `t`), the CRF adds learned scores for
    tag bigrams, and the tags are chosen jointly. For the real tokens `t_1 < ... < t_n`
    of a sequence and tags `y`, the path score is

        s(y) = start[y_1] + sum_i E[t_i, y_i] + sum_{i>1} A[y_{i-1}, y_i] + end[y_n]

    and `p(y | E) = exp(s(y)) / Z` with `Z = sum_y' exp(s(y'))` over all `K^n` paths.
    `log Z` comes from the forward algorithm in log space,

        alpha_1 = start + E[t_1],   alpha_i[j] = logsumexp_k(alpha_{i-1}[k] + A[k, j]) + E[t_i, j],
        log Z = logsumexp_j(alpha_n[j] + end[j]),

    and the best path from the same recursion with `max` in place of `logsumexp`
    (Viterbi), keeping the argmax `k` of each step as a backpointer to walk back from
    `argmax_j(delta_n[j] + end[j])`.

    Weights: `transitions` `A`, `(K, K)`, the score of tag `i` followed by tag `j` in
    `A[i, j]`; `start_transitions` `(K,)` and `end_transitions` `(K,)`, the scores of the
    first and last tag. They stay float32 under mixed precision, and both dynamic programs
    run in float32 whatever the compute dtype.

    Masked positions are skipped: the path goes from one real token to the next, so
    right padding (the usual case), left padding and holes all work. A sequence with no
    real token decodes to all zeros and has log-likelihood 0.

    Training: pass the gold `tags` to the call, and the layer adds the batch mean of
    `-log p(tags | emissions)` with `add_loss` (whether training or evaluating) while
    still returning the decoded path; compile without a loss. Call it again without
    `tags` on the same emissions for the inference model, which shares the weights:

        decoded = crf(emissions, tags=gold_tags)     # training model, adds the NLL
        decoded = crf(emissions)                     # inference / export model

    Args:
        num_tags: int, the number of tags `K`.
        transitions_initializer: initializer of all three weights. Defaults to
            `"zeros"`, which makes the first decodes the per-token argmax.
        unroll: bool, unroll both dynamic programs over the (static) sequence length
            instead of running a `fori_loop`, as Keras RNNs do. Both give the same
            paths and both convert to TFLite builtins. Unrolled is a little faster on
            LiteRT (0.6-0.8 vs 0.9-1.1 ms for 128 tokens and 9 tags, one thread), but
            the model grows with the length (536 vs 22 KB) and the length must be
            static. Defaults to `False`.

    Call arguments:
        emissions: `(B, T, K)` emission scores (usually a `Dense(K)` on top of the
            encoder).
        mask: optional boolean `(B, T)`, True for real tokens. Defaults to the Keras
            mask of `emissions` (e.g. from `Embedding(mask_zero=True)`).
        tags: optional int `(B, T)` gold tags in `[0, K)`; when given, the negative
            log-likelihood is added as a loss (see above).
        emissions_mask: not for users: with two tensor arguments (`emissions` and
            `tags`) Keras passes the Keras mask of `emissions` here instead of in
            `mask`. `mask` wins when both are set.

    Returns:
        int32 `(B, T)`, the Viterbi (highest-scoring) tag path; masked positions hold 0.
        The output keeps the Keras mask of `emissions`.

    Example:
    >>> crf = CRF(num_tags=3)
    >>> emissions = np.array([[[2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 5.0, 0.0]]])
    >>> mask = np.array([[True, True, False]])
    >>> keras.ops.convert_to_numpy(crf(emissions, mask=mask))
    array([[0, 2, 0]], dtype=int32)
    >>> log_p = crf.log_likelihood(emissions, np.array([[0, 2, 0]]), mask=mask)
    >>> round(float(log_p[0]), 4)   # 3 - log((e^2 + 2)(e + 2)) with zero transitions
    -0.791
    """

    def __init__(self, num_tags, transitions_initializer="zeros", unroll=False, **kwargs):
        check_positive_int("num_tags", num_tags, "size of the tag set")
        check_bool("unroll", unroll)
        super().__init__(**kwargs)
        self.num_tags = num_tags
        self.transitions_initializer = keras.initializers.get(transitions_initializer)
        self.unroll = unroll
        self.supports_masking = True

    # === Build ===

    def build(self, emissions_shape, tags_shape=None):
        self._check_emissions_shape(emissions_shape)
        k = self.num_tags
        # autocast=False: the dynamic programs read float32 weights under mixed precision.
        self.transitions = self.add_weight(
            name="transitions",
            shape=(k, k),
            autocast=False,
            initializer=clone_initializer(self.transitions_initializer),
        )
        self.start_transitions = self.add_weight(
            name="start_transitions",
            shape=(k,),
            autocast=False,
            initializer=clone_initializer(self.transitions_initializer),
        )
        self.end_transitions = self.add_weight(
            name="end_transitions",
            shape=(k,),
            autocast=False,
            initializer=clone_initializer(self.transitions_initializer),
        )

    # === Call ===

    def call(self, emissions, mask=None, tags=None, emissions_mask=None):
        mask = emissions_mask if mask is None else mask
        if tags is not None:
            self.add_loss(-ops.mean(self.log_likelihood(emissions, tags, mask)))
        return viterbi_decode(
            emissions,
            self.transitions,
            self.start_transitions,
            self.end_transitions,
            mask=mask,
            unroll=self.unroll,
        )

    def log_likelihood(self, emissions, tags, mask=None):
        """`log p(tags | emissions) = s(tags) - log Z`, per sequence, in float32.

        Args:
            emissions: `(B, T, K)` emission scores.
            tags: int `(B, T)` gold tags in `[0, K)`; masked positions are ignored.
            mask: optional boolean `(B, T)`, True for real tokens.

        Returns:
            float32 `(B,)`; 0 for a sequence without real tokens.
        """
        self._check_emissions_shape(emissions.shape)
        if not _compatible(tags.shape, emissions.shape[:-1]):
            raise ValueError(
                "`tags` must hold one tag per token, shape (batch, seq) = "
                f"{tuple(emissions.shape[:-1])} for these emissions. "
                f"Received: tags.shape={tuple(tags.shape)}"
            )
        if not self.built:
            self.build(emissions.shape)
        emissions, mask, first = _time_major(emissions, mask)  # (T, B, K), (T, B), (T, B)
        tags = ops.transpose(ops.cast(tags, "int32"), (1, 0))  # (T, B)
        transitions = ops.cast(self.transitions, "float32")  # (K, K)
        start = ops.cast(self.start_transitions, "float32")  # (K,)
        end = ops.cast(self.end_transitions, "float32")  # (K,)
        k = self.num_tags

        def step(carry, emission, real, is_first, tag):
            alpha, gold, previous = carry  # (B, K), (B,), (B,)
            emitted = _pick(emission, tag)  # (B,) E[t, y_t]
            # alpha_i[j] = logsumexp_k(alpha_{i-1}[k] + A[k, j]) + E[t_i, j]
            chained = ops.logsumexp(ops.expand_dims(alpha, 2) + transitions, axis=1)  # (B, K)
            bigram = ops.take(ops.reshape(transitions, (-1,)), previous * k + tag)  # (B,)
            first_col = ops.expand_dims(is_first, 1)  # (B, 1)
            new_alpha = ops.where(first_col, start, chained) + emission  # (B, K)
            new_gold = gold + ops.where(is_first, ops.take(start, tag), bigram) + emitted
            real_col = ops.expand_dims(real, 1)  # (B, 1)
            return (
                ops.where(real_col, new_alpha, alpha),
                ops.where(real, new_gold, gold),
                ops.where(real, tag, previous),
            ), None

        batch_zeros = ops.zeros_like(emissions[0, :, 0])  # (B,)
        init = (ops.zeros_like(emissions[0]), batch_zeros, ops.cast(batch_zeros, "int32"))
        (alpha, gold, last), _ = _loop(step, init, (emissions, mask, first, tags), self.unroll)
        any_real = ops.any(mask, axis=0)  # (B,)
        log_z = ops.logsumexp(alpha + end, axis=1)  # (B,)
        gold = gold + ops.take(end, last)  # (B,)
        return ops.where(any_real, gold - log_z, 0.0)

    # === Masks, shapes, config ===

    def compute_mask(self, emissions, mask=None, tags=None, emissions_mask=None):
        return emissions_mask if mask is None else mask

    def compute_output_spec(self, emissions, mask=None, tags=None, emissions_mask=None):
        return keras.KerasTensor(emissions.shape[:-1], dtype="int32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_tags": self.num_tags,
                "transitions_initializer": keras.initializers.serialize(
                    self.transitions_initializer
                ),
                "unroll": self.unroll,
            }
        )
        return config

    def _check_emissions_shape(self, shape):
        if len(shape) != 3 or shape[-1] != self.num_tags:
            raise ValueError(
                "`emissions` must have shape (batch, seq, num_tags) with num_tags="
                f"{self.num_tags}: one score per tag and token (project the encoder "
                f"output with Dense({self.num_tags})). Received: emissions.shape="
                f"{tuple(shape)}"
            )
        if self.unroll and shape[1] is None:
            raise ValueError(
                "unroll=True unrolls over the sequence length, which must then be known "
                "when the layer is called: give `keras.Input` a fixed length or use "
                f"unroll=False. Received: emissions.shape={tuple(shape)}"
            )


def viterbi_decode(
    emissions, transitions, start_transitions, end_transitions, mask=None, unroll=False
):
    """Highest-scoring tag path of a linear-chain CRF (Viterbi), in float32.

        delta_1 = start + E[t_1],   delta_i[j] = max_k(delta_{i-1}[k] + A[k, j]) + E[t_i, j]
        y_n = argmax_j(delta_n[j] + end[j]),   y_{i-1} = backpointer_i[y_i]

    over the real tokens `t_1 < ... < t_n` of each sequence (masked positions are
    skipped). Ties go to the lowest tag index.

    Args:
        emissions: `(B, T, K)` emission scores `E`.
        transitions: `(K, K)`, `A[i, j]` the score of tag `i` followed by tag `j`.
        start_transitions: `(K,)` scores of the first tag.
        end_transitions: `(K,)` scores of the last tag.
        mask: optional boolean `(B, T)`, True for real tokens.
        unroll: bool, unroll the loops over the static sequence length.

    Returns:
        int32 `(B, T)`, 0 at masked positions.

    Example:
    >>> emissions = np.array([[[2.0, 0.0], [1.0, 0.0]]])
    >>> transitions = np.array([[-5.0, 0.0], [0.0, 0.0]])    # tag 0 never follows tag 0
    >>> keras.ops.convert_to_numpy(viterbi_decode(emissions, transitions, np.zeros(2), np.zeros(2)))
    array([[0, 1]], dtype=int32)
    """
    emissions, mask, first = _time_major(emissions, mask)  # (T, B, K), (T, B), (T, B)
    transitions = ops.cast(transitions, "float32")  # (K, K)
    start = ops.cast(start_transitions, "float32")  # (K,)
    end = ops.cast(end_transitions, "float32")  # (K,)
    identity = ops.zeros_like(emissions[0], dtype="int32") + ops.arange(
        ops.shape(emissions)[-1], dtype="int32"
    )  # (B, K)

    # Flags with a trailing axis, made once rather than at every step.
    real = ops.expand_dims(mask, 2)  # (T, B, 1)
    is_first = ops.expand_dims(first, 2)  # (T, B, 1)
    # Elsewhere the backpointer is the identity, so the walk back carries the tag of the
    # next real token through skipped positions.
    follows = real & ~is_first  # (T, B, 1) a real token after a real token

    def forward(delta, emission, real, is_first, follows):
        candidates = ops.expand_dims(delta, 2) + transitions  # (B, K_prev, K)
        best, backpointer = _max_and_argmax(candidates, axis=1)  # (B, K), (B, K)
        new_delta = ops.where(is_first, start, best) + emission  # (B, K)
        backpointer = ops.where(follows, backpointer, identity)  # (B, K)
        return ops.where(real, new_delta, delta), backpointer

    delta, backpointers = _loop(
        forward,
        ops.zeros_like(emissions[0]),
        (emissions, real, is_first, follows),
        unroll,
        output=ops.zeros_like(emissions, dtype="int32"),
    )  # (B, K), (T, B, K)
    last_tag = _max_and_argmax(delta + end, axis=1)[1]  # (B,)

    def backward(tag, backpointer):
        previous = _pick(backpointer, tag)  # (B,)
        return previous, tag

    _, path = _loop(
        backward,
        last_tag,
        (backpointers,),
        unroll,
        reverse=True,
        output=ops.zeros_like(mask, dtype="int32"),
    )  # (T, B)
    return ops.transpose(ops.where(mask, path, 0), (1, 0))  # (B, T)


def _time_major(emissions, mask):
    """float32 `(T, B, K)` emissions, bool `(T, B)` mask and first-real-token flags."""
    emissions = ops.cast(emissions, "float32")  # (B, T, K)
    if mask is None:
        mask = ops.ones_like(emissions[:, :, 0], dtype="bool")  # (B, T)
    mask = ops.cast(mask, "bool")  # (B, T)
    count = ops.cumsum(ops.cast(mask, "int32"), axis=1)  # (B, T) real tokens so far
    first = mask & (count == 1)  # (B, T)
    return (
        ops.transpose(emissions, (1, 0, 2)),
        ops.transpose(mask, (1, 0)),
        ops.transpose(first, (1, 0)),
    )


def _max_and_argmax(x, axis):
    """`max` and first `argmax` along `axis`, from TFLite builtins only.

    `ops.argmax` on floats checks the sign bit of zeros (a flush-to-zero fix) with a
    `BitwiseAnd`, which is no TFLite builtin; the lowest index equal to the max is the
    same argmax, made of REDUCE_MAX, EQUAL, SELECT and REDUCE_MIN.
    """
    best = ops.max(x, axis=axis, keepdims=True)
    size = x.shape[axis]
    index_shape = [1] * len(x.shape)
    index_shape[axis] = size
    index = ops.reshape(ops.arange(size, dtype="int32"), index_shape)
    argmax = ops.min(ops.where(x == best, index, size), axis=axis)
    return ops.squeeze(best, axis), argmax


def _pick(values, index):
    """`values[b, index[b]]` for `(B, K)` values and `(B,)` indices."""
    # Not `take_along_axis`: on TensorFlow it broadcasts through SHAPE / MAXIMUM / FILL /
    # BROADCAST_TO ops, which would run at every step of the exported loop.
    tags = ops.arange(values.shape[-1], dtype="int32")  # (K,)
    return ops.sum(ops.where(tags == ops.expand_dims(index, 1), values, 0), axis=1)


def _loop(step, carry, sequences, unroll, reverse=False, output=None):
    """`carry, y_t = step(carry, *[s[t] for s in sequences])` over the time axis 0.

    Returns the last carry and, when `output` (a zeros `(T, ...)` buffer of the `y_t`
    shape and dtype) is given, the `y_t` stacked along axis 0.
    """
    if unroll:
        steps = sequences[0].shape[0]
        if steps is None:
            raise ValueError(
                "unroll=True unrolls over the sequence length, which must be static. "
                "Received: a sequence length of None"
            )
        outputs = [None] * steps
        for t in reversed(range(steps)) if reverse else range(steps):
            carry, outputs[t] = step(carry, *[s[t] for s in sequences])
        return carry, None if output is None else ops.stack(outputs)

    steps = ops.shape(sequences[0])[0]

    def body(i, state):
        carry, buffer = state if output is not None else (state, None)
        t = steps - 1 - i if reverse else i
        carry, y = step(carry, *[ops.take(s, t, axis=0) for s in sequences])
        if output is None:
            return carry
        start = (t,) + (0,) * (len(output.shape) - 1)
        return carry, ops.slice_update(buffer, start, y[None])

    state = ops.fori_loop(0, steps, body, carry if output is None else (carry, output))
    return (state, None) if output is None else state


def _compatible(shape_a, shape_b):
    return len(shape_a) == len(shape_b) and all(
        a is None or b is None or a == b for a, b in zip(shape_a, shape_b)
    )
