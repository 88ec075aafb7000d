"""Named-entity recognition with `BertTokenClassifier` (softmax or CRF): strict entity F1."""

import numpy as np

from keras_attn.models.bert_token_classifier import BertTokenClassifier
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_token_classifier import XLNetTokenClassifier
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.conll_reader import ConllReader
from keras_attn.text.labelled_examples import encode_sentences
from keras_attn.text.labelled_examples import score_sentences
from keras_attn.text.ner import IGNORE_LABEL
from keras_attn.text.ner import first_piece_mask
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length


class NerTask(BertTask):
    """CoNLL-format sentences -> one IOB2 tag per word (first-subword labels); metric: strict
    entity F1 (CoNLL-2003 evaluation, equal to seqeval's strict mode)."""

    name = "ner"
    metric = task_spec("ner").metric

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
        return encode_sentences(sentences, self.tokenizer, self.labels, path, self.log)

    def build_model(self):
        trained = self.trained_model((BertTokenClassifier, XLNetTokenClassifier), len(self.labels),
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
        return score_sentences(examples, outputs, self.labels)
