"""AdamW that clips and accumulates the global gradient under `tf.distribute`."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_attn")
class GlobalGradientAdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` (Loshchilov & Hutter, 2019) made exact under `tf.distribute`.

    Keras 3 (3.15) applies `global_clipnorm` and `gradient_accumulation_steps` to each
    replica's *partial* gradient and all-reduces afterwards: with R replicas the clip sees
    norms of partial sums (so clipping changes with R), and each replica's accumulator
    holds a different partial sum (the "mirrored" copies diverge and a checkpoint keeps
    only the first). This optimizer all-reduces first: every replica then holds the global
    gradient `g`, clips and accumulates exactly what one device would, and passes `g / R`
    on, which Keras' own all-reduce sums back to `g` (exactly when R is a power of two).
    Without a strategy it is `keras.optimizers.AdamW`, with one more fix: with
    `gradient_accumulation_steps=k`, Keras 3.15 evaluates a learning-rate schedule at the
    micro-step count (`_iterations`, k per update), so a schedule over N updates ends
    after N/k of them (measured: a one-update linear schedule applies rate 0). Here the
    schedule sees `iterations`, the number of updates, as the docs of Keras promise.

    The training pipeline's losses are sums over the replica's examples already divided by
    the size of the global batch, so the summed gradient is the global-batch mean.

    Args: those of `keras.optimizers.AdamW`.

    Example:
    >>> optimizer = GlobalGradientAdamW(learning_rate=1e-3, global_clipnorm=1.0)
    >>> variable = keras.Variable([1.0, 2.0])
    >>> optimizer.apply([keras.ops.convert_to_tensor([30.0, 40.0])], [variable])
    >>> [round(float(v), 4) for v in variable.numpy()]  # clipped to norm 1, Adam step 1e-3
    [0.999, 1.999]
    """

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _replicas(self):
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return None, 1
        return context, context.num_replicas_in_sync

    def apply(self, grads, trainable_variables=None):
        context, replicas = self._replicas()
        if context is not None:
            grads = list(grads)
            present = [i for i, g in enumerate(grads) if g is not None]
            # Embedding gradients arrive as IndexedSlices; the sum over replicas is dense.
            dense = [tf.convert_to_tensor(grads[i]) for i in present]
            reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, dense)
            for i, g in zip(present, reduced):
                grads[i] = g / replicas
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        _, replicas = self._replicas()
        if replicas == 1:
            return super()._clip_gradients(grads)
        # `grads` are g / R here (see `apply`): clip g, hand on g / R.
        clipped = super()._clip_gradients([None if g is None else g * replicas for g in grads])
        return [None if g is None else g / replicas for g in clipped]
