"""Checkpoints of a whole training state, written atomically and verified when read.

A checkpoint is a directory `step-00001200/` with
- `state.npz`: every model variable (weights, and the dropout seed-generator states) and
  every optimizer variable (iteration count, moments, accumulators, loss scale), in order;
- `meta.json`, written last: the step, the data position, the variable paths and shapes,
  and the SHA-256 of `state.npz`.

It is first written under a temporary name and renamed when complete, so a process killed
mid-write leaves no directory that looks finished. Reading checks the checksum and that
every variable matches the model's by path and shape; a checkpoint that fails is reported
and the previous one is tried, so a corrupt latest checkpoint costs only the steps since
the one before.

Besides the newest `keep`, the newest `keep_milestones` checkpoints whose step is a
milestone (the trainer's epoch ends) are kept, for `average_weights` (checkpoint averaging,
Vaswani et al. 2017, 6.1).
"""

import hashlib
import json
import pathlib
import re
import shutil
import time

import numpy as np

from keras_attn import atomic_files
from keras_attn.errors import KerasAttnError

PREFIX = "step-"
# Keras makes top-level names unique per process (`adam_w_1/...`, `seed_generator_3/...`):
# the suffix depends on what the process built before, so it is not compared.
_PROCESS_SUFFIX = re.compile(r"^([^/]+?)_\d+/")
# Seed generators (dropout's random state) are numbered per process wherever they are.
_SEED_GENERATOR_NUMBER = re.compile(r"(^|/)seed_generator_\d+(?=/)")


def _comparable(path):
    return _SEED_GENERATOR_NUMBER.sub(r"\1seed_generator", _PROCESS_SUFFIX.sub(r"\1/", path))


def step_of(path):
    """The step of the checkpoint directory `path` (`step-00001200` -> 1200)."""
    return int(pathlib.Path(path).name[len(PREFIX):])


class CheckpointError(KerasAttnError, RuntimeError):
    """A checkpoint that cannot be used, with the reason."""


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _variables(model, optimizer):
    variables = [("model", v) for v in model.variables]
    if optimizer is not None:
        variables += [("optimizer", v) for v in optimizer.variables]
    return variables


