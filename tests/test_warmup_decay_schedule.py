"""WarmupDecaySchedule against a numpy transcription of its docstring formula."""

import math

import keras
import numpy as np
import pytest

from keras_attn.training.warmup_decay_schedule import WarmupDecaySchedule


def numpy_schedule(step, peak, total, warmup, decay, end=0.0):
    """The docstring's formula, written independently in float64.

        lr(t) = lr * (t + 1) / W                                 t < W
        lr(t) = lr_end + (lr - lr_end) * (1 - p)                 linear
        lr(t) = lr_end + (lr - lr_end) * (1 + cos(pi p)) / 2     cosine
        lr(t) = lr                                               constant
        p = min(1, (t - W) / max(1, N - W))
    """
    t = np.asarray(step, np.float64)
    p = np.clip((t - warmup) / max(1, total - warmup), 0.0, 1.0)
    if decay == "linear":
        decayed = end + (peak - end) * (1.0 - p)
    elif decay == "cosine":
        decayed = end + (peak - end) * (1.0 + np.cos(np.pi * p)) / 2.0
    else:
        decayed = np.full_like(t, peak)
    return np.where(t < warmup, peak * (t + 1.0) / max(1, warmup), decayed)


def values(schedule, steps):
    return np.array([float(schedule(step)) for step in steps])


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("total, warmup, end", [(20, 5, 0.0), (20, 5, 1e-4), (7, 0, 0.0),
                                                (10, 10, 0.0), (3, 1, 2e-4)])
def test_values_match_the_formula(decay, total, warmup, end):
    peak = 5e-4
    schedule = WarmupDecaySchedule(peak, total_steps=total, warmup_steps=warmup, decay=decay,
                                   end_learning_rate=end)
    steps = np.arange(0, total + 4)  # past the end: stays at the end rate
    np.testing.assert_allclose(values(schedule, steps),
                               numpy_schedule(steps, peak, total, warmup, decay, end),
                               rtol=1e-6, atol=1e-12)


def test_hand_computed_points():
    linear = WarmupDecaySchedule(1.0, total_steps=10, warmup_steps=4)
    # Warm-up 1/4, 2/4, 3/4, 4/4; then p = (t - 4) / 6.
    np.testing.assert_allclose(values(linear, [0, 1, 2, 3, 4, 7, 10, 13]),
                               [0.25, 0.5, 0.75, 1.0, 1.0, 0.5, 0.0, 0.0], atol=1e-6)
    cosine = WarmupDecaySchedule(2.0, total_steps=6, warmup_steps=2, decay="cosine",
                                 end_learning_rate=1.0)
    # p = 0, 1/4, 1/2, 3/4, 1 at t = 2..6: 1 + (1 + cos(pi p)) / 2.
    expected = [1 + (1 + math.cos(math.pi * k / 4)) / 2 for k in range(5)]
    np.testing.assert_allclose(values(cosine, range(2, 7)), expected, rtol=1e-6)
    constant = WarmupDecaySchedule(3.0, total_steps=5, warmup_steps=3, decay="constant")
    np.testing.assert_allclose(values(constant, range(7)), [1, 2, 3, 3, 3, 3, 3], rtol=1e-6)


def test_inverse_sqrt_is_the_transformer_schedule():
    # Vaswani et al. (2017), eq. 3: lrate = d^-0.5 * min(s^-0.5, s * W^-1.5), s = t + 1.
    d_model, warmup = 512, 4000
    schedule = WarmupDecaySchedule((d_model * warmup) ** -0.5, total_steps=10,
                                   warmup_steps=warmup, decay="inverse_sqrt")
    steps = np.array([0, 1, 999, 3998, 3999, 4000, 10000, 100000])
    s = steps + 1.0
    paper = d_model ** -0.5 * np.minimum(s ** -0.5, s * warmup ** -1.5)
    np.testing.assert_allclose(values(schedule, steps), paper, rtol=1e-5)


def test_no_warmup_starts_at_the_peak_and_ends_at_the_end_rate():
    schedule = WarmupDecaySchedule(1e-3, total_steps=4, warmup_steps=0,
                                   end_learning_rate=1e-4)
    np.testing.assert_allclose(values(schedule, range(6)),
                               [1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4], rtol=1e-6)


def test_first_update_is_not_wasted():
    for warmup in (1, 3, 100):
        schedule = WarmupDecaySchedule(1.0, total_steps=200, warmup_steps=warmup)
        assert float(schedule(0)) == pytest.approx(1.0 / warmup)


def test_accepts_tensor_and_variable_steps():
    schedule = WarmupDecaySchedule(1.0, total_steps=10, warmup_steps=4)
    step = keras.Variable(7, dtype="int64", trainable=False)
    assert float(schedule(step)) == pytest.approx(0.5)
    assert float(schedule(keras.ops.convert_to_tensor(2))) == pytest.approx(0.75)


@pytest.mark.parametrize("kwargs, message", [
    (dict(peak_learning_rate=0.0), r"`peak_learning_rate` must be > 0\. "
                                   r"Received: peak_learning_rate=0\.0"),
    (dict(peak_learning_rate=-1e-3), r"Received: peak_learning_rate=-0\.001"),
    (dict(total_steps=0), r"`total_steps` must be a positive integer\. Received: total_steps=0"),
    (dict(total_steps=2.5), r"Received: total_steps=2\.5"),
    (dict(warmup_steps=-1), r"`warmup_steps` must be an int >= 0\. Received: warmup_steps=-1"),
    (dict(warmup_steps=1.5), r"Received: warmup_steps=1\.5"),
    (dict(decay="step"), r"`decay` must be 'linear', 'cosine', 'constant' or 'inverse_sqrt'\. "
                         r"Received: decay='step'"),
    (dict(end_learning_rate=2e-3), r"`end_learning_rate` must be in \[0, peak_learning_rate\]\. "
                                   r"Received: end_learning_rate=0\.002"),
    (dict(end_learning_rate=-1e-6), r"Received: end_learning_rate=-1e-06"),
])
def test_validation(kwargs, message):
    arguments = dict(peak_learning_rate=1e-3, total_steps=10, warmup_steps=2)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        WarmupDecaySchedule(**arguments)


def test_get_config_round_trip():
    schedule = WarmupDecaySchedule(3e-4, total_steps=50, warmup_steps=5, decay="cosine",
                                   end_learning_rate=3e-5)
    config = schedule.get_config()
    assert config == {"peak_learning_rate": 3e-4, "total_steps": 50, "warmup_steps": 5,
                      "decay": "cosine", "end_learning_rate": 3e-5}
    clone = WarmupDecaySchedule.from_config(config)
    steps = np.arange(60)
    np.testing.assert_array_equal(values(clone, steps), values(schedule, steps))
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule))
    assert isinstance(restored, WarmupDecaySchedule)
    assert restored.get_config() == config


def test_serialized_inside_a_compiled_optimizer(tmp_path):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(inputs))
    schedule = WarmupDecaySchedule(1e-2, total_steps=8, warmup_steps=2, decay="cosine",
                                   end_learning_rate=1e-3)
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=schedule), loss="mse")
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 2), "float32")
    model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    optimizer = loaded.optimizer
    restored = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    assert isinstance(restored, WarmupDecaySchedule)
    assert restored.get_config() == schedule.get_config()
    assert int(optimizer.iterations) == 3
    # The loaded optimizer's current rate is the schedule at step 3.
    expected = numpy_schedule(3, 1e-2, 8, 2, "cosine", 1e-3)
    assert float(optimizer.learning_rate) == pytest.approx(float(expected), rel=1e-6)
