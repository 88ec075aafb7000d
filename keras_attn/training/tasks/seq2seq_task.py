"""Sequence-to-sequence training (`Seq2SeqTransformer`, `AttentionRNNSeq2Seq`) on aligned
line files or `source<TAB>target` TSV: sacreBLEU of batched beam search through the cache."""

import numpy as np
import sacrebleu

from keras_attn.layers.validation import check_int
from keras_attn.models.attention_rnn_seq2seq import ATTENTION_RNN_PRESETS
from keras_attn.models.attention_rnn_seq2seq import AttentionRNNSeq2Seq
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.runs.config_schema import ConfigError
from keras_attn.text.errors import DataError
from keras_attn.text.joined_word_pieces import JOINER_TOKEN
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.parallel_corpus import Pair
from keras_attn.text.parallel_corpus import read_parallel_files
from keras_attn.text.text_lines import read_lines
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import DEFAULT_RESERVED_TOKENS
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length
from keras_attn.translation import Translator
from keras_attn.translation_qat import CALIBRATION_SOURCES
from keras_attn.translation_qat import QATTranslation

# sacreBLEU's default corpus BLEU (13a tokenization, cased): the field's reported number.
SACREBLEU = sacrebleu.metrics.BLEU()


def read_pairs(path, source_column=0, target_column=1):
    """`Pair(source, target, line)`s of a TSV file; a line with too few columns or an
    empty source/target raises a `DataError` naming `path:line`. Blank lines are skipped.

    Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "pairs.tsv"
    >>> _ = path.write_text("one two\\teins zwei\\nthree\\n", encoding="utf-8")
    >>> read_pairs(path)
    Traceback (most recent call last):
    ...
    keras_attn.text.errors.DataError: ...pairs.tsv:2: 1 tab-separated column(s), ...
    """
    for name, value in (("data.text_column", source_column),
                        ("data.target_column", target_column)):
        check_int(name, value, meaning="seq2seq reads TSV columns by index")
    pairs = []
    for number, line in read_lines(path):
        if not line.strip():
            continue
        columns = line.split("\t")
        try:
            source, target = columns[source_column].strip(), columns[target_column].strip()
        except IndexError:
            raise DataError(path, number, f"{len(columns)} tab-separated column(s), but "
                            f"data.text_column={source_column} and data.target_column="
                            f"{target_column} need more; write `source<TAB>target`.") from None
        for what, text in (("source", source), ("target", target)):
            if not text:
                raise DataError(path, number, f"empty {what} text; every line needs a "
                                              "non-empty source and target.")
        pairs.append(Pair(source, target, number))
    if not pairs:
        raise DataError(path, 1, "no `source<TAB>target` lines in the file.")
    return pairs


def read_split_pairs(data, path, log=None):
    """The `Pair`s of one split of a seq2seq config's `data`: `path` is a TSV file
    (`read_pairs` with `data.text_column`, `data.target_column`) or two aligned line files
    `{source, target}` (`read_parallel_files`; lines blank on both sides skipped, noted
    through `log`)."""
    if not isinstance(path, dict):
        return read_pairs(path, data.text_column, data.target_column)
    pairs, blank = read_parallel_files(path["source"], path["target"])
    if blank and log is not None:
        log(f"{path['source']}, {path['target']}: skipped {len(blank)} line(s) blank on both "
            f"sides (first: line {blank[0]})")
    return pairs


