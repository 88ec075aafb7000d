"""XLNet permutation-language-model pretraining on packed blocks of raw text: perplexity
of the predicted (last `1/K` of each factorization order) tokens."""

import math

import numpy as np
from keras import ops

from keras_attn.models.permutation_lm_inputs import permutation_lm_inputs
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_lm import XLNetLM
from keras_attn.runs.config_schema import ConfigError
from keras_attn.training.tasks.causal_lm_task import CausalLMTask
from keras_attn.training.tasks.task import pad_stack
from keras_attn.training.tasks.task import padded_length


class PermutationLMTask(CausalLMTask):
    """XLNet pretraining (Yang et al., 2019, §2.2–2.3); metric: perplexity
    `exp(mean -log p(x_{z_t} | x_{z<t}))` over the predicted tokens, lower is better.

    Text as `causal_lm`: non-blank lines, WordPiece-tokenized (vocabulary learned from
    `data.train` or `model.vocabulary`), each followed by `[SEP]`, packed into blocks of
    `data.max_length` tokens. Every batch draws one factorization order per block
    (`permutation_lm_inputs`; with `data.span_length` S > 1 over spans of S consecutive
    positions, the span-grouped variant) and predicts its last `P = ceil(data.mask_rate *
    T)` positions (partial prediction, `mask_rate = 1/K`; the paper's K = 6 or 7 is
    0.15-0.17). Each block's order is seeded with `train.seed` and its index, so a resumed
    run sees the same orders, and the dev evaluation after every epoch the same orders
    whatever the batching. The orders are drawn on the host when a global batch is
    collated, not in the graph: replicas and workers read row slices of it, so every
    strategy trains on the orders one device would. No memory across blocks.

    The model is `XLNetLM` on a two-stream `XLNetBackbone.from_preset(model.preset)` with
    the tokenizer's vocabulary size and `model.dropout`, then `model.overrides`. Its
    encoder fine-tunes: a `classification` or `ner` config with `model.checkpoint: <this
    run>` builds `XLNetClassifier` / `XLNetTokenClassifier` on its content stream.
    """

    name = "permutation_lm"
    metric = "perplexity"
    higher_is_better = False

    def prepare(self):
        data = self.config.data
        if not 0 < data.mask_rate < 1:
            raise ConfigError("`data.mask_rate` is the predicted fraction 1/K of each "
                              "factorization order and must be in (0, 1) (XLNet: 1/6). "
                              f"Received: data.mask_rate={data.mask_rate}", self.config.source)
        super().prepare()

    def encode(self, texts, path):
        """Consecutive blocks of `L = data.max_length` ids (the last may be shorter),
        with their index (the seed of their orders)."""
        stream = self.token_stream(texts)
        length = self.config.data.max_length
        return [{"token_ids": stream[start: start + length], "index": i}
                for i, start in enumerate(range(0, len(stream), length))]

    def lengths(self, examples):
        return [len(example["token_ids"]) for example in examples]

    def build_model(self):
        model = self.config.model
        overrides = {"vocabulary_size": self.tokenizer.vocabulary_size(),
                     "dropout": model.dropout, "two_stream": True}
        overrides.update(model.overrides)
        return XLNetLM(XLNetBackbone.from_preset(model.preset, **overrides))

    def collate(self, examples):
        length = padded_length([len(e["token_ids"]) for e in examples],
                               self.config.data.max_length)
        token_ids = pad_stack([e["token_ids"] for e in examples], length, 0)  # (B, T)
        real = (np.arange(length)[None] < np.array(self.lengths(examples))[:, None])
        num_predict = max(1, math.ceil(self.config.data.mask_rate * length))
        span = self.config.data.span_length
        noise = np.stack([  # one order per block, seeded by its index
            np.random.default_rng([self.config.train.seed, int(e["index"])])
            .random(-(-length // span))
            for e in examples])  # (B, ceil(T / S))
        inputs, labels, weights = permutation_lm_inputs(
            token_ids, num_predict, padding_mask=real.astype("int32"), span_length=span,
            order_noise=noise)
        x = {k: ops.convert_to_numpy(v) for k, v in inputs.items()}
        return x, ops.convert_to_numpy(labels), ops.convert_to_numpy(weights)
