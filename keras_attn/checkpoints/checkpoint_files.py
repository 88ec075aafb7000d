"""What every checkpoint importer shares: reading the files and reporting the tensors that
do not fit the model.

- `read_json_config` / `read_hf_config`: a JSON config (`config.json`,
  `bert_config.json`) parsed into a dict, with errors that name the file (and the line
  of a JSON syntax error).
- `read_safetensors`: all tensors of a Hugging Face directory's `model.safetensors` (or
  its shards listed in `model.safetensors.index.json`) as numpy arrays, through
  `safetensors.numpy` — no PyTorch; a missing or corrupt file names the file.
- `tensor_problems` / `raise_for_problems`: the one error an importer raises before it
  assigns anything, listing together the weights the model needs that are *missing*, the
  checkpoint tensors that map to no weight (*unused*) and the *wrongly shaped* ones.
- `HF_ACTIVATIONS`: transformers' activation names (`hidden_act`,
  `activation_function`) translated to ours.
"""

import json
import os

import safetensors
from safetensors.numpy import load_file

# transformers' ACT2FN names -> ours. "gelu" is the exact erf GELU; "gelu_new",
# "gelu_pytorch_tanh" and "gelu_fast" are the tanh approximation (GPT-2's and the
# original BERT code's).
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_approximate",
    "gelu_pytorch_tanh": "gelu_approximate",
    "gelu_fast": "gelu_approximate",
    "relu": "relu",
}
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"


def read_json_config(path, argument="config_path"):
    """The JSON object in the file `path`, as a dict.

    Args:
        path: str, the file.
        argument: str, the argument that named the file, quoted in the errors.

    Raises:
        ValueError: the file does not exist, is not valid JSON (with its line and column)
            or does not hold a JSON object.

    Example:
    >>> read_json_config("/nonexistent/config.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: No config file at /nonexistent/config.json. Received: config_path=...
    """
    if not os.path.isfile(path):
        raise ValueError(f"No config file at {path}. Received: {argument}={path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}:{error.lineno}:{error.colno}: not valid JSON ({error.msg}); the config "
            f"file may be truncated or not a config. Received: {argument}={path!r}"
        ) from error
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text, so it is not a JSON config ({error}). "
            f"Received: {argument}={path!r}"
        ) from error
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} must hold a JSON object of config fields. "
            f"Received: {type(config).__name__} {str(config)[:80]}"
        )
    return config


def read_hf_config(directory, expected_files=("config.json", SAFETENSORS_FILE)):
    """`(config, config_path)` of the Hugging Face checkpoint directory `directory`.

    Args:
        directory: str, the checkpoint directory.
        expected_files: the files the importer reads, quoted when `directory` is not a
            directory.

    Raises:
        ValueError: `directory` is not a directory, or its `config.json` is absent or
            unreadable (see `read_json_config`).
    """
    if not os.path.isdir(directory):
        raise ValueError(
            f"`directory` must be an HF checkpoint directory ({', '.join(expected_files)}). "
            f"Received: directory={directory!r}"
        )
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise ValueError(
            "No config.json in the checkpoint directory. "
            f"Received: directory={directory!r}, files={sorted(os.listdir(directory))}"
        )
    return read_json_config(config_path, argument="directory"), config_path


def read_safetensors(directory):
    """All tensors of `model.safetensors` (or its shards) in `directory`, as numpy.

    Raises:
        ValueError: neither `model.safetensors` nor `model.safetensors.index.json` is in
            `directory`, the index lacks its `weight_map` or names an absent shard, or a
            file is not a readable safetensors file (each naming the file).
    """
    single = os.path.join(directory, SAFETENSORS_FILE)
    index = os.path.join(directory, SAFETENSORS_INDEX_FILE)
    if os.path.exists(single):
        return _load_safetensors_file(single)
    if os.path.exists(index):
        weight_map = read_json_config(index, argument="directory").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(
                f"{index} must map tensor names to shard files under `weight_map`, as "
                f"transformers writes it. Received: weight_map={weight_map!r}"
            )
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_load_safetensors_file(os.path.join(directory, shard), index))
        return tensors
    raise ValueError(
        f"No {SAFETENSORS_FILE} (or {SAFETENSORS_INDEX_FILE}) in {directory}. Only the "
        "safetensors format is read (no PyTorch); convert `pytorch_model.bin` with "
        "transformers' `save_pretrained(..., safe_serialization=True)`. "
        f"Received: files={sorted(os.listdir(directory))}"
    )


def _load_safetensors_file(path, index=None):
    if not os.path.isfile(path):
        raise ValueError(
            f"The shard {os.path.basename(path)} listed in {index} is not in "
            f"{os.path.dirname(path)}: the checkpoint is incomplete. Received: "
            f"files={sorted(os.listdir(os.path.dirname(path)))}"
        )
    try:
        return load_file(path)
    except safetensors.SafetensorError as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); it may be truncated "
            "(an interrupted download) or in another format. Received: "
            f"size={os.path.getsize(path)} bytes"
        ) from error


def shape_mismatch(name, stored_shape, expected_shape):
    """One entry of the wrong-shape list of `tensor_problems`."""
    return (f"{name}: checkpoint shape {tuple(stored_shape)}, the config implies "
            f"{tuple(expected_shape)}")


def tensor_problems(*, missing=(), unused=(), mismatched=(), missing_hint="",
                    unused_hint="", config_file="the config file"):
    """The sentences describing the tensors that do not fit a model (empty if all fit).

    Args:
        missing: checkpoint names of the weights the model needs that are absent.
        unused: checkpoint names of tensors that map to no weight of the model.
        mismatched: `shape_mismatch` entries.
        missing_hint: str appended to the missing-weights sentence.
        unused_hint: str appended to the unused-tensors sentence (how to exclude them,
            or what they suggest about the checkpoint).
        config_file: the file the sizes came from, named in the wrong-shape sentence.

    Returns:
        list of str, for `raise_for_problems`.

    Example:
    >>> tensor_problems(missing=["ln_f.bias"], mismatched=[shape_mismatch("wte", (5, 4),
    ...                 (6, 4))])  # doctest: +NORMALIZE_WHITESPACE
    ['1 weight(s) the model needs are missing from the checkpoint: ln_f.bias',
     '1 tensor(s) have the wrong shape: wte: checkpoint shape (5, 4), the config implies
     (6, 4) (check that the config file belongs to these weights)']
    """
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} weight(s) the model needs are missing from the checkpoint: "
            + listing(list(missing)) + missing_hint
        )
    if unused:
        problems.append(
            f"{len(unused)} checkpoint tensor(s) map to no weight of the model: "
            + listing(list(unused)) + unused_hint
        )
    if mismatched:
        problems.append(
            f"{len(mismatched)} tensor(s) have the wrong shape: " + "; ".join(mismatched)
            + f" (check that {config_file} belongs to these weights)"
        )
    return problems


def raise_for_problems(problems, *, source, target, received):
    """Raises one `ValueError` listing `problems` (from `tensor_problems` and the
    importer's own checks), if there are any.

    Args:
        problems: list of str.
        source: the checkpoint (path), named in the error.
        target: str, the model class the checkpoint was to fill.
        received: str, the `Received: ...` part of the message (the importer's
            arguments that decide what is skipped or allowed).
    """
    if problems:
        raise ValueError(f"Cannot import {source} into {target}: " + ". ".join(problems)
                         + f". Received: {received}")


def listing(names, limit=40):
    """`names` joined by commas, the first `limit` of them and a count of the rest."""
    shown = ", ".join(names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
