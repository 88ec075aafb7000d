"""The training run behind `keras-attn train`: strategy, data, model, loop, checkpoints,
evaluation and results."""

import json
import os
import pathlib
import platform
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn import atomic_files
from keras_attn.models.gpt_causal_lm import copy_head_tables
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_layout
from keras_attn.runs.config_schema import ConfigError
from keras_attn.runs.overwrite_guard import check_train_output
from keras_attn.runs.quantization_recipe import QuantizationRecipe
from keras_attn.runs.run_directory import RunDirectory
from keras_attn.runs.run_directory import lineage_of
from keras_attn.runs.run_lock import run_lock
from keras_attn.training.epoch_loop import EpochLoop
from keras_attn.training.epoch_loop import FitRunner
from keras_attn.training.epoch_loop import LoopRunner
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.progress_reporter import ProgressReporter
from keras_attn.training.progress_reporter import format_duration
from keras_attn.training.step_checkpoints import StepCheckpoints
from keras_attn.training.step_checkpoints import step_of
from keras_attn.training.strategy import is_chief
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.tasks import make_task


class Trainer:
    """Trains a task model as a `TrainingConfig` says; `run()` returns the results dict
    that is also written to `<output_dir>/metrics.json`.

    Args:
        config: a `TrainingConfig`.
        log: callable receiving progress lines. Defaults to silence.
        quantization: the `QuantizationRecipe` a quantization-aware run records in its
            `lineage.json` (the quantize stage passes its own); derived from the config.
        overwrite: bool, replace a run of another configuration in the output directory
            (`keras_attn.runs.overwrite_guard`); without it such a directory is an
            `OverwriteError`, and a run of the same configuration is resumed.
    """

    def __init__(self, config, log=None, quantization=None, overwrite=False):
        self.config = config
        self.overwrite = overwrite
        self.log = log or (lambda message: None)
        self.output_dir = pathlib.Path(config.output_dir or "runs/train")
        self.chief = is_chief()
        self.model = None  # the trained model, after `run()`
        # A quantization-aware run records its recipe in lineage.json (export reads it).
        self.quantization = None
        if config.model.quantization_aware:
            self.quantization = quantization or QuantizationRecipe.from_config(config)
        self._best_weights = None

    # --- set-up -------------------------------------------------------------------------

    def _setup_numerics(self):
        train = self.config.train
        keras.utils.set_random_seed(train.seed)
        if train.deterministic:
            tf.config.experimental.enable_op_determinism()
        keras.mixed_precision.set_dtype_policy(train.mixed_precision or "float32")

    def _batch_sizes(self, replicas):
        train = self.config.train
        if train.per_replica_batch_size is not None:
            return train.per_replica_batch_size * replicas, train.per_replica_batch_size
        if train.global_batch_size % replicas:
            raise ConfigError(
                f"train.global_batch_size={train.global_batch_size} does not divide over "
                f"{replicas} replicas: use a multiple of {replicas} or set "
                "train.per_replica_batch_size", self.config.source)
        return train.global_batch_size, train.global_batch_size // replicas

    def _trainer_state(self):
        return {"step": 0, "history": [], "best_value": None, "best_epoch": None,
                "epochs_without_improvement": 0, "stopped_early": False,
                "stopped_for_time": False}

    # --- the run ------------------------------------------------------------------------

    def run(self):
        # The dtype policy is process-global; the caller's is put back afterwards (the
        # trained model keeps the policy it was built with).
        previous_policy = keras.config.dtype_policy()
        try:
            # The chief writes the run directory and holds it while it runs (a second
            # process writing it is refused); the other workers of its job write nothing there.
            with run_lock(writes=[self.output_dir] if self.chief else []):
                return self._run()
        finally:
            keras.config.set_dtype_policy(previous_policy)

    def _run(self):
        train, started = self.config.train, time.perf_counter()
        if self.chief or not self.overwrite:  # the chief alone removes a replaced run
            check_train_output(self.output_dir, self.config, self.overwrite and self.chief,
                               self.log)
        self._setup_numerics()
        strategy, description, runner_name = self._strategy()
        replicas = strategy.num_replicas_in_sync
        global_batch, per_replica = self._batch_sizes(replicas)
        self.log(f"strategy: {description}; runner: {runner_name}; global batch {global_batch} "
                 f"= {replicas} replicas x {per_replica}"
                 + (f", {train.gradient_accumulation_steps} micro-batches per update"
                    if train.gradient_accumulation_steps > 1 else ""))
        task, stream = self._data(global_batch)
        total_steps = stream.steps_per_epoch * train.epochs
        if train.max_steps is not None:
            total_steps = min(total_steps, train.max_steps * train.gradient_accumulation_steps)
        updates = total_steps // train.gradient_accumulation_steps
        model, optimizer = self._model(strategy, task, updates)
        self.log(f"model: {model.name}, {model.count_params():,} parameters; {updates:,} "
                 f"updates ({train.epochs} epochs x "
                 f"{stream.steps_per_epoch // train.gradient_accumulation_steps:,}"
                 f"{', capped by max_steps' if train.max_steps else ''})")
        checkpoints, state = self._restore(model, optimizer, stream.steps_per_epoch,
                                           total_steps)
        progress = ProgressReporter(
            total_steps, stream.steps_per_epoch, train.log_every_steps, self.log,
            tf.summary.create_file_writer(str(self.output_dir / "tensorboard"))
            if self.chief else None)
        loop = EpochLoop(self, task, model, optimizer, stream, checkpoints, state, progress)
        runner = FitRunner(model, strategy, stream, loop.on_step) if runner_name == "fit" \
            else LoopRunner(model, strategy, stream, loop.on_step, train.jit_compile)
        train_started = time.perf_counter()
        loop.run(runner, total_steps)
        train_seconds = time.perf_counter() - train_started
        return self._finish(task, model, loop.predict, state, stream, checkpoints, {
            "strategy": description, "runner": runner_name, "replicas": replicas,
            "global_batch_size": global_batch, "per_replica_batch_size": per_replica,
            "gradient_accumulation_steps": train.gradient_accumulation_steps,
            "steps_per_epoch": stream.steps_per_epoch, "total_steps": total_steps,
            "updates": updates, "train_seconds_this_process": round(train_seconds, 1),
            "wall_seconds_this_process": round(time.perf_counter() - started, 1),
        })

    def _strategy(self):
        """`(strategy, description, runner name)`: the `tf.distribute` strategy and whether
        `model.fit` or the `strategy.run` loop drives it."""
        config = self.config
        strategy, description = resolve_strategy(
            config.distribute.strategy, tpu=config.distribute.tpu,
            logical_cpu_devices=config.distribute.logical_cpu_devices)
        runner_name = config.train.runner
        if runner_name == "auto":
            multi = isinstance(strategy, (tf.distribute.MultiWorkerMirroredStrategy,
                                          tf.distribute.TPUStrategy))
            runner_name = "loop" if multi else "fit"
        elif runner_name == "fit" and isinstance(strategy,
                                                 tf.distribute.MultiWorkerMirroredStrategy):
            raise ConfigError(
                "train.runner=fit cannot run under MultiWorkerMirroredStrategy: Keras 3's "
                "fit fails there (keras-team/keras#20585). Use runner: auto or loop.",
                config.source)
        return strategy, description, runner_name

    def _data(self, global_batch):
        """The prepared task and its batch stream; the chief starts the run directory."""
        config, train = self.config, self.config.train
        task = make_task(config, self.output_dir, self.log, write_files=self.chief)
        task.prepare()
        if self.chief:
            RunDirectory(self.output_dir).write_start(
                config, task.tokenizer_settings(), lineage_of(
                    config.model.checkpoint,
                    self.quantization and self.quantization.to_dict()))
            task.save_assets(self.output_dir)
        stream = task.batch_stream(global_batch, seed=train.seed,
                                   accumulation_steps=train.gradient_accumulation_steps,
                                   bucket_by_length=train.bucket_by_length)
        return task, stream

    def _model(self, strategy, task, updates):
        """The compiled task model (its QAT twin for quantization-aware runs) and optimizer,
        built in the strategy's scope."""
        train = self.config.train
        task.total_updates = updates
        with strategy.scope():
            keras.utils.set_random_seed(train.seed)
            model = task.build_model()
            if self.config.model.quantization_aware:
                model = self._quantization_aware(model, task)
            optimizer = make_optimizer(train, updates, model)
            optimizer.build(model.trainable_variables)
            model.compile(optimizer=optimizer, loss=task.loss(), jit_compile=train.jit_compile)
        self.model = model
        return model, optimizer

    def _quantization_aware(self, model, task):
        if activation_quantizers(model):  # a QAT run continued stays as it is
            _check_continued_qat_model(model, self.config)
        else:
            if self.config.model.checkpoint is None:
                self.log("warning: quantization-aware training from fresh weights (no "
                         "model.checkpoint): the activation ranges of an untrained model "
                         "clip what training grows, and on our measurements the loss stayed "
                         "at chance; train the float model first, then continue its run with "
                         "model.quantization_aware: true")
            # Start the ranges from inference-mode min/max over a few training batches
            # (what the quantize stage's calibration does): an EMA started from one dropout
            # batch clipped MiniLM's outlier activations (docs/export.md).
            count = self.quantization.calibration_examples
            model = task.quantization_aware_copy(model, self.quantization.layout(), count)
            self.log(f"QAT activation ranges calibrated on "
                     f"{min(count, len(task.train_examples))} training examples "
                     "(inference mode)")
        self.log("quantization-aware training: fake int8 quantization of weights and "
                 "activations (ranges: moving averages of the training batches)")
        return model

    def _restore(self, model, optimizer, steps_per_epoch, total_steps):
        """`(checkpoints, trainer state)`, resumed from the latest checkpoint if any. The
        last `train.average_checkpoints` epoch ends are kept for averaging."""
        checkpoints = StepCheckpoints(
            self.output_dir / "checkpoints", self.config.train.keep_checkpoints, self.log,
            keep_milestones=self.config.train.average_checkpoints,
            is_milestone=lambda step: step % steps_per_epoch == 0 or step == total_steps)
        state = self._trainer_state()
        meta = checkpoints.restore_latest(model, optimizer)
        if meta is not None:
            state.update(meta["trainer_state"])
            self.log(f"resumed from checkpoint at step {state['step']} "
                     f"(epoch {state['step'] / steps_per_epoch:.2f})")
        return checkpoints, state

    def early_stopping(self, state, task, value, epoch, model):
        """After epoch `epoch`'s dev score `value`: keeps the best weights (and
        `best.weights.h5`), or counts an epoch without improvement and stops the run after
        `train.early_stopping_patience` of them."""
        best = state["best_value"]
        improved = best is None or (value > best if task.higher_is_better else value < best)
        if improved:
            state.update(best_value=value, best_epoch=epoch, epochs_without_improvement=0)
            # Every worker keeps its own copy: no worker waits for the chief's file.
            self._best_weights = [np.array(v.numpy()) for v in model.weights]
            if self.chief:
                with atomic_files.atomic_path(self.output_dir / "best.weights.h5") as path:
                    model.save_weights(path)
        else:
            state["epochs_without_improvement"] += 1
            patience = self.config.train.early_stopping_patience
            if patience is not None and state["epochs_without_improvement"] >= patience:
                state["stopped_early"] = True
                self.log(f"early stopping: no dev improvement for {patience} epochs")

    def _average_checkpoints(self, task, model, predict, state, checkpoints, steps_per_epoch):
        """Checkpoint averaging (`train.average_checkpoints`, Vaswani et al. 2017, 6.1): the
        model's weights averaged over the last N epochs' checkpoints, kept when they score
        better on dev than the best epoch (whose weights the model holds on entry). Returns
        the record for `metrics.json`, or `None` when off. The chief alone (it writes the
        checkpoints and the model) averages."""
        count = self.config.train.average_checkpoints
        if not count or task.dev_examples is None or not self.chief:
            return None
        paths = checkpoints.milestones()[-count:]
        epochs = [-(-step_of(path) // steps_per_epoch) for path in paths]
        if len(paths) < 2:
            self.log(f"checkpoint averaging: {len(paths)} epoch checkpoint(s) in "
                     f"{checkpoints.directory}, 2 or more needed; the best epoch is used")
            return {"epochs": epochs, "used": False, "dev": None}
        best = [np.array(v.numpy()) for v in model.variables]
        for variable, value in zip(model.variables, checkpoints.average_weights(paths, model)):
            variable.assign(value)
        scores = task.evaluate(predict, task.dev_examples, self.config.train.eval_batch_size)
        value, best_value = scores[task.metric], state["best_value"]
        used = value > best_value if task.higher_is_better else value < best_value
        if not used:
            for variable, value_before in zip(model.variables, best):
                variable.assign(value_before)
        self.log(f"checkpoint average of epochs {epochs[0]}-{epochs[-1]}: dev {task.metric} "
                 f"{value:.4f} vs {best_value:.4f} at the best epoch {state['best_epoch']}: "
                 f"{'the average' if used else 'the best epoch'} is kept")
        return {"epochs": epochs, "used": bool(used), "dev": scores}

    def _finish(self, task, model, predict, state, stream, checkpoints, facts):
        config, log = self.config, self.log
        best_file = self.output_dir / "best.weights.h5"
        if self._best_weights is not None:
            model.set_weights(self._best_weights)
            log(f"restored the best weights (epoch {state['best_epoch']})")
        elif state["best_epoch"] is not None and best_file.is_file():
            model.load_weights(best_file)  # the best epoch was before a resume
            log(f"restored the best weights (epoch {state['best_epoch']}) from {best_file}")
        history = state["history"]
        results = {
            "task": task.name, "metric": task.metric, "config": config.to_dict(),
            **facts,
            # every process's training and evaluation time (the epochs that record it)
            "train_seconds": round(sum(h.get("train_seconds", 0.0) for h in history), 1),
            "eval_seconds": round(sum(h.get("eval_seconds", 0.0) for h in history), 1),
            "checkpoint_average": self._average_checkpoints(
                task, model, predict, state, checkpoints, stream.steps_per_epoch),
            "best_epoch": state["best_epoch"], "best_dev": None, "test": None,
            "stopped_early": state["stopped_early"],
            "stopped_for_time": state.get("stopped_for_time", False), "history": history,
            "examples": {"train": stream.num_examples,
                         "dev": len(task.dev_examples) if task.dev_examples else 0,
                         "test": len(task.test_examples) if task.test_examples else 0},
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": os.cpu_count(), "tensorflow": tf.__version__,
                        "keras": keras.__version__},
        }
        if state["best_epoch"] is not None:
            results["best_dev"] = state["history"][state["best_epoch"] - 1].get("dev")
        if task.test_examples is not None:
            results["test"] = task.evaluate(predict, task.test_examples,
                                            config.train.eval_batch_size)
            log(f"test {task.metric}: {results['test'][task.metric]:.4f}")
        if self.chief:
            # For inference and export: the architecture and best weights, not compiled (the
            # optimizer state lives in checkpoints/; loading needs no training classes).
            trained = task.inference_model(model)
            inference = trained.__class__.from_config(trained.get_config())
            inference.set_weights(trained.get_weights())
            copy_head_tables(trained, inference)
            RunDirectory(self.output_dir).write_finish(inference, results)
            log(f"wrote {self.output_dir / 'model.keras'} and {self.output_dir / 'metrics.json'}"
                f" in {format_duration(facts['wall_seconds_this_process'])}")
        return results


def _check_continued_qat_model(model, config):
    """A continued QAT run keeps its quantizer layout; a config asking for another is an error
    rather than silently ignored (its activation ranges were calibrated for that layout)."""
    asked = {"float_residual": config.model.float_residual,
             "feedforward_float_channels": config.model.feedforward_float_channels}
    differences = [(key, found, asked[key]) for key, found in model_layout(model).items()
                   if found != asked[key]]
    if differences:
        key, found, asked = differences[0]
        raise ConfigError(
            f"model.checkpoint={config.model.checkpoint} is a QAT run with {key}={found}, "
            f"but model.{key} is {asked}: set model.{key}: {json.dumps(found)} to continue "
            "it, or continue its float run instead", config.source)


def train(config, log=None, quantization=None, overwrite=False):
    """Trains as `config` (a `TrainingConfig`) says and returns the results dict; `overwrite`
    replaces a run of another configuration in its output directory (see `Trainer`)."""
    return Trainer(config, log, quantization, overwrite).run()