class Seq2SeqTask(BertTask):
    """`source -> target` with an encoder-decoder model; metric: sacreBLEU (0-100) of
    beam search, higher is better.

    Data: `data.train` (`dev`, `test`) is a `source<TAB>target` TSV file or two aligned
    line files `{source: train.de, target: train.en}` (`read_parallel_files`: every
    misalignment is a `file:line` error).

    Source and target share one WordPiece vocabulary learned from both sides of the
    training data (or `model.vocabulary`), as the paper's shared BPE vocabulary (Vaswani
    et al., 2017, §5.1), with a `[JOIN]` token that makes the pieces reversible
    (`JoinedWordPieces`): the output detokenizes to raw text. The source is its pieces
    followed by `[SEP]` (at most `data.max_length` ids); the target is its pieces
    followed by `[SEP]`, the end token (at most `data.target_max_length`); the decoder
    starts from `[CLS]`, the BOS token. Training is teacher-forced next-token
    cross-entropy with `train.label_smoothing`. `model.preset` picks the model: a
    `Seq2SeqTransformer` preset or an `AttentionRNNSeq2Seq` one (`attention_rnn_*`).

    Evaluation decodes every batch with `model.beam_search` (`train.eval_num_beams`
    beams, `train.eval_length_penalty`; 1 beam: `greedy_decode`) through the key/value
    cache, in one `tf.function`, detokenizes and scores sacreBLEU against the raw
    reference lines (cased, 13a), reporting its signature; also teacher-forced
    perplexity, token accuracy and decoding sentences/s.

    `model.checkpoint: <a seq2seq run of a Seq2SeqTransformer>` continues that run (its
    vocabulary and lower-casing); with `model.quantization_aware: true` the trainer
    trains its `quantize_model` copy, which has no `beam_search`: evaluation decodes it
    through `QATTranslation` (the float model's translation graphs quantized, holding the
    QAT weights as they are at each evaluation).
    """

    name = "seq2seq"
    metric = "bleu"
    higher_is_better = True
    reserved_tokens = DEFAULT_RESERVED_TOKENS + (JOINER_TOKEN,)

    def prepare(self):
        data = self.config.data
        train = self._read(data.train)
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: [p.source for p in train] + [p.target for p in train]),
            lowercase=self.lowercase, sequence_length=data.max_length,
        )
        self.pieces = JoinedWordPieces(self.tokenizer)
        self.bos_token_id = self.tokenizer.cls_token_id
        self.eos_token_id = self.tokenizer.sep_token_id
        self.model = self.float_model = self._qat_translation = None
        self._translators = {}
        self.train_examples = self.encode(train)
        self.dev_examples = self.encode(self._read(data.dev)) if data.dev else None
        self.test_examples = self.encode(self._read(data.test)) if data.test else None
        self.log(f"{len(self.train_examples):,} training pairs, vocabulary "
                 f"{self.tokenizer.vocabulary_size():,}"
                 + (f"; truncated: {self._truncated} sources/targets (data.max_length="
                    f"{data.max_length}, data.target_max_length={data.target_max_length})"
                    if self._truncated else ""))

    def _read(self, path):
        return read_split_pairs(self.config.data, path, self.log)

    def _ids(self, texts, limit):
        """Joined piece ids of each text plus `[SEP]`, cut to `limit` (`[SEP]` kept)."""
        out = []
        for ids in self.pieces.encode(texts):
            self._truncated += len(ids) > limit - 1
            out.append(np.append(ids[: limit - 1], self.eos_token_id).astype("int32"))
        return out

    def encode(self, pairs):
        """Pairs as dicts of `source_ids`, `target_ids` (both ending in `[SEP]`) and the
        raw `reference` text."""
        self._truncated = 0
        data = self.config.data
        sources = self._ids([p.source for p in pairs], data.max_length)
        targets = self._ids([p.target for p in pairs], data.target_max_length)
        return [{"source_ids": s, "target_ids": t, "reference": p.target}
                for s, t, p in zip(sources, targets, pairs)]

    def lengths(self, examples):
        return [len(e["source_ids"]) + len(e["target_ids"]) for e in examples]

    def build_model(self):
        """A new model of `model.preset`, or the model of the run `model.checkpoint` names,
        continued (a float `Seq2SeqTransformer`, or a quantization-aware run's QAT copy).
        `self.float_model` is the float `Seq2SeqTransformer` whose translation graphs
        decode a QAT copy (`translator`)."""
        model = self.config.model
        trained = self._continued_model()
        if trained is not None:
            self.model = trained
        elif model.preset in ATTENTION_RNN_PRESETS:
            if model.quantization_aware:
                raise ConfigError(
                    f"model.preset={model.preset} is an attention RNN: quantization-aware "
                    "training and the int8 translation files are for Seq2SeqTransformer "
                    "presets (transformer_*); set model.quantization_aware: false",
                    self.config.source)
            self.model = AttentionRNNSeq2Seq.from_preset(model.preset, **self._overrides())
        else:
            self.model = Seq2SeqTransformer.from_preset(model.preset, **self._overrides())
        self.float_model = self.model if not activation_quantizers(self.model) else \
            _float_model_of(self.trained_run(), self.config.source)
        return self.model

    def quantization_aware_copy(self, model, layout, count):
        """The trainer's QAT copy of the float model, kept as `self.model`: what the
        evaluation decodes (`translator`)."""
        self.model = super().quantization_aware_copy(model, layout, count)
        return self.model

    def _overrides(self):
        model = self.config.model
        return {"vocabulary_size": self.tokenizer.vocabulary_size(), "dropout": model.dropout,
                **model.overrides}

    def _continued_model(self):
        """The model of the seq2seq run `model.checkpoint` names (`None`: no such run): a
        `Seq2SeqTransformer`, or the QAT copy of one when `model.quantization_aware` is set;
        its output rows must be this run's vocabulary (the run's own)."""
        run, source = self.trained_run(), self.config.source
        if run is None:
            return None
        model = run.load_model()
        quantized = bool(activation_quantizers(model))
        if not quantized and not isinstance(model, Seq2SeqTransformer):
            raise ConfigError(
                f"model.checkpoint={run.path} holds a {type(model).__name__}: seq2seq continues "
                "Seq2SeqTransformer runs only (quantization-aware training and the int8 "
                "translation files need its encoder and decoding-step graphs); train the "
                "attention RNN from model.preset instead", source)
        if quantized and not self.config.model.quantization_aware:
            raise ConfigError(
                f"model.checkpoint={run.path} is a quantization-aware run: set "
                "model.quantization_aware: true to continue it (or continue its float run)",
                source)
        rows = model.output.shape[-1]  # (B, T, V) logits
        if rows != self.tokenizer.vocabulary_size():
            raise ConfigError(
                f"model.checkpoint={run.path}: its model has {rows} vocabulary rows, this "
                f"run's tokenizer {self.tokenizer.vocabulary_size()} (the run's vocab.txt "
                "was changed)", source)
        self.log(f"continuing from the trained model {run.path / 'model.keras'}")
        return model

    def loss(self):
        return MaskedSparseCategoricalCrossentropy(
            ignore_class=self.tokenizer.pad_token_id, reduction="sum",
            label_smoothing=self.config.train.label_smoothing)

    def collate(self, examples):
        data = self.config.data
        pad = self.tokenizer.pad_token_id
        source_length = padded_length([len(e["source_ids"]) for e in examples],
                                      data.max_length)
        target_length = padded_length([len(e["target_ids"]) for e in examples],
                                      data.target_max_length)
        source = pad_stack([e["source_ids"] for e in examples], source_length, pad)  # (B, S)
        labels = pad_stack([e["target_ids"] for e in examples], target_length, pad)  # (B, T)
        # Teacher forcing: the decoder reads BOS and the target shifted right.
        decoder = np.concatenate(
            [np.full((len(examples), 1), self.bos_token_id, "int32"), labels[:, :-1]], axis=1
        )  # (B, T)
        x = {"encoder_token_ids": source,
             "encoder_padding_mask": (source != pad).astype("int32"),
             "decoder_token_ids": decoder,
             "decoder_padding_mask": (labels != pad).astype("int32")}
        return x, labels, (labels != pad).astype("float32")

    def translator(self, **decoding):
        """The `Translator` of the task's model (`decoding`: its `num_beams`,
        `length_penalty`, `use_cache`; the beams and penalty default to
        `train.eval_num_beams` and `train.eval_length_penalty`), one per setting."""
        train, data = self.config.train, self.config.data
        decoding = {"num_beams": train.eval_num_beams,
                    "length_penalty": train.eval_length_penalty, **decoding}
        key = tuple(sorted(decoding.items()))
        if key not in self._translators:
            self._translators[key] = Translator(self._decoded_model(), self.pieces,
                                                data.max_length, data.target_max_length,
                                                **decoding)
        if self._qat_translation is not None:
            self._qat_translation.refresh()  # the QAT model's weights as they are now
        return self._translators[key]

    def _decoded_model(self):
        """The model the `Translator` decodes: the task's model, or for its QAT copy (a
        quantization-aware run: `quantization_aware_copy`, or a QAT run continued) the
        `QATTranslation` over the float model's quantized translation graphs, calibrated
        once."""
        if not activation_quantizers(self.model):
            return self.model
        if self._qat_translation is None:
            sources = [e["source_ids"] for e in self.calibration_sample(CALIBRATION_SOURCES)]
            self._qat_translation = QATTranslation(
                self.model, self.float_model, sources, self.tokenizer,
                1 + self.config.data.target_max_length)
            self.log("decoding the QAT model through its quantized translation graphs "
                     f"(calibrated on {len(sources)} training sources; ranges calibrated "
                     f"only: {', '.join(self._qat_translation.calibrated_only)})")
        return self._qat_translation

    def evaluate(self, predict, examples, batch_size):
        total_nll, correct, count = 0.0, 0, 0
        for indices, x in self.eval_batches(examples, batch_size):
            _, labels, weights = self.collate([examples[i] for i in indices])
            logits = predict(x)  # (B, T, V)
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
            total_nll += float((nll * weights).sum())
            correct += int(((logits.argmax(-1) == labels) * weights).sum())
            count += int(weights.sum())
        hypotheses, seconds = self.translator().translate_ids(
            [e["source_ids"] for e in examples], batch_size)
        score = SACREBLEU.corpus_score(hypotheses, [[e["reference"] for e in examples]])
        mean_nll = total_nll / count
        return {"bleu": score.score, "bleu_signature": str(SACREBLEU.get_signature()),
                "bleu_precisions": list(score.precisions), "brevity_penalty": score.bp,
                "perplexity": float(np.exp(mean_nll)), "loss": mean_nll,
                "token_accuracy": correct / count, "pairs": len(examples),
                "decoding_sentences_per_second": round(len(examples) / seconds, 2),
                "examples": [{"reference": examples[i]["reference"],
                              "hypothesis": hypotheses[i]} for i in range(min(3, len(examples)))]}


def _float_model_of(run, source):
    """The float `Seq2SeqTransformer` of the quantization-aware run `run`
    (`RunDirectory.float_run`)."""
    origin = run.float_run()
    if origin is None:
        raise ConfigError(
            f"{run.path} is a quantization-aware run whose float run "
            f"({run.lineage().source}) is gone: its translations are decoded through that "
            "Seq2SeqTransformer's graphs; continue a float seq2seq run with "
            "model.quantization_aware: true instead", source)
    model = origin.load_model()
    if not isinstance(model, Seq2SeqTransformer):
        raise ConfigError(f"{origin.path}: holds a {type(model).__name__}, not the "
                          "Seq2SeqTransformer a quantization-aware run continues", source)
    return model
