"""Autoregressive decoding with a key/value cache: greedy, sampling, beam search.

Every decoder (GPT, the encoder-decoder Transformer, Transformer-XL) exposes one
callback and these functions do the rest:

    next_token_logits(token_ids, cache, index) -> (logits, new_cache)

- `token_ids`: `(B, t)` int32. The first call gets the whole prompt (prefill,
  `index = 0`); every later call one token `(B, 1)`.
- `index`: scalar int32, the number of tokens already in the cache (where this call's
  keys/values are written).
- `cache`: any nest (tensor / tuple / list / dict) of tensors with the batch on axis 0;
  returned with the same structure and shapes.
- `logits`: `(B, V)`, the next-token logits of the LAST position of `token_ids`.

The decode loops are `keras.ops.while_loop`s over tensors of static shapes (the output
buffer is `(B, prompt_len + max_new_tokens)` from the start), so `generate` and
`beam_search` trace inside `tf.function` (also with `jit_compile=True`).

Logit processors (HF order when combined: temperature, then top-k, then top-p), each
`(B, V) -> (B, V)`, filtered tokens set to `-inf`:

    temperature:  z' = z / T                          p = softmax(z / T)
    top-k:        keep z_i >= z_(k)  (k-th largest)   p_i ∝ exp(z_i) on the kept tokens
    top-p:        keep the smallest set of most likely tokens whose mass is >= p
                  (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration")

Ties with the last kept logit are kept (top-k and top-p may keep more than k tokens / the
minimal mass when logits are equal).
"""

import math

import keras
from keras import ops

from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_int_sequence
from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int

SAMPLERS = ("greedy", "sample")


# === Logit processors ===


def scale_by_temperature(logits, temperature):
    """Divides logits by a temperature: `softmax(z / T)`; `T < 1` sharpens, `T > 1`
    flattens the distribution.

    Args:
        logits: `(..., V)` float tensor.
        temperature: float > 0.

    Returns:
        `(..., V)` float tensor `logits / temperature`.

    Example:
    >>> z = keras.ops.array([[0.0, 1.0, 2.0]])
    >>> np.round(keras.ops.convert_to_numpy(scale_by_temperature(z, 0.5)), 3).tolist()
    [[0.0, 2.0, 4.0]]
    """
    _check_temperature(temperature)
    return ops.divide(logits, ops.cast(temperature, logits.dtype))


