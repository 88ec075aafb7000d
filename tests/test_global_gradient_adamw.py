"""GlobalGradientAdamW without a strategy, its accumulation fix, and the no-decay rule.

The distributed half (replicas all-reduce before clipping/accumulating) is exercised end
to end in tests/test_trainer.py (Mirrored and two-worker runs against one device).
"""

import dataclasses

import keras
import numpy as np
import pytest

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.runs.training_config import TrainingConfig
from keras_attn.training.global_gradient_adamw import GlobalGradientAdamW
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.optimizer import no_decay_variables
from keras_attn.training.warmup_decay_schedule import WarmupDecaySchedule

pytestmark = pytest.mark.tensorflow

SHAPES = [(3, 4), (4,), (2, 2, 3)]


def make_variables(seed=0):
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(size=shape).astype("float32"), name=f"v{i}")
            for i, shape in enumerate(SHAPES)]


def dyadic_gradients(rng, scale=1.0):
    """Gradients with values k/8, |k| <= 40: sums of up to 4 of them and their means
    (division by 2 or 4) are exact in float32, so accumulating in any order gives the
    same bits as the mean computed in numpy."""
    return [(rng.integers(-40, 41, size=shape) / 8.0 * scale).astype("float32")
            for shape in SHAPES]


def run(optimizer, gradient_steps, seed=0):
    variables = make_variables(seed)
    for grads in gradient_steps:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [np.asarray(v.numpy()) for v in variables]


def assert_bitwise_equal(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def schedule(total=6, warmup=2):
    return WarmupDecaySchedule(1e-2, total_steps=total, warmup_steps=warmup)


# --- (a) without a strategy it is keras.optimizers.AdamW ------------------------------------


@pytest.mark.parametrize("learning_rate", [3e-3, "schedule"])
@pytest.mark.parametrize("global_clipnorm", [None, 1.0])
def test_equals_keras_adamw_bit_for_bit(learning_rate, global_clipnorm):
    rng = np.random.default_rng(1)
    # Large gradients (norms around 10-50), so the 1.0 clip is active on every step.
    steps = [dyadic_gradients(rng, scale=4.0) for _ in range(5)]

    def arguments():
        rate = schedule() if learning_rate == "schedule" else learning_rate
        return dict(learning_rate=rate, weight_decay=0.05, beta_1=0.8, beta_2=0.99,
                    epsilon=1e-6, global_clipnorm=global_clipnorm)

    ours = GlobalGradientAdamW(**arguments())
    reference = keras.optimizers.AdamW(**arguments())
    ours_weights = run(ours, steps)
    reference_weights = run(reference, steps)
    assert_bitwise_equal(ours_weights, reference_weights)
    assert int(ours.iterations) == int(reference.iterations) == 5
    # The run did move the weights (and differently with and without the clip).
    assert max(float(np.max(np.abs(a - b))) for a, b in
               zip(ours_weights, make_variables())) > 1e-3


def test_clipping_is_by_the_global_norm():
    # One Adam step moves each coordinate by lr * sign(g) whatever the scale of g, so
    # the clip is checked on the second moment instead: v = (1 - beta_2) g_clipped^2.
    gradient = np.array([30.0, 40.0], "float32")  # norm 50 -> clipped to norm 1
    optimizer = GlobalGradientAdamW(learning_rate=1e-3, global_clipnorm=1.0, beta_2=0.5)
    variable = keras.Variable([1.0, 2.0])
    optimizer.apply([keras.ops.convert_to_tensor(gradient)], [variable])
    velocity = [v for v in optimizer.variables if "velocity" in v.path]
    np.testing.assert_allclose(velocity[0].numpy(), 0.5 * (gradient / 50.0) ** 2, rtol=1e-6)


# --- (b) gradient accumulation with a schedule -------------------------------------------


def accumulated_and_mean_steps(k, updates, seed=2):
    rng = np.random.default_rng(seed)
    micro = [[dyadic_gradients(rng) for _ in range(k)] for _ in range(updates)]
    flat = [grads for update in micro for grads in update]
    means = [[np.mean(np.stack(parts), axis=0, dtype=np.float64).astype("float32")
              for parts in zip(*update)] for update in micro]
    return flat, means


@pytest.mark.parametrize("k", [2, 4])
def test_k_micro_steps_equal_one_step_on_the_mean_gradient(k):
    updates = 4
    flat, means = accumulated_and_mean_steps(k, updates)
    common = dict(weight_decay=0.05, global_clipnorm=2.0, epsilon=1e-6)
    accumulating = GlobalGradientAdamW(learning_rate=schedule(total=updates, warmup=1),
                                       gradient_accumulation_steps=k, **common)
    one_step = GlobalGradientAdamW(learning_rate=schedule(total=updates, warmup=1), **common)
    accumulated = run(accumulating, flat)
    reference = run(one_step, means)
    assert_bitwise_equal(accumulated, reference)
    assert int(accumulating.iterations) == int(one_step.iterations) == updates
    # The learning rate the optimizer reports is the schedule's at the update count.
    assert float(accumulating.learning_rate) == float(one_step.learning_rate)


@pytest.mark.parametrize("k", [2, 4])
def test_keras_adamw_accumulation_evaluates_the_schedule_at_micro_steps(k):
    """Documents the Keras 3.15 bug GlobalGradientAdamW fixes.

    keras.optimizers.AdamW(gradient_accumulation_steps=k) calls the schedule with the
    micro-step counter: update u uses lr(k u + k - 1) instead of lr(u). Reproduced here
    exactly with a non-accumulating AdamW whose rate is set to lr(k u + k - 1) by hand.
    """
    updates = 3
    flat, means = accumulated_and_mean_steps(k, updates)
    rates = schedule(total=updates, warmup=1)
    common = dict(weight_decay=0.05, epsilon=1e-6)
    keras_accumulating = keras.optimizers.AdamW(learning_rate=rates,
                                                gradient_accumulation_steps=k, **common)
    keras_weights = run(keras_accumulating, flat)
    correct = run(GlobalGradientAdamW(learning_rate=rates, **common), means)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(keras_weights, correct)) > 1e-4

    wrong_steps = keras.optimizers.AdamW(learning_rate=1.0, **common)
    variables = make_variables()
    for u, grads in enumerate(means):
        wrong_steps.learning_rate = float(rates(k * u + k - 1))
        wrong_steps.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    assert_bitwise_equal(keras_weights, [np.asarray(v.numpy()) for v in variables])
    # With warm-up 1 over 3 updates, update 1 should use lr(1) = 1e-2 but gets lr(2k - 1),
    # which is 0 (the schedule has ended) for k >= 2.
    assert float(rates(1)) == pytest.approx(1e-2) and float(rates(2 * k - 1)) == 0.0


