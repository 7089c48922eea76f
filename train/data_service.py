"""A data host of the built-in trainer: TensorFlow's tf.data service, serving the ranks' input.

    python -P -m train.data_service      (the launcher of a data host runs it; container.plan)

The first data host runs the dispatcher on `data_service_port` and every data host a worker on
the port after it (AWS's example of a heterogeneous job does the same). Each training rank
registers its own input pipeline (train.pipeline.training_input: reading, decoding and
augmenting its share of the files, then batching) with the dispatcher and reads finished
batches from the workers (train.trainer): the expensive part of the input runs here, on the
data group's CPUs, not beside the ranks' compute. The workers read the channel's files at the
paths the ranks name, so the training channel must reach the data hosts whole
(FullyReplicated). Passes of the endless stream are dealt to the workers as they ask
(dynamic sharding): every sample of a pass once, in an order that depends on the workers'
pace, so a stopped job resumes at the pass, not at the exact sample.

The servers run until the launcher stops this process, when the training has ended.
"""

from __future__ import annotations

import os
import signal
import sys

from job.rank_job import DATA_HOST_ENV, DATA_SERVICE_ENV
from train.logs import log


def main() -> None:
    import tensorflow as tf

    service = tf.data.experimental.service
    host = os.environ[DATA_HOST_ENV]
    dispatcher_host, _, port = os.environ[DATA_SERVICE_ENV].removeprefix("grpc://").rpartition(":")
    servers = []
    if host == dispatcher_host:
        servers.append(service.DispatchServer(service.DispatcherConfig(port=int(port))))
    servers.append(
        service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=f"{dispatcher_host}:{port}",
                worker_address=f"{host}:{int(port) + 1}",
                port=int(port) + 1,
            )
        )
    )
    roles = "dispatcher and worker" if len(servers) == 2 else "worker"
    log.info(f"data service: {roles} on {host}, dispatcher {dispatcher_host}:{port}")
    # A stop is the ranks' to act on: they save at an agreed step, which needs their next
    # batches. The launcher of a data host does not pass it on (container.data_host): the
    # servers run until the leader reports the training's end and the launcher ends them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    servers[-1].join()


if __name__ == "__main__":
    main()
