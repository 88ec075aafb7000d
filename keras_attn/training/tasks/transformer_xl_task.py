"""Transformer-XL language modelling with segment memory carried from batch to batch."""

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_attn.models.transformer_xl_lm import TransformerXLLM
from keras_attn.models.transformer_xl_lm import empty_memory
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.runs.config_schema import ConfigError
from keras_attn.text.errors import DataError
from keras_attn.training.tasks.batch_stream import BatchStream
from keras_attn.training.tasks.causal_lm_task import CausalLMTask
from keras_attn.training.tasks.character_evaluation import segment_memory_nll


class SegmentStream(BatchStream):
    """Batches of `B` parallel streams of consecutive segments, in order, every epoch.

    Example `k * B + b` is segment `k` of stream `b`, so micro-batch `k` holds segment `k`
    of every stream, row `b` for stream `b` (the replica that receives row `b` always
    receives the same stream). `x["reset"]` is 1 on the first batch of every epoch and on
    the first batch of every `dataset()` call (the trainer calls it once per epoch, and at
    the step a killed run resumes from): the memory restarts empty there.
    """

    def __init__(self, examples, collate, global_batch_size):
        super().__init__(examples, collate, [len(e["token_ids"]) - 1 for e in examples],
                         global_batch_size, seed=0, bucket_by_length=False)
        self.fresh_steps = set()

    def _permutation(self, epoch):
        return np.arange(self.num_examples)  # the streams' order is the text's

    def raw_batch(self, step):
        x, y, weights = super().raw_batch(step)
        if step % self.steps_per_epoch == 0 or step in self.fresh_steps:
            x = {**x, "reset": np.ones_like(x["reset"])}
        return x, y, weights

    def dataset(self, start_step, stop_step, num_shards=1, shards=(0,)):
        self.fresh_steps.add(start_step)
        return super().dataset(start_step, stop_step, num_shards, shards)


class MemoryCarryingLM(keras.Model):
    """Trains a `TransformerXLLM` with its memory kept between batches (§3.2).

    The `(B_replica, L, M, d)` memory and its `(B_replica, M)` mask live in non-trainable
    variables, one copy per replica (`synchronization="on_read"`: replica `r` keeps the
    memory of the streams it reads; a read outside the replicas, as by the chief's checkpoint,
    returns the first replica's copy without a collective, which with `aggregation="mean"`
    the other workers never joined). A training call reads them, zeroes the mask of the rows
    whose `reset` is 1 (a masked memory is exactly no memory), runs the model and stores the
    new memory, which carries no gradient (`TransformerXLLM` stops it). Inference calls
    leave the memory alone.
    """

    def __init__(self, lm, batch_size, memory_length, **kwargs):
        super().__init__(**kwargs)
        self.lm = lm  # a TransformerXLLM or its quantize_model copy
        shape = empty_memory(lm, batch_size, memory_length)["memory"].shape  # (B, L, M, d)
        self.memory = keras.Variable(np.zeros(shape, "float32"), trainable=False,
                                     synchronization="on_read",
                                     aggregation="only_first_replica", name="memory")
        self.memory_mask = keras.Variable(np.zeros((batch_size, memory_length), "float32"),
                                          trainable=False, synchronization="on_read",
                                          aggregation="only_first_replica", name="memory_mask")
        self({"token_ids": np.ones(shape[:1] + (1,), "int32"),
              "reset": np.ones(shape[:1], "int32")})

    def call(self, inputs, training=False):
        keep = 1 - ops.cast(inputs["reset"], "int32")[:, None]  # (B, 1)
        mask = ops.cast(self.memory_mask, "int32") * keep  # (B, M)
        out = self.lm({"token_ids": inputs["token_ids"],
                       "memory": ops.convert_to_tensor(self.memory),
                       "memory_padding_mask": mask}, training=training)
        if training:
            self.memory.assign(ops.cast(out["memory"], "float32"))
            self.memory_mask.assign(ops.cast(out["memory_padding_mask"], "float32"))
        return out["logits"]  # (B, T, V)


