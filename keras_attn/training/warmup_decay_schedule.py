"""Linear warm-up followed by linear, cosine, inverse-square-root or no decay."""

import math

import keras
from keras import ops

from keras_attn.layers.validation import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class WarmupDecaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The learning-rate schedule of BERT fine-tuning (Devlin et al., 2019, App. A.2).

    With peak rate `lr`, `W` warm-up steps, `N` total steps and end rate `lr_end`:

        lr(t) = lr * (t + 1) / W                                         t < W
        lr(t) = lr_end + (lr - lr_end) * (1 - p)                         linear
        lr(t) = lr_end + (lr - lr_end) * (1 + cos(pi p)) / 2             cosine
        lr(t) = lr                                                       constant
        lr(t) = lr * sqrt(W / (t + 1))                                   inverse_sqrt
        with p = min(1, (t - W) / max(1, N - W))

    The first update already uses `lr / W` (not 0), so no step is wasted.

    `inverse_sqrt` is the Transformer's schedule (Vaswani et al., 2017, §5.3):
    `d^-0.5 * min(s^-0.5, s * W^-1.5)` with `s = t + 1` is the above with
    `lr = (d * W)^-0.5`; it ignores `N` and `lr_end`.

    Args:
        peak_learning_rate: float > 0.
        total_steps: int >= 1, number of optimizer updates of the run.
        warmup_steps: int >= 0.
        decay: `"linear"`, `"cosine"`, `"constant"` or `"inverse_sqrt"`.
        end_learning_rate: float >= 0, the rate at `total_steps`. Defaults to `0.0`.

    Example:
    >>> schedule = WarmupDecaySchedule(1.0, total_steps=10, warmup_steps=4)
    >>> [round(float(schedule(step)), 3) for step in (0, 3, 4, 7, 10)]
    [0.25, 1.0, 1.0, 0.5, 0.0]
    """

    def __init__(self, peak_learning_rate, total_steps, warmup_steps, decay="linear",
                 end_learning_rate=0.0):
        if not peak_learning_rate > 0:
            raise ValueError(f"`peak_learning_rate` must be > 0. "
                             f"Received: peak_learning_rate={peak_learning_rate}")
        check_positive_int("total_steps", total_steps)
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"`warmup_steps` must be an int >= 0. "
                             f"Received: warmup_steps={warmup_steps!r}")
        if decay not in ("linear", "cosine", "constant", "inverse_sqrt"):
            raise ValueError("`decay` must be 'linear', 'cosine', 'constant' or "
                             "'inverse_sqrt'. "
                             f"Received: decay={decay!r}")
        if not 0 <= end_learning_rate <= peak_learning_rate:
            raise ValueError("`end_learning_rate` must be in [0, peak_learning_rate]. "
                             f"Received: end_learning_rate={end_learning_rate}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.total_steps = total_steps
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak, end = self.peak_learning_rate, self.end_learning_rate
        warmup = peak * (step + 1.0) / max(1, self.warmup_steps)
        progress = ops.clip(
            (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps), 0.0, 1.0
        )
        if self.decay == "linear":
            decayed = end + (peak - end) * (1.0 - progress)
        elif self.decay == "cosine":
            decayed = end + (peak - end) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        elif self.decay == "inverse_sqrt":
            decayed = peak * ops.sqrt(max(1, self.warmup_steps) / (step + 1.0))
        else:
            decayed = ops.convert_to_tensor(peak, "float32") + 0.0 * step
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "end_learning_rate": self.end_learning_rate,
        }
