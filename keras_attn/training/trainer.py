"""The training run behind `keras-attn train`: strategy, data, model, loop, checkpoints,
evaluation and results."""

import json
import math
import os
import pathlib
import platform
import time

import keras
import numpy as np
import tensorflow as tf

from keras_attn.training.config import ConfigError
from keras_attn.training.optimizer import make_optimizer
from keras_attn.training.progress_reporter import ProgressReporter
from keras_attn.training.progress_reporter import format_duration
from keras_attn.training.step_checkpoints import StepCheckpoints
from keras_attn.training.strategy import is_chief
from keras_attn.training.strategy import resolve_strategy
from keras_attn.training.tasks import make_task

# Training examples whose inference-mode min/max start the ranges of a new QAT model.
QAT_CALIBRATION_EXAMPLES = 128


class _FitRunner:
    """Runs steps with `model.fit` (one device, `MirroredStrategy`)."""

    name = "fit"

    def __init__(self, model, strategy, stream, on_step):
        self.model, self.strategy, self.stream, self.on_step = model, strategy, stream, on_step

    def run(self, start, stop):
        on_step, first = self.on_step, start

        class Adapter(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                on_step(first + batch + 1, float(logs["loss"]))

        self.model.fit(self.stream.dataset(start, stop), epochs=1, steps_per_epoch=stop - start,
                       verbose=0, shuffle=False, callbacks=[Adapter()])


class _LoopRunner:
    """Runs steps with `strategy.run` in a `tf.function` (any strategy; needed for
    `MultiWorkerMirroredStrategy` and TPUs, where Keras 3's `fit` fails).

    The replica step computes the same thing as Keras' `train_step`: the compiled loss
    (`model.compute_loss`, so task models with their own loss work), loss scaling for
    float16, and `optimizer.apply`, which all-reduces the gradients.
    """

    name = "loop"

    def __init__(self, model, strategy, stream, on_step, jit_compile):
        self.model, self.strategy, self.stream, self.on_step = model, strategy, stream, on_step
        optimizer = model.optimizer

        def replica_step(x, y, weights):
            with tf.GradientTape() as tape:
                y_pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights,
                                          training=True)
                scaled = optimizer.scale_loss(loss)
            gradients = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(gradients, model.trainable_variables)
            return loss

        def train_step(iterator):
            x, y, weights = next(iterator)
            losses = strategy.run(replica_step, args=(x, y, weights))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        self.train_step = tf.function(train_step, jit_compile=jit_compile,
                                      reduce_retracing=True)

    def run(self, start, stop):
        replicas = self.strategy.num_replicas_in_sync

        def dataset_fn(context):
            local = replicas // context.num_input_pipelines
            first = context.input_pipeline_id * local
            return self.stream.dataset(start, stop, num_shards=replicas,
                                       shards=tuple(range(first, first + local)))

        iterator = iter(self.strategy.distribute_datasets_from_function(dataset_fn))
        total, count = 0.0, 0
        for step in range(start, stop):
            total += float(self.train_step(iterator))
            count += 1
            self.on_step(step + 1, total / count)


