"""Translating with a trained `seq2seq` run: batched beam search through the cache, the
detokenized text, and the cross-attention alignment of a translation.

    translator = Translator.from_run("runs/multi30k_transformer")
    translator.translate(["Ein Mann fährt Fahrrad."])        # ['A man is riding a bike.']
    translator.alignment("Ein Mann fährt Fahrrad.")           # source pieces x target pieces

`keras-attn predict` and `keras-attn explain` translate with it
(`keras_attn.cli.translation_commands`), on a run or on an exported translation file
(`keras_attn.export.tflite.translation_file`); the `seq2seq` training task decodes its dev and
test sets with the same `Translator`.
"""

import functools
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_attn.errors import KerasAttnError
from keras_attn.models.attention_rnn_seq2seq import AttentionRNNSeq2Seq
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.models.seq2seq_transformer import _embed
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.tokenizer import WordPieceTokenizer

TRANSLATION_TASK = "seq2seq"


class TranslationError(KerasAttnError, ValueError):
    """A run, text or file the translation commands cannot work with (message says why)."""


def is_translation_run(path):
    """Whether `path` is a run directory of the `seq2seq` task."""
    try:
        return RunDirectory(path).task == TRANSLATION_TASK
    except (OSError, ValueError):  # no config.json, or not one (`RunDirectoryError`)
        return False


class Translator:
    """Source texts in, translations out, with one encoder-decoder model.

    Sources become joined word pieces plus `[SEP]` (cut to `max_length`), are sorted by
    length into batches, and each batch is decoded by the model's `beam_search`
    (`greedy_decode` for one beam) inside one `tf.function` whose batch and length
    dimensions are free, so no batch retraces it (a translation file's runtime is called
    from it through `tf.numpy_function`).

    Args:
        model: a `Seq2SeqTransformer`, an `AttentionRNNSeq2Seq` or a `TranslationFile`.
        pieces: the `JoinedWordPieces` of the model's vocabulary.
        max_length: int, source pieces kept (including `[SEP]`).
        max_new_tokens: int, the longest translation in pieces (including `[SEP]`).
        num_beams: int. Defaults to `4`.
        length_penalty: float, the beam score is `log p / L ** length_penalty`.
        use_cache: bool, decode through the key/value cache. Defaults to `True`.
    """

    def __init__(self, model, pieces, max_length, max_new_tokens, num_beams=4,
                 length_penalty=1.0, use_cache=True):
        self.model, self.pieces = model, pieces
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self.num_beams, self.length_penalty, self.use_cache = num_beams, length_penalty, use_cache
        tokenizer = pieces.tokenizer
        self.bos_token_id, self.eos_token_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.generated_tokens = 0  # tokens decoded by `translate_ids` (EOS included)
        spec = tf.TensorSpec([None, None], tf.int32)
        # A partial, not the bound method or a closure: TF counts the traces of one code
        # object over all instances (a partial has none) and warns of retracing when
        # several translators exist (the export's six).
        self._decode = tf.function(functools.partial(Translator._decode_batch, self),
                                   input_signature=[spec, spec])

    @classmethod
    def from_run(cls, run_dir, num_beams=None, **kwargs):
        """The `Translator` of a finished `seq2seq` run (`model.keras`, `vocab.txt`,
        `config.json`, `tokenizer.json`); decoding settings default to the run's
        `train.eval_num_beams` and `train.eval_length_penalty`."""
        run = RunDirectory(run_dir)
        if not is_translation_run(run.path):
            raise TranslationError(f"{run}: not a run directory of task {TRANSLATION_TASK!r} "
                                   "(its config.json names another task, or is missing)")
        for name in ("model.keras", "vocab.txt", "tokenizer.json"):
            if not (run.path / name).is_file():
                raise TranslationError(f"{run.path}: no {name}; the run has not finished training "
                                       "(a run writes model.keras at its end)")
        config = run.recorded_config()
        tokenizer = WordPieceTokenizer(str(run.path / "vocab.txt"),
                                       lowercase=run.tokenizer_settings().lowercase)
        train = config.get("train", {})
        kwargs.setdefault("length_penalty", train.get("eval_length_penalty", 1.0))
        model = keras.saving.load_model(run.path / "model.keras", compile=False)
        if not isinstance(model, (Seq2SeqTransformer, AttentionRNNSeq2Seq)):
            raise TranslationError(
                f"{run.path}: a quantization-aware run; its model.keras is the QAT copy, one "
                "teacher-forced graph without a cache or beam search: translate with its "
                f"export (`keras-attn export {run.path}`, then `keras-attn predict` on it)")
        return cls(model, JoinedWordPieces(tokenizer), config["data"]["max_length"],
                   config["data"]["target_max_length"],
                   num_beams or train.get("eval_num_beams", 4), **kwargs)

    def _decode_batch(self, ids, mask):
        settings = dict(bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
                        pad_token_id=self.pad_token_id, max_new_tokens=self.max_new_tokens,
                        use_cache=self.use_cache)
        if self.num_beams == 1:
            return self.model.greedy_decode(ids, mask, **settings)
        return self.model.beam_search(ids, mask, num_beams=self.num_beams,
                                      length_penalty=self.length_penalty, **settings)[0]

    def source_ids(self, texts):
        """Joined piece ids plus `[SEP]` of each text, cut to `max_length`."""
        return [np.append(ids[: self.max_length - 1], self.eos_token_id).astype("int32")
                for ids in self.pieces.encode(texts)]

    def text(self, ids):
        """The detokenized text of generated ids, up to the first `[SEP]`."""
        ids = [int(i) for i in ids]
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        return self.pieces.decode(ids)

    def translate_ids(self, sources, batch_size=64, progress=None):
        """`(texts, seconds)`: the translation of every source id array, in order, and
        the time spent decoding; `progress(done, total)` after each batch."""
        texts = [None] * len(sources)
        order = np.argsort([len(s) for s in sources], kind="stable")
        seconds = 0.0
        for start in range(0, len(order), batch_size):
            indices = order[start: start + batch_size]
            length = max(len(sources[i]) for i in indices)
            batch = np.full((len(indices), length), self.pad_token_id, "int32")  # (B, S)
            for row, index in enumerate(indices):
                batch[row, : len(sources[index])] = sources[index]
            started = time.perf_counter()
            ids = self._decode(tf.constant(batch), tf.constant(
                (batch != self.pad_token_id).astype("int32"))).numpy()  # (B, N)
            seconds += time.perf_counter() - started
            for row, index in enumerate(indices):
                texts[index] = self.text(ids[row])
                self.generated_tokens += _generated_count(ids[row], self.eos_token_id)
            if progress is not None:
                progress(min(start + batch_size, len(order)), len(order))
        return texts, seconds

    def translate(self, texts, batch_size=64, progress=None):
        """The translation of each text of `texts`."""
        return self.translate_ids(self.source_ids(texts), batch_size, progress)[0]

    def alignment(self, text):
        """The translation of `text` and where its decoder looked: a dict of
        `translation` (str), `source_tokens` (the pieces of `text`, with `[SEP]`),
        `target_tokens` (those of the translation, with `[SEP]`) and `weights`, the
        `(T, S)` cross-attention of the decoder predicting each target piece: the additive
        attention of an `AttentionRNNSeq2Seq`, the last decoder block's heads averaged
        for a `Seq2SeqTransformer`."""
        source = self.source_ids([text])[0]
        generated = self._decode(tf.constant(source[None]),
                                 tf.constant(np.ones((1, len(source)), "int32"))).numpy()[0]
        generated = [int(i) for i in generated]
        target = generated[: generated.index(self.eos_token_id) + 1] \
            if self.eos_token_id in generated else generated
        decoder = np.array([[self.bos_token_id] + target[:-1]], "int32")  # (1, T)
        weights = cross_attention(self.model, source[None], decoder)[0]  # (T, S)
        vocabulary = self.pieces.tokenizer.get_vocabulary()
        return {"translation": self.text(target),
                "source_tokens": [vocabulary[i] for i in source],
                "target_tokens": [vocabulary[i] for i in target],
                "weights": np.asarray(weights)}


