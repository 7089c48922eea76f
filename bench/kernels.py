"""Item 3's ceiling: how fast the model's matrix products run on micro-batches vs one batch.

Accumulating k micro-batches of b does the same arithmetic as one batch of k*b, in k times
more, k times smaller matrix products. This times exactly the products of the benchmark's
MLP (per Dense layer: forward x @ W, the weight gradient x^T @ dy, and the input gradient
dy @ W^T for every layer but the first), one thread, in the trainer's CPU rank environment,
at both batch sizes. t(k*b) / (k * t(b)) is what the accumulated run can reach at best: the
rest of a training step (the optimizer, Keras' loop, the accumulation itself) only adds.

    python -m bench.kernels OUT.json MICRO_BATCH K FEATURES HIDDEN,UNITS CLASSES REPEAT_SECONDS

REPEAT_SECONDS is the work per timed repeat: 1 s keeps the full run's timings above the
clock's noise; the tiny run only checks that the products run and are timed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def layer_shapes(features: int, hidden: list[int], classes: int) -> list[tuple[int, int]]:
    sizes = [features, *hidden, classes]
    return list(zip(sizes, sizes[1:]))


def seconds_per_pass(batch: int, shapes: list[tuple[int, int]], repeat_seconds: float) -> float:
    """Best-of-3 seconds of one forward+backward pass worth of the layers' products, each
    repeat about `repeat_seconds` of calls."""
    import tensorflow as tf

    weights = [tf.random.normal(shape) for shape in shapes]
    inputs = [tf.random.normal((batch, fan_in)) for fan_in, _ in shapes]
    grads = [tf.random.normal((batch, fan_out)) for _, fan_out in shapes]

    def layer_products() -> list[Any]:
        out = []
        for index, (w, x, dy) in enumerate(zip(weights, inputs, grads)):
            out += [tf.matmul(x, w), tf.matmul(x, dy, transpose_a=True)]
            if index:  # the first layer's input needs no gradient
                out.append(tf.matmul(dy, w, transpose_b=True))
        return out

    products = tf.function(layer_products)
    products()
    started = time.perf_counter()
    products()
    calls = max(1, int(repeat_seconds / (time.perf_counter() - started)))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            products()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def main(argv: list[str]) -> None:
    out, micro, k, features = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    hidden, classes = [int(units) for units in argv[4].split(",")], int(argv[5])
    repeat_seconds = float(argv[6])
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    shapes = layer_shapes(features, hidden, classes)
    micro_seconds = seconds_per_pass(micro, shapes, repeat_seconds)
    whole_seconds = seconds_per_pass(micro * k, shapes, repeat_seconds)
    out.write_text(
        json.dumps(
            {
                "micro_batch": micro,
                "k": k,
                "shapes": shapes,
                "micro_seconds": micro_seconds,
                "whole_seconds": whole_seconds,
                "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                "ceiling": whole_seconds / (k * micro_seconds),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
