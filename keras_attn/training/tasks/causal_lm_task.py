"""Causal language modelling with `GPTCausalLM` on packed blocks of text: perplexity."""

import math

import keras
import numpy as np

from keras_attn.models.auxiliary_loss_lm import AuxiliaryLossLM
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.runs.config_schema import ConfigError
from keras_attn.text.character_tokenizer import VOCABULARY_FILE
from keras_attn.text.character_tokenizer import CharacterTokenizer
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


def read_character_text(path):
    """A text file as one string for character-level models: every line (blank ones and
    leading spaces kept, trailing whitespace dropped) followed by a newline, with the
    `DataError`s of `read_lines` and one for a file without any non-blank character."""
    lines = [line.rstrip() for _, line in read_lines(path)]
    if not any(lines):
        raise DataError(path, 1, "the file holds no text (only blank lines); give the text "
                                 "the model should learn, as plain UTF-8 lines.")
    return "\n".join(lines) + "\n"


class CausalLMTask(BertTask):
    """Next-token prediction on contiguous blocks of text (GPT-2 style packing); metric:
    perplexity `exp(mean_t -log p(x_t | x_<t))`, lower is better.

    Every non-blank line is WordPiece-tokenized and followed by `[SEP]`, the end-of-text
    token (GPT-2's `<|endoftext|>`), so the model learns where a text stops and a block
    may cross text boundaries. The token stream is cut into blocks of `data.max_length`
    inputs: block `i` reads tokens `[i L, (i + 1) L)` and predicts `[i L + 1, (i + 1) L + 1)`
    (nanoGPT's `x, y`); only the last block is shorter. Each predicted token has raw loss
    weight 1, so the loss is the mean next-token cross-entropy of the global batch.

    With `model.tokenizer: characters` (or `bytes`) the text is read whole (line breaks
    are symbols too) and encoded by a `CharacterTokenizer`; evaluation adds
    `bits_per_character = loss / ln 2`. The auxiliary losses of Al-Rfou et al. (2018)
    switch on with `model.intermediate_layer_losses` and `model.future_targets` (the
    model trains inside an `AuxiliaryLossLM`; the saved model is the plain
    `GPTCausalLM`), and per-layer position embeddings with
    `model.overrides: {layer_position_embeddings: true}`.

    The WordPiece vocabulary is learned from `data.train` (or read from `model.vocabulary`);
    the model is `GPTCausalLM` on `GPTBackbone.from_preset(model.preset)` with the tokenizer's
    vocabulary size, `data.max_length` positions and `model.dropout`, then
    `model.overrides`.
    """

    name = "causal_lm"
    metric = "perplexity"
    higher_is_better = False

    total_updates = 1  # set by the trainer before `build_model` (the fade-out schedule)

    @property
    def characters(self):
        """True for a character or byte vocabulary (`model.tokenizer`)."""
        return self.config.model.tokenizer != "wordpiece"

    def prepare(self):
        data = self.config.data
        texts = self.read_texts(data.train)
        if data.max_train_examples:
            texts = texts[: data.max_train_examples]
        if self.characters:
            self.tokenizer = self.character_tokenizer(texts)
        else:
            self.tokenizer = WordPieceTokenizer(
                self.vocabulary(lambda: texts), lowercase=self.config.model.lowercase,
                sequence_length=data.max_length,
            )
        self.train_examples = self.encode(texts, data.train)
        self.dev_examples = self.encode(self.read_texts(data.dev), data.dev) if data.dev \
            else None
        self.test_examples = self.encode(self.read_texts(data.test), data.test) \
            if data.test else None
        self.log(f"{len(texts):,} training texts -> {len(self.train_examples):,} blocks of "
                 f"{data.max_length} tokens, vocabulary {self.tokenizer.vocabulary_size():,}")

    def read_texts(self, path):
        """WordPiece: the non-blank lines; characters: the whole text as one string."""
        return [read_character_text(path)] if self.characters else read_text_lines(path)

    def character_tokenizer(self, texts):
        """The continued run's `characters.json` (its model reads those ids), this run's
        (a resumed run), else learned from `texts`."""
        trained = self.trained_run()
        for saved in ([trained.path / VOCABULARY_FILE] if trained else []) + [
                self.output_dir / VOCABULARY_FILE]:
            if saved.is_file():
                return CharacterTokenizer.load(saved)
        tokenizer = CharacterTokenizer.from_texts(texts, self.config.model.tokenizer)
        self.log(f"{self.config.model.tokenizer} vocabulary of {tokenizer.vocabulary_size()} "
                 f"symbols from {self.config.data.train}")
        return tokenizer

    def save_assets(self, directory):
        if self.characters:
            self.tokenizer.save(directory)
        else:
            super().save_assets(directory)

    def token_stream(self, texts):
        """int32 ids of `texts`: characters, or WordPiece ids each followed by the
        end-of-text `[SEP]`."""
        if self.characters:
            return np.concatenate([self.tokenizer.encode(text) for text in texts])
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
        extra = self.config.model.future_targets  # ids the multiple targets read past L + 1
        blocks = []
        for start in range(0, len(stream) - 1, length):
            blocks.append({"token_ids": stream[start: start + length + 1 + extra]})
        return blocks

    def lengths(self, examples):
        extra = self.config.model.future_targets
        return [min(len(e["token_ids"]) - 1, self.config.data.max_length) for e in examples] \
            if extra else [len(e["token_ids"]) - 1 for e in examples]

    @property
    def auxiliary_losses(self):
        model = self.config.model
        return model.intermediate_layer_losses or model.future_targets > 0

    def build_model(self):
        trained = self.trained_model(GPTCausalLM, None, head=None,
                                     hint="continue a causal_lm run of a GPTCausalLM")
        if trained is not None:
            if activation_quantizers(trained):
                raise ConfigError(
                    f"model.checkpoint={self.config.model.checkpoint} is a quantization-aware "
                    "run: its loaded LM head reads a table of its own (no longer tied to the "
                    "token embedding), so it cannot train on; continue its float run with "
                    "model.quantization_aware: true instead", self.config.source)
            self._check_continued_vocabulary(trained)
            return self._with_auxiliary_losses(trained)
        model = self.config.model
        overrides = {"vocabulary_size": self.tokenizer.vocabulary_size(),
                     "max_sequence_length": self.config.data.max_length,
                     "dropout": model.dropout}
        overrides.update(model.overrides)
        return self._with_auxiliary_losses(
            GPTCausalLM(GPTBackbone.from_preset(model.preset, **overrides)))

    def _check_continued_vocabulary(self, model):
        """A continued run's model reads this run's ids: the tokenizer kind and vocabulary
        size must be the trained run's."""
        run = self.trained_run()
        kind = run.tokenizer_settings().kind
        if kind != self.config.model.tokenizer:
            raise ConfigError(f"model.checkpoint={run.path} was trained with model.tokenizer: "
                              f"{kind}; set model.tokenizer: {kind} to continue it",
                              self.config.source)
        logits = model.output["logits"] if isinstance(model.output, dict) else model.output
        rows = logits.shape[-1]  # (B, T, V)
        if rows != self.tokenizer.vocabulary_size():
            raise ConfigError(f"model.checkpoint={run.path}: its model has {rows} vocabulary "
                              f"rows, this run's tokenizer {self.tokenizer.vocabulary_size()} "
                              "(use the run's vocabulary: model.vocabulary unset)",
                              self.config.source)

    def _with_auxiliary_losses(self, lm):
        model = self.config.model
        if not self.auxiliary_losses:
            return lm
        return AuxiliaryLossLM(lm, intermediate_layer_losses=model.intermediate_layer_losses,
                               future_targets=model.future_targets,
                               total_updates=max(1, self.total_updates))

    def inference_model(self, model):
        return model.lm if isinstance(model, AuxiliaryLossLM) else model

    def loss(self):
        if self.auxiliary_losses:
            return None  # AuxiliaryLossLM's own compute_loss
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def collate(self, examples):
        """`x`, labels `(B, T)` (or `(B, T, 1 + K)` with `K` future targets, 0 past the
        text) and the `(B, T)` weights of the real positions."""
        max_length = self.config.data.max_length
        extra = self.config.model.future_targets
        counts = [min(len(e["token_ids"]) - 1, max_length) for e in examples]
        length = padded_length(counts, max_length)
        inputs = pad_stack([e["token_ids"][:-1] for e in examples], length, 0)  # (B, T)
        labels = np.stack([pad_stack([e["token_ids"][1 + k:] for e in examples], length, 0)
                           for k in range(1 + extra)], axis=-1)  # (B, T, 1 + K)
        real = np.zeros((len(examples), length), "int32")
        for row, count in enumerate(counts):
            real[row, :count] = 1
        x = {"token_ids": inputs, "padding_mask": real}
        return x, (labels if extra else labels[..., 0]), real.astype("float32")

    def evaluate(self, predict, examples, batch_size):
        total_nll, correct, count = 0.0, 0, 0
        for indices, x in self.eval_batches(examples, batch_size):
            logits = predict(x)  # (B, T, V)
            if isinstance(logits, dict):  # AuxiliaryLossLM: the final layer's
                logits = logits["logits"]
            _, labels, weights = self.collate([examples[i] for i in indices])
            labels = labels[..., 0] if labels.ndim == 3 else labels
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            nll = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
            total_nll += float((nll * weights).sum())
            correct += int(((logits.argmax(-1) == labels) * weights).sum())
            count += int(weights.sum())
        mean_nll = total_nll / count
        scores = {"perplexity": float(np.exp(mean_nll)), "loss": mean_nll,
                  "token_accuracy": correct / count, "tokens": count, "blocks": len(examples)}
        if self.characters:
            scores["bits_per_character"] = mean_nll / math.log(2)
        return scores
