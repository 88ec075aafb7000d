"""Batching of variable-length examples: counted truncation, length buckets, dynamic or static
padding."""

import numpy as np
import tensorflow as tf

from keras_attn.layers.validation import check_int_sequence
from keras_attn.layers.validation import check_positive_int
from keras_attn.text.ner import IGNORE_LABEL

# Texts per model call when a caller of predict, predict_entities or the export's scoring
# gives no batch size.
PREDICT_BATCH_SIZE = 32


def model_inputs_at_length(batch, length):
    """The model inputs of a collated `batch`, padded with zeros to `(B, length)`.

    The fixed-length inputs of calibration (the quantize stage) and of the exported
    artifacts (scoring, latency). `label_mask`, which tokens a training loss scores, is not a
    model input and is left out.

    Args:
        batch: dict of `(B, S)` integer arrays, `S <= length`.
        length: int. The padded length.
    Returns:
        dict of `(B, length)` int32 numpy arrays.
    Example:
    >>> x = model_inputs_at_length({"token_ids": [[5, 6]], "label_mask": [[1, 0]]}, 4)
    >>> {name: value.tolist() for name, value in x.items()}
    {'token_ids': [[5, 6, 0, 0]]}
    """
    return {name: np.pad(np.asarray(value, "int32"), ((0, 0), (0, length - np.shape(value)[1])))
            for name, value in batch.items() if name != "label_mask"}


class TruncationCounter:
    """Counts what truncation removed, while a `tf.data` pipeline runs.

    The counts are `tf.Variable`s updated inside the pipeline, so they are exact however the
    dataset is consumed (`fit`, a loop, several epochs: they accumulate until `reset()`).

    Example:
    >>> counter = TruncationCounter()
    >>> counter.result()
    {'examples': 0, 'truncated_examples': 0, 'truncated_tokens': 0}
    """

    def __init__(self):
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="examples")
        self.truncated_examples = tf.Variable(0, dtype=tf.int64, trainable=False,
                                              name="truncated_examples")
        self.truncated_tokens = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="truncated_tokens")

    def update(self, length, max_length):
        """Records one example of `length` tokens cut to `max_length` (graph-safe)."""
        removed = tf.cast(tf.maximum(length - max_length, 0), tf.int64)
        return tf.group(
            self.examples.assign_add(1),
            self.truncated_examples.assign_add(tf.cast(removed > 0, tf.int64)),
            self.truncated_tokens.assign_add(removed),
        )

    def reset(self):
        for variable in (self.examples, self.truncated_examples, self.truncated_tokens):
            variable.assign(0)

    def result(self):
        """`{"examples", "truncated_examples", "truncated_tokens"}` as Python ints."""
        return {
            "examples": int(self.examples.numpy()),
            "truncated_examples": int(self.truncated_examples.numpy()),
            "truncated_tokens": int(self.truncated_tokens.numpy()),
        }

    def __repr__(self):
        return f"TruncationCounter({self.result()})"


