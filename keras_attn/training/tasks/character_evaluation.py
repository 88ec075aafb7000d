"""Scoring a text with a language model, the two ways the character-level papers do it.

- `sliding_window_nll`: a model with a fixed context `L` (the vanilla Transformer of
  Al-Rfou et al., 2018) reads a window of the `L` previous characters for every character
  and scores only the newest one (one forward pass of `L` tokens per character);
- `segment_memory_nll`: Transformer-XL (Dai et al., 2019, §3.2) reads the text once, in
  segments of `T` characters, each attending to a memory of the `M` previous hidden states
  (one forward pass of `T` tokens per `T` characters).

Both return the summed negative log-likelihood in nats, the number of scored characters
and the seconds spent (after one warm-up call per input shape, so tracing is not timed);
`bits_per_character(nll, count) = nll / (count ln 2)`.
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn.models.transformer_xl_lm import empty_memory


def bits_per_character(nll, count):
    """Mean negative log2-likelihood: `nll` (nats, summed over `count` symbols) / ln 2.

    Example:
    >>> round(bits_per_character(math.log(2) * 10, 5), 6)
    2.0
    """
    return nll / (count * math.log(2))


def _nll(logits, targets):
    """Summed `-log softmax(logits)[target]` in float64, `(N, V)` logits."""
    logits = np.asarray(logits, "float64")
    log_z = np.logaddexp.reduce(logits, axis=-1)
    return float((log_z - logits[np.arange(len(targets)), targets]).sum())


def _text_and_forward(model, ids, limit):
    """The int32 ids to score (the first `limit` + 1 when given) and the model's inference
    call as a `tf.function`."""
    ids = np.asarray(ids, "int32")
    if limit is not None:
        ids = ids[: limit + 1]
    return ids, tf.function(lambda x: model(x, training=False), reduce_retracing=True)


def sliding_window_nll(model, ids, context, batch_size=64, limit=None):
    """Scores `ids[1:]` with a window of at most `context` previous ids per character.

    The first `context` characters come from one causal pass over `ids[:context]` (each
    position sees its whole prefix, which is what a window would hold); every later
    character `t` gets its own window `ids[t - context: t]`, its last logit scored.

    Args:
        model: a `GPTCausalLM` (called on `{"token_ids", "padding_mask"}`).
        ids: 1-D int array, the text.
        context: int, the window `L` (at most the model's positions).
        batch_size: int, windows per forward pass.
        limit: int or None, score only the first `limit` characters.

    Returns:
        `(nll, count, seconds)`.
    """
    ids, forward = _text_and_forward(model, ids, limit)

    def logits(windows):
        return keras.ops.convert_to_numpy(forward(
            {"token_ids": windows, "padding_mask": np.ones_like(windows)}))

    head = ids[: min(context, len(ids) - 1)][None]  # (1, L)
    windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], context)[1:]  # (N, L)
    starts = list(range(0, len(windows), batch_size))
    for warm_up in [head] + [np.ascontiguousarray(windows[s: s + batch_size])
                             for s in starts[:1] + starts[-1:]]:
        logits(warm_up)
    started = time.perf_counter()
    nll = _nll(logits(head)[0], ids[1: head.shape[1] + 1])
    count = head.shape[1]
    for start in starts:
        batch = np.ascontiguousarray(windows[start: start + batch_size])
        targets = ids[context + 1 + start: context + 1 + start + len(batch)]
        nll += _nll(logits(batch)[:, -1], targets)
        count += len(batch)
    return nll, count, time.perf_counter() - started


def segment_memory_nll(lm, ids, segment_length, memory_length, limit=None):
    """Scores `ids[1:]` with a `TransformerXLLM` (or its `quantize_model` copy) reading
    `ids` once in segments of `segment_length`, each with a memory of `memory_length` hidden
    states per layer.

    Returns:
        `(nll, count, seconds)`.
    """
    ids, forward = _text_and_forward(lm, ids, limit)
    state = empty_memory(lm, 1, memory_length)
    inputs, targets = ids[:-1], ids[1:]
    for start in {0, (len(inputs) - 1) // segment_length * segment_length}:  # warm-up
        forward({"token_ids": inputs[start: start + segment_length][None], **state})
    started = time.perf_counter()
    nll = 0.0
    for start in range(0, len(inputs), segment_length):
        segment = inputs[start: start + segment_length][None]  # (1, T)
        out = forward({"token_ids": segment, **state})
        nll += _nll(keras.ops.convert_to_numpy(out["logits"])[0],
                    targets[start: start + segment_length])
        state = {"memory": out["memory"], "memory_padding_mask": out["memory_padding_mask"]}
    return nll, len(targets), time.perf_counter() - started
