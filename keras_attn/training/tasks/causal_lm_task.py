"""Causal language modelling with `GPTCausalLM` on packed blocks of text: perplexity."""

import keras
import numpy as np

from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.text.errors import DataError
from keras_attn.text.text_lines import read_lines
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.training.tasks.task import BertTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length

ENCODE_CHUNK = 2048


def read_text_lines(path):
    """The non-blank lines of a text file (stripped), with a `DataError` for a file that
    holds none."""
    lines = [line.strip() for _, line in read_lines(path)]
    lines = [line for line in lines if line]
    if not lines:
        raise DataError(path, 1, "the file holds no text (only blank lines); give one text "
                                 "per line.")
    return lines


class CausalLMTask(BertTask):
    """Next-token prediction on contiguous blocks of text (GPT-2 style packing); metric:
    perplexity `exp(mean_t -log p(x_t | x_<t))`, lower is better.

    Every non-blank line is WordPiece-tokenized and followed by `[SEP]`, the end-of-text
    token (GPT-2's `<|endoftext|>`), so the model learns where a text stops and a block
    may cross text boundaries. The token stream is cut into blocks of `data.max_length`
    inputs: block `i` reads tokens `[i L, (i + 1) L)` and predicts `[i L + 1, (i + 1) L + 1)`
    (nanoGPT's `x, y`); only the last block is shorter. Each predicted token has raw loss
    weight 1, so the loss is the mean next-token cross-entropy of the global batch.

    The vocabulary is learned from `data.train` (or read from `model.vocabulary`); the
    model is `GPTCausalLM` on `GPTBackbone.from_preset(model.preset)` with the tokenizer's
    vocabulary size, `data.max_length` positions and `model.dropout`, then
    `model.overrides`.
    """

    name = "causal_lm"
    metric = "perplexity"
    higher_is_better = False

    def prepare(self):
        data = self.config.data
        texts = read_text_lines(data.train)
        if data.max_train_examples:
            texts = texts[: data.max_train_examples]
        self.tokenizer = WordPieceTokenizer(
            self.vocabulary(lambda: texts), lowercase=self.config.model.lowercase,
            sequence_length=data.max_length,
        )
        self.train_examples = self.encode(texts, data.train)
        self.dev_examples = self.encode(read_text_lines(data.dev), data.dev) if data.dev \
            else None
        self.test_examples = self.encode(read_text_lines(data.test), data.test) \
            if data.test else None
        self.log(f"{len(texts):,} training texts -> {len(self.train_examples):,} blocks of "
                 f"{data.max_length} tokens, vocabulary {self.tokenizer.vocabulary_size():,}")

    def token_stream(self, texts):
        """int32 ids of `texts`, each followed by the end-of-text `[SEP]`."""
        pieces = []
        end = np.array([self.tokenizer.sep_token_id], "int32")
        for start in range(0, len(texts), ENCODE_CHUNK):
            for ids in self.tokenizer.tokenize(texts[start: start + ENCODE_CHUNK]).to_list():
                pieces.append(np.asarray(ids, "int32"))
                pieces.append(end)
        return np.concatenate(pieces)

    def encode(self, texts, path):
        """Blocks as dicts of `token_ids`: `L + 1` ids (the last block may be shorter)."""
        stream = self.token_stream(texts)
        length = self.config.data.max_length
        if len(stream) < 2:
            raise DataError(path, 1, f"{len(stream)} token: a language model needs at least "
                                     "2 tokens (one to read, one to predict).")
        blocks = []
        for start in range(0, len(stream) - 1, length):
            blocks.append({"token_ids": stream[start: start + length + 1]})
        return blocks

    def lengths(self, examples):
        return [len(example["token_ids"]) - 1 for example in examples]

    def build_model(self):
        model = self.config.model
        overrides = {"vocabulary_size": self.tokenizer.vocabulary_size(),
                     "max_sequence_length": self.config.data.max_length,
                     "dropout": model.dropout}
        overrides.update(model.overrides)
        return GPTCausalLM(GPTBackbone.from_preset(model.preset, **overrides))

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def collate(self, examples):
        length = padded_length([len(e["token_ids"]) - 1 for e in examples],
                               self.config.data.max_length)
        inputs = pad_stack([e["token_ids"][:-1] for e in examples], length, 0)  # (B, T)
        labels = pad_stack([e["token_ids"][1:] for e in examples], length, 0)  # (B, T)
        real = np.zeros((len(examples), length), "int32")
        for row, example in enumerate(examples):
            real[row, : len(example["token_ids"]) - 1] = 1
        x = {"token_ids": inputs, "padding_mask": real}
        return x, labels, real.astype("float32")

    def evaluate(self, predict, examples, batch_size):
        total_nll, correct, count = 0.0, 0, 0
        for indices, x in self.eval_batches(examples, batch_size):
            logits = predict(x)  # (B, T, V)
            _, labels, weights = self.collate([examples[i] for i in indices])
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
            total_nll += float((nll * weights).sum())
            correct += int(((logits.argmax(-1) == labels) * weights).sum())
            count += int(weights.sum())
        mean_nll = total_nll / count
        return {"perplexity": float(np.exp(mean_nll)), "loss": mean_nll,
                "token_accuracy": correct / count, "tokens": count, "blocks": len(examples)}