class SequenceBatcher:
    """Truncates, buckets and pads a dataset of variable-length examples into batches.

    Elements are dicts of tensors. The sequence features (by default every rank-1 feature, e.g.
    `token_ids`, `segment_ids`, `padding_mask`, `labels` as made by `align_word_labels` or a
    tokenizer that does not pad) have the same length within an example; the others (a scalar
    `label`) are batched as they are.

    - Truncation: sequences longer than `sequence_length` are cut; with `keep_last_token=True`
      (default) the last element is kept, so a final `[SEP]` (and its segment id, mask and
      ignore label) survives: `x[:sequence_length - 1] + x[-1:]`. Every example and every removed
      token is counted in `self.truncation` (a `TruncationCounter`).
    - Dynamic padding (default): each batch is padded to its longest example.
    - Buckets (`bucket_boundaries`): examples are grouped by length (`length < boundary`) before
      batching (`tf.data.Dataset.bucket_by_sequence_length`), so batches hold similar lengths
      and little padding.
    - Static shapes (`static_shape=True`, for export and TPUs): every batch is exactly
      `(batch_size, sequence_length)`: padded to `sequence_length`, last partial batch dropped
      unless `drop_remainder=False`.

    Padding values: `IGNORE_LABEL` (-100) for keys named `labels`, `False` for booleans, `""`
    for strings, `0` otherwise; `padding_values` overrides per key.

    Args:
        batch_size: int. Examples per batch (per bucket when `bucket_batch_sizes` is not given).
        sequence_length: int or `None`. Maximum (or, with `static_shape`, exact) length.
        sequence_keys: sequence of str or `None`. The sequence features; `None` = every rank-1
            feature of the dataset.
        bucket_boundaries: increasing sequence of int or `None`.
        bucket_batch_sizes: sequence of `len(bucket_boundaries) + 1` ints or `None`.
        static_shape: bool. Pad every batch to `sequence_length` (required then).
        keep_last_token: bool. Keep the last element when truncating.
        padding_values: dict `{key: value}` or `None`.
        drop_remainder: bool or `None`. Drop a last smaller batch; `None` = `static_shape`.

    Example:
    >>> dataset = tf.data.Dataset.from_generator(
    ...     lambda: iter([{"token_ids": [2, 7, 3]}, {"token_ids": [2, 7, 8, 9, 10, 3]}]),
    ...     output_signature={"token_ids": tf.TensorSpec((None,), tf.int32)})
    >>> batcher = SequenceBatcher(batch_size=2, sequence_length=4)
    >>> batch = next(iter(batcher(dataset)))
    >>> batch["token_ids"].numpy().tolist()
    [[2, 7, 3, 0], [2, 7, 8, 3]]
    >>> batcher.truncation.result()
    {'examples': 2, 'truncated_examples': 1, 'truncated_tokens': 2}
    """

    def __init__(
        self,
        batch_size,
        sequence_length=None,
        *,
        sequence_keys=None,
        bucket_boundaries=None,
        bucket_batch_sizes=None,
        static_shape=False,
        keep_last_token=True,
        padding_values=None,
        drop_remainder=None,
    ):
        check_positive_int("batch_size", batch_size)
        if sequence_length is not None:
            check_positive_int("sequence_length", sequence_length)
            if keep_last_token and sequence_length < 2:
                raise ValueError(
                    "`keep_last_token=True` needs `sequence_length >= 2`. "
                    f"Received: sequence_length={sequence_length}"
                )
        if static_shape and sequence_length is None:
            raise ValueError(
                "`static_shape=True` pads to `sequence_length`, which must be given. "
                "Received: sequence_length=None"
            )
        if bucket_boundaries is not None:
            bucket_boundaries = list(bucket_boundaries)
            check_int_sequence("bucket_boundaries", bucket_boundaries, low=1)
            if not bucket_boundaries or bucket_boundaries != sorted(set(bucket_boundaries)):
                raise ValueError(
                    "`bucket_boundaries` must be strictly increasing positive ints. "
                    f"Received: bucket_boundaries={bucket_boundaries}"
                )
            if bucket_batch_sizes is None:
                bucket_batch_sizes = [batch_size] * (len(bucket_boundaries) + 1)
            bucket_batch_sizes = list(bucket_batch_sizes)
            if len(bucket_batch_sizes) != len(bucket_boundaries) + 1:
                raise ValueError(
                    "`bucket_batch_sizes` needs len(bucket_boundaries) + 1 = "
                    f"{len(bucket_boundaries) + 1} sizes. Received: "
                    f"bucket_batch_sizes={bucket_batch_sizes}"
                )
            for size in bucket_batch_sizes:
                check_positive_int("bucket_batch_sizes", size)
        elif bucket_batch_sizes is not None:
            raise ValueError(
                "`bucket_batch_sizes` needs `bucket_boundaries`. Received: "
                f"bucket_batch_sizes={bucket_batch_sizes}"
            )
        self.batch_size = batch_size
        self.sequence_length = sequence_length
        self.sequence_keys = None if sequence_keys is None else list(sequence_keys)
        self.bucket_boundaries = bucket_boundaries
        self.bucket_batch_sizes = bucket_batch_sizes
        self.static_shape = bool(static_shape)
        self.keep_last_token = bool(keep_last_token)
        self.padding_values = dict(padding_values or {})
        self.drop_remainder = self.static_shape if drop_remainder is None else bool(drop_remainder)
        self.truncation = TruncationCounter()

    def _keys(self, spec):
        if not isinstance(spec, dict):
            raise ValueError(
                f"SequenceBatcher needs a dataset of dicts. Received element_spec={spec}"
            )
        if self.sequence_keys is None:
            keys = [key for key, value in spec.items() if value.shape.rank == 1]
        else:
            keys = self.sequence_keys
            for key in keys:
                if key not in spec or spec[key].shape.rank != 1:
                    raise ValueError(
                        f"Sequence key {key!r} must be a rank-1 feature of the dataset. "
                        f"Received: element_spec={spec}"
                    )
        if not keys:
            raise ValueError(f"The dataset has no rank-1 (sequence) feature: {spec}")
        return keys

    def _padding_value(self, key, dtype):
        if key in self.padding_values:
            return tf.constant(self.padding_values[key], dtype)
        if dtype == tf.bool:
            return tf.constant(False)
        if dtype == tf.string:
            return tf.constant("")
        if key == "labels" and dtype.is_integer:
            return tf.constant(IGNORE_LABEL, dtype)
        return tf.constant(0, dtype)

    def __call__(self, dataset):
        spec = dataset.element_spec
        keys = self._keys(spec)
        max_length = self.sequence_length

        def truncate(features):
            features = dict(features)
            length = tf.shape(features[keys[0]])[0]
            for key in keys[1:]:
                tf.debugging.assert_equal(
                    tf.shape(features[key])[0], length,
                    message=f"Sequence features {keys} must have one length per example.",
                )
            if max_length is None:
                return features
            with tf.control_dependencies([self.truncation.update(length, max_length)]):
                for key in keys:
                    value = features[key]
                    if self.keep_last_token:
                        kept = tf.minimum(length, max_length) - 1
                        value = tf.concat([value[:kept], value[length - 1:]], axis=0)
                    else:
                        value = value[:max_length]
                    features[key] = tf.identity(value)
            return features

        dataset = dataset.map(truncate)
        length = self.sequence_length if self.static_shape else None
        padded_shapes = {
            key: [length] if key in keys else value.shape for key, value in spec.items()
        }
        padding_values = {key: self._padding_value(key, value.dtype) for key, value in spec.items()}
        if self.bucket_boundaries is None:
            return dataset.padded_batch(
                self.batch_size, padded_shapes=padded_shapes, padding_values=padding_values,
                drop_remainder=self.drop_remainder,
            )
        return dataset.bucket_by_sequence_length(
            element_length_func=lambda features: tf.shape(features[keys[0]])[0],
            bucket_boundaries=self.bucket_boundaries,
            bucket_batch_sizes=self.bucket_batch_sizes,
            padded_shapes=padded_shapes,
            padding_values=padding_values,
            drop_remainder=self.drop_remainder,
        )
