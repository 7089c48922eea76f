"""One optimizer step of the built-in trainer: k micro-batches, one allreduce, one update.

"A k times bigger device": each step takes the rank's whole per-device batch, runs forward
and backward on its k micro-batches one after another (a tf.while_loop, so only one
micro-batch's activations exist at a time), sums the gradients, averages them over the k
micro-batches and over the ranks in one grouped Horovod allreduce, then applies them once.

Why not Horovod's own accumulation (DistributedOptimizer's backward_passes_per_step, which
train.distributed.optimizer offers users' scripts): there every micro-batch is a Keras step
of its own, with a Python round trip, an assign_add into accumulator variables and a
tf.cond per gradient. On the benchmark's MLP that ran 4 x 64 at 0.71-0.78 of one batch of
256; inside one step it runs at 0.87-0.92, against a ceiling of 0.95-0.97 for the matrix
products alone (`make bench`, item 3).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


class AccumulatingModel(tf.keras.Model):
    """Trains `inner` (which is what gets checkpointed and exported) with `steps` micro-batches
    per optimizer step; evaluation and prediction are `inner`'s own. `mean_over_ranks` turns
    this rank's mean gradients into the mean over every rank (train.sync)."""

    def __init__(self, inner: tf.keras.Model, steps: int, mean_over_ranks: Callable[[list], list]):
        super().__init__(name=f"{inner.name}_accumulating")
        self.inner, self.steps, self.mean_over_ranks = inner, steps, mean_over_ranks

    def call(self, inputs, training=None):
        return self.inner(inputs, training=training)

    def train_step(self, data):
        features, labels = data
        micro = tf.shape(features)[0] // self.steps
        variables = self.inner.trainable_variables

        def micro_step(index, sums):
            rows = slice(index * micro, (index + 1) * micro)
            with tf.GradientTape() as tape:
                predicted = self.inner(features[rows], training=True)
                loss = self.compiled_loss(
                    labels[rows], predicted, regularization_losses=self.inner.losses
                )
            self.compiled_metrics.update_state(labels[rows], predicted)
            gradients = tape.gradient(loss, variables)
            return index + 1, [
                total + tf.convert_to_tensor(gradient) for total, gradient in zip(sums, gradients)
            ]

        _, sums = tf.while_loop(
            lambda index, _: index < self.steps,
            micro_step,
            (tf.constant(0), [tf.zeros_like(v) for v in variables]),
        )
        # distributed: the mean over ranks (Horovod: one grouped allreduce)
        gradients = self.mean_over_ranks([total / self.steps for total in sums])
        self.optimizer.apply_gradients(zip(gradients, variables))
        return {metric.name: metric.result() for metric in self.metrics}
