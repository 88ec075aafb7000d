"""Text classification (single texts or pairs) with `BertClassifier`: accuracy."""

import keras
import numpy as np

from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.runs.task_registry import task_spec
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.labelled_examples import encode_texts
from keras_attn.text.labelled_examples import score_texts
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length


class ClassificationTask(BertTask):
    """`[CLS] text [SEP] (pair [SEP])` -> label; metric: accuracy."""

    name = "classification"
    metric = task_spec("classification").metric

    def _reader(self, path):
        data = self.config.data
        return ClassificationReader(path, text_column=data.text_column,
                                    label_column=data.label_column,
                                    text_pair_column=data.text_pair_column, header=data.header)

    def prepare(self):
        data = self.config.data
        reader = self._reader(data.train)
        train = list(reader)
        reader.check_inferred_header(train)
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        self.labels = self.task_labels(lambda: (example.label for example in train))
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: [e.text for e in train] + [e.text_pair for e in train
                                                               if e.text_pair]),
            lowercase=self.lowercase, sequence_length=data.max_length,
        )
        self.train_examples = self.encode(train, data.train)
        self.dev_examples = self.encode(list(self._reader(data.dev)), data.dev) if data.dev \
            else None
        self.test_examples = self.encode(list(self._reader(data.test)), data.test) \
            if data.test else None
        self.log(f"{len(self.train_examples):,} training examples, {len(self.labels)} labels "
                 f"{list(self.labels.labels)}, vocabulary {self.tokenizer.vocabulary_size():,}")

    def encode(self, examples, path):
        """Examples as dicts of `token_ids`, `segment_ids` (unpadded) and `label`."""
        return encode_texts(examples, self.tokenizer, self.labels, path, self.log)

    def build_model(self):
        trained = self.trained_model((BertClassifier, XLNetClassifier), len(self.labels),
                                     "classification")
        if trained is not None:
            return trained
        backbone = self.backbone(self.tokenizer.vocabulary_size())
        if isinstance(backbone, XLNetBackbone):  # the encoder of a permutation_lm run
            return XLNetClassifier(backbone, num_classes=len(self.labels),
                                   dropout=self.config.model.dropout)
        return BertClassifier(backbone, num_classes=len(self.labels),
                              dropout=self.config.model.dropout)

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def collate(self, examples):
        length = padded_length([len(e["token_ids"]) for e in examples],
                               self.config.data.max_length)
        x = self.bert_inputs([e["token_ids"] for e in examples], length)
        x["segment_ids"] = pad_stack([e["segment_ids"] for e in examples], length, 0)
        y = np.array([e["label"] for e in examples], dtype="int32")
        return x, y, np.ones(len(examples), dtype="float32")

    def evaluate(self, predict, examples, batch_size):
        return self.score(examples, self.predict_outputs(predict, examples, batch_size))

    def score(self, examples, outputs):
        """Accuracy and mean cross-entropy of per-example `(C,)` logits."""
        return score_texts(examples, outputs)
