"""`ModelConfig`: the config is the constructor's named arguments, and it round-trips."""

import keras
import numpy as np
import pytest

from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models.model_config import ModelConfig


def tiny_bert(**kwargs):
    return BertBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=4,
                        intermediate_dim=8, max_sequence_length=8, **kwargs)


@keras.saving.register_keras_serializable(package="test_model_config")
class _Scaled(ModelConfig, keras.Model):
    def __init__(self, units, scale=2.0, *, inner=None, **kwargs):
        inputs = keras.Input((3,))
        outputs = keras.layers.Dense(units)(inputs) * scale
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.units = units
        self.scale = scale
        self.inner = inner


@keras.saving.register_keras_serializable(package="test_model_config")
class _Forgetful(ModelConfig, keras.Model):
    def __init__(self, units, **kwargs):
        inputs = keras.Input((3,))
        super().__init__(inputs=inputs, outputs=keras.layers.Dense(units)(inputs), **kwargs)


def test_config_is_the_named_arguments_plus_name_trainable_dtype():
    config = _Scaled(4, scale=0.5, name="scaled", trainable=False).get_config()
    assert config == {
        "name": "scaled", "trainable": False,
        "dtype": keras.dtype_policies.serialize(keras.dtype_policies.get("float32")),
        "units": 4, "scale": 0.5, "inner": None,
    }
    assert _Scaled.config_arguments() == ("units", "scale", "inner")


def test_nested_model_and_dtype_policy_round_trip():
    model = _Scaled(2, inner=tiny_bert(dropout=0.3, dtype="mixed_bfloat16"), name="outer")
    config = model.get_config()
    assert config["inner"]["class_name"] == "BertBackbone"
    clone = _Scaled.from_config(config)
    assert isinstance(clone.inner, BertBackbone)
    assert clone.inner.dropout == 0.3
    assert clone.inner.dtype_policy.name == "mixed_bfloat16"
    assert clone.inner.get_layer("pooled_dense").dtype_policy.name == "mixed_bfloat16"
    assert clone.get_config() == config


def test_task_model_round_trip_keeps_the_outputs_after_set_weights():
    model = BertClassifier(tiny_bert(), num_classes=3, dropout=0.2, name="clf")
    clone = BertClassifier.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    x = {"token_ids": np.array([[2, 5, 7, 0]]), "segment_ids": np.zeros((1, 4), "int32"),
         "padding_mask": np.array([[1, 1, 1, 0]])}
    np.testing.assert_allclose(clone(x), model(x), atol=1e-6)
    assert clone.name == "clf" and clone.dropout == 0.2


def test_an_argument_not_stored_is_named():
    with pytest.raises(AttributeError, match=r"takes `units` but does not store it"):
        _Forgetful(2).get_config()


@keras.saving.register_keras_serializable(package="test_model_config")
class _Stored(ModelConfig, keras.Model):
    def __init__(self, units, scale=2.0, **kwargs):
        inputs = keras.Input((3,))
        outputs = keras.layers.Dense(units)(inputs) * scale
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self.store_arguments(locals())


def test_store_arguments_sets_each_named_argument_from_locals():
    model = _Stored(3, scale=0.25, name="stored")
    assert (model.units, model.scale) == (3, 0.25)
    assert _Stored.from_config(model.get_config()).get_config() == model.get_config()


def test_store_arguments_names_a_missing_value():
    model = _Stored(3)
    with pytest.raises(KeyError, match=r"needs the value of `scale`.*Received: \['units'\]"):
        model.store_arguments({"units": 3})
