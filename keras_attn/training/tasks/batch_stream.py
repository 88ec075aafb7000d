"""The deterministic stream of training batches: step number in, batch out.

Training resumes exactly because a batch is a pure function of `(seed, step)`: the
examples are read in the order of one seeded permutation per epoch, laid end to end (an
epoch boundary may fall inside a batch, so no example is ever dropped or repeated
within an epoch), and batch `s` holds positions `[s B, (s + 1) B)` of that sequence. With
length bucketing, each window of 64 batches is sorted by length before being cut into
batches, and the batches of a window are visited in a seeded random order, which keeps
padding low without changing what an epoch contains.

Loss weights are normalized here, where the whole global batch is known: a task's collate
function gives every example (or token) a raw weight (1 for counted, 0 for ignored); the
stream divides by the total raw weight of the update (all replicas, all accumulation
micro-batches) and multiplies by the accumulation count (the optimizer averages the
micro-batch gradients). Each replica then sums `weight * loss` over its rows, and the
all-reduced sum is the mean over the global batch, however it is split.
"""

import math

import numpy as np
import tensorflow as tf

WINDOW_BATCHES = 64


def _map(function, value):
    if isinstance(value, dict):
        return {key: function(v) for key, v in value.items()}
    return function(value)


def _map2(function, value, other):
    if isinstance(value, dict):
        return {key: function(v, other[key]) for key, v in value.items()}
    return function(value, other)


class BatchStream:
    """Deterministic global batches over a list of encoded examples.

    Args:
        examples: list of examples, each a dict of numpy arrays (what the task encodes).
        collate: `collate(examples) -> (x, y, raw_weights)` numpy structures for one global
            micro-batch (padding to one common length), `raw_weights` shaped like the loss.
        lengths: int array, the token count of each example (for bucketing and tokens/s).
        global_batch_size: int, examples per micro-batch over all replicas.
        seed: int, data order.
        accumulation_steps: int, micro-batches per optimizer update.
        bucket_by_length: bool, see the module docstring.

    Example:
    >>> examples = [{"x": np.arange(n)} for n in (3, 1, 2, 5)]
    >>> def collate(batch):
    ...     return {"n": np.array([len(e["x"]) for e in batch])}, None, np.ones(len(batch))
    >>> stream = BatchStream(examples, collate, [3, 1, 2, 5], global_batch_size=2, seed=0)
    >>> stream.steps_per_epoch
    2
    >>> x, _, w = stream.batch(0)
    >>> w.tolist()
    [0.5, 0.5]
    """

    def __init__(self, examples, collate, lengths, global_batch_size, seed,
                 accumulation_steps=1, bucket_by_length=True):
        if not examples:
            raise ValueError("no training examples: the training file yielded none")
        self.examples = examples
        self.collate = collate
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.global_batch_size = int(global_batch_size)
        self.seed = int(seed)
        self.accumulation_steps = int(accumulation_steps)
        self.bucket_by_length = bool(bucket_by_length)
        self._permutations = {}
        self._window_cache = (None, None)
        self._weight_totals = {}

    @property
    def num_examples(self):
        return len(self.examples)

    @property
    def steps_per_epoch(self):
        """Micro-batches per epoch, rounded up to whole optimizer updates."""
        micro = math.ceil(self.num_examples / self.global_batch_size)
        return math.ceil(micro / self.accumulation_steps) * self.accumulation_steps

    def _permutation(self, epoch):
        if epoch not in self._permutations:
            if len(self._permutations) > 4:
                self._permutations.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._permutations[epoch] = rng.permutation(self.num_examples)
        return self._permutations[epoch]

    def _positions(self, start, stop):
        """Example indices at positions `[start, stop)` of the endless epoch sequence."""
        n = self.num_examples
        out = []
        position = start
        while position < stop:
            epoch, offset = divmod(position, n)
            take = min(stop - position, n - offset)
            out.append(self._permutation(epoch)[offset: offset + take])
            position += take
        return np.concatenate(out)

    def indices(self, step):
        """Example indices of micro-batch `step`."""
        size = self.global_batch_size
        if not self.bucket_by_length:
            return self._positions(step * size, (step + 1) * size)
        window, slot = divmod(step, WINDOW_BATCHES)
        if self._window_cache[0] != window:
            start = window * WINDOW_BATCHES * size
            items = self._positions(start, start + WINDOW_BATCHES * size)
            items = items[np.argsort(self.lengths[items], kind="stable")]
            batches = items.reshape(WINDOW_BATCHES, size)
            order = np.random.default_rng([self.seed, 1 << 30, window]).permutation(
                WINDOW_BATCHES
            )
            self._window_cache = (window, batches[order])
        return self._window_cache[1][slot]

    def raw_batch(self, step):
        """`(x, y, raw_weights)` of micro-batch `step`, not normalized."""
        return self.collate([self.examples[i] for i in self.indices(step)])

    def batch(self, step):
        """`(x, y, weights)` of micro-batch `step`, weights normalized over its update.

        `weights` may be a dict of arrays (one per loss term, e.g. masked-LM slots and
        next-sentence labels); each is normalized by its own total.
        """
        x, y, weights = self.raw_batch(step)
        first = step - step % self.accumulation_steps
        totals = None
        for other in range(first, first + self.accumulation_steps):
            if other not in self._weight_totals:
                if len(self._weight_totals) > 4 * self.accumulation_steps:
                    self._weight_totals.clear()
                raw = weights if other == step else self.raw_batch(other)[2]
                self._weight_totals[other] = _map(lambda w: float(np.sum(w)), raw)
            add = self._weight_totals[other]
            totals = add if totals is None else _map2(lambda a, b: a + b, totals, add)

        def normalize(w, total):
            scale = self.accumulation_steps / total if total > 0 else 0.0
            return (np.asarray(w, np.float32) * scale).astype(np.float32)

        return x, y, _map2(normalize, weights, totals)

    def tokens(self, step):
        """Tokens (no padding) in micro-batch `step`, for throughput."""
        return int(self.lengths[self.indices(step)].sum())

    def dataset(self, start_step, stop_step, num_shards=1, shards=(0,)):
        """`tf.data.Dataset` of the micro-batches `[start_step, stop_step)`.

        With `num_shards > 1` each micro-batch is split by rows into `num_shards` equal parts
        (one per replica) and, for each step, the parts listed in `shards` are yielded in
        that order: `distribute_datasets_from_function` hands consecutive elements of a
        worker's dataset to its local replicas.
        """
        if self.global_batch_size % num_shards:
            raise ValueError(
                f"the global batch ({self.global_batch_size}) must divide evenly over "
                f"{num_shards} replicas; change train.global_batch_size"
            )
        rows = self.global_batch_size // num_shards

        def spec(value):
            value = np.asarray(value)
            return tf.TensorSpec((None,) * value.ndim, tf.as_dtype(value.dtype))

        def element(step):
            x, y, w = self.batch(step)
            return (x, y, w) if y is not None else (x, w)

        signature = tf.nest.map_structure(spec, element(start_step))

        def generate():
            for step in range(start_step, stop_step):
                full = element(step)
                for shard in shards:
                    yield tf.nest.map_structure(
                        lambda v, s=shard: np.asarray(v)[s * rows: (s + 1) * rows], full
                    )

        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = (
            tf.data.experimental.AutoShardPolicy.OFF
        )
        return dataset.with_options(options).prefetch(2)
