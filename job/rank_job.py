"""The validated job as every rank receives it: the launcher decides, the ranks read.

The launcher (`train`) validates the job once and plans it (container.plan): the built-in
trainer's config and batch plan, or the user's script and the hyperparameters it sees. It
hands that to every rank on every host as JSON in the TRAIN_JOB environment variable (an
`mpirun -x`, so it reaches the ranks on other hosts with no shared file). Ranks read it here
and never parse hyperparameters.json or plan the batches again, so every rank runs exactly
what the launcher logged and `train --dry-run` printed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from job.batching import BatchPlan
from job.errors import ConfigError
from job.trainer_config import TrainerConfig

JOB_ENV = "TRAIN_JOB"
# Set by the launcher of a heterogeneous job's data host (container.data_host) to that host's
# name: its script runs alone, outside the ranks' world (TRAIN_HOSTS are the training hosts).
DATA_HOST_ENV = "TRAIN_DATA_HOST"
# grpc://<host>:<port> of the tf.data service dispatcher that a heterogeneous job's data hosts
# run for the built-in trainer (train.data_service); every rank reads its input from it.
DATA_SERVICE_ENV = "TRAIN_DATA_SERVICE"
# Linux holds at most 128 KiB in one environment string (MAX_ARG_STRLEN), its name included.
ENV_LIMIT = 128 * 1024


@dataclass(frozen=True)
class Processes:
    """The job's processes as Keras 3's `keras.distribution.initialize()` and JAX's
    `jax.distributed.initialize()` are told them, by the environment variables each reads when
    called with no arguments (what Keras's distribution guide shows), so that a script joins
    the job with no setting of its own, and not through JAX's guess from Open MPI's internals.
    `devices[l]`: the GPUs of the process with local rank l (() on a CPU host)."""

    coordinator: str = ""  # host:port of process 0, where every process meets
    count: int = 1
    devices: tuple[tuple[int, ...], ...] = ()

    def environment(self, rank: int, local_rank: int) -> dict[str, str]:
        if not self.coordinator:
            return {}
        devices = self.devices[local_rank] if self.devices else (0,)
        return {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": self.coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": str(self.count),
            "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
            "JAX_COORDINATOR_ADDRESS": self.coordinator,
            "JAX_LOCAL_DEVICE_IDS": ",".join(map(str, devices)),
        }


@dataclass(frozen=True)
class RankJob:
    program: str = ""  # the user's script; "" runs the built-in trainer
    script_hyperparameters: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig | None = None
    batches: BatchPlan | None = None
    # MultiWorkerMirroredStrategy: every worker's host:port, rank r's at index r; () = Horovod
    tf_workers: tuple[str, ...] = ()
    processes: Processes = Processes()

    def to_json(self) -> str:
        return json.dumps(
            {
                "program": self.program,
                "script_hyperparameters": self.script_hyperparameters,
                "trainer": asdict(self.trainer) if self.trainer else None,
                "batches": asdict(self.batches) if self.batches else None,
                "tf_workers": list(self.tf_workers),
                "processes": asdict(self.processes),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> RankJob:
        try:
            raw = json.loads(text)
            processes = raw["processes"]
            return cls(
                raw["program"],
                raw["script_hyperparameters"],
                TrainerConfig(**raw["trainer"]) if raw["trainer"] else None,
                BatchPlan(**raw["batches"]) if raw["batches"] else None,
                tuple(raw["tf_workers"]),
                Processes(
                    processes["coordinator"],
                    processes["count"],
                    tuple(tuple(ids) for ids in processes["devices"]),
                ),
            )
        except (ValueError, TypeError, KeyError) as error:
            raise ConfigError(
                f"{JOB_ENV} does not hold a job written by this image's launcher "
                f"({type(error).__name__}: {error}); start ranks with `train`"
            ) from None

    def worker_environment(self, rank: int, local_rank: int = 0) -> dict[str, str]:
        """What rank `rank` adds to its environment: its place among the job's processes for
        Keras 3 and JAX, and under MultiWorkerMirroredStrategy its worker's TF_CONFIG, as AWS's
        TensorFlow containers write it."""
        environment = self.processes.environment(rank, local_rank)
        if self.tf_workers:
            environment["TF_CONFIG"] = json.dumps(
                {
                    "cluster": {"worker": list(self.tf_workers)},
                    "environment": "cloud",
                    "task": {"type": "worker", "index": rank},
                }
            )
        return environment

    def environment(self) -> dict[str, str]:
        """The rank environment that carries the job; ConfigError when it cannot fit."""
        text = self.to_json()
        size = len(JOB_ENV) + 1 + len(text.encode())
        if size > ENV_LIMIT:
            raise ConfigError(
                f"the job's hyperparameters take {size} bytes as JSON, and every rank receives "
                f"them in one environment variable, which holds at most {ENV_LIMIT} bytes; "
                "pass large values in a file (under the code folder or in an input channel)"
            )
        return {JOB_ENV: text}


def read_rank_job(environ: Mapping[str, str] = os.environ) -> RankJob:
    """This rank's job; ConfigError naming the way to start ranks when there is none."""
    text = environ.get(JOB_ENV)
    if text is None:
        raise ConfigError(
            f"{JOB_ENV} is not set: rank programs run under the launcher, which validates the "
            "job once and hands every rank the result; run `train --ml-root DIR` "
            "(`train --ml-root DIR --dry-run` prints the plan)"
        )
    return RankJob.from_json(text)
