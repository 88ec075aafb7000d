"""AdamW for Transformers: warm-up/decay schedule, no decay on biases and LayerNorm,
global-norm clipping, gradient accumulation and (for float16) loss scaling."""

import keras

from keras_attn.training.global_gradient_adamw import GlobalGradientAdamW
from keras_attn.training.warmup_decay_schedule import WarmupDecaySchedule


def no_decay_variables(model):
    """The variables AdamW must not decay: biases and normalization scales/offsets.

    BERT's optimizer (and transformers' `Trainer`) exclude every variable whose name has
    `bias` or belongs to a LayerNorm. Keras names a normalization layer's variables `gamma`
    and `beta` and every bias `bias` (or `*_bias`, like Transformer-XL's `content_bias`),
    so the rule reads the variable names.
    """
    return [
        v for v in model.trainable_variables
        if "bias" in v.name or v.name in ("gamma", "beta")
    ]


def make_optimizer(train_config, total_steps, model):
    """The AdamW optimizer of a training run.

    Args:
        train_config: the `train` section of a `TrainingConfig`.
        total_steps: int, optimizer updates of the whole run (for the schedule).
        model: the model, whose biases and normalization variables get no weight decay.

    Returns:
        A `keras.optimizers.AdamW` (wrapped in `LossScaleOptimizer` under `mixed_float16`),
        not yet built.
    """
    warmup = train_config.warmup_steps
    if warmup is None:
        warmup = int(round(train_config.warmup_ratio * total_steps))
    schedule = WarmupDecaySchedule(
        train_config.learning_rate,
        total_steps=max(1, total_steps),
        warmup_steps=min(warmup, total_steps),
        decay=train_config.decay,
        end_learning_rate=train_config.learning_rate * train_config.end_learning_rate_ratio,
    )
    accumulation = train_config.gradient_accumulation_steps
    optimizer = GlobalGradientAdamW(
        learning_rate=schedule,
        weight_decay=train_config.weight_decay,
        beta_1=train_config.beta_1,
        beta_2=train_config.beta_2,
        epsilon=train_config.epsilon,
        global_clipnorm=train_config.clipnorm or None,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
    )
    optimizer.exclude_from_weight_decay(var_list=no_decay_variables(model))
    if train_config.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
