"""Masked-language-model pretraining (optionally with next-sentence prediction) of a BERT
encoder: perplexity of the masked tokens."""

import math
import pathlib

import numpy as np

from keras_attn.models.bert_masked_lm import BertMaskedLM
from keras_attn.models.bert_pretrainer import BertPretrainer
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.runs.config_schema import ConfigError
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.pretraining_data import NextSentencePairs
from keras_attn.text.raw_text_reader import RawTextReader
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length

ENCODE_CHUNK = 2048
IGNORE_LABEL = -100
MASK_TOKEN_RATE = 0.8
RANDOM_TOKEN_RATE = 0.1
# Seeds of the static masks: (train.seed, split, example index[, copy]).
SPLITS = {"train": 0, "dev": 1, "test": 2}
# Files read as tables of texts (`ClassificationReader`) rather than as a raw-text corpus.
TABULAR_SUFFIXES = (".tsv", ".csv", ".jsonl")


def mask_tokens(token_ids, rng, mask_rate, max_predictions, mask_token_id, unselectable,
                random_pool):
    """BERT's masking of one sequence in numpy (Devlin et al., 2019, §3.1, appendix A.1).

    `n` = tokens not in `unselectable`; `k = min(max_predictions, max(1, round(mask_rate n)))`
    of them are drawn without replacement (Python's half-to-even `round`, as
    `create_pretraining_data.py`); each becomes `[MASK]` with probability 0.8, a token of
    `random_pool` with probability 0.1, and stays itself with probability 0.1.

    Returns:
        `(corrupted_ids, positions, original_ids)`; `positions` increasing, int32.

    Example:
    >>> ids = np.array([2, 10, 11, 12, 13, 14, 15, 16, 3])  # [CLS] 7 tokens [SEP]
    >>> corrupted, positions, original = mask_tokens(
    ...     ids, np.random.default_rng(0), 0.3, 20, mask_token_id=4,
    ...     unselectable=[0, 2, 3], random_pool=np.arange(10, 17))
    >>> len(positions), bool((original == ids[positions]).all())  # round(0.3 * 7) = 2
    (2, True)
    >>> bool((np.delete(corrupted, positions) == np.delete(ids, positions)).all())
    True
    """
    token_ids = np.asarray(token_ids, "int32")
    candidates = np.flatnonzero(~np.isin(token_ids, unselectable))
    if len(candidates) == 0:
        empty = np.zeros(0, "int32")
        return token_ids.copy(), empty, empty
    count = min(max_predictions, max(1, int(round(len(candidates) * mask_rate))))
    positions = np.sort(rng.choice(candidates, size=count, replace=False)).astype("int32")
    action = rng.random(count)
    replacement = random_pool[rng.integers(0, len(random_pool), size=count)]
    corrupted = token_ids.copy()
    original = token_ids[positions]
    corrupted[positions] = np.where(
        action < MASK_TOKEN_RATE, mask_token_id,
        np.where(action < MASK_TOKEN_RATE + RANDOM_TOKEN_RATE, replacement, original),
    )
    return corrupted, positions, original


