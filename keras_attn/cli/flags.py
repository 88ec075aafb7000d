"""Settings to command-line flags, in one place: every field of a settings dataclass declared
with `keras_attn.runs.config_schema.setting` (`QuantizationRecipe`, `ExportOptions`,
`ServerLimits`) becomes a flag whose name, type, bounds, choices and help come from that one
declaration; `settings_from_arguments` reads the parsed values back."""

import argparse
import dataclasses
import math
import typing

from keras_attn.runs.quantization_recipe import QuantizationRecipe


def positive_int(text):
    """`argparse` type: an integer > 0."""
    return _number(text, int, 1, None, "a positive integer")


def _number(text, kind, minimum, maximum, what):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    too_low = minimum is not None and value < minimum
    too_high = maximum is not None and value > maximum
    if too_low or too_high or value != value or value in (math.inf, -math.inf):
        raise argparse.ArgumentTypeError(
            f"expected {what}, got {value if kind is int else repr(text)}")
    return value


def _value_type(field):
    """The function reading a flag's text: the setting's `parse`, else its annotation's
    numeric type checked against the setting's bounds (`--workers 0`: "expected an integer
    >= 1")."""
    meta = field.metadata
    kinds = [t for t in (typing.get_args(field.type) or (field.type,)) if t is not type(None)]
    parse = meta["parse"] or (kinds[0] if kinds and kinds[0] in (int, float) else str)
    if parse not in (int, float):
        return parse
    minimum, maximum = meta["minimum"], meta["maximum"]
    if parse is int and minimum == 1 and maximum is None:
        return positive_int
    kind = "an integer" if parse is int else "a number"
    bounds = [f">= {minimum}" if minimum is not None else "",
              f"<= {maximum}" if maximum is not None else ""]
    what = " ".join([kind, " and ".join(b for b in bounds if b)]).strip()
    return lambda text: _number(text, parse, minimum, maximum, what)


def _flag(field):
    meta = field.metadata
    if meta["flag"]:
        return meta["flag"]
    name = field.name.replace("_", "-")
    return f"--no-{name}" if field.default is True else f"--{name}"


def flag_fields(settings):
    """The fields of the dataclass `settings` that are command-line flags."""
    return [field for field in dataclasses.fields(settings)
            if "help" in field.metadata and field.metadata["flag"] is not False]


def add_setting_flags(group, settings, unset=False):
    """Adds one flag per setting of the dataclass `settings` to `group` (a parser or an
    argument group), each with the setting's help and its default in it.

    Args:
        group: `argparse.ArgumentParser` or argument group.
        settings: the settings dataclass.
        unset: leave unset flags `None` for a caller whose defaults depend on other flags
            (`--all-int8`); else each flag's default is the setting's. A bool flag is
            `None` when unset either way.
    """
    for field in flag_fields(settings):
        meta, scale = field.metadata, field.metadata["flag_scale"]
        if isinstance(field.default, bool):
            group.add_argument(_flag(field), dest=field.name, default=None,
                               action="store_false" if field.default else "store_true",
                               help=meta["help"])
            continue
        default = field.default
        if isinstance(default, tuple):
            default = list(default)
        elif default is not None and scale != 1:
            default = default * scale
        shown = "" if default in (None, "default") else f" (default: {default})"
        metavar = meta["metavar"] or (None if meta["choices"] else
                                      _flag(field).lstrip("-").replace("-", "_").upper())
        group.add_argument(_flag(field), dest=field.name, type=_value_type(field),
                           nargs=meta["nargs"], metavar=metavar,
                           choices=meta["choices"] or None, default=None if unset else default,
                           help=meta["help"] + shown)


def settings_from_arguments(settings, args):
    """`{name: value}` of the flags `add_setting_flags(..., settings)` parsed into `args`
    (flags left unset out), in the settings' units."""
    values = {}
    for field in flag_fields(settings):
        value = getattr(args, field.name, None)
        if value is None:
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif field.metadata["flag_scale"] != 1:
            value = value / field.metadata["flag_scale"]
        values[field.name] = value
    return values


def add_recipe_flags(parser):
    """`--all-int8` and one flag per `QuantizationRecipe` setting, in their own group."""
    group = parser.add_argument_group(
        "quantization", "how model_int8.tflite is made; the defaults are the measured "
                        "best recipe (docs/export.md)")
    group.add_argument("--all-int8", action="store_true",
                       help="quantize every activation, the residual stream too (default: "
                            "residual stream and widest feed-forward channels float)")
    add_setting_flags(group, QuantizationRecipe, unset=True)


def recipe_from_arguments(args):
    """The `QuantizationRecipe` of the flags `add_recipe_flags` added (unset: defaults)."""
    values = {name: None if value == "none" else value
              for name, value in settings_from_arguments(QuantizationRecipe, args).items()}
    return QuantizationRecipe.all_int8(**values) if args.all_int8 else QuantizationRecipe(**values)


def recipe_flags(recipe):
    """The command-line flags that give `recipe` (only what differs from the default)."""
    default = QuantizationRecipe() if recipe.float_residual else QuantizationRecipe.all_int8()
    flags = [] if recipe.float_residual else ["--all-int8"]
    for field in flag_fields(QuantizationRecipe):
        value = getattr(recipe, field.name)
        if value != getattr(default, field.name):
            flags += [_flag(field), str(value)]
    return flags
