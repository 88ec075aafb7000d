"""The loop inside `Trainer.run`: `EpochLoop` (epochs of steps, the progress line, step
checkpoints, and after each epoch the dev evaluation, early stopping and a checkpoint) over
a step runner, `FitRunner` (`model.fit`) or `LoopRunner` (`strategy.run`)."""

import math
import time

import keras
import numpy as np
import tensorflow as tf


class FitRunner:
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


class LoopRunner:
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


class EpochLoop:
    """The training loop of one `Trainer.run`: epochs of runner steps, the progress line,
    step checkpoints, and after each epoch the dev evaluation, early stopping and a
    checkpoint."""

    def __init__(self, trainer, task, model, optimizer, stream, checkpoints, state, progress):
        self.trainer, self.task, self.model, self.optimizer = trainer, task, model, optimizer
        self.stream, self.checkpoints, self.state = stream, checkpoints, state
        self.progress = progress
        self.train = trainer.config.train
        self.epoch_end = None  # the epoch's last step is checkpointed after its evaluation
        self.inner = getattr(optimizer, "inner_optimizer", optimizer)
        self.predict_functions = {}

    def predict(self, x):
        """Numpy outputs of the model for batch `x` (floats as float32). One trace per input
        structure: its signature leaves every dimension free, so evaluation batches of other
        sizes and lengths do not retrace."""
        specs = tf.nest.map_structure(
            lambda v: tf.TensorSpec([None] * np.ndim(v), tf.as_dtype(np.asarray(v).dtype)), x)
        key = repr(specs)
        if key not in self.predict_functions:
            self.predict_functions[key] = tf.function(
                lambda batch: self.model(batch, training=False), input_signature=[specs])
        outputs = self.predict_functions[key](tf.nest.map_structure(tf.constant, x))
        return keras.tree.map_structure(
            lambda o: np.asarray(keras.ops.convert_to_numpy(o)).astype(
                "float32" if np.issubdtype(np.asarray(o).dtype, np.floating) else
                np.asarray(o).dtype), outputs)

    def save(self, step):
        self.state["step"] = step
        if self.trainer.chief:
            self.checkpoints.save(self.model, self.optimizer, step,
                                  {"trainer_state": self.state})

    def on_step(self, step, loss):
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"loss became {loss} at step {step}; lower train.learning_rate, keep "
                "train.clipnorm, or use mixed_bfloat16 instead of mixed_float16")
        learning_rate = float(keras.ops.convert_to_numpy(self.inner.learning_rate))
        self.progress.step(step, loss, self.stream.tokens(step - 1), learning_rate)
        if step % self.train.checkpoint_every_steps == 0 and step != self.epoch_end:
            self.save(step)

    def run(self, runner, total_steps):
        step, steps_per_epoch = self.state["step"], self.stream.steps_per_epoch
        self.progress.start(step)
        while step < total_steps and not self.state["stopped_early"] \
                and not self.out_of_time():
            epoch = step // steps_per_epoch
            stop = self.epoch_end = min((epoch + 1) * steps_per_epoch, total_steps)
            runner.run(step, stop)
            step = stop
            self.progress.end_line()
            self.state["history"].append(self.end_of_epoch(epoch, step))
            self.save(step)
            self.progress.start(step)

    def out_of_time(self):
        """Whether the next epoch's training, if it takes as long as the last one's, would
        end past `train.time_budget_minutes` of training (validation is not counted: its
        cost depends on the decoding settings and on how long an untrained model's outputs
        run, not on what training costs)."""
        budget, history = self.train.time_budget_minutes, self.state["history"]
        if budget is None or not history:
            return False
        seconds = [h.get("train_seconds", 0.0) for h in history]
        if sum(seconds) + seconds[-1] <= budget * 60:
            return False
        self.state["stopped_for_time"] = True
        self.trainer.log(f"time budget: {sum(seconds) / 60:.1f} of {budget:g} minutes of "
                         f"training spent in {len(history)} epochs; another would take "
                         f"{seconds[-1] / 60:.1f}: stopping")
        return True

    def end_of_epoch(self, epoch, step):
        """The epoch's history record, with its dev scores (early stopping follows them)."""
        task, state = self.task, self.state
        record = {"epoch": epoch + 1, "step": step,
                  "updates": step // self.train.gradient_accumulation_steps,
                  "tokens_per_second": round(self.progress.run_tokens_per_second, 1),
                  # this process's part of the epoch (all of it unless resumed within it)
                  "tokens": self.progress.run_tokens,
                  "train_seconds": round(self.progress.run_seconds, 1)}
        if task.dev_examples is not None:
            started = time.perf_counter()
            scores = task.evaluate(self.predict, task.dev_examples, self.train.eval_batch_size)
            record["dev"] = scores
            record["eval_seconds"] = round(time.perf_counter() - started, 1)
            self.progress.scalars(step, scores, "dev")
            self.trainer.early_stopping(state, task, scores[task.metric], epoch + 1,
                                         self.model)
            self.trainer.log(f"epoch {epoch + 1}: dev {task.metric} "
                             f"{scores[task.metric]:.4f} (best {state['best_value']:.4f} at "
                             f"epoch {state['best_epoch']})")
        return record
