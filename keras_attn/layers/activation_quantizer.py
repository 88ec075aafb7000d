"""`ActivationQuantizer`: per-tensor fake int8 quantization of activations with ranges
learned as moving averages (Jacob et al., 2018)."""

import keras
from keras import ops

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_number


def _check_decay(decay):
    check_number("decay", decay, 0, 1, include_low=False, include_high=False,
                 meaning="the EMA factor of the activation ranges, e.g. 0.999")


def _check_fixed_range(fixed_range):
    if fixed_range is None:
        return None
    if (not isinstance(fixed_range, (tuple, list)) or len(fixed_range) != 2
            or not float(fixed_range[0]) <= 0.0 <= float(fixed_range[1])
            or float(fixed_range[0]) == float(fixed_range[1])):
        raise ValueError(
            "`fixed_range` must be a pair (min, max) with min <= 0 <= max and min < max "
            "(zero must be representable in int8). Received: "
            f"fixed_range={fixed_range!r}"
        )
    return (float(fixed_range[0]), float(fixed_range[1]))


@keras.saving.register_keras_serializable(package="keras_attn")
class ActivationQuantizer(keras.layers.Layer):
    """Per-tensor fake quantization of an activation with an EMA-learned range
    (Jacob et al., 2018, "Quantization and Training of Neural Networks for Efficient
    Integer-Arithmetic-Only Inference", §3.1 and §3.2).

        m_t = decay m_{t-1} + (1 - decay) min(0, min x_t)     (first batch: m_1 = min(0, min x_1))
        M_t = decay M_{t-1} + (1 - decay) max(0, max x_t)
        y = FakeQuant(x; m, M, 8 bits)
          = (round(clip(x, m', M') - m') / s) s + m',   s = (M - m) / 255

    where `m'`, `M'` are the range nudged so that 0 is exactly representable (TF's
    `FakeQuantWithMinMaxVars`, which the TFLite converter turns into int8 scale and zero
    point). The range is updated in training (and while `calibrating` is set) and frozen
    in inference. Under `tf.distribute` the replicas' updates are averaged (the batch
    extremes of a step enter as their mean over replicas), so every replica and worker
    keeps the same range. On the TensorFlow backend the op is `tf.quantization.
    fake_quant_with_min_max_vars` (through `keras.quantizers.fake_quant_with_min_max_vars`),
    whose gradient is the straight-through estimator inside the range.

    Args:
        decay: float in (0, 1), EMA factor of the range. Defaults to `0.999`.
        fixed_range: optional `(min, max)`: a range that is not learned (softmax
            probabilities use `(0, 255/256)`, TFLite's fixed int8 softmax output scale).
        mask_margin: float >= 0, used with `stats_mask`: the range minimum is lowered by
            this much below the EMA minimum of the real entries, and masked entries are
            set to it. For attention scores it puts padded keys `mask_margin` nats below
            every real score, so that their softmax weight is `<= exp(-mask_margin)`
            (about 6e-6 for the default `12.0`) while the scale stays bounded (an
            additive -1e9 would make the int8 scale useless). Defaults to `12.0`.
        masked_value: float, the value of masked entries when `quantize=False` (the
            float twin). Defaults to `-1e9` (exact float masking: zero probability);
            graphs to be calibrated by the TFLite converter (post-training quantization)
            need a bounded value such as `-20.0`.
        quantize: bool; `False` gives the identity (ranges are still tracked), the float
            twin of the same graph. Defaults to `True`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`).

    Call arguments:
        inputs: float tensor.
        stats_mask: optional boolean tensor broadcastable to `inputs`: only the `True`
            entries enter the range statistics, and the `False` entries are replaced by
            the range minimum (by `masked_value` when `quantize=False`) — how padded
            attention keys are masked in int8.
        training: bool, update the range.

    Returns:
        A tensor like `inputs`, fake-quantized (or passed through when `quantize=False`).

    Example:
    >>> quantizer = ActivationQuantizer()
    >>> y = quantizer(np.array([[-1.0, 0.5, 3.0]], "float32"), training=True)
    >>> float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy())
    (-1.0, 3.0)
    >>> [round(float(v), 4) for v in keras.ops.convert_to_numpy(y)[0]]  # nudged: 0 is a code
    [-1.0039, 0.502, 2.9961]
    """

    def __init__(self, decay=0.999, fixed_range=None, mask_margin=12.0, masked_value=-1e9,
                 quantize=True, **kwargs):
        _check_decay(decay)
        fixed_range = _check_fixed_range(fixed_range)
        check_number("mask_margin", mask_margin, low=0,
                     meaning="nats between the real scores and the masked ones")
        check_number("masked_value", masked_value)
        check_bool("quantize", quantize)
        super().__init__(**kwargs)
        self.supports_masking = True  # elementwise: the Keras mask passes through
        self.decay = float(decay)
        self.fixed_range = fixed_range
        self.mask_margin = float(mask_margin)
        self.masked_value = float(masked_value)
        self.quantize = quantize
        # Set by `calibrate_model`: update ranges in inference mode (no dropout).
        self.calibrating = False
        # Set by `freeze_model_ranges` for export: the range as Python floats. The
        # TFLite converter turns a FakeQuant into int8 scales only when its min/max fold
        # to constants; variable reads did not always fold (measured: "FakeQuant... is
        # neither a custom op nor a flex op" from the second block on).
        self.frozen_range = None

    def build(self, inputs_shape, stats_mask_shape=None):
        low, high = self.fixed_range or (0.0, 0.0)
        # aggregation="mean": under tf.distribute each replica's update is averaged over
        # the replicas, so all keep one range. With the default ("none") every replica
        # kept the EMA of its own batches and the workers of one run disagreed.
        self.min_value = self.add_weight(
            name="min_value", shape=(), initializer=keras.initializers.Constant(low),
            trainable=False, autocast=False, aggregation="mean",
        )
        self.max_value = self.add_weight(
            name="max_value", shape=(), initializer=keras.initializers.Constant(high),
            trainable=False, autocast=False, aggregation="mean",
        )
        self.initialized = self.add_weight(
            name="initialized", shape=(),
            initializer=keras.initializers.Constant(1.0 if self.fixed_range else 0.0),
            trainable=False, autocast=False, aggregation="mean",
        )
        self.built = True

    def call(self, inputs, stats_mask=None, training=None):
        x = ops.cast(inputs, "float32")
        if (training or self.calibrating) and self.fixed_range is None:
            self._update_range(x, stats_mask)
        low, high = self.frozen_range or (self.min_value, self.max_value)
        if stats_mask is not None:
            low = low - self.mask_margin
            stats_mask = ops.cast(stats_mask, "bool")
            x = ops.where(stats_mask, x, low if self.quantize else self.masked_value)
        if self.quantize:
            x = keras.quantizers.fake_quant_with_min_max_vars(x, low, high, num_bits=8)
        return ops.cast(x, inputs.dtype)

    def step(self):
        """The width of one int8 code of the current range, `(max - min) / 255`."""
        low, high = self.frozen_range or (self.min_value, self.max_value)
        return (high - low) / 255.0

    def _update_range(self, x, stats_mask):
        if stats_mask is None:
            batch_min, batch_max = ops.min(x), ops.max(x)
        else:
            stats_mask = ops.broadcast_to(ops.cast(stats_mask, "bool"), ops.shape(x))
            # Large finite fillers rather than +-inf: the result is the same, and the graph
            # stays clean for tf.debugging.enable_check_numerics.
            batch_min = ops.min(ops.where(stats_mask, x, 1e30))
            batch_max = ops.max(ops.where(stats_mask, x, -1e30))
        # Zero is kept inside the range so that it has an exact int8 code (zero point).
        batch_min = ops.minimum(batch_min, 0.0)
        batch_max = ops.maximum(batch_max, 0.0)
        started = ops.greater(self.initialized, 0.5)
        if self.calibrating:
            # Calibration sees a few batches: the running min/max (an EMA would keep
            # the first batch's range and clip later outliers).
            new_min = ops.minimum(self.min_value, batch_min)
            new_max = ops.maximum(self.max_value, batch_max)
        else:
            d = self.decay
            new_min = d * self.min_value + (1.0 - d) * batch_min
            new_max = d * self.max_value + (1.0 - d) * batch_max
        self.min_value.assign(ops.where(started, new_min, batch_min))
        self.max_value.assign(ops.where(started, new_max, batch_max))
        self.initialized.assign(1.0)

    def compute_output_shape(self, inputs_shape, stats_mask_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            decay=self.decay,
            fixed_range=self.fixed_range,
            mask_margin=self.mask_margin,
            masked_value=self.masked_value,
            quantize=self.quantize,
        )
        return config