class StepCheckpoints:
    """Saves and restores the training state of a model and its optimizer every N steps.

    Args:
        directory: where the `step-*` directories go.
        keep: how many of the newest checkpoints to keep. Defaults to `3`.
        log: callable receiving one-line messages (skipped corrupt checkpoints).
        keep_milestones: how many of the newest milestone checkpoints to keep besides
            those. Defaults to `0`.
        is_milestone: callable, step -> bool (e.g. an epoch's end). Defaults to none.

    Example:
    >>> import tempfile
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> checkpoints = StepCheckpoints(tempfile.mkdtemp())
    >>> path = checkpoints.save(model, None, step=10, extra={"epoch": 0})
    >>> _ = model.layers[0].kernel.assign(np.zeros((2, 1)))
    >>> checkpoints.restore_latest(model, None)["step"]
    10
    """

    def __init__(self, directory, keep=3, log=None, keep_milestones=0, is_milestone=None):
        self.directory = pathlib.Path(directory)
        self.keep = keep
        self.log = log or (lambda message: None)
        self.keep_milestones = keep_milestones
        self.is_milestone = is_milestone or (lambda step: False)

    def milestones(self):
        """Finished checkpoint directories at milestone steps, oldest first."""
        return [path for path in self.paths() if self.is_milestone(step_of(path))]

    def paths(self):
        """Finished checkpoint directories, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            if path.is_dir() and path.name.startswith(PREFIX) and path.name[len(PREFIX):].isdigit():
                found.append((int(path.name[len(PREFIX):]), path))
        return [path for _, path in sorted(found)]

    def save(self, model, optimizer, step, extra=None):
        """Writes the state at `step` (plus the JSON-able `extra`) and prunes old ones."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{step:08d}"
        atomic_files.remove_stale_temporaries(self.directory)  # of a killed run
        variables = _variables(model, optimizer)
        arrays = {f"{i:05d}": np.asarray(v.numpy()) for i, (_, v) in enumerate(variables)}
        with atomic_files.atomic_path(final) as temporary:  # synced, then renamed
            temporary.mkdir()
            with open(temporary / "state.npz", "wb") as file:
                np.savez(file, **arrays)
            meta = {
                "step": int(step),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "state_sha256": _sha256(temporary / "state.npz"),
                "variables": [
                    {"owner": owner, "path": v.path, "shape": list(arrays[f"{i:05d}"].shape),
                     "dtype": str(arrays[f"{i:05d}"].dtype)}
                    for i, (owner, v) in enumerate(variables)
                ],
                **(extra or {}),
            }
            with open(temporary / "meta.json", "w", encoding="utf-8") as file:
                json.dump(meta, file, indent=1)
        kept = set(self.paths()[-self.keep:])
        if self.keep_milestones:
            kept.update(self.milestones()[-self.keep_milestones:])
        for old in self.paths():
            if old not in kept:
                shutil.rmtree(old, ignore_errors=True)
        return final

    def read(self, path, model, optimizer, owners=("model", "optimizer")):
        """`(meta, arrays)` of the checkpoint at `path`, verified against the model.
        `owners=("model",)` reads the model's variables only.

        Raises `CheckpointError` saying what is wrong (missing file, checksum mismatch,
        unreadable arrays, variables that do not match the model).
        """
        path = pathlib.Path(path)
        meta_path, state_path = path / "meta.json", path / "state.npz"
        if not meta_path.is_file() or not state_path.is_file():
            raise CheckpointError(f"{path}: incomplete (meta.json or state.npz missing)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise CheckpointError(f"{meta_path}: unreadable ({error})") from None
        if not isinstance(meta, dict):
            raise CheckpointError(f"{meta_path}: not a checkpoint description (a JSON object)")
        if _sha256(state_path) != meta.get("state_sha256"):
            raise CheckpointError(f"{state_path}: checksum mismatch (file damaged or partial)")
        variables = [(owner, v) for owner, v in _variables(model, optimizer) if owner in owners]
        stored = [(i, saved) for i, saved in enumerate(meta.get("variables", []))
                  if saved.get("owner") in owners]
        expected = [saved for _, saved in stored]
        if len(expected) != len(variables):
            raise CheckpointError(
                f"{path}: holds {len(expected)} variables"
                f"{'' if len(owners) > 1 else ' of the ' + owners[0]}, the "
                f"{' and '.join(owners)} {'have' if len(owners) > 1 else 'has'} "
                f"{len(variables)} (a different model or "
                "optimizer configuration)"
            )
        try:
            with np.load(state_path) as state:
                arrays = [state[f"{i:05d}"] for i, _ in stored]
        except Exception as error:  # zipfile/pickle errors have no common base class
            raise CheckpointError(f"{state_path}: unreadable ({error})") from None
        for (owner, variable), saved, array in zip(variables, expected, arrays):
            if (tuple(array.shape) != tuple(variable.shape)
                    or _comparable(saved["path"]) != _comparable(variable.path)):
                raise CheckpointError(
                    f"{path}: variable {saved['path']} {tuple(array.shape)} does not match "
                    f"{owner} variable {variable.path} {tuple(variable.shape)}"
                )
        return meta, arrays

    def average_weights(self, paths, model):
        """The model's weights averaged over the checkpoints at `paths`:
        theta = (1/N) sum_i theta_i for every floating-point variable; the others (seed
        generator states) are taken from the last checkpoint. A list in `model.variables`
        order, for `set_weights`-style assignment.

        Raises `CheckpointError` when a checkpoint is unusable (see `read`).
        """
        if not paths:
            raise CheckpointError(f"{self.directory}: no checkpoints to average")
        sums = None
        for path in paths:
            meta, arrays = self.read(path, model, None, owners=("model",))
            if sums is None:
                sums = [a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
                        for a in arrays]
                continue
            sums = [total + a if np.issubdtype(a.dtype, np.floating) else a
                    for total, a in zip(sums, arrays)]
        return [(total / len(paths)).astype(v.dtype) if np.issubdtype(total.dtype, np.floating)
                else total for total, v in zip(sums, arrays)]

    def restore(self, path, model, optimizer):
        """Assigns the state at `path` to the model and optimizer; returns its meta."""
        meta, arrays = self.read(path, model, optimizer)
        for (_, variable), array in zip(_variables(model, optimizer), arrays):
            variable.assign(array)
        return meta

    def restore_latest(self, model, optimizer):
        """Restores the newest usable checkpoint; returns its meta, or `None` if none.

        Checkpoints that fail verification are reported through `log` and skipped.
        """
        for path in reversed(self.paths()):
            try:
                return self.restore(path, model, optimizer)
            except CheckpointError as error:
                self.log(f"skipping unusable checkpoint: {error}")
        return None
