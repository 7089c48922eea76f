"""Item 11: a heterogeneous job's input. The trainer's image pipeline (item 7's: TFRecord PNGs
of 32x32 decoded, flipped and cropped, shuffled, batched) read through a data host's tf.data
service, against the same pipeline run in the reading process itself, in one run.

The data host is `python -P -m train.data_service`, what a data host's launcher runs for the
built-in trainer, on loopback; one process drains the pipeline first on its own (the
reference), then through the service (dynamic sharding, as train.pipeline.served reads it).
On one machine both share the same cores, so the ratio shows what serving costs (gRPC,
serialisation of each batch) at equal CPU, not what a real data group gains: its CPUs come in
addition to the training hosts', so k data hosts serve up to k times what one decodes, until
the network or the consumer limits it. No target: the comparison that matters needs hosts.

    python -m bench.hetero pipeline OUT.json CHANNEL SERVICE BATCH BATCHES REPEATS
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import data_scale
from bench.launch import PYTHON, REPO, run, stop
from bench.results import Measurement, median
from bench.sizes import Sizes
from container.network import free_port
from job.rank_job import DATA_HOST_ENV, DATA_SERVICE_ENV

QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def measure(sizes: Sizes, workdir: Path) -> Measurement:
    root = data_scale.job(workdir / "job", "tfrecord", {}, sizes.image_copies)
    service = f"grpc://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [PYTHON, "-P", "-m", "train.data_service"],
        cwd=REPO,
        env={**QUIET_TF, DATA_HOST_ENV: "127.0.0.1", DATA_SERVICE_ENV: service},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = workdir / "served.json"
    try:
        run(
            [
                PYTHON,
                "-m",
                "bench.hetero",
                "pipeline",
                str(out),
                str(root / "input" / "data" / "train"),
                service,
                "32",
                str(sizes.pipeline_batches),
                str(sizes.pipeline_repeats),
            ],
            timeout=600,
            what="served input pipeline",
            env=QUIET_TF,
        )
    finally:
        stop(server)
    rates = json.loads(out.read_text())
    return Measurement(
        item=11,
        metric="image input through a data host's tf.data service (loopback)",
        unit="samples/s",
        value=median(rates["served"]),
        reference=median(rates["local"]),
        reference_name="the same pipeline in the reading process",
        samples=tuple(rates["served"]),
        note="one machine: the data host shares the reader's cores",
        details=rates,
    )


def main(argv: list[str]) -> None:
    if argv[0] != "pipeline":
        raise SystemExit(__doc__)
    out, channel, service = Path(argv[1]), Path(argv[2]), argv[3]
    batch, batches, repeats = map(int, argv[4:7])
    out.write_text(
        json.dumps(
            {
                "local": data_scale.pipeline_rates(channel, batch, batches, repeats),
                "served": data_scale.pipeline_rates(channel, batch, batches, repeats, service),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