def test_one_update_linear_schedule_is_not_zero():
    # The measurement quoted in the docstring: a one-update linear schedule with
    # accumulation applies rate 0 in Keras, and the peak rate here.
    rates = WarmupDecaySchedule(1e-2, total_steps=1, warmup_steps=0)
    gradient = [np.ones(shape, "float32") for shape in SHAPES]
    start = make_variables()
    ours = run(GlobalGradientAdamW(learning_rate=rates, gradient_accumulation_steps=2,
                                   weight_decay=0.0), [gradient, gradient])
    theirs = run(keras.optimizers.AdamW(learning_rate=rates, gradient_accumulation_steps=2,
                                        weight_decay=0.0), [gradient, gradient])
    for before, mine, keras_result in zip(start, ours, theirs):
        np.testing.assert_array_equal(keras_result, before.numpy())  # lr(1) = 0: no move
        # Adam's first step moves by lr * g / (|g| + eps) = 1e-2 against the gradient
        # (up to the float32 rounding of weights of order 1).
        np.testing.assert_allclose(before.numpy() - mine, 1e-2, atol=5e-7, rtol=0)


# --- (c) no decay on biases and LayerNorm --------------------------------------------------


def tiny_classifier(fused_qkv, num_layers=2):
    backbone = BertBackbone(vocabulary_size=30, num_layers=num_layers, num_heads=2,
                            hidden_dim=8, intermediate_dim=16, max_sequence_length=8,
                            fused_qkv=fused_qkv)
    return BertClassifier(backbone, num_classes=3)


