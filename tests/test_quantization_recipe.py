"""The quantization recipe: its defaults are the measured best, and every front end (config,
command line, results script) reads the one declaration."""

import argparse

import pytest

from keras_attn.cli.flags import add_recipe_flags
from keras_attn.cli.flags import recipe_flags
from keras_attn.cli.flags import recipe_from_arguments
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.training_config import TrainingConfig


def parse(*flags):
    parser = argparse.ArgumentParser()
    add_recipe_flags(parser)
    return recipe_from_arguments(parser.parse_args(list(flags)))


def test_defaults_are_the_measured_recipe():
    recipe = QuantizationRecipe()
    assert recipe.layout() == {"float_residual": True, "feedforward_float_channels": 4}
    assert recipe.qat_epochs == 0 and recipe.calibration_examples == 512
    assert QuantizationRecipe.all_int8().layout() == {"float_residual": False,
                                                      "feedforward_float_channels": 0}


@pytest.mark.parametrize("recipe", [
    QuantizationRecipe(), QuantizationRecipe.all_int8(), QuantizationRecipe(qat_epochs=2),
    QuantizationRecipe.all_int8(qat_epochs=1, qat_learning_rate=2e-5, qat_max_steps=40),
    QuantizationRecipe(feedforward_float_channels=0, calibration_examples=64),
    QuantizationRecipe(max_accuracy_drop=None), QuantizationRecipe(max_accuracy_drop=1.5),
])
def test_flags_and_dicts_round_trip(recipe):
    assert parse(*recipe_flags(recipe)) == recipe
    assert QuantizationRecipe.from_dict(recipe.to_dict()) == recipe


def test_the_default_budget_and_no_budget():
    # The default checks the recipe against a 0.5-point budget, or one held-out example
    # when that is more; `none` turns it off, and the all-int8 recipe has none (its residual
    # stream has no float ops to move).
    assert QuantizationRecipe().max_accuracy_drop == "default" == parse().max_accuracy_drop
    assert QuantizationRecipe().budget_points(872) == 0.5
    assert QuantizationRecipe().budget_points(200) == 0.5
    assert QuantizationRecipe().budget_points(34) == 2.9412  # as the search rounds drops
    assert QuantizationRecipe(max_accuracy_drop=0.5).budget_points(34) == 0.5
    assert QuantizationRecipe(max_accuracy_drop=None).budget_points(34) is None
    assert parse("--max-accuracy-drop", "none").max_accuracy_drop is None
    assert parse("--max-accuracy-drop", "None").max_accuracy_drop is None
    assert parse("--max-accuracy-drop", "0").max_accuracy_drop == 0.0
    assert QuantizationRecipe.all_int8().max_accuracy_drop is None
    assert QuantizationRecipe(float_residual=False,
                              feedforward_float_channels=0).max_accuracy_drop is None
    assert parse("--all-int8") == QuantizationRecipe.all_int8()
    assert "until at most 0.5 points (or one example, if more) are lost" in \
        QuantizationRecipe().describe()
    assert "until at most 1 points are lost" in QuantizationRecipe(max_accuracy_drop=1).describe()
    assert "points are lost" not in QuantizationRecipe(max_accuracy_drop=None).describe()
    # A recipe recorded before budgets existed searched none.
    legacy = {k: v for k, v in QuantizationRecipe().to_dict().items()
              if k != "max_accuracy_drop"}
    assert QuantizationRecipe.from_dict(legacy).max_accuracy_drop is None
    with pytest.raises(ValueError, match="it needs the default recipe"):
        parse("--all-int8", "--max-accuracy-drop", "1")
    with pytest.raises(SystemExit):
        parse("--max-accuracy-drop", "half")


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


# --- the recipe in a training config (from_config / config_overrides) ---------------------

FLOAT_RUN = {"task": "ner", "data": {"train": "t.tsv"}, "model": {"checkpoint": "minilm"},
             "train": {"learning_rate": 4e-5, "epochs": 5, "max_steps": None}}


@pytest.mark.parametrize("recipe, epochs, learning_rate", [
    (QuantizationRecipe(qat_epochs=2), 2, 4e-6),  # default: the float run's / 10
    (QuantizationRecipe.all_int8(qat_epochs=1, qat_learning_rate=2e-5, qat_max_steps=40),
     1, 2e-5),
    (QuantizationRecipe(feedforward_float_channels=0, qat_epochs=3, qat_learning_rate=1e-5),
     3, 1e-5),
])
def test_config_overrides_and_from_config_are_inverse(recipe, epochs, learning_rate):
    config = TrainingConfig.from_dict(FLOAT_RUN, recipe.config_overrides(4e-5))
    model, train = config.model, config.train
    assert model.quantization_aware is True
    assert (model.float_residual, model.feedforward_float_channels) == (
        recipe.float_residual, recipe.feedforward_float_channels)
    assert (train.epochs, train.max_steps) == (epochs, recipe.qat_max_steps)
    assert train.learning_rate == pytest.approx(learning_rate, rel=1e-12)
    read_back = QuantizationRecipe.from_config(config)
    # A training config holds no budget: a QAT run trained by `keras-attn train` searched
    # none (the quantize stage records its own recipe, budget included).
    assert read_back.to_dict() == {**recipe.to_dict(), "max_accuracy_drop": None,
                                   "qat_learning_rate": pytest.approx(learning_rate,
                                                                      rel=1e-12)}


def test_calibration_only_still_builds_a_one_epoch_config():
    overrides = dict(QuantizationRecipe().config_overrides(4e-5))
    assert overrides == {"model.quantization_aware": True, "model.float_residual": True,
                         "model.feedforward_float_channels": 4, "train.epochs": 1,
                         "train.max_steps": None,
                         "train.learning_rate": pytest.approx(4e-6, rel=1e-12)}


def test_from_config_checks_what_it_reads():
    # A config that is not a valid recipe (e.g. a continued QAT run edited by hand) is named.
    config = TrainingConfig.from_dict(FLOAT_RUN, [("model.float_residual", False),
                                                  ("model.feedforward_float_channels", 2)])
    with pytest.raises(ValueError, match=r"`feedforward_float_channels` needs "
                                         r"`float_residual=True` .*Received: "
                                         r"feedforward_float_channels=2, float_residual=False"):
        QuantizationRecipe.from_config(config)
