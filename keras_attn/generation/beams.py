"""Beam search over a key/value cache: `beam_search` and its loop, `_BeamSearch`."""

import math

import keras
from keras import ops

from keras_attn.generation.checks import _check_common
from keras_attn.generation.checks import _stop_checker
from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_positive_int


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
        next_token_logits: the model callback (the `keras_attn.generation` docstring).
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
