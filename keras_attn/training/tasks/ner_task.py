"""Named-entity recognition with `BertTokenClassifier` (softmax or CRF): strict entity F1."""

import numpy as np
import tensorflow as tf

from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_token_classifier import XLNetTokenClassifier
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.errors import DataError
from keras_attn.text.errors import character_names
from keras_attn.text.ner import IGNORE_LABEL
from keras_attn.text.ner import align_word_labels
from keras_attn.text.ner import decode_word_labels
from keras_attn.text.ner import entity_scores
from keras_attn.text.ner import first_piece_mask
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.config import ConfigError
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length

ENCODE_CHUNK = 1024


class NerTask(BertTask):
    """CoNLL-format sentences -> one IOB2 tag per word (first-subword labels); metric: strict
    entity F1 (CoNLL-2003 evaluation, equal to seqeval's strict mode)."""

    name = "ner"
    metric = "f1"

    def prepare(self):
        data = self.config.data
        train = list(ConllReader(data.train))
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        if not train:
            raise ValueError(f"{data.train}: no sentences")
        self.labels = self.task_labels(lambda: (tag for sentence in train
                                                for tag in sentence.tags))
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: [" ".join(s.tokens) for s in train]),
            lowercase=self.lowercase, sequence_length=data.max_length,
        )
        self.train_examples = self.encode(train, data.train)
        self.dev_examples = self.encode(list(ConllReader(data.dev)), data.dev) if data.dev \
            else None
        self.test_examples = self.encode(list(ConllReader(data.test)), data.test) \
            if data.test else None
        self.log(f"{len(self.train_examples):,} training sentences, {len(self.labels)} tags, "
                 f"vocabulary {self.tokenizer.vocabulary_size():,}")

    def encode(self, sentences, path):
        """Sentences as dicts of `token_ids`, `labels`, `word_ids` and the gold `tags`."""
        encoded = []
        truncated_words = 0
        tokenizer = self.tokenizer
        for start in range(0, len(sentences), ENCODE_CHUNK):
            chunk = sentences[start: start + ENCODE_CHUNK]
            # A sentence's words are on consecutive lines from `s.line`.
            label_ids = [[self.labels.id(tag, path, s.line + offset)
                          for offset, tag in enumerate(s.tags)] for s in chunk]
            pieces = tokenizer.tokenize_words([list(s.tokens) for s in chunk])
            _check_words_have_pieces(chunk, pieces.row_lengths(axis=2).to_list(), path)
            out = align_word_labels(
                pieces, tf.ragged.constant(label_ids, dtype=tf.int32),
                cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                sequence_length=self.config.data.max_length,
            )
            truncated_words += int(out["num_truncated_words"].numpy().sum())
            token_ids = out["token_ids"].to_list()
            labels = out["labels"].to_list()
            word_ids = out["word_ids"].to_list()
            for row, sentence in enumerate(chunk):
                encoded.append({
                    "token_ids": np.asarray(token_ids[row], "int32"),
                    "labels": np.asarray(labels[row], "int32"),
                    "word_ids": np.asarray(word_ids[row], "int32"),
                    "tags": list(sentence.tags),
                })
        if truncated_words:
            self.log(f"{path}: {truncated_words} words cut by max_length="
                     f"{self.config.data.max_length} (they count as 'O' predictions)")
        return encoded

    def build_model(self):
        trained = self.trained_model(BertTokenClassifier, len(self.labels),
                                     "token_classification", use_crf=self.config.model.use_crf)
        if trained is not None:
            return trained
        backbone = self.backbone(self.tokenizer.vocabulary_size())
        if isinstance(backbone, XLNetBackbone):  # the encoder of a permutation_lm run
            if self.config.model.use_crf:
                raise ConfigError("XLNetTokenClassifier has no CRF: set model.use_crf: false "
                                  "to fine-tune a permutation_lm run. Received: "
                                  "model.use_crf=true", self.config.source)
            return XLNetTokenClassifier(backbone, num_classes=len(self.labels),
                                        dropout=self.config.model.dropout)
        return BertTokenClassifier(backbone, num_labels=len(self.labels),
                                   dropout=self.config.model.dropout,
                                   use_crf=self.config.model.use_crf)

    def loss(self):
        if self.config.model.use_crf:
            return None  # the CRF model's own compute_loss (sequence NLL)
        return MaskedSparseCategoricalCrossentropy(reduction="sum")

    def collate(self, examples):
        length = padded_length([len(e["token_ids"]) for e in examples],
                               self.config.data.max_length)
        x = self.bert_inputs([e["token_ids"] for e in examples], length)
        labels = pad_stack([e["labels"] for e in examples], length, IGNORE_LABEL)
        # The first piece of each word is where its tag is predicted (labels are not known
        # at inference, so this comes from the word ids).
        word_ids = pad_stack([e["word_ids"][:length] for e in examples], length, -1)
        first_piece = first_piece_mask(word_ids).astype(labels.dtype)
        if self.config.model.use_crf:
            x["label_mask"] = first_piece
            weights = np.ones(len(examples), "float32")  # per sentence: the CRF NLL
        else:
            weights = (labels != IGNORE_LABEL).astype("float32")
        return x, labels, weights

    def evaluate(self, predict, examples, batch_size):
        return self.score(examples, self.predict_outputs(predict, examples, batch_size))

    def score(self, examples, outputs):
        """Strict entity F1 of per-example outputs: `(S, C)` logits (first-subword argmax)
        or, from a CRF model, dicts with the Viterbi `tags`."""
        gold, predicted = [], []
        filled = 0
        for example, output in zip(examples, outputs):
            scores = output["tags"] if isinstance(output, dict) else output
            n = len(example["token_ids"])
            tags, num_filled = decode_word_labels(
                np.asarray(scores)[None, :n], example["word_ids"][None], [len(example["tags"])],
                self.labels,
            )
            filled += num_filled
            gold.append(example["tags"])
            predicted.append(tags[0])
        scores = entity_scores(gold, predicted)
        return {
            "f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"],
            "sentences": len(examples), "words_without_prediction": filled,
            "per_type_f1": {k: v["f1"] for k, v in scores["per_type"].items()},
        }


def _check_words_have_pieces(sentences, piece_counts, path):
    """A token the tokenizer turns into no word piece (only whitespace, control or format
    characters such as U+00A0 or U+200B) would be tagged without the model seeing it: a
    `DataError` at its line."""
    for sentence, counts in zip(sentences, piece_counts):
        for offset, count in enumerate(counts):
            if count == 0:
                token = sentence.tokens[offset]
                raise DataError(
                    path, sentence.line + offset,
                    f"the token {token!r} ({character_names(token)}) yields no word piece: "
                    "the tokenizer drops all its characters (whitespace, control and format "
                    "characters), so the model would never see the word it is tagged for. "
                    "Replace it with the visible text it stands for, or delete the line")
