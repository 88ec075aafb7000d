"""Text classification (single texts or pairs) with `BertClassifier`: accuracy."""

import keras
import numpy as np

from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_classifier import XLNetClassifier
from keras_attn.text.classification_reader import ClassificationReader
from keras_attn.text.errors import DataError
from keras_attn.text.errors import character_names
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length

ENCODE_CHUNK = 2048


class ClassificationTask(BertTask):
    """`[CLS] text [SEP] (pair [SEP])` -> label; metric: accuracy."""

    name = "classification"
    metric = "accuracy"

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
        encoded = []
        truncated = 0
        pairs = examples and examples[0].text_pair is not None
        for start in range(0, len(examples), ENCODE_CHUNK):
            chunk = examples[start: start + ENCODE_CHUNK]
            texts = [e.text for e in chunk]
            self._check_texts_have_pieces(chunk, "text", path)
            if pairs:
                self._check_texts_have_pieces(chunk, "text_pair", path)
            out = self.tokenizer(texts, [e.text_pair for e in chunk] if pairs else None,
                                 return_num_truncated=True)
            lengths = out["padding_mask"].numpy().sum(axis=1)
            token_ids, segment_ids = out["token_ids"].numpy(), out["segment_ids"].numpy()
            truncated += int((out["num_truncated"].numpy() > 0).sum())
            for row, example in enumerate(chunk):
                n = lengths[row]
                label = self.labels.id(example.label, path, example.line) \
                    if example.label is not None else -1
                encoded.append({"token_ids": token_ids[row, :n],
                                "segment_ids": segment_ids[row, :n], "label": label})
        if truncated:
            self.log(f"{path}: {truncated} examples cut by max_length="
                     f"{self.config.data.max_length} (their last word pieces are dropped)")
        return encoded

    def _check_texts_have_pieces(self, examples, column, path):
        """A text the tokenizer turns into no word piece (empty, or only whitespace, control
        or format characters such as U+00A0 or U+200B) would be classified from `[CLS]
        [SEP]` alone: a `DataError` at its line."""
        texts = [getattr(e, column) for e in examples]
        counts = self.tokenizer.tokenize(texts).row_lengths().numpy()
        for example, text, count in zip(examples, texts, counts):
            if count == 0:
                raise DataError(
                    path, example.line,
                    f"the {column} {text!r} ({character_names(text)}) yields no word piece: "
                    "it is empty or the tokenizer drops all its characters (whitespace, "
                    "control and format characters), so the example has no text to learn "
                    "from. Write its text, or remove the row")

    def build_model(self):
        trained = self.trained_model(BertClassifier, len(self.labels), "classification")
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
        logits = np.stack(outputs)
        labels = np.array([e["label"] for e in examples])
        predicted = logits.argmax(axis=-1)
        log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        return {
            "accuracy": float((predicted == labels).mean()),
            "loss": float(-log_probs[np.arange(len(labels)), labels].mean()),
            "examples": len(labels),
        }
