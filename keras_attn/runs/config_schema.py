"""The config schema's machinery, shared by every settings dataclass of the pipeline: a key is
a dataclass field declared once with `setting(...)` (default, help, choices, bounds); a
section is a frozen dataclass of keys and sub-sections; `check_section` turns a dict (YAML)
into checked constructor arguments, and `set_dotted` applies a `key.sub=value` override.
Every problem is a `ConfigError` naming the key, the file and what would be accepted."""

import copy
import dataclasses
import typing

import yaml

from keras_attn.errors import KerasAttnError

REQUIRED = dataclasses.MISSING


class ConfigError(KerasAttnError, ValueError):
    """A configuration problem, with the file (or "override") it comes from."""

    def __init__(self, message, where=None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def setting(default=REQUIRED, help="", choices=(), minimum=None, maximum=None, *,
            parse=None, metavar=None, nargs=None, flag=None, flag_scale=1):
    """One setting, declared once: its default (none: the key is required), help, choices and
    bounds, and how the command line gives it. Its annotation says which types are accepted
    (`int | None`). The config reads the first group; `keras_attn.cli.flags` turns every
    setting of a dataclass (`QuantizationRecipe`, `ExportOptions`, `ServerLimits`) into a
    flag with the same help, choices and bounds.

    Args:
        default: the value when unset (a dict or list is copied for every instance).
        help: what the setting does (the `--help` text and the config errors' hint).
        choices: the accepted values, if a fixed set.
        minimum, maximum: inclusive bounds of a number.
        parse: the flag's text to value function (`int`, `float`, ...; default: the
            annotation's type).
        metavar: the flag's value name in `--help`.
        nargs: `"+"` for a flag taking several values (a tuple setting).
        flag: the flag (default `--the-name`; `--no-the-name` for a bool that defaults to
            true); `False`: no flag.
        flag_scale: the flag's unit in the setting's (1000: `--batch-timeout-ms` of seconds).

    Returns:
        A `dataclasses.field`.

    Example:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Limits:
    ...     workers: int = setting(2, minimum=1, help="threads")
    >>> dataclasses.fields(Limits)[0].metadata["help"], Limits().workers
    ('threads', 2)
    """
    metadata = {"help": help, "choices": tuple(choices), "minimum": minimum,
                "maximum": maximum, "parse": parse, "metavar": metavar, "nargs": nargs,
                "flag": flag, "flag_scale": flag_scale}
    if isinstance(default, (dict, list)):  # a fresh copy for every config
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class ConfigSection:
    """What every section (and the whole config) shares: `to_dict`."""

    def to_dict(self):
        """The section as a dict (a deep copy), in declaration order."""
        return {field.name: _plain(getattr(self, field.name)) for field in config_keys(type(self))}


def _plain(value):
    return value.to_dict() if isinstance(value, ConfigSection) else copy.deepcopy(value)




# --- checking -------------------------------------------------------------------------------


def config_keys(section):
    """The fields of a section class that are config keys (`TrainingConfig.source` is not)."""
    return [f for f in dataclasses.fields(section) if f.metadata.get("key", True)]


def section_type(field):
    """The section class a field holds, or `None` for a plain key."""
    is_section = isinstance(field.type, type) and issubclass(field.type, ConfigSection)
    return field.type if is_section else None


def check_section(section, values, prefix, where):
    """The checked constructor arguments of `section` from the dict `values` (absent keys:
    left to the defaults)."""
    if not isinstance(values, dict):
        raise ConfigError(f"`{prefix or 'config'}` must be a mapping. Received: {values!r}",
                          where)
    keys = {field.name: field for field in config_keys(section)}
    unknown = sorted(set(values) - set(keys))
    if unknown:
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown key `{name}`. Known keys here: {sorted(keys)}", where)
    checked = {}
    for key, field in keys.items():
        name = f"{prefix}.{key}" if prefix else key
        subsection = section_type(field)
        if subsection is not None:
            given = values.get(key)
            checked[key] = subsection(**check_section(
                subsection, {} if given is None else given, name, where))
        elif key in values:
            checked[key] = _check_value(name, values[key], field, where)
        elif field.default is REQUIRED and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"`{name}` is required ({field.metadata['help']}).", where)
    return checked


def _check_value(name, value, field, where):
    """`value` of key `name` if its field accepts it (an int where a float belongs: as a
    float), else a `ConfigError` naming the key, the accepted types or bounds and the value."""
    meta = field.metadata
    types = typing.get_args(field.type) or (field.type,)
    if value is None and (type(None) in types or field.default is None):
        return value
    accepted = tuple(t for t in types if t is not type(None))
    ok = isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted)
    if not ok and float in accepted and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        names = " or ".join(t.__name__ for t in accepted)
        raise ConfigError(
            f"`{name}` must be {names} ({meta['help']}). Received: {name}={value!r}", where)
    if meta["choices"] and value not in meta["choices"]:
        raise ConfigError(
            f"`{name}` must be one of {list(meta['choices'])}. Received: {name}={value!r}",
            where)
    if meta["minimum"] is not None and not value >= meta["minimum"]:  # NaN fails too
        raise ConfigError(f"`{name}` must be >= {meta['minimum']} ({meta['help']}). "
                          f"Received: {name}={value!r}", where)
    if meta["maximum"] is not None and not value <= meta["maximum"]:
        raise ConfigError(f"`{name}` must be <= {meta['maximum']} ({meta['help']}). "
                          f"Received: {name}={value!r}", where)
    return value


# --- overrides ------------------------------------------------------------------------------


def set_dotted(root, values, dotted, value, where):
    """Set `value` at the dotted key `dotted` (`train.epochs`) of the dict `values` of the
    section class `root`, after checking that every part names a key."""
    parts = dotted.split(".")
    section, node = root, values
    for i, part in enumerate(parts):
        keys = {field.name: field for field in config_keys(section)} if section else {}
        if part not in keys:
            raise ConfigError(
                f"unknown key `{'.'.join(parts[: i + 1])}` in override `{dotted}`. "
                f"Known keys here: {sorted(keys)}",
                where,
            )
        section = section_type(keys[part])
        if i == len(parts) - 1:
            if section is not None:
                raise ConfigError(f"`{dotted}` is a section; override one of its keys "
                                  f"({sorted(f.name for f in config_keys(section))})", where)
            node[part] = value
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"`{'.'.join(parts[: i + 1])}` must be a mapping to override "
                                  f"`{dotted}`. Received: {node!r}", where)


def parse_override(text):
    """`"train.learning_rate=3e-5"` -> `("train.learning_rate", 3e-05)` (value read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"an override is `key=value` (e.g. train.epochs=2). Received: {text!r}",
                          "override")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"cannot read the value of `{key}` as YAML: {error}", "override")
    # YAML 1.1 reads "3e-5" (no dot) as a string; a number is what was meant.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip(), value