def top_k_filter(logits, k):
    """Keeps the `k` largest logits of each row and sets the others to `-inf`.

    Args:
        logits: `(B, V)` float tensor.
        k: int > 0; `k >= V` keeps everything.

    Returns:
        `(B, V)` tensor; sampling from its softmax draws only among the top `k` tokens
        with probabilities renormalized over them. Logits equal to the k-th largest are
        kept.

    Example:
    >>> z = keras.ops.array([[1.0, 3.0, 2.0, 0.0]])
    >>> keras.ops.convert_to_numpy(top_k_filter(z, 2)).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    check_positive_int("top_k", k)
    k = min(k, logits.shape[-1]) if logits.shape[-1] is not None else k
    kth_largest = ops.top_k(logits, k, sorted=True)[0][..., -1:]  # (B, 1)
    return ops.where(logits < kth_largest, _neg_inf(logits.dtype), logits)


def top_p_filter(logits, p):
    """Nucleus filter: keeps the smallest set of most likely tokens whose probability
    mass reaches `p`, sets the others to `-inf`.

    Sorted by decreasing probability, token `j` is kept when the mass of the tokens
    before it is `< p` (so the most likely token is always kept).

    Args:
        logits: `(B, V)` float tensor.
        p: float in (0, 1]; `1.0` keeps everything.

    Returns:
        `(B, V)` tensor, the filtered logits.

    Example:
    >>> z = keras.ops.log(keras.ops.array([[0.1, 0.5, 0.15, 0.25]]))
    >>> kept = keras.ops.isfinite(top_p_filter(z, 0.7))
    >>> keras.ops.convert_to_numpy(kept).tolist()
    [[False, True, False, True]]
    """
    _check_top_p(p)
    descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)  # (B, V)
    probs = ops.softmax(descending, axis=-1)  # (B, V)
    mass_before = ops.cumsum(probs, axis=-1) - probs  # (B, V)
    num_kept = ops.sum(ops.cast(mass_before < p, "int32"), axis=-1, keepdims=True)  # (B, 1)
    num_kept = ops.maximum(num_kept, 1)
    threshold = ops.take_along_axis(descending, num_kept - 1, axis=-1)  # (B, 1)
    return ops.where(logits < threshold, _neg_inf(logits.dtype), logits)


def process_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """Temperature, then top-k, then top-p (the order of HF `generate`), in float32.

    Args:
        logits: `(B, V)` float tensor.
        temperature: float > 0. Defaults to `1.0` (unchanged).
        top_k: optional int > 0.
        top_p: optional float in (0, 1].

    Returns:
        `(B, V)` float32 logits whose softmax is the sampling distribution.

    Example:
    >>> z = keras.ops.array([[1.0, 3.0, 2.0, 0.0]])
    >>> keras.ops.convert_to_numpy(process_logits(z, 2.0, top_k=3)).tolist()
    [[0.5, 1.5, 1.0, -inf]]
    """
    logits = ops.cast(logits, "float32")
    if temperature != 1.0:
        logits = scale_by_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits


def sample_from_logits(logits, uniform):
    """Draws one token per row from `softmax(logits)` by inverting its CDF at `uniform`.

    Token `j` is drawn when `cdf[j-1] <= u * cdf[V-1] < cdf[j]`, so tokens of probability
    0 (logit `-inf`) are never drawn. With `u` uniform on [0, 1) this is exact categorical
    sampling; drawing `u` up front lets the decode loop stay free of random state.

    Args:
        logits: `(B, V)` float tensor (already processed).
        uniform: `(B,)` float tensor of draws in [0, 1).

    Returns:
        `(B,)` int32 token ids.

    Example:
    >>> z = keras.ops.log(keras.ops.array([[0.5, 0.0, 0.5], [0.2, 0.8, 0.0]]))
    >>> ids = sample_from_logits(z, keras.ops.array([0.6, 0.1]))
    >>> keras.ops.convert_to_numpy(ids).tolist()
    [2, 0]
    """
    probs = ops.softmax(ops.cast(logits, "float32"), axis=-1)  # (B, V)
    cdf = ops.cumsum(probs, axis=-1)  # (B, V)
    target = ops.cast(uniform, "float32")[:, None] * cdf[:, -1:]  # (B, 1)
    index = ops.sum(ops.cast(cdf <= target, "int32"), axis=-1)  # (B,)
    # Rounding can put `target` at the very top of the CDF; never step past the last
    # token that has any probability.
    vocab = ops.shape(probs)[-1]
    last_possible = vocab - 1 - ops.argmax(ops.flip(ops.cast(probs > 0, "int32"), axis=-1), axis=-1)
    return ops.cast(ops.minimum(index, ops.cast(last_possible, "int32")), "int32")


# === Greedy and sampling ===


def generate(
    next_token_logits,
    prompt,
    cache,
    max_new_tokens,
    sampler="greedy",
    stop_token_ids=(),
    pad_token_id=0,
    seed=None,
    temperature=1.0,
    top_k=None,
    top_p=None,
):
    """Greedy or random decoding of `max_new_tokens` tokens after `prompt`.

    Greedy: `y_t = argmax_v z_t[v]`. Sampling: `y_t ~ softmax(process_logits(z_t))`
    (temperature, top-k, top-p; see `process_logits`). After a row emits one of
    `stop_token_ids` it keeps that token and then `pad_token_id`; the loop ends early
    once every row has stopped.

    Args:
        next_token_logits: the model callback (module docstring).
        prompt: `(B, P)` int tensor, `P >= 1` static; all rows have `P` real tokens.
        cache: the callback's initial (empty) cache, a nest of batch-major tensors with
            room for `P + max_new_tokens` positions.
        max_new_tokens: int >= 0.
        sampler: `"greedy"` or `"sample"`.
        stop_token_ids: sequence of int token ids that end a row (kept in the output).
        pad_token_id: int, written after a row's stop token.
        seed: sampling only: an int (deterministic: the same seed gives the same tokens,
            eagerly and inside `tf.function`; under XLA, `jit_compile=True`, TensorFlow's
            stateless RNG draws another stream, equally deterministic), a
            `keras.random.SeedGenerator` (advances on every call) or `None` (Keras'
            global generator).
        temperature: sampling only, float > 0. Defaults to `1.0`.
        top_k: sampling only, optional int > 0.
        top_p: sampling only, optional float in (0, 1].

    Returns:
        `(B, P + max_new_tokens)` int32 token ids, the prompt first.

    Example:
    >>> table = keras.ops.one_hot(keras.ops.array([1, 2, 3, 0]), 4)  # next(v) = v + 1
    >>> def next_token_logits(token_ids, cache, index):
    ...     return keras.ops.take(table, token_ids[:, -1], axis=0), cache
    >>> ids = generate(next_token_logits, keras.ops.array([[0], [2]]), (), 4,
    ...                stop_token_ids=(3,), pad_token_id=0)
    >>> keras.ops.convert_to_numpy(ids).tolist()
    [[0, 1, 2, 3, 0], [2, 3, 0, 0, 0]]
    """
    _check_sampler(sampler, temperature, top_k, top_p)
    prompt, prompt_length = _check_common(prompt, max_new_tokens, stop_token_ids, pad_token_id)
    batch = ops.shape(prompt)[0]
    tokens = ops.concatenate(
        [prompt, ops.full((batch, max_new_tokens), pad_token_id, dtype="int32")], axis=1
    )  # (B, P + N)
    if max_new_tokens == 0:
        return tokens
    choose = _token_chooser(sampler, max_new_tokens, batch, seed, temperature, top_k, top_p)
    is_stop = _stop_checker(stop_token_ids)
    logits, cache = next_token_logits(prompt, cache, ops.convert_to_tensor(0, "int32"))
    first = choose(logits, 0)  # (B,)
    tokens = ops.slice_update(tokens, (0, prompt_length), first[:, None])
    done = is_stop(first)  # (B,)

    def cond(step, tokens, done, cache):
        return ops.logical_and(step < max_new_tokens, ops.logical_not(ops.all(done)))

    def body(step, tokens, done, cache):
        index = prompt_length + step - 1  # position of the last written token
        last = ops.expand_dims(ops.take(tokens, index, axis=1), 1)  # (B, 1)
        logits, cache = next_token_logits(last, cache, index)  # (B, V)
        token = ops.where(done, pad_token_id, choose(logits, step))  # (B,)
        tokens = ops.slice_update(tokens, (0, index + 1), token[:, None])
        done = ops.logical_or(done, is_stop(token))
        return step + 1, tokens, done, cache

    step = ops.convert_to_tensor(1, "int32")
    _, tokens, _, _ = ops.while_loop(cond, body, (step, tokens, done, cache))
    return tokens


def _check_sampler(sampler, temperature, top_k, top_p):
    """`sampler` is known; the sampling arguments are valid, and left at their defaults for
    greedy decoding (where they would have no effect)."""
    if sampler not in SAMPLERS:
        raise ValueError(
            f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}"
        )
    if sampler == "greedy":
        defaults = {"temperature": 1.0, "top_k": None, "top_p": None}
        given = {
            name: value
            for name, value in zip(defaults, (temperature, top_k, top_p))
            if value != defaults[name]
        }
        if given:
            raise ValueError(
                "`temperature`, `top_k` and `top_p` shape the sampling distribution and "
                "have no effect on greedy decoding; pass `sampler=\"sample\"` or drop "
                f"them. Received: sampler='greedy', {_format(given)}"
            )
        return
    _check_temperature(temperature)
    if top_k is not None:
        check_positive_int("top_k", top_k)
    if top_p is not None:
        _check_top_p(top_p)


def _token_chooser(sampler, max_new_tokens, batch, seed, temperature, top_k, top_p):
    """`choose(logits, step)`: the `(B,)` int32 token of each row at `step`, the argmax
    (greedy) or a draw from the processed distribution with the uniforms of that step, all
    `(N, B)` drawn here at once."""
    if sampler == "greedy":
        return lambda logits, step: ops.cast(ops.argmax(logits, axis=-1), "int32")  # (B,)
    uniforms = keras.random.uniform((max_new_tokens, batch), seed=seed)  # (N, B)

    def choose(logits, step):
        logits = process_logits(logits, temperature, top_k, top_p)  # (B, V)
        return sample_from_logits(logits, ops.take(uniforms, step, axis=0))  # (B,)

    return choose


# === Beam search ===


def beam_search(
    next_token_logits,
    prompt,
    cache,
    max_new_tokens,
    num_beams,
    length_penalty=1.0,
    stop_token_ids=(),
    pad_token_id=0,
):
    """Beam search: the most likely continuation under a length-normalized score.

    A hypothesis ends at its first stop token or after `max_new_tokens` tokens; with
    `L` generated tokens (stop token included) its score is the HF-style

        score = sum_t log p(y_t | y_<t, prompt) / L ** length_penalty

    (`length_penalty > 0` favours longer hypotheses, `0` is the raw log-probability).
    Each step expands the `num_beams` live hypotheses of every batch item by the whole
    vocabulary, sends every expansion ending in a stop token (every expansion at the
    last step) to the finished set, and keeps the `num_beams` best others; the batch
    runs as `B * num_beams` rows and every cache tensor is reordered along axis 0 with
    `ops.take`. The search stops early only when no live hypothesis can still beat the
    best finished one (log-probabilities are <= 0, so the bound is exact), which gives
    the same result as running every step. With enough beams (`num_beams >= V **
    (max_new_tokens - 1)`) it is exhaustive: the result is the best-scoring sequence.

    Args:
        next_token_logits: the model callback (module docstring).
        prompt: `(B, P)` int tensor, `P >= 1` static.
        cache: the callback's initial cache for batch `B`; the prompt is prefilled once
            per batch item, then the cache is repeated `num_beams` times.
        max_new_tokens: int >= 0.
        num_beams: int > 0; `1` is greedy decoding.
        length_penalty: float, the exponent above. Defaults to `1.0`.
        stop_token_ids: sequence of int token ids that end a hypothesis.
        pad_token_id: int, written after a hypothesis' stop token.

    Returns:
        `(sequences, scores)`: `(B, P + max_new_tokens)` int32, the best hypothesis of
        each batch item (prompt first, `pad_token_id` after its stop token), and its
        `(B,)` float32 score.

    Example:
    >>> table = keras.ops.log(keras.ops.array(  # row v: p(next | last token v)
    ...     [[0.1, 0.5, 0.4], [0.4, 0.3, 0.3], [0.05, 0.9, 0.05]]))
    >>> def next_token_logits(token_ids, cache, index):
    ...     return keras.ops.take(table, token_ids[:, -1], axis=0), cache
    >>> ids, scores = beam_search(next_token_logits, keras.ops.array([[0]]), (), 2,
    ...                           num_beams=2, length_penalty=0.0)
    >>> keras.ops.convert_to_numpy(ids).tolist()  # greedy: 0, 1, 0 (0.5 * 0.4 = 0.2)
    [[0, 2, 1]]
    >>> round(float(keras.ops.convert_to_numpy(scores)[0]), 4)  # log(0.4 * 0.9)
    -1.0217
    """
    check_positive_int("num_beams", num_beams)
    check_number("length_penalty", length_penalty)
    prompt, prompt_length = _check_common(prompt, max_new_tokens, stop_token_ids, pad_token_id)
    batch = ops.shape(prompt)[0]
    padded = ops.concatenate(
        [prompt, ops.full((batch, max_new_tokens), pad_token_id, dtype="int32")], axis=1
    )  # (B, P + N)
    if max_new_tokens == 0:
        return padded, ops.zeros((batch,), "float32")
    search = _BeamSearch(next_token_logits, prompt_length, max_new_tokens, num_beams,
                         length_penalty, _stop_checker(stop_token_ids))
    return search.run(prompt, padded, cache)


class _BeamSearch:
    """One `beam_search` call: its settings, and the loop's steps as methods.

    The loop state is `(step, log_probs, beam_scores, tokens, cache, best_scores,
    best_tokens)`: `log_probs` `(B*K, V)` of the next token of every beam, `beam_scores`
    `(B, K)` of the live beams, `tokens` `(B*K, P + N)`, the cache of `B*K` rows, and the
    best finished hypothesis of each batch item, `best_scores` `(B,)` and `best_tokens`
    `(B, P + N)`.
    """

    def __init__(self, next_token_logits, prompt_length, max_new_tokens, beams,
                 length_penalty, is_stop):
        self.next_token_logits = next_token_logits
        self.prompt_length = prompt_length
        self.max_new_tokens = max_new_tokens
        self.beams = beams
        self.length_penalty = length_penalty
        self.is_stop = is_stop

    def run(self, prompt, padded, cache):
        """`(best_tokens, best_scores)` of the search from `prompt` `(B, P)`."""
        state = self._prefill(prompt, padded, cache)
        state = ops.while_loop(self._continues, self._step, state)
        # The last selection finishes every live beam (or, after an early stop, cannot
        # improve on the best, by the bound).
        _, _, _, best_scores, best_tokens = self._select(*state)
        return best_tokens, best_scores

    def _prefill(self, prompt, padded, cache):
        """Prefills once per batch item, then gives every beam its copy: the first state."""
        beams = self.beams
        batch = ops.shape(prompt)[0]
        logits, cache = self.next_token_logits(prompt, cache,
                                               ops.convert_to_tensor(0, "int32"))
        self.vocab = logits.shape[-1]
        log_probs = ops.repeat(ops.log_softmax(ops.cast(logits, "float32")), beams, axis=0)
        cache = keras.tree.map_structure(lambda x: ops.repeat(x, beams, axis=0), cache)
        tokens = ops.repeat(padded, beams, axis=0)  # (B*K, P + N)
        # Only beam 0 is live at first, so the first step does not pick K copies of a token.
        beam_scores = ops.tile(
            ops.convert_to_tensor([[0.0] + [-math.inf] * (beams - 1)], "float32"), (batch, 1)
        )  # (B, K)
        best_scores = ops.full((batch,), -math.inf, dtype="float32")  # (B,)
        candidate_token = ops.tile(ops.arange(self.vocab, dtype="int32"), (beams,))  # (K*V,)
        self.candidate_is_stop = self.is_stop(candidate_token)[None, :]  # (1, K*V)
        self.row_offset = ops.arange(batch, dtype="int32")[:, None] * beams  # (B, 1)
        return (ops.convert_to_tensor(0, "int32"), log_probs, beam_scores, tokens, cache,
                best_scores, padded)

    def _normalizer(self, length):
        return ops.power(ops.cast(length, "float32"), float(self.length_penalty))

    def _select(self, step, log_probs, beam_scores, tokens, cache, best_scores, best_tokens):
        """Extends every live beam by every token; updates the finished best and keeps
        the `K` best live extensions (step = index of the token being chosen)."""
        beams, vocab = self.beams, self.vocab
        column = self.prompt_length + step
        candidates = beam_scores[:, :, None] + ops.reshape(log_probs, (-1, beams, vocab))
        candidates = ops.reshape(candidates, (-1, beams * vocab))  # (B, K*V)
        finishing = ops.logical_or(self.candidate_is_stop,
                                   step == self.max_new_tokens - 1)  # (1|B, K*V)
        finished = ops.where(
            finishing, candidates / self._normalizer(step + 1), -math.inf
        )  # (B, K*V)
        best_candidate = ops.cast(ops.argmax(finished, axis=-1), "int32")  # (B,)
        candidate_score = ops.max(finished, axis=-1)  # (B,)
        # Strictly better only: a later equal score never replaces an earlier one, which
        # is what makes stopping at the bound (see `_continues`) exact.
        improved = candidate_score > best_scores  # (B,)
        rows = ops.reshape(self.row_offset, (-1,)) + best_candidate // vocab  # (B,)
        candidate_tokens = ops.slice_update(
            ops.take(tokens, rows, axis=0), (0, column), (best_candidate % vocab)[:, None]
        )  # (B, P + N)
        best_tokens = ops.where(improved[:, None], candidate_tokens, best_tokens)
        best_scores = ops.where(improved, candidate_score, best_scores)

        live = ops.where(finishing, -math.inf, candidates)  # (B, K*V)
        beam_scores, chosen = ops.top_k(live, beams)  # (B, K)
        rows = ops.reshape(self.row_offset + chosen // vocab, (-1,))  # (B*K,)
        tokens = ops.slice_update(
            ops.take(tokens, rows, axis=0), (0, column),
            ops.reshape(chosen % vocab, (-1, 1)),
        )  # (B*K, P + N)
        cache = keras.tree.map_structure(lambda x: ops.take(x, rows, axis=0), cache)
        return beam_scores, tokens, cache, best_scores, best_tokens

    def _continues(self, step, log_probs, beam_scores, tokens, cache, best_scores,
                   best_tokens):
        # Live beams hold `step` tokens and will end with L in [step + 1, N] tokens. Their
        # log-probability sums can only fall, so s / L**lp is at most s / N**lp
        # (lp >= 0) or s / (step + 1)**lp (lp < 0).
        final_length = self.max_new_tokens if self.length_penalty >= 0 else step + 1
        bound = ops.max(beam_scores, axis=-1) / self._normalizer(final_length)  # (B,)
        settled = ops.all(best_scores >= bound)
        return ops.logical_and(step < self.max_new_tokens - 1, ops.logical_not(settled))

    def _step(self, step, log_probs, beam_scores, tokens, cache, best_scores, best_tokens):
        beam_scores, tokens, cache, best_scores, best_tokens = self._select(
            step, log_probs, beam_scores, tokens, cache, best_scores, best_tokens
        )
        index = self.prompt_length + step  # position of the token just chosen
        last = ops.expand_dims(ops.take(tokens, index, axis=1), 1)  # (B*K, 1)
        logits, cache = self.next_token_logits(last, cache, index)  # (B*K, V)
        log_probs = ops.log_softmax(ops.cast(logits, "float32"))
        return step + 1, log_probs, beam_scores, tokens, cache, best_scores, best_tokens


# === Checks and helpers ===


def _check_common(prompt, max_new_tokens, stop_token_ids, pad_token_id):
    check_int("max_new_tokens", max_new_tokens, low=0)
    check_int_sequence("stop_token_ids", tuple(stop_token_ids), low=0, meaning="token ids")
    check_int("pad_token_id", pad_token_id, low=0, meaning="a token id")
    prompt = ops.convert_to_tensor(prompt)
    if len(prompt.shape) != 2 or prompt.shape[1] is None or prompt.shape[1] < 1:
        raise ValueError(
            "`prompt` must be a (batch, prompt_length) tensor of token ids with a static "
            "prompt_length >= 1 (the decode loop has static shapes). "
            f"Received: prompt.shape={tuple(prompt.shape)}"
        )
    if "int" not in str(prompt.dtype):
        raise ValueError(
            f"`prompt` must hold integer token ids. Received: prompt.dtype={prompt.dtype}"
        )
    return ops.cast(prompt, "int32"), prompt.shape[1]


def _stop_checker(stop_token_ids):
    """`(...) int32 -> (...) bool`, True where a token is one of `stop_token_ids`."""
    stop_ids = tuple(stop_token_ids)

    def is_stop(token):
        if not stop_ids:
            return ops.zeros(ops.shape(token), "bool")
        ids = ops.convert_to_tensor(stop_ids, "int32")  # (S,)
        return ops.any(ops.equal(ops.expand_dims(token, -1), ids), axis=-1)

    return is_stop


def _check_temperature(temperature):
    check_number_above("temperature", temperature, 0, "logits are divided by it")


def _check_top_p(p):
    check_number("top_p", p, 0, 1, include_low=False, meaning="a probability mass")


def _neg_inf(dtype):
    return ops.cast(-math.inf, dtype)


def _format(values):
    return ", ".join(f"{name}={value!r}" for name, value in values.items())