class TransformerXLTask(CausalLMTask):
    """Segment-level recurrent training of `TransformerXLLM` (Dai et al., 2019, §3.2).

    The training text (characters, bytes or WordPiece ids, `model.tokenizer`) is one
    stream of `N` ids cut into `B = train.global_batch_size` equal parallel streams of
    `S = (N - 1) // B` ids; each stream is read in consecutive segments of
    `T = data.max_length` inputs (`K = S // T` per stream, the tail dropped). Micro-batch
    `k` of an epoch holds segment `k` of every stream, and each layer's memory of the
    `M = model.memory_length` (default `T`) previous states is carried to batch `k + 1`
    without gradient. The memory is empty at the start of every epoch and at the step a
    run resumes from (it is not checkpointed: see `SegmentStream`).

    Dev and test texts are read once, as one stream, in segments of `T` with a memory of
    `data.eval_memory_length` (default `M`; longer is allowed, as in the paper's §4).
    Metrics: `bits_per_character` (for characters), `perplexity`, `loss` (nats),
    `eval_seconds`.
    """

    name = "transformer_xl_lm"
    metric = "perplexity"
    higher_is_better = False

    def encode(self, texts, path):
        return [{"token_ids": self.token_stream(texts)}]

    def prepare(self):
        super().prepare()
        stream = self.train_examples[0]["token_ids"]
        self.train_examples = self.segments(stream, self.config.data.train)
        self.log(f"{len(stream):,} training ids -> {self.batch_size} streams x "
                 f"{len(self.train_examples) // self.batch_size:,} segments of "
                 f"{self.config.data.max_length}")

    @property
    def batch_size(self):
        train = self.config.train
        if train.global_batch_size is not None:
            return train.global_batch_size
        return train.per_replica_batch_size * tf.distribute.get_strategy().num_replicas_in_sync

    @property
    def memory_length(self):
        memory = self.config.model.memory_length
        return self.config.data.max_length if memory is None else memory

    def segments(self, stream, path):
        """Examples `k * B + b`: segment `k` of stream `b` (`T + 1` ids)."""
        batch, length = self.batch_size, self.config.data.max_length
        per_stream = (len(stream) - 1) // batch
        count = per_stream // length
        if count < 1:
            raise DataError(path, 1, f"{len(stream):,} ids make no segment of {length} in "
                                     f"each of {batch} streams: lower train.global_batch_size "
                                     "or data.max_length, or give more text.")
        return [{"token_ids": stream[b * per_stream + k * length:
                                     b * per_stream + (k + 1) * length + 1],
                 "segment": k}
                for k in range(count) for b in range(batch)]

    def batch_stream(self, global_batch_size, seed, accumulation_steps, bucket_by_length):
        if accumulation_steps != 1:
            raise ConfigError("task transformer_xl_lm carries memory from one batch to the "
                              "next: use train.gradient_accumulation_steps=1",
                              self.config.source)
        return SegmentStream(self.train_examples, self.collate, global_batch_size)

    def lengths(self, examples):
        return [len(e["token_ids"]) - 1 for e in examples]

    def build_model(self):
        model = self.config.model
        lm = self.trained_model(TransformerXLLM, None, head=None,
                                hint="continue a transformer_xl_lm run")
        if lm is not None:
            self._check_continued_vocabulary(lm)
        else:
            lm = TransformerXLLM.from_preset(
                model.preset, **{"vocabulary_size": self.tokenizer.vocabulary_size(),
                                 "memory_length": max(1, self.memory_length),
                                 "dropout": model.dropout, **model.overrides})
        return self._memory_model(lm)

    def quantization_aware_copy(self, model, layout, count):
        """The memory-carrying model of the `quantize_model` copy of the LM it carries,
        calibrated on the first segments of the training streams (about `count` of them),
        each with the memory the float LM left (a copy calibrated on empty memories would
        start with no range for them)."""
        lm, batch = model.lm, self.batch_size
        state = empty_memory(lm, batch, self.memory_length)
        batches = []
        for k in range(max(1, min(count, len(self.train_examples)) // batch)):
            x, _, _ = self.collate(self.train_examples[k * batch:(k + 1) * batch])
            batches.append({"token_ids": x["token_ids"], **state})
            out = lm(batches[-1], training=False)
            state = {"memory": ops.convert_to_numpy(out["memory"]),
                     "memory_padding_mask": ops.convert_to_numpy(out["memory_padding_mask"])}
        copy = quantize_model(lm, **layout)
        calibrate_model(copy, batches)
        return self._memory_model(copy)

    def _memory_model(self, lm):
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        self.memory_model = MemoryCarryingLM(lm, self.batch_size // replicas,
                                             self.memory_length)
        return self.memory_model

    def inference_model(self, model):
        return model.lm

    def loss(self):
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def collate(self, examples):
        inputs = np.stack([e["token_ids"][:-1] for e in examples]).astype("int32")  # (B, T)
        labels = np.stack([e["token_ids"][1:] for e in examples]).astype("int32")  # (B, T)
        reset = np.array([e["segment"] == 0 for e in examples], "int32")  # (B,)
        return ({"token_ids": inputs, "reset": reset}, labels,
                np.ones(labels.shape, "float32"))

    def evaluate(self, predict, examples, batch_size):
        memory = self.config.data.eval_memory_length
        memory = self.memory_length if memory is None else memory
        nll, count, seconds = segment_memory_nll(
            self.memory_model.lm, examples[0]["token_ids"], self.config.data.max_length,
            memory)
        scores = {"perplexity": math.exp(nll / count), "loss": nll / count, "tokens": count,
                  "eval_memory_length": memory, "eval_seconds": round(seconds, 2)}
        if self.characters:
            scores["bits_per_character"] = nll / count / math.log(2)
        return scores
