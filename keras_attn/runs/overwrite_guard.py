"""Runs and exports are never replaced silently.

`keras-attn train` into an `output_dir` that holds a run (finished or only started: its
`config.json`) of another configuration, and `keras-attn export --output-dir` into a directory
that holds an export of another run, stop with an `OverwriteError` naming what differs and the
choices: another directory, `--overwrite` (replace it), or, for training, the same config
(resume it). The same configuration resumes (train) or reuses the artifacts (export).

`check_output_dir` is the one rule; `train_identity` and `export_identity` say what each
directory records about what made it.
"""

import json
import pathlib
import shutil

from keras_attn.errors import KerasAttnError
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_lock import LOCK_FILE
from keras_attn.runs.run_lock import run_lock

# Settings that may change when a run is resumed: where and how fast it runs, what it logs,
# how long it trains (a run continued for more epochs or steps is resumed) and whether its
# last epochs are averaged at the end.
RESUMABLE_SETTINGS = ("output_dir", "distribute.strategy", "distribute.tpu",
                      "distribute.logical_cpu_devices", "train.log_every_steps",
                      "train.keep_checkpoints", "train.checkpoint_every_steps",
                      "train.eval_batch_size", "train.epochs", "train.max_steps",
                      "train.average_checkpoints", "train.time_budget_minutes")
# What a run has trained: a directory with `config.json` and none of these stopped before its
# first checkpoint (a config error found while building the model, a kill in the first
# steps): nothing is lost by starting it again with another configuration.
TRAINED_STATE = ("model.keras", "metrics.json", "best.weights.h5", "checkpoints/step-*")
# The files and directories of a run (docs/pipeline.md) that `--overwrite` removes; anything
# else in the directory (an export/ below it, the user's files) is left.
RUN_FILES = ("config.json", "tokenizer.json", "lineage.json", "vocab.txt", "characters.json",
             "labels.txt", "model.keras", "metrics.json", "best.weights.h5", "checkpoints",
             "tensorboard")
# The files of an export that name the run it was made from, in the order they are read.
EXPORT_RECORDS = ("export_report.json", "model_card.json")


class OverwriteError(KerasAttnError, ValueError):
    """An output directory holds a run or export that the command would replace."""


def check_output_dir(directory, recorded, wanted, what, choices, ignore=()):
    """Raises `OverwriteError` when `directory` holds `what` whose `recorded` identity (a dict,
    `None` when the directory holds none) differs from `wanted` in a key not in `ignore`.

    Args:
        directory: the output directory (for the message).
        recorded: dict, the identity the directory records, or `None`.
        wanted: dict, the identity of what the command would write.
        what: str, e.g. `"a run"`, for the message.
        choices: str, what the user can do instead (ends the message).
        ignore: dotted keys that may differ.

    Example:
    >>> check_output_dir("runs/a", {"seed": 1}, {"seed": 1}, "a run", "")
    >>> try:
    ...     check_output_dir("runs/a", {"seed": 1}, {"seed": 2}, "a run", "use another one")
    ... except OverwriteError as error:
    ...     print(error)
    runs/a holds a run of another configuration: seed is 1 there, 2 here. Nothing was \
written: use another one
    """
    if recorded is None:
        return
    differences = [(key, old, new) for key, old, new in _differences(recorded, wanted)
                   if key not in ignore]
    if differences:
        shown = "; ".join(f"{key} is {_shown(old)} there, {_shown(new)} here"
                          for key, old, new in differences[:8])
        more = f" (and {len(differences) - 8} more)" if len(differences) > 8 else ""
        raise OverwriteError(f"{directory} holds {what} of another configuration: {shown}"
                             f"{more}. Nothing was written: {choices}")


def train_identity(directory):
    """The configuration (dict) a run directory records in `config.json`, completed with
    today's defaults, or `None` when it holds no run with something trained
    (`TRAINED_STATE`)."""
    run = RunDirectory(directory)
    if not (run.path / "config.json").is_file() or \
            not any(any(run.path.glob(pattern)) for pattern in TRAINED_STATE):
        return None
    try:
        return run.config().to_dict()
    except ConfigError:  # written by another version: compared as recorded
        return run.recorded_config()


def check_train_output(directory, config, overwrite=False, log=None):
    """`keras-attn train`'s rule for its output `directory`: the same `config` resumes,
    another one is an `OverwriteError`, unless `overwrite`: then the earlier run's files
    (`RUN_FILES`) and the export made from it in `export/` are removed first, and the run
    starts from scratch."""
    directory = pathlib.Path(directory)
    recorded = train_identity(directory)
    if recorded is None:
        return
    if overwrite:
        removed = [name for name in RUN_FILES if (directory / name).exists()]
        stale = export_identity(directory / "export")  # `keras-attn export`'s default place
        if stale == {"source_run": str(directory.resolve())}:
            removed.append("export")
        for name in removed:
            path = directory / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        (log or print)(f"--overwrite: removed the earlier run in {directory} "
                       f"({', '.join(removed)})")
        return
    check_output_dir(
        directory, recorded, config.to_dict(), "a run", ignore=RESUMABLE_SETTINGS,
        choices="give another output_dir (--output-dir), add --overwrite to replace that run, "
                "or train with its configuration (its config.json) to resume it")


def export_identity(directory):
    """`{"source_run": ...}` of the export in `directory` (from its report or model card),
    or `None` when it holds no export."""
    for name in EXPORT_RECORDS:
        path = pathlib.Path(directory) / name
        if path.is_file():
            try:
                source = json.loads(path.read_text(encoding="utf-8")).get("source_run")
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                source = f"unreadable ({path.name} is damaged)"
            return {"source_run": source}
    return None


def check_export_output(directory, run_dir, overwrite=False, log=None):
    """`keras-attn export`'s rule for its output directory: an export of the same run is
    reused (its finished steps), of another run an `OverwriteError`, unless `overwrite`: then
    the directory's contents are removed first (the exporter would reuse the other run's
    artifacts otherwise). A directory without `EXPORT_RECORDS` is not touched."""
    directory = pathlib.Path(directory)
    recorded = export_identity(directory)
    wanted = {"source_run": str(pathlib.Path(run_dir).resolve())}
    if overwrite and recorded is not None and recorded != wanted:
        for path in directory.iterdir():
            if path.name.startswith(LOCK_FILE):
                continue  # the lock this export holds (`run_lock`)
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        (log or print)(f"--overwrite: removed the export of {recorded['source_run']} in "
                       f"{directory}")
        return
    check_output_dir(
        directory, recorded, wanted, "an export",
        choices="give another --output-dir, or add --overwrite to replace that export")


def guarded_export(run_dir, output_dir, overwrite, export, log=None, reads=()):
    """`export()`'s result, called under the run lock (writing `output_dir`, reading
    `run_dir` and `reads`) after `check_export_output`: the export commands' frame."""
    with run_lock(writes=[output_dir], reads=[run_dir, *reads]):
        check_export_output(output_dir, run_dir, overwrite, log=log)
        return export()


def _differences(recorded, wanted, prefix=""):
    """`(dotted key, recorded value, wanted value)` of every key whose values differ."""
    found = []
    for key in sorted(set(recorded) | set(wanted), key=str):
        old, new = recorded.get(key), wanted.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found += _differences(old, new, f"{prefix}{key}.")
        elif old != new:
            found.append((f"{prefix}{key}", old, new))
    return found


def _shown(value):
    return json.dumps(value) if not isinstance(value, str) else repr(value)