class Trainer:
    """Trains a task model as a `TrainingConfig` says; `run()` returns the results dict
    that is also written to `<output_dir>/metrics.json`.

    Args:
        config: a `TrainingConfig`.
        log: callable receiving progress lines. Defaults to silence.
    """

    def __init__(self, config, log=None):
        self.config = config
        self.log = log or (lambda message: None)
        self.output_dir = pathlib.Path(config.output_dir or "runs/train")
        self.chief = is_chief()
        self.model = None  # the trained model, after `run()`
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
                "epochs_without_improvement": 0, "stopped_early": False}

    # --- the run ------------------------------------------------------------------------

    def run(self):
        # The dtype policy is process-global; the caller's is put back afterwards (the
        # trained model keeps the policy it was built with).
        previous_policy = keras.config.dtype_policy()
        try:
            return self._run()
        finally:
            keras.config.set_dtype_policy(previous_policy)

    def _run(self):
        config, train, log = self.config, self.config.train, self.log
        started = time.perf_counter()
        self._setup_numerics()
        strategy, description = resolve_strategy(
            config.distribute.strategy, tpu=config.distribute.tpu,
            logical_cpu_devices=config.distribute.logical_cpu_devices,
        )
        replicas = strategy.num_replicas_in_sync
        global_batch, per_replica = self._batch_sizes(replicas)
        runner_name = train.runner
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
        log(f"strategy: {description}; runner: {runner_name}; global batch {global_batch} = "
            f"{replicas} replicas x {per_replica}"
            + (f", {train.gradient_accumulation_steps} micro-batches per update"
               if train.gradient_accumulation_steps > 1 else ""))
        if self.chief:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.json").write_text(
                json.dumps(config.to_dict(), indent=1), encoding="utf-8")

        task = make_task(config, self.output_dir, log, write_files=self.chief)
        task.prepare()
        if self.chief:
            task.save_assets(self.output_dir)
        stream = task.batch_stream(global_batch, seed=train.seed,
                                   accumulation_steps=train.gradient_accumulation_steps,
                                   bucket_by_length=train.bucket_by_length)
        steps_per_epoch = stream.steps_per_epoch
        total_steps = steps_per_epoch * train.epochs
        if train.max_steps is not None:
            total_steps = min(total_steps, train.max_steps * train.gradient_accumulation_steps)
        updates = total_steps // train.gradient_accumulation_steps

        task.total_updates = updates
        with strategy.scope():
            keras.utils.set_random_seed(train.seed)
            model = task.build_model()
            if config.model.quantization_aware:
                from keras_attn.quantization.qat_bert import QatBert

                if isinstance(model, QatBert):  # a QAT run continued stays as it is
                    _check_continued_qat_model(model, config)
                else:
                    model = QatBert.from_float(
                        model, float_residual=config.model.float_residual,
                        feedforward_float_channels=config.model.feedforward_float_channels)
                    # Start the ranges from inference-mode min/max over a few training
                    # batches (what export's calibration does): an EMA started from one
                    # dropout batch clipped MiniLM's outlier activations (docs/export.md).
                    model.calibrate(task.input_batches(QAT_CALIBRATION_EXAMPLES))
                    count = min(QAT_CALIBRATION_EXAMPLES, len(task.train_examples))
                    log(f"QAT activation ranges calibrated on {count} training examples "
                        "(inference mode)")
                log("quantization-aware training: fake int8 quantization of weights and "
                    "activations (ranges: moving averages of the training batches)")
            optimizer = make_optimizer(train, updates, model)
            optimizer.build(model.trainable_variables)
            model.compile(optimizer=optimizer, loss=task.loss(), jit_compile=train.jit_compile)
        self.model = model
        log(f"model: {model.name}, {model.count_params():,} parameters; {updates:,} updates "
            f"({train.epochs} epochs x {steps_per_epoch // train.gradient_accumulation_steps:,}"
            f"{', capped by max_steps' if train.max_steps else ''})")

        checkpoints = StepCheckpoints(self.output_dir / "checkpoints", train.keep_checkpoints,
                                      log)
        state = self._trainer_state()
        meta = checkpoints.restore_latest(model, optimizer)
        if meta is not None:
            state.update(meta["trainer_state"])
            log(f"resumed from checkpoint at step {state['step']} "
                f"(epoch {state['step'] / steps_per_epoch:.2f})")

        writer = tf.summary.create_file_writer(str(self.output_dir / "tensorboard")) \
            if self.chief else None
        progress = ProgressReporter(total_steps, steps_per_epoch, train.log_every_steps, log,
                                    writer)
        inner = getattr(optimizer, "inner_optimizer", optimizer)

        def learning_rate():  # the schedule's value at the current update
            return float(keras.ops.convert_to_numpy(inner.learning_rate))

        def save(step):
            state["step"] = step
            extra = {"trainer_state": state}
            if self.chief:
                checkpoints.save(model, optimizer, step, extra)

        epoch_end = {"value": None}

        def on_step(step, loss):
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"loss became {loss} at step {step}; lower train.learning_rate, keep "
                    "train.clipnorm, or use mixed_bfloat16 instead of mixed_float16")
            progress.step(step, loss, stream.tokens(step - 1), learning_rate())
            if step % train.checkpoint_every_steps == 0 and step != epoch_end["value"]:
                save(step)

        if runner_name == "fit":
            runner = _FitRunner(model, strategy, stream, on_step)
        else:
            runner = _LoopRunner(model, strategy, stream, on_step, train.jit_compile)

        predict_function = tf.function(lambda x: model(x, training=False),
                                       reduce_retracing=True)

        def predict(x):
            outputs = predict_function(x)
            return keras.tree.map_structure(
                lambda o: np.asarray(keras.ops.convert_to_numpy(o)).astype(
                    "float32" if np.issubdtype(np.asarray(o).dtype, np.floating) else
                    np.asarray(o).dtype), outputs)

        step = state["step"]
        progress.start(step)
        train_started = time.perf_counter()
        while step < total_steps and not state["stopped_early"]:
            epoch = step // steps_per_epoch
            stop = min((epoch + 1) * steps_per_epoch, total_steps)
            epoch_end["value"] = stop
            runner.run(step, stop)
            step = stop
            progress.end_line()
            record = {"epoch": epoch + 1, "step": step,
                      "updates": step // train.gradient_accumulation_steps,
                      "tokens_per_second": round(progress.run_tokens_per_second, 1)}
            if task.dev_examples is not None:
                scores = task.evaluate(predict, task.dev_examples, train.eval_batch_size)
                record["dev"] = scores
                progress.scalars(step, scores, "dev")
                self._early_stopping(state, task, scores[task.metric], epoch + 1, model)
                log(f"epoch {epoch + 1}: dev {task.metric} {scores[task.metric]:.4f} "
                    f"(best {state['best_value']:.4f} at epoch {state['best_epoch']})")
            state["history"].append(record)
            save(step)
            progress.start(step)
        train_seconds = time.perf_counter() - train_started
        return self._finish(task, model, predict, state, stream, {
            "strategy": description, "runner": runner_name, "replicas": replicas,
            "global_batch_size": global_batch, "per_replica_batch_size": per_replica,
            "gradient_accumulation_steps": train.gradient_accumulation_steps,
            "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
            "updates": updates, "train_seconds_this_process": round(train_seconds, 1),
            "wall_seconds_this_process": round(time.perf_counter() - started, 1),
        })

    def _early_stopping(self, state, task, value, epoch, model):
        best = state["best_value"]
        improved = best is None or (value > best if task.higher_is_better else value < best)
        if improved:
            state.update(best_value=value, best_epoch=epoch, epochs_without_improvement=0)
            # Every worker keeps its own copy: no worker waits for the chief's file.
            self._best_weights = [np.array(v.numpy()) for v in model.weights]
            if self.chief:
                model.save_weights(self.output_dir / "best.weights.h5")
        else:
            state["epochs_without_improvement"] += 1
            patience = self.config.train.early_stopping_patience
            if patience is not None and state["epochs_without_improvement"] >= patience:
                state["stopped_early"] = True
                self.log(f"early stopping: no dev improvement for {patience} epochs")

    def _finish(self, task, model, predict, state, stream, facts):
        config, log = self.config, self.log
        best_file = self.output_dir / "best.weights.h5"
        if self._best_weights is not None:
            model.set_weights(self._best_weights)
            log(f"restored the best weights (epoch {state['best_epoch']})")
        elif state["best_epoch"] is not None and best_file.is_file():
            model.load_weights(best_file)  # the best epoch was before a resume
            log(f"restored the best weights (epoch {state['best_epoch']}) from {best_file}")
        results = {
            "task": task.name, "metric": task.metric, "config": config.to_dict(),
            **facts,
            "best_epoch": state["best_epoch"], "best_dev": None, "test": None,
            "stopped_early": state["stopped_early"], "history": state["history"],
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
            inference.save(self.output_dir / "model.keras")
            (self.output_dir / "metrics.json").write_text(
                json.dumps(results, indent=1, default=float), encoding="utf-8")
            log(f"wrote {self.output_dir / 'model.keras'} and {self.output_dir / 'metrics.json'}"
                f" in {format_duration(facts['wall_seconds_this_process'])}")
        return results


def _check_continued_qat_model(model, config):
    """A continued QAT run keeps its quantizer layout; a config asking for another is an error
    rather than silently ignored (its activation ranges were calibrated for that layout)."""
    differences = model.layout_differences(config.model.float_residual,
                                           config.model.feedforward_float_channels)
    if differences:
        key, found, asked = differences[0]
        raise ConfigError(
            f"model.checkpoint={config.model.checkpoint} is a QAT run with {key}={found}, "
            f"but model.{key} is {asked}: set model.{key}: {json.dumps(found)} to continue "
            "it, or continue its float run instead", config.source)


def train(config, log=None):
    """Trains as `config` (a `TrainingConfig`) says and returns the results dict."""
    return Trainer(config, log).run()