def _generated_count(ids, eos_token_id):
    """Tokens a decoding generated: up to its EOS included, or all of them."""
    ids = [int(i) for i in ids]
    return ids.index(eos_token_id) + 1 if eos_token_id in ids else len(ids)


def cross_attention(model, source_ids, decoder_ids):
    """`(B, T, S)` numpy attention of the decoder reading `decoder_ids` `(B, T)` over the
    source `source_ids` `(B, S)` (no padding)."""
    mask = np.ones_like(source_ids, "int32")
    if isinstance(model, AttentionRNNSeq2Seq):
        cache = model.initial_decoding_cache(source_ids, mask, decoder_ids.shape[1])
        return ops.convert_to_numpy(model.alignment(decoder_ids, cache))
    if not isinstance(model, Seq2SeqTransformer):
        raise TranslationError("cross-attention is read from a Seq2SeqTransformer or an "
                               f"AttentionRNNSeq2Seq. Received: {type(model).__name__}")
    encoder_outputs = model.encode(source_ids, mask)  # (B, S, d)
    y = _embed(model.token_embedding, model.get_layer("position_encoding"),
               ops.convert_to_tensor(decoder_ids, "int32"))  # (B, T, d)
    for block in model.decoder_layers:
        y, scores = block(y, encoder_outputs, encoder_padding_mask=mask,
                          return_attention_scores=True, training=False)
    return ops.convert_to_numpy(ops.mean(scores["cross_attention"], axis=1))  # (B, T, S)
