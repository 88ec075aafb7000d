"""The quantization recipe: its defaults are the measured best, and every front end (config,
command line, results script) reads the one declaration."""

import argparse

import pytest

from keras_attn.training.config import TrainingConfig
from keras_attn.training.quantization_recipe import QuantizationRecipe


def parse(*flags):
    parser = argparse.ArgumentParser()
    QuantizationRecipe.add_arguments(parser)
    return QuantizationRecipe.from_arguments(parser.parse_args(list(flags)))


def test_defaults_are_the_measured_recipe():
    recipe = QuantizationRecipe()
    assert recipe.layout() == {"float_residual": True, "feedforward_float_channels": 4}
    assert recipe.qat_epochs == 0 and recipe.calibration_examples == 128
    assert QuantizationRecipe.all_int8().layout() == {"float_residual": False,
                                                      "feedforward_float_channels": 0}


@pytest.mark.parametrize("recipe", [
    QuantizationRecipe(), QuantizationRecipe.all_int8(), QuantizationRecipe(qat_epochs=2),
    QuantizationRecipe.all_int8(qat_epochs=1, qat_learning_rate=2e-5, qat_max_steps=40),
    QuantizationRecipe(feedforward_float_channels=0, calibration_examples=64),
])
def test_flags_and_dicts_round_trip(recipe):
    assert parse(*recipe.to_flags()) == recipe
    assert QuantizationRecipe.from_dict(recipe.to_dict()) == recipe


def test_command_line_defaults_and_all_int8():
    assert parse() == QuantizationRecipe()
    assert parse("--all-int8").float_residual is False
    with pytest.raises(ValueError, match="needs `float_residual=True`"):
        parse("--all-int8", "--feedforward-float-channels", "2")


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="Received: qat_epochs=-1"):
        QuantizationRecipe(qat_epochs=-1)
    with pytest.raises(ValueError, match="`calibration_examples` must be a positive integer"):
        QuantizationRecipe(calibration_examples=0)
    with pytest.raises(ValueError, match="`qat_learning_rate`"):
        QuantizationRecipe(qat_learning_rate=0.0)
    with pytest.raises(ValueError, match="unknown quantization setting 'qat_epoch'"):
        QuantizationRecipe.from_dict({"qat_epoch": 1})


def test_training_config_reads_the_recipe_defaults():
    values = {"task": "classification", "data": {"train": "t.tsv"},
              "model": {"preset": "bert_tiny", "quantization_aware": True}}
    model = TrainingConfig.from_dict(values).model
    assert (model.float_residual, model.feedforward_float_channels) == (True, 4)
    # Recorded configs (every key written) read back unchanged, QAT or not.
    values["model"] = {"preset": "bert_tiny"}
    config = TrainingConfig.from_dict(values)
    assert TrainingConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
