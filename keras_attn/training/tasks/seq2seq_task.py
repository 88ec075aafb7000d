"""Sequence-to-sequence training with `Seq2SeqTransformer` on `source<TAB>target` TSV
files: corpus BLEU of greedy decoding."""

import collections

import numpy as np

from keras_attn.layers.validation import check_int
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.text.errors import DataError
from keras_attn.text.text_lines import read_lines
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.bleu import corpus_bleu
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length

ENCODE_CHUNK = 2048

Pair = collections.namedtuple("Pair", ["source", "target", "line"])


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


class Seq2SeqTask(BertTask):
    """`source -> target` with an encoder-decoder Transformer; metric: corpus BLEU-4 (0-100)
    of greedy decoding, higher is better.

    Source and target share one WordPiece vocabulary (learned from both sides of
    `data.train`, or `model.vocabulary`), as the paper's shared BPE vocabulary (Vaswani et
    al., 2017, §5.1). The source is its pieces followed by `[SEP]` (at most
    `data.max_length` ids); the target is its pieces followed by `[SEP]`, the end token
    (at most `data.target_max_length`); the decoder starts from `[CLS]`, the BOS token.
    Training is teacher-forced next-token cross-entropy with raw weight 1 per target
    token. Evaluation decodes greedily (one full decoder pass per generated token, through
    the trainer's `predict`) until `[SEP]` or `data.target_max_length` tokens, detokenizes
    the word pieces (`##` glued), splits on whitespace and scores corpus BLEU-4 against
    the detokenized reference pieces (so both sides share the tokenizer's normalization);
    it also reports teacher-forced perplexity and token accuracy.
    """

    name = "seq2seq"
    metric = "bleu"
    higher_is_better = True

    def prepare(self):
        data = self.config.data
        train = self._read(data.train)
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: [p.source for p in train] + [p.target for p in train]),
            lowercase=self.config.model.lowercase, sequence_length=data.max_length,
        )
        self.bos_token_id = self.tokenizer.cls_token_id
        self.eos_token_id = self.tokenizer.sep_token_id
        self.train_examples = self.encode(train)
        self.dev_examples = self.encode(self._read(data.dev)) if data.dev else None
        self.test_examples = self.encode(self._read(data.test)) if data.test else None
        self.log(f"{len(self.train_examples):,} training pairs, vocabulary "
                 f"{self.tokenizer.vocabulary_size():,}"
                 + (f"; truncated: {self._truncated} sources/targets (data.max_length="
                    f"{data.max_length}, data.target_max_length={data.target_max_length})"
                    if self._truncated else ""))

    def _read(self, path):
        data = self.config.data
        return read_pairs(path, data.text_column, data.target_column)

    def _pieces(self, texts, limit):
        """Ids of each text plus `[SEP]`, cut to `limit` (the `[SEP]` is kept)."""
        out = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            for ids in self.tokenizer.tokenize(texts[start: start + ENCODE_CHUNK]).to_list():
                self._truncated += len(ids) > limit - 1
                out.append(np.asarray(ids[: limit - 1] + [self.eos_token_id], "int32"))
        return out

    def encode(self, pairs):
        """Pairs as dicts of `source_ids`, `target_ids` (both ending in `[SEP]`)."""
        self._truncated = 0
        data = self.config.data
        sources = self._pieces([p.source for p in pairs], data.max_length)
        targets = self._pieces([p.target for p in pairs], data.target_max_length)
        return [{"source_ids": s, "target_ids": t} for s, t in zip(sources, targets)]

    def lengths(self, examples):
        return [len(e["source_ids"]) + len(e["target_ids"]) for e in examples]

    def build_model(self):
        model = self.config.model
        overrides = {"vocabulary_size": self.tokenizer.vocabulary_size(),
                     "dropout": model.dropout}
        overrides.update(model.overrides)
        return Seq2SeqTransformer.from_preset(model.preset, **overrides)

    def loss(self):
        return MaskedSparseCategoricalCrossentropy(ignore_class=self.tokenizer.pad_token_id,
                                                   reduction="sum")

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

    def greedy_decode(self, predict, x):
        """`(B, <= target_max_length)` greedy ids for the sources of `x`, full decoder
        passes through `predict`; rows that emitted `[SEP]` keep it and stop growing."""
        batch = len(x["encoder_token_ids"])
        generated = np.zeros((batch, 0), "int32")
        finished = np.zeros(batch, bool)
        for _ in range(self.config.data.target_max_length):
            decoder = np.concatenate(
                [np.full((batch, 1), self.bos_token_id, "int32"), generated], axis=1
            )  # (B, t + 1)
            logits = predict({"encoder_token_ids": x["encoder_token_ids"],
                              "encoder_padding_mask": x["encoder_padding_mask"],
                              "decoder_token_ids": decoder,
                              "decoder_padding_mask": np.ones_like(decoder)})  # (B, t+1, V)
            next_ids = logits[:, -1].argmax(-1).astype("int32")  # (B,)
            next_ids = np.where(finished, self.tokenizer.pad_token_id, next_ids)
            generated = np.concatenate([generated, next_ids[:, None]], axis=1)
            finished |= next_ids == self.eos_token_id
            if finished.all():
                break
        return generated

    def words(self, ids):
        """Whitespace tokens of the detokenized pieces before the first `[SEP]`."""
        ids = [int(i) for i in ids]
        if self.eos_token_id in ids:
            ids = ids[: ids.index(self.eos_token_id)]
        ids = [i for i in ids if i != self.tokenizer.pad_token_id]
        if not ids:
            return []
        return self.tokenizer.detokenize([ids]).numpy()[0].decode("utf-8").split()

    def evaluate(self, predict, examples, batch_size):
        hypotheses = [None] * len(examples)
        total_nll, correct, count = 0.0, 0, 0
        for indices, x in self.eval_batches(examples, batch_size):
            _, labels, weights = self.collate([examples[i] for i in indices])
            logits = predict(x)  # (B, T, V)
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
            total_nll += float((nll * weights).sum())
            correct += int(((logits.argmax(-1) == labels) * weights).sum())
            count += int(weights.sum())
            for row, ids in zip(indices, self.greedy_decode(predict, x)):
                hypotheses[row] = self.words(ids)
        references = [self.words(e["target_ids"]) for e in examples]
        score = corpus_bleu(references, hypotheses)
        mean_nll = total_nll / count
        return {"bleu": 100.0 * score.bleu,
                "bleu_precisions": [100.0 * p for p in score.precisions],
                "brevity_penalty": score.brevity_penalty,
                "perplexity": float(np.exp(mean_nll)), "loss": mean_nll,
                "token_accuracy": correct / count, "pairs": len(examples)}
