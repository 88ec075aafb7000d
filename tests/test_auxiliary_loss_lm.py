"""AuxiliaryLossLM (Al-Rfou et al., 2018): the fade-out schedule and the three losses
against numpy; per-layer position embeddings of GPTBackbone."""

import keras
import numpy as np
import pytest

from keras_attn.models.auxiliary_loss_lm import AuxiliaryLossLM
from keras_attn.models.auxiliary_loss_lm import intermediate_loss_weights
from keras_attn.models.gpt_backbone import GPTBackbone
from keras_attn.models.gpt_causal_lm import GPTCausalLM


def tiny_lm(num_layers=3, layer_position_embeddings=False, seed=0):
    keras.utils.set_random_seed(seed)
    return GPTCausalLM(GPTBackbone(
        vocabulary_size=11, num_layers=num_layers, num_heads=2, hidden_dim=8,
        intermediate_dim=16, max_sequence_length=8, dropout=0.0,
        layer_position_embeddings=layer_position_embeddings))


def numpy_schedule(progress, num_layers):
    # Al-Rfou et al. §3.2: layer l's loss is dropped after l / (2L) of training.
    return [1.0 if progress < layer / (2 * num_layers) else 0.0
            for layer in range(1, num_layers)]


@pytest.mark.parametrize("progress", [0.0, 0.1, 0.125, 0.2, 0.3, 0.374, 0.5, 0.9])
def test_schedule_matches_the_paper(progress):
    np.testing.assert_array_equal(intermediate_loss_weights(progress, 4),
                                  numpy_schedule(progress, 4))


def test_two_layer_figure_three():
    # Paper, Figure 3: with two layers the intermediate loss is gone after 25 % of training.
    assert intermediate_loss_weights(0.249, 2).tolist() == [1.0]
    assert intermediate_loss_weights(0.25, 2).tolist() == [0.0]


def numpy_ce(logits, targets):
    logits = np.asarray(logits, "float64")
    log_z = np.logaddexp.reduce(logits, axis=-1)
    return log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


@pytest.mark.parametrize("step", [0, 3, 5])  # both layers, layer 2 only, none
def test_loss_against_numpy(step):
    total_updates = 12  # L = 3: layer 1 counts below step 2, layer 2 below step 4
    model = AuxiliaryLossLM(tiny_lm(), intermediate_layer_losses=True, future_targets=2,
                            total_updates=total_updates)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(step)
    rng = np.random.default_rng(1)
    x = {"token_ids": rng.integers(1, 11, (2, 5)).astype("int32"),
         "padding_mask": np.ones((2, 5), "int32")}
    y = rng.integers(1, 11, (2, 5, 3)).astype("int32")
    y[1, 3:, 2] = 0  # past the text: no loss for the second future target
    w = rng.uniform(0.1, 1.0, (2, 5)).astype("float32")
    out = model(x)
    loss = float(model.compute_loss(x, y, out, w))

    to_np = keras.ops.convert_to_numpy
    expected = (numpy_ce(to_np(out["logits"]), y[..., 0]) * w).sum()
    for active, logits in zip(numpy_schedule(step / total_updates, 3), out["layer_logits"]):
        expected += active * (numpy_ce(to_np(logits), y[..., 0]) * w).sum()
    for k, logits in enumerate(out["future_logits"], start=1):
        expected += 0.5 * (numpy_ce(to_np(logits), y[..., k]) * w * (y[..., k] != 0)).sum()
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # The final-layer logits are the plain LM's.
    np.testing.assert_allclose(to_np(out["logits"]), to_np(model.lm(x)), atol=1e-6)


def test_intermediate_heads_read_their_layer():
    model = AuxiliaryLossLM(tiny_lm(), intermediate_layer_losses=True, total_updates=4)
    x = {"token_ids": np.array([[1, 2, 3]], "int32"), "padding_mask": np.ones((1, 3), "int32")}
    block_1 = keras.Model(model.lm.backbone.input,
                          model.lm.backbone.get_layer("transformer_layer_0").output)
    expected = model.layer_heads[0](block_1(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)["layer_logits"][0]),
                               keras.ops.convert_to_numpy(expected), atol=1e-6)
    assert [h.name for h in model.layer_heads] == ["layer_head_1", "layer_head_2"]


def test_without_options_it_is_the_plain_loss():
    model = AuxiliaryLossLM(tiny_lm(), total_updates=4)
    x = {"token_ids": np.array([[1, 2, 3]], "int32"), "padding_mask": np.ones((1, 3), "int32")}
    y = np.array([[2, 3, 4]], "int32")
    out = model(x)
    assert out["layer_logits"] == [] and out["future_logits"] == []
    expected = numpy_ce(keras.ops.convert_to_numpy(out["logits"]), y).mean()
    np.testing.assert_allclose(float(model.compute_loss(x, y, out)), expected, rtol=1e-5)


def test_config_round_trip_and_errors():
    model = AuxiliaryLossLM(tiny_lm(2), intermediate_layer_losses=True, future_targets=1,
                            total_updates=7)
    clone = AuxiliaryLossLM.from_config(model.get_config())
    assert (clone.intermediate_layer_losses, clone.future_targets, clone.total_updates) == (
        True, 1, 7)
    with pytest.raises(ValueError, match="future_targets=-1"):
        AuxiliaryLossLM(tiny_lm(2), future_targets=-1)
    with pytest.raises(ValueError, match="GPTCausalLM"):
        AuxiliaryLossLM(model.lm.backbone)


def test_layer_position_embeddings_are_added_at_every_layer():
    lm = tiny_lm(2, layer_position_embeddings=True)
    backbone = lm.backbone
    plain = tiny_lm(2)
    # Exactly L extra (T, H) tables.
    assert lm.count_params() - plain.count_params() == 2 * 8 * 8
    x = {"token_ids": np.array([[1, 2, 3, 4, 5]], "int32"),
         "padding_mask": np.ones((1, 5), "int32")}
    before = keras.ops.convert_to_numpy(lm(x))
    table = backbone.get_layer("layer_position_embedding_1").embeddings
    table.assign(table + np.random.default_rng(0).normal(size=(8, 8)).astype("float32"))
    assert np.abs(keras.ops.convert_to_numpy(lm(x)) - before).max() > 1e-3
    # Cached decoding adds the same tables.
    cache = lm.build_cache(1, 8)
    first, cache = lm.call_with_cache(x["token_ids"][:, :3], cache, 0)
    second, _ = lm.call_with_cache(x["token_ids"][:, 3:], cache, 3)
    np.testing.assert_allclose(np.concatenate([first, second], 1),
                               keras.ops.convert_to_numpy(lm(x)), atol=1e-5)
    assert GPTBackbone.from_config(backbone.get_config()).layer_position_embeddings
