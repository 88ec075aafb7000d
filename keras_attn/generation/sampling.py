"""Greedy and random decoding, one token per row and step: `generate`."""

import keras
from keras import ops

from keras_attn.generation.checks import _check_common
from keras_attn.generation.checks import _stop_checker
from keras_attn.generation.logits import _check_temperature
from keras_attn.generation.logits import _check_top_p
from keras_attn.generation.logits import process_logits
from keras_attn.generation.logits import sample_from_logits
from keras_attn.layers.validation import check_positive_int

SAMPLERS = ("greedy", "sample")


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
        next_token_logits: the model callback (the `keras_attn.generation` docstring).
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


def _format(values):
    return ", ".join(f"{name}={value!r}" for name, value in values.items())
