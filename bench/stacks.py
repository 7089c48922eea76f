"""Item 9: the same 2-rank job on every stack: TensorFlow 2.21's MultiWorkerMirroredStrategy and
Keras 3 on JAX (both in the `tf` image) against Horovod on TensorFlow 2.15 (the default image).

Each image runs the built-in trainer's throughput job of item 2 (bench.training.hyperparameters:
the MLP, no checkpoints, no warmup, one TensorFlow thread per rank) in one container, with 1
rank and with 2 ranks, interleaved (H1 H2 M1 M2 J1 J2, repeated) so drift in the machine's load
hits every configuration. A run's throughput is the median of its epochs after the first; a
configuration's the median over its runs. Rows: MWMS and Keras 3 on JAX vs Horovod at 2 ranks
(target >= 0.9), and each stack's 2 ranks vs twice its 1 rank (its scaling, the same measure as
item 2).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bench.jobs import DataShape, parse_metrics, synthetic, write_job
from bench.launch import log
from bench.results import Measurement, Target, median
from bench.sizes import Sizes
from bench.training import hyperparameters
from scripts.local_cluster import Engine

RUN_TIMEOUT = 900
MWMS = {"multi_worker_mirrored_strategy": "true"}
JAX = {"backend": "jax"}


@dataclass
class Stack:
    name: str
    image: str
    extra: dict[str, str] = field(default_factory=dict)
    # ranks -> run throughputs (None: a run that printed none after its first epoch)
    runs: dict[int, list[float | None]] = field(default_factory=dict)

    def throughput(self, ranks: int) -> float | None:
        return median(self.runs.get(ranks, []))


def run_in_image(engine: Engine, image: str, root: Path) -> float | None:
    """One job in one container; the median samples/s of its epochs after the first."""
    result = engine.run(
        "run", "--rm", "-v", f"{root}:/opt/ml", image, "train", check=False, timeout=RUN_TIMEOUT
    )
    if result.returncode:
        raise RuntimeError(
            f"the job in {image} exited {result.returncode}: "
            f"{(result.stdout + result.stderr)[-2000:]}"
        )
    epochs = parse_metrics(result.stdout)[1:]
    return median(e["samples_per_sec"] for e in epochs if "samples_per_sec" in e)


def measure(sizes: Sizes, workdir: Path, horovod_image: str, tf_image: str) -> list[Measurement]:
    engine = Engine.detect()
    stacks = [
        Stack("Horovod", horovod_image),
        Stack("MWMS", tf_image, MWMS),
        Stack("Keras 3 on JAX", tf_image, JAX),
    ]
    data = synthetic(DataShape(sizes.samples, sizes.features))
    batch = sizes.per_device_batch
    for repeat in range(sizes.repeats):
        for stack in stacks:
            for ranks in (1, 2):
                root = workdir / f"{stack.name}-{ranks}-{repeat}"
                shutil.rmtree(root, ignore_errors=True)
                write_job(
                    root,
                    {
                        **hyperparameters(
                            sizes, ranks=ranks, per_device_batch=batch, max_device_batch=batch
                        ),
                        **stack.extra,
                    },
                    data,
                )
                log(f"item 9: {stack.name}, {ranks} rank(s), run {repeat + 1}")
                try:
                    stack.runs.setdefault(ranks, []).append(run_in_image(engine, stack.image, root))
                except subprocess.TimeoutExpired as error:
                    raise RuntimeError(f"{stack.name} {ranks} rank(s): {error}") from None
    horovod = stacks[0]
    model = f"mlp {sizes.features}-{sizes.hidden_units.replace(',', '-')}-10, batch {batch}"
    rows = [
        Measurement(
            item=9,
            metric=f"stacks: {stack.name} (TF 2.21 image) vs Horovod (TF 2.15), 2 ranks",
            unit="samples/s",
            value=stack.throughput(2),
            reference=horovod.throughput(2),
            reference_name="Horovod, 2 ranks",
            target=Target("ratio", ">=", 0.9),
            note=f"{model}; one container each",
            samples=tuple(stack.runs.get(2, [])),
            details={stack.name: stack.runs for stack in stacks},
        )
        for stack in stacks[1:]
    ]
    for stack in stacks:
        single = stack.throughput(1)
        rows.append(
            Measurement(
                item=9,
                metric=f"stacks: {stack.name} scaling, 2 ranks vs 1",
                unit="samples/s",
                value=stack.throughput(2),
                reference=None if single is None else 2 * single,
                reference_name="2 x 1 rank",
                note=model,
                samples=tuple(stack.runs.get(2, [])),
            )
        )
    return rows
