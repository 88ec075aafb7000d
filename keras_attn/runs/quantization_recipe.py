"""How a float run becomes its int8 model: the one declaration of the quantization settings.

`QuantizationRecipe` is read by the `quantize` stage, `keras-attn quantize` / `export` / `demo`
(`keras_attn.cli.flags` makes their flags from its fields), the training config
(`model.float_residual`, `model.feedforward_float_channels`) and the result scripts.
Its defaults are the recipe measured best on SST-2 and CoNLL-2003 MiniLM runs
(`docs/export_results.md`): the residual stream and LayerNorm in float, the 4 widest
feed-forward channels of each block in float (LLM.int8()'s decomposition, Dettmers et al.,
2022), activation ranges calibrated on training examples without QAT epochs.
`QuantizationRecipe.all_int8()` is the all-int8 alternative.
"""

import dataclasses

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.runs.config_schema import setting

# The default budget (docs/export.md, "An int8 accuracy budget"): the recipe's measured
# loss is 0.0-0.2 points on SST-2 dev and CoNLL-2003, inside it, so the default costs one
# scoring of the float and the calibrated model on dev; 0.5 is the accuracy target the
# export is held to, and on a run where the recipe loses more, ops move to float. On a
# small held-out set the default allows one example (a calibrated model and its file
# disagree on 1-2 % of examples: one example is below what the check can resolve).
DEFAULT_MAX_ACCURACY_DROP = 0.5


def _points_or_none(text):
    """`--max-accuracy-drop`: points (a float >= 0), or `"none"` for no budget (a parsed
    `None` would read as a flag not given)."""
    return "none" if text.strip().lower() == "none" else float(text)