def expected_no_decay(model):
    """Biases and LayerNorm gamma/beta, gathered from the layers' own attributes."""
    backbone = model.backbone
    norm = backbone.get_layer("embeddings_layer_norm")
    found = [norm.gamma, norm.beta]
    for block in backbone.transformer_layers:
        attention = block.self_attention
        if attention.fused_qkv:
            found.append(attention.qkv_bias)
        else:
            found += [attention.query_dense.bias, attention.key_dense.bias,
                      attention.value_dense.bias]
        found.append(attention.output_dense.bias)
        for name in ("self_attention_layer_norm", "feedforward_layer_norm"):
            found += [getattr(block, name).gamma, getattr(block, name).beta]
        for name in ("feedforward_intermediate_dense", "feedforward_output_dense"):
            found.append(getattr(block, name).bias)
    found.append(backbone.get_layer("pooled_dense").bias)
    found.append(model.get_layer("logits").bias)
    return found


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_no_decay_variables_are_exactly_biases_and_layer_norms(fused_qkv):
    model = tiny_classifier(fused_qkv)
    expected = expected_no_decay(model)
    # Per block: Q/K/V biases (1 fused or 3), attention output bias, 2 LayerNorms x 2,
    # 2 feed-forward biases; plus the embedding LayerNorm (2), pooler and logits biases.
    per_block = (1 if fused_qkv else 3) + 1 + 4 + 2
    assert len(expected) == 2 + 2 * per_block + 2
    got = no_decay_variables(model)
    assert sorted(v.path for v in got) == sorted(v.path for v in expected)
    assert {id(v) for v in got} == {id(v) for v in expected}
    assert len(got) == len(expected)  # no duplicates


def test_weight_decay_skips_biases_and_layer_norms():
    model = tiny_classifier(fused_qkv=True)
    config = TrainingConfig.from_dict(
        {"task": "classification", "data": {"train": "t.tsv"}, "model": {"preset": "x"},
         "train": {"learning_rate": 0.1, "weight_decay": 0.5, "warmup_steps": 0,
                   "clipnorm": None}})
    optimizer = make_optimizer(config.train, total_steps=10, model=model)
    variables = model.trainable_variables
    before = [np.asarray(v.numpy()) for v in variables]
    # Zero gradients: Adam's step is 0/(0 + eps) = 0, only the decay moves weights.
    optimizer.apply([keras.ops.zeros(v.shape) for v in variables], variables)
    excluded = {id(v) for v in expected_no_decay(model)}
    lr, wd = np.float32(0.1), np.float32(0.5)
    decayed = 0
    for variable, old in zip(variables, before):
        new = np.asarray(variable.numpy())
        if id(variable) in excluded:
            np.testing.assert_array_equal(new, old, err_msg=variable.path)
        else:
            np.testing.assert_allclose(new, old - old * wd * lr, rtol=1e-6,
                                       err_msg=variable.path)
            assert np.max(np.abs(new)) < np.max(np.abs(old))
            decayed += 1
    # Decayed: 3 embedding tables, per block the fused QKV and output kernels and the
    # two feed-forward kernels, the pooler and logits kernels.
    assert decayed == 3 + 2 * 4 + 2


def test_make_optimizer_maps_the_config():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
    config = TrainingConfig.from_dict(
        {"task": "classification", "data": {"train": "t.tsv"}, "model": {"preset": "x"},
         "train": {"learning_rate": 1e-3, "warmup_ratio": 0.25, "decay": "cosine",
                   "end_learning_rate_ratio": 0.1, "beta_1": 0.8, "beta_2": 0.95,
                   "epsilon": 1e-7, "clipnorm": 0.5, "gradient_accumulation_steps": 3}})
    optimizer = make_optimizer(config.train, total_steps=8, model=model)
    assert isinstance(optimizer, GlobalGradientAdamW)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.8, 0.95, 1e-7)
    assert optimizer.global_clipnorm == 0.5 and optimizer.gradient_accumulation_steps == 3
    rates = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    assert rates.get_config() == {"peak_learning_rate": 1e-3, "total_steps": 8,
                                  "warmup_steps": 2, "decay": "cosine",
                                  "end_learning_rate": pytest.approx(1e-4)}
    train = dataclasses.replace(config.train, gradient_accumulation_steps=1, clipnorm=None,
                                mixed_precision="mixed_float16")
    wrapped = make_optimizer(train, total_steps=8, model=model)
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    inner = wrapped.inner_optimizer
    assert inner.gradient_accumulation_steps is None and inner.global_clipnorm is None


def test_serialization_round_trip():
    optimizer = GlobalGradientAdamW(learning_rate=schedule(), weight_decay=0.01,
                                    global_clipnorm=1.0, gradient_accumulation_steps=2)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, GlobalGradientAdamW)
    assert restored.get_config() == optimizer.get_config()
