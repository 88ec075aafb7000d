"""Greedy decoding and beam search of an encoder-decoder model, with or without its
key/value (or recurrent-state) cache: what `Seq2SeqTransformer` and `AttentionRNNSeq2Seq`
share."""

from keras import ops

from keras_attn import generation
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_positive_int


class EncoderDecoderDecoding:
    """Decoding for a functional encoder-decoder `keras.Model` whose inputs are the dict
    `encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids`,
    `decoder_padding_mask` and whose output is `(B, T, V)` next-token logits.

    The model provides `initial_decoding_cache(encoder_token_ids, encoder_padding_mask,
    max_length)` and `next_token_logits(token_ids, cache, index)` (the
    `keras_attn.generation` callback); with `use_cache=False` the decoding instead runs
    the whole model on the source and every token so far at each step (what the
    `seq2seq` task did before the cache; slower, the reference the cache is tested
    against).
    """

    def greedy_decode(self, encoder_token_ids, encoder_padding_mask=None, *, bos_token_id,
                      max_new_tokens, eos_token_id=None, pad_token_id=0, use_cache=True):
        """Greedy decoding `y_t = argmax_v p(v | y_<t, x)`.

        Args:
            encoder_token_ids: `(B, S)` int source ids.
            encoder_padding_mask: `(B, S)`, 1/True for real source tokens. Defaults to
                `encoder_token_ids != pad_token_id`.
            bos_token_id: int, the first decoder token.
            max_new_tokens: int, number of tokens to generate.
            eos_token_id: optional int; a row stops after emitting it (kept) and is
                filled with `pad_token_id`.
            pad_token_id: int, the padding id. Defaults to `0`.
            use_cache: bool. Defaults to `True`; `False` recomputes everything per step.

        Returns:
            `(B, max_new_tokens)` int32 generated ids, without the BOS token.
        """
        prompt, cache, stop, step = self._start_decoding(
            encoder_token_ids, encoder_padding_mask, bos_token_id, max_new_tokens,
            eos_token_id, pad_token_id, use_cache)
        tokens = generation.generate(step, prompt, cache, max_new_tokens, stop_token_ids=stop,
                                     pad_token_id=pad_token_id)  # (B, 1 + max_new_tokens)
        return tokens[:, 1:]

    def beam_search(self, encoder_token_ids, encoder_padding_mask=None, *, bos_token_id,
                    max_new_tokens, num_beams=4, length_penalty=1.0, eos_token_id=None,
                    pad_token_id=0, use_cache=True):
        """Beam search (Vaswani et al. used 4 beams, §6.1).

        The source is encoded (and, with the cache, projected) once per batch item;
        `generation.beam_search` then repeats the cache for the beams. Hypotheses are
        ranked by `sum_t log p(y_t) / L ** length_penalty`, `L` the number of generated
        tokens (EOS included): fairseq's `--lenpen` form. (The paper's, from Wu et al.
        2016, is `((5 + L) / 6) ** alpha`.)

        Args:
            encoder_token_ids, encoder_padding_mask, bos_token_id, max_new_tokens,
                eos_token_id, pad_token_id, use_cache: as in `greedy_decode`.
            num_beams: int, beam width. Defaults to `4`; `1` is greedy decoding.
            length_penalty: float, exponent of the length normalization. Defaults
                to `1.0`; `0.0` ranks by total log-probability.

        Returns:
            `(tokens, scores)`: `(B, max_new_tokens)` int32 best hypotheses without the
            BOS token, and their `(B,)` float32 scores.
        """
        prompt, cache, stop, step = self._start_decoding(
            encoder_token_ids, encoder_padding_mask, bos_token_id, max_new_tokens,
            eos_token_id, pad_token_id, use_cache)
        tokens, scores = generation.beam_search(
            step, prompt, cache, max_new_tokens, num_beams=num_beams,
            length_penalty=length_penalty, stop_token_ids=stop, pad_token_id=pad_token_id,
        )  # (B, 1 + max_new_tokens), (B,)
        return tokens[:, 1:], scores

    def _start_decoding(self, encoder_token_ids, encoder_padding_mask, bos_token_id,
                        max_new_tokens, eos_token_id, pad_token_id, use_cache):
        """The BOS prompt, the initial cache, the stop ids and the step callback."""
        for name, value in (("bos_token_id", bos_token_id), ("pad_token_id", pad_token_id)):
            _check_token_id(name, value, self.vocabulary_size)
        if eos_token_id is not None:
            _check_token_id("eos_token_id", eos_token_id, self.vocabulary_size)
        check_positive_int("max_new_tokens", max_new_tokens)
        check_bool("use_cache", use_cache)
        encoder_token_ids = ops.convert_to_tensor(encoder_token_ids, "int32")  # (B, S)
        if len(encoder_token_ids.shape) != 2:
            raise ValueError(
                "`encoder_token_ids` must be a (batch, source_length) int tensor. "
                f"Received: encoder_token_ids.shape={tuple(encoder_token_ids.shape)}"
            )
        if encoder_padding_mask is None:
            encoder_padding_mask = ops.not_equal(encoder_token_ids, pad_token_id)
        batch = ops.shape(encoder_token_ids)[0]
        prompt = ops.full((batch, 1), bos_token_id, dtype="int32")  # (B, 1)
        stop = () if eos_token_id is None else (eos_token_id,)
        if use_cache:
            cache = self.initial_decoding_cache(encoder_token_ids, encoder_padding_mask,
                                                1 + max_new_tokens)
            return prompt, cache, stop, self.next_token_logits
        cache = {"encoder_token_ids": encoder_token_ids,
                 "encoder_padding_mask": ops.cast(encoder_padding_mask, "int32"),
                 "decoder_token_ids": ops.zeros((batch, 1 + max_new_tokens), "int32")}
        return prompt, cache, stop, self._full_pass_next_token_logits

    def _full_pass_next_token_logits(self, token_ids, cache, index):
        """The `generation` callback without a cache: writes `token_ids` into the decoder
        buffer at `index` and runs the whole model on the source and the buffer (the
        causal decoder makes the positions after `index` irrelevant)."""
        decoder = ops.slice_update(cache["decoder_token_ids"], (0, index),
                                   ops.cast(token_ids, "int32"))  # (B, 1 + N)
        logits = self({"encoder_token_ids": cache["encoder_token_ids"],
                       "encoder_padding_mask": cache["encoder_padding_mask"],
                       "decoder_token_ids": decoder,
                       "decoder_padding_mask": ops.ones_like(decoder)},
                      training=False)  # (B, 1 + N, V)
        last = index + ops.shape(token_ids)[1] - 1
        return ops.take(logits, last, axis=1), {**cache, "decoder_token_ids": decoder}


def _check_token_id(name, value, vocabulary_size):
    check_int(name, value, 0, vocabulary_size, meaning="a token id", high_name="vocabulary_size")