@dataclasses.dataclass(frozen=True)
class QuantizationRecipe:
    """The settings of the `quantize` stage (see the module docstring).

    Attributes:
        float_residual: keep the residual sums and LayerNorm internals in float
            (`quantize_model(float_residual=True)`): `model_int8.tflite` runs ADD and LayerNorm in
            float, and the ops XNNPACK has no int8 kernel for (attention products, softmax,
            GELU) too (`keras_attn.export.tflite.tflite_float_ops`); every weight matmul in int8.
        feedforward_float_channels: with `float_residual`, the widest feed-forward hidden
            channels of each block kept in float (their outliers would set the int8 scales).
        qat_epochs: epochs of quantization-aware fine-tuning; 0 calibrates the activation
            ranges on training examples only.
        qat_learning_rate: peak learning rate of QAT; `None` is a tenth of the run's.
        qat_max_steps: cap on QAT updates (quick runs).
        calibration_examples: training examples whose inference-mode min/max set the
            activation ranges (QAT starts from them too; PTQ calibrates on them): a seeded
            sample of the whole training file (`Task.calibration_sample`), all of it when
            smaller.
        max_accuracy_drop: the int8 accuracy budget in points (accuracy or F1 x 100) the
            calibrated model may lose on held-out examples (`quantization_budget`);
            `"default"`: `DEFAULT_MAX_ACCURACY_DROP` or one held-out example, whichever is
            more (`budget_points`), with `float_residual`, else `None`; `None`: the recipe
            as it is, unchecked.

    Example:
    >>> recipe = QuantizationRecipe()
    >>> recipe.float_residual, recipe.feedforward_float_channels, recipe.qat_epochs
    (True, 4, 0)
    >>> QuantizationRecipe.all_int8().float_residual
    False
    """

    float_residual: bool = setting(
        True, flag=False,  # --all-int8
        help="keep the residual sums and LayerNorm internals in float, and in the TFLite file "
             "the attention products, softmax and GELU (every weight matmul stays int8)")
    feedforward_float_channels: int = setting(
        4, help="with float_residual: keep this many widest feed-forward channels of each "
                "block in float (0: none)", parse=int, metavar="K")
    qat_epochs: int = setting(
        0, help="quantization-aware fine-tuning epochs (0: calibrate the ranges only)",
        parse=int)
    qat_learning_rate: float = setting(
        None, help="QAT peak learning rate (default: the run's / 10)", parse=float)
    qat_max_steps: int = setting(None, help="cap on QAT updates", parse=int)
    calibration_examples: int = setting(
        512, help="training examples calibrating the activation ranges (a seeded sample of "
                  "the whole training file)", parse=int)
    max_accuracy_drop: float = setting(
        "default",
        help="int8 accuracy budget in points (accuracy or F1 x 100): move the most sensitive ops "
        "to float until the calibrated model loses at most this much on the run's dev split "
        "(without one: training examples the calibration did not use); 'none': the recipe "
        f"as it is, unchecked (default: {DEFAULT_MAX_ACCURACY_DROP:g}, or one held-out "
        "example if that is more; none with --all-int8)",
        parse=_points_or_none, metavar="POINTS")

    def __post_init__(self):
        if self.max_accuracy_drop == "default" and self.float_residual is not True:
            object.__setattr__(self, "max_accuracy_drop", None)  # no float stream to use
        check_bool("float_residual", self.float_residual)
        check_int("feedforward_float_channels", self.feedforward_float_channels, low=0)
        check_int("qat_epochs", self.qat_epochs, low=0)
        if self.qat_max_steps is not None:
            check_positive_int("qat_max_steps", self.qat_max_steps)
        check_positive_int("calibration_examples", self.calibration_examples)
        if self.qat_learning_rate is not None:
            check_number_above("qat_learning_rate", self.qat_learning_rate, 0)
        if self.max_accuracy_drop not in (None, "default"):
            check_number("max_accuracy_drop", self.max_accuracy_drop, low=0,
                         meaning="points of accuracy or F1 the int8 model may lose")
            if not self.float_residual:
                raise ValueError(
                    "`max_accuracy_drop` moves ops to float inside the float residual stream: "
                    "it needs the default recipe (remove --all-int8). Received: "
                    f"max_accuracy_drop={self.max_accuracy_drop}, float_residual=False")
        if self.feedforward_float_channels and not self.float_residual:
            raise ValueError(
                "`feedforward_float_channels` needs `float_residual=True` (remove "
                "--all-int8, or set --feedforward-float-channels 0). Received: "
                f"feedforward_float_channels={self.feedforward_float_channels}, "
                "float_residual=False")

    def budget_points(self, examples):
        """The budget in points on `examples` held-out examples: `max_accuracy_drop`, or
        for the default `DEFAULT_MAX_ACCURACY_DROP` or one example, whichever is more
        (`None` without a budget).

        Example:
        >>> QuantizationRecipe().budget_points(872), QuantizationRecipe().budget_points(34)
        (0.5, 2.9412)
        >>> QuantizationRecipe(max_accuracy_drop=0).budget_points(34)
        0
        """
        if self.max_accuracy_drop == "default":
            # Rounded as the search's drops are (4 decimals): one example's drop, 100 / n,
            # is then within it, not a rounding above it.
            return round(max(DEFAULT_MAX_ACCURACY_DROP, 100 / max(examples, 1)), 4)
        return self.max_accuracy_drop

    @classmethod
    def all_int8(cls, **changes):
        """Every activation int8 (the residual stream too): smaller graphs, lower accuracy."""
        return cls(**{"float_residual": False, "feedforward_float_channels": 0, **changes})

    def layout(self):
        """The arguments that shape the QAT model (`quantize_model(model, **layout)`)."""
        return {"float_residual": self.float_residual,
                "feedforward_float_channels": self.feedforward_float_channels}

    def to_dict(self):
        return dataclasses.asdict(self)

    # --- the training config ------------------------------------------------------------
    # A quantization-aware training run is the recipe written into a `TrainingConfig`:
    # `config_overrides` writes it (the quantize stage), `from_config` reads it back (the
    # trainer, for the run's lineage.json). These two are the only mapping between them.

    @classmethod
    def from_config(cls, config):
        """The recipe of a quantization-aware `TrainingConfig`: its QAT layout
        (`model.float_residual`, `model.feedforward_float_channels`) and its fine-tuning
        (`train.epochs`, `train.learning_rate`, `train.max_steps`)."""
        model, train = config.model, config.train
        return cls(float_residual=model.float_residual,
                   feedforward_float_channels=model.feedforward_float_channels,
                   qat_epochs=train.epochs, qat_learning_rate=train.learning_rate,
                   qat_max_steps=train.max_steps, max_accuracy_drop=None)

    def config_overrides(self, run_learning_rate):
        """The `(dotted key, value)` overrides that make a float run's config train this
        recipe: quantization-aware, its layout, `max(qat_epochs, 1)` epochs (calibration
        only still builds the QAT config) at `qat_learning_rate` or, by default, a tenth of
        the float run's `run_learning_rate`.

        Example:
        >>> dict(QuantizationRecipe(qat_epochs=2).config_overrides(5e-5))["train.learning_rate"]
        5e-06
        """
        return [("model.quantization_aware", True),
                *((f"model.{key}", value) for key, value in self.layout().items()),
                ("train.epochs", max(self.qat_epochs, 1)),
                ("train.max_steps", self.qat_max_steps),
                ("train.learning_rate", self.qat_learning_rate or run_learning_rate / 10)]

    @classmethod
    def from_dict(cls, values):
        """The recipe recorded by `to_dict` (unknown keys are an error, missing ones default;
        a record without `max_accuracy_drop` predates budgets: none was searched)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown quantization setting {unknown[0]!r}; known: "
                             f"{sorted(names)}. Received: {values!r}")
        return cls(**{"max_accuracy_drop": None, **values})

    def describe(self):
        """One line saying how the int8 model is made (export report, logs)."""
        if self.qat_epochs == 0:
            how = (f"ranges calibrated on up to {self.calibration_examples} training examples "
                   "drawn at random, no fine-tuning")
        else:
            how = (f"{self.qat_epochs} epoch(s) of quantization-aware fine-tuning"
                   + (f", at most {self.qat_max_steps} updates" if self.qat_max_steps else "")
                   + (f", learning rate {self.qat_learning_rate:g}" if self.qat_learning_rate
                      else ", learning rate: the run's / 10"))
        stream = ("residual sums and LayerNorm internals float" if self.float_residual
                  else "every activation int8 (--all-int8)")
        if self.feedforward_float_channels:
            stream += (f"; the {self.feedforward_float_channels} widest feed-forward channels "
                       "of each block float")
        if self.max_accuracy_drop == "default":
            stream += (f"; the most sensitive ops float until at most "
                       f"{DEFAULT_MAX_ACCURACY_DROP:g} points (or one example, if more) are "
                       "lost on held-out examples")
        elif self.max_accuracy_drop is not None:
            stream += (f"; the most sensitive ops float until at most "
                       f"{self.max_accuracy_drop:g} points are lost on held-out examples")
        return f"{how}; {stream}"

    # --- command line -------------------------------------------------------------------


def recipe_default(name):
    """Default of one recipe setting (the training config's keys read it)."""
    return QuantizationRecipe.__dataclass_fields__[name].default


def recipe_help(name):
    return QuantizationRecipe.__dataclass_fields__[name].metadata["help"]

