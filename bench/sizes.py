"""How big each benchmark is: the full run of `make bench` and the tiny one the tests use.

Full sizes are chosen so that `make bench` ends within 10 minutes on the project's 2-core
machine while each trainer epoch lasts seconds (so per-epoch throughput is not dominated by
timer granularity) and the model's compute dominates its allreduce (an MLP 256-1024-1024-10:
1.3 M parameters, 5.3 MB of gradients per step).

Tiny sizes (`make bench-tiny`, tests/bench) run every item for real at the least that still
measures what its row says: one run per configuration, two timed repeats, a tenth of a second
per timed kernel repeat, the digits once. What is left of a tiny run is mostly its processes'
start-ups (importing TensorFlow and Horovod: about 4 CPU-seconds each), so the saving there is
in running fewer of them (bench.training.TrainerJobs), not in smaller sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.allreduce import KB


@dataclass(frozen=True)
class Sizes:
    allreduce_bytes: tuple[int, ...]
    allreduce_repeats: int
    samples: int  # training samples of the synthetic dataset
    features: int
    hidden_units: str
    per_device_batch: int  # item 2: per rank; item 3: the big batch (= k micro-batches)
    accumulation_steps: int
    epochs: int  # the first is discarded (tf.function tracing)
    repeats: int  # trainer runs per configuration, interleaved
    reader_samples: int
    pipeline_batches: int
    pipeline_repeats: int  # items 5, 7 and 11: timed drains of each input pipeline
    kernel_seconds: float  # item 3's ceiling: work per timed repeat of the matrix products
    cluster_epochs: int  # item 4: one optimizer step per epoch
    serve_requests: int
    scale_copies: int  # item 7: copies of the digits in the smaller TFRecord channel
    scale_image_size: int  # item 7: pixels of the PNG in each of those records
    image_copies: int  # item 7: copies of the digits the image model trains on
    image_model: str  # item 7: the model whose consumption the image pipeline must outpace
    parity_epochs: int  # item 7: epochs of the TFRecord vs CSV accuracy jobs


FULL = Sizes(
    allreduce_bytes=tuple(4 * KB * 4**i for i in range(9)),  # 4 KB .. 256 MB
    allreduce_repeats=5,
    samples=8192,
    features=256,
    hidden_units="1024,1024",
    per_device_batch=256,
    accumulation_steps=4,
    epochs=3,
    repeats=2,
    reader_samples=16384,
    pipeline_batches=200,
    pipeline_repeats=3,
    kernel_seconds=1.0,
    cluster_epochs=3,
    serve_requests=50,
    scale_copies=25,
    scale_image_size=224,
    image_copies=3,
    image_model="mobilenet_v2",
    parity_epochs=6,
)

TINY = Sizes(
    allreduce_bytes=(4 * KB, 64 * KB),
    allreduce_repeats=2,
    samples=256,
    features=8,
    hidden_units="16",
    per_device_batch=32,
    accumulation_steps=4,
    epochs=2,
    repeats=1,
    reader_samples=256,
    pipeline_batches=5,
    pipeline_repeats=2,
    kernel_seconds=0.1,
    cluster_epochs=2,
    serve_requests=3,
    scale_copies=1,
    scale_image_size=16,
    image_copies=1,
    image_model="cnn",
    parity_epochs=1,
)
