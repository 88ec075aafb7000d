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

The package, by concern: `logits` (the logit processors and the sampling draw), `sampling`
(`generate`: greedy and random decoding), `beams` (`beam_search`) and `checks` (the prompt
and token-id checks both decode loops share).
"""

from keras_attn.generation.beams import beam_search
from keras_attn.generation.logits import process_logits
from keras_attn.generation.logits import sample_from_logits
from keras_attn.generation.logits import scale_by_temperature
from keras_attn.generation.logits import top_k_filter
from keras_attn.generation.logits import top_p_filter
from keras_attn.generation.sampling import SAMPLERS
from keras_attn.generation.sampling import generate

__all__ = [
    "SAMPLERS",
    "beam_search",
    "generate",
    "process_logits",
    "sample_from_logits",
    "scale_by_temperature",
    "top_k_filter",
    "top_p_filter",
]