class MaskedLMTask(BertTask):
    """BERT pretraining on raw text; metric: masked-token perplexity
    `exp(mean over masked slots of -log p(original token))`, lower is better; also the
    masked-token accuracy (and next-sentence accuracy with NSP).

    Data: one sentence per line, a blank line between documents (`RawTextReader`); or a
    `.tsv`/`.csv`/`.jsonl` table whose `data.text_column` (and `data.text_pair_column`)
    holds the texts, each row one document (labels are ignored): the training texts of a
    classification task, to pretrain on them before fine-tuning.
    Without `data.next_sentence_prediction`, consecutive sentences of a document are
    packed into `[CLS] ... [SEP]` examples of at most `data.max_length` tokens (a longer
    sentence is cut and counted) and the model is `BertMaskedLM`, trained with
    `MaskedSparseCategoricalCrossentropy(reduction="sum")` and raw weight 1 per masked
    slot, i.e. the mean cross-entropy over the masked tokens of the global batch. With
    it, every sentence with a successor becomes a `[CLS] A [SEP] B [SEP]` pair
    (`NextSentencePairs`, seeded with `train.seed`: B is the true next sentence or, half
    of the time, a random sentence of another document) and the model is
    `BertPretrainer`, whose built-in loss is `L_MLM + L_NSP` (per micro-batch means).

    Masking is static, as in BERT's original data generation with `dupe_factor=1`: every
    example is masked once, when it is encoded, with `numpy.random.default_rng([train.seed,
    split, index])` (`mask_tokens`). An example's masks therefore depend only on the seed
    and its position in the file, not on the batch it lands in or on the epoch, which is
    what makes a resumed run identical to an uninterrupted one, and the dev masks are the
    same after every epoch, so dev perplexities are comparable. `data.dupe_factor = k`
    (BERT's `--dupe_factor`) masks every training sequence k times with different masks
    (copy `c > 0` seeded with `[train.seed, 0, index, c]`), so that several epochs over a
    small corpus do not see the same masks; dev and test are masked once. `P =
    ceil(data.mask_rate * data.max_length)` prediction slots per example (20 for BERT's
    0.15 x 128).
    """

    name = "mlm"
    metric = "perplexity"
    higher_is_better = False

    def prepare(self):
        data = self.config.data
        if not 0 < data.mask_rate < 1:
            raise ConfigError("`data.mask_rate` must be in (0, 1) (BERT: 0.15). Received: "
                              f"data.mask_rate={data.mask_rate}", self.config.source)
        self.nsp = data.next_sentence_prediction
        documents = self.documents(data.train)
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: [s for sentences in documents for s in sentences]),
            lowercase=self.lowercase, sequence_length=data.max_length,
        )
        vocabulary = self.tokenizer.get_vocabulary()
        self.max_predictions = max(1, math.ceil(data.mask_rate * data.max_length))
        self.unselectable = np.array([self.tokenizer.cls_token_id, self.tokenizer.sep_token_id,
                                      self.tokenizer.pad_token_id], "int32")
        self.random_pool = np.array(
            [i for i, t in enumerate(vocabulary) if not (t.startswith("[") and t.endswith("]"))],
            "int32")
        self.train_examples = self.encode(data.train, "train")
        if data.max_train_examples:
            self.train_examples = self.train_examples[: data.max_train_examples]
        self.dev_examples = self.encode(data.dev, "dev") if data.dev else None
        self.test_examples = self.encode(data.test, "test") if data.test else None
        self.log(f"{len(self.train_examples):,} training "
                 f"{'sentence pairs' if self.nsp else 'sequences'}, vocabulary "
                 f"{len(vocabulary):,}, {self.max_predictions} mask slots per sequence"
                 + (f"; {self._truncated} cut to data.max_length={data.max_length}"
                    if self._truncated else ""))

    def documents(self, path):
        """The documents (lists of sentences) of `path`: a raw-text corpus, or the rows of a
        table of texts (`TABULAR_SUFFIXES`), each row a document of its text (and pair)."""
        if pathlib.Path(path).suffix.lower() not in TABULAR_SUFFIXES:
            return [d.sentences for d in RawTextReader(path)]
        data = self.config.data
        reader = ClassificationReader(path, text_column=data.text_column, label_column=None,
                                      text_pair_column=data.text_pair_column,
                                      header=data.header)
        documents = [[e.text] + ([e.text_pair] if e.text_pair else []) for e in reader]
        if not documents:
            raise ConfigError(f"{path} holds no texts (column {data.text_column!r})",
                              self.config.source)
        return documents

    def _packed_sequences(self, path):
        """`(token_ids, segment_ids)` of sentences packed per document (no NSP)."""
        budget = self.config.data.max_length - 2
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        documents = self.documents(path)
        sentences = [s for sentences in documents for s in sentences]
        pieces = []
        for start in range(0, len(sentences), ENCODE_CHUNK):
            pieces += self.tokenizer.tokenize(sentences[start: start + ENCODE_CHUNK]).to_list()
        sequences = []
        position = 0
        for document in documents:
            current = []
            for ids in pieces[position: position + len(document)]:
                if len(ids) > budget:
                    self._truncated += 1
                    ids = ids[:budget]
                if current and len(current) + len(ids) > budget:
                    sequences.append(current)
                    current = []
                current = current + ids
            position += len(document)
            if current:
                sequences.append(current)
        for ids in sequences:
            token_ids = np.asarray([cls] + ids + [sep], "int32")
            yield token_ids, np.zeros_like(token_ids), None

    def _sentence_pairs(self, path):
        """`(token_ids, segment_ids, next_sentence_label)` of NSP pairs."""
        pairs = list(NextSentencePairs(self.documents(path), seed=self.config.train.seed))
        for start in range(0, len(pairs), ENCODE_CHUNK):
            chunk = pairs[start: start + ENCODE_CHUNK]
            out = self.tokenizer([p["text"] for p in chunk], [p["text_pair"] for p in chunk],
                                 return_num_truncated=True)
            lengths = out["padding_mask"].numpy().sum(axis=1)
            token_ids, segment_ids = out["token_ids"].numpy(), out["segment_ids"].numpy()
            self._truncated += int((out["num_truncated"].numpy() > 0).sum())
            for row, pair in enumerate(chunk):
                n = lengths[row]
                yield token_ids[row, :n], segment_ids[row, :n], pair["next_sentence_label"]

    def encode(self, path, split):
        """Masked examples: dicts of `token_ids` (corrupted), `segment_ids`,
        `mask_positions`, `mask_ids`, `index` (and `next_sentence_label` with NSP);
        `data.dupe_factor` masked copies of every sequence for the training split."""
        self._truncated = 0
        sequences = list(self._sentence_pairs(path) if self.nsp
                         else self._packed_sequences(path))
        seed = self.config.train.seed
        copies = self.config.data.dupe_factor if split == "train" else 1
        encoded = []
        for copy, (index, (token_ids, segment_ids, label)) in (
                (c, item) for c in range(copies) for item in enumerate(sequences)):
            key = [seed, SPLITS[split], index] + ([copy] if copy else [])
            rng = np.random.default_rng(key)
            corrupted, positions, original = mask_tokens(
                token_ids, rng, self.config.data.mask_rate, self.max_predictions,
                self.tokenizer.mask_token_id, self.unselectable, self.random_pool)
            example = {"token_ids": corrupted, "segment_ids": np.asarray(segment_ids, "int32"),
                       "mask_positions": positions, "mask_ids": original, "index": index}
            if label is not None:
                example["next_sentence_label"] = int(label)
            encoded.append(example)
        return encoded

    def build_model(self):
        model_class = BertPretrainer if self.nsp else BertMaskedLM
        flag = str(self.nsp).lower()  # as the YAML config spells it
        trained = self.trained_model(  # an mlm run continued (more steps, more text)
            model_class, None, None,
            hint=f"data.next_sentence_prediction: {flag} asks for that model; set it to "
                 f"{str(not self.nsp).lower()} to continue this run")
        if trained is not None:
            return trained
        backbone = self.backbone(self.tokenizer.vocabulary_size())
        return model_class(backbone)

    def loss(self):
        if self.nsp:
            return None  # BertPretrainer's own compute_loss: L_MLM + L_NSP
        return MaskedSparseCategoricalCrossentropy(ignore_class=IGNORE_LABEL, reduction="sum")

    def collate(self, examples):
        length = padded_length([len(e["token_ids"]) for e in examples],
                               self.config.data.max_length)
        x = self.bert_inputs([e["token_ids"] for e in examples], length)
        x["segment_ids"] = pad_stack([e["segment_ids"] for e in examples], length, 0)
        # A fixed number of slots keeps one (B, P) shape for the compiled step.
        x["mask_positions"] = pad_stack([e["mask_positions"] for e in examples],
                                        self.max_predictions, 0)  # (B, P)
        labels = pad_stack([e["mask_ids"] for e in examples], self.max_predictions,
                           IGNORE_LABEL)  # (B, P)
        weights = (labels != IGNORE_LABEL).astype("float32")  # (B, P)
        if not self.nsp:
            return x, labels, weights
        y = {"mask_ids": np.where(labels == IGNORE_LABEL, 0, labels).astype("int32"),
             "mask_weights": weights,
             "next_sentence_labels": np.array([e["next_sentence_label"] for e in examples],
                                              "int32")}
        # One weight per loss term: the stream normalizes each over the global batch.
        return x, y, {"mlm": weights, "nsp": np.ones(len(examples), "float32")}

    def evaluate(self, predict, examples, batch_size):
        total_nll, correct, count = 0.0, 0, 0
        nsp_correct = 0
        for indices, x in self.eval_batches(examples, batch_size):
            batch = [examples[i] for i in indices]
            outputs = predict(x)
            logits = outputs["mlm_logits"] if self.nsp else outputs  # (B, P, V)
            labels = pad_stack([e["mask_ids"] for e in batch], self.max_predictions,
                               IGNORE_LABEL)  # (B, P)
            kept = labels != IGNORE_LABEL
            safe = np.where(kept, labels, 0)
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            nll = -np.take_along_axis(log_probs, safe[..., None], axis=-1)[..., 0]  # (B, P)
            total_nll += float(nll[kept].sum())
            correct += int((logits.argmax(-1) == labels)[kept].sum())
            count += int(kept.sum())
            if self.nsp:
                nsp_labels = np.array([e["next_sentence_label"] for e in batch])
                nsp_correct += int((outputs["nsp_logits"].argmax(-1) == nsp_labels).sum())
        mean_nll = total_nll / count
        scores = {"perplexity": float(np.exp(mean_nll)), "loss": mean_nll,
                  "masked_accuracy": correct / count, "masked_tokens": count,
                  "sequences": len(examples)}
        if self.nsp:
            scores["next_sentence_accuracy"] = nsp_correct / len(examples)
        return scores
