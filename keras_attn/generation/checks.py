"""The checks and helpers both decode loops share: the prompt, token ids, stop tokens."""

from keras import ops

from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_int_sequence


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
