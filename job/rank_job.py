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
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from job.errors import ConfigError
from job.batching import BatchPlan
from job.trainer_config import TrainerConfig

JOB_ENV = "TRAIN_JOB"
# Linux holds at most 128 KiB in one environment string (MAX_ARG_STRLEN), its name included.
ENV_LIMIT = 128 * 1024


@dataclass(frozen=True)
class RankJob:
    program: str = ""  # the user's script; "" runs the built-in trainer
    script_hyperparameters: dict[str, Any] = field(default_factory=dict)
    trainer: TrainerConfig | None = None
    batches: BatchPlan | None = None
    # MultiWorkerMirroredStrategy: every worker's host:port, rank r's at index r; () = Horovod
    tf_workers: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({
            "program": self.program, "script_hyperparameters": self.script_hyperparameters,
            "trainer": asdict(self.trainer) if self.trainer else None,
            "batches": asdict(self.batches) if self.batches else None,
            "tf_workers": list(self.tf_workers),
        }, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "RankJob":
        try:
            raw = json.loads(text)
            return cls(raw["program"], raw["script_hyperparameters"],
                       TrainerConfig(**raw["trainer"]) if raw["trainer"] else None,
                       BatchPlan(**raw["batches"]) if raw["batches"] else None,
                       tuple(raw["tf_workers"]))
        except (ValueError, TypeError, KeyError) as error:
            raise ConfigError(f"{JOB_ENV} does not hold a job written by this image's launcher "
                              f"({type(error).__name__}: {error}); start ranks with `train`"
                              ) from None

    def worker_environment(self, rank: int) -> dict[str, str]:
        """What rank `rank` adds to its environment: under MultiWorkerMirroredStrategy its
        worker's TF_CONFIG, as AWS's TensorFlow containers write it; nothing for Horovod."""
        if not self.tf_workers:
            return {}
        return {"TF_CONFIG": json.dumps({
            "cluster": {"worker": list(self.tf_workers)}, "environment": "cloud",
            "task": {"type": "worker", "index": rank}})}

    def environment(self) -> dict[str, str]:
        """The rank environment that carries the job; ConfigError when it cannot fit."""
        text = self.to_json()
        size = len(JOB_ENV) + 1 + len(text.encode())
        if size > ENV_LIMIT:
            raise ConfigError(
                f"the job's hyperparameters take {size} bytes as JSON, and every rank receives "
                f"them in one environment variable, which holds at most {ENV_LIMIT} bytes; "
                "pass large values in a file (under the code folder or in an input channel)")
        return {JOB_ENV: text}


def read_rank_job(environ: Mapping[str, str] = os.environ) -> RankJob:
    """This rank's job; ConfigError naming the way to start ranks when there is none."""
    text = environ.get(JOB_ENV)
    if text is None:
        raise ConfigError(
            f"{JOB_ENV} is not set: rank programs run under the launcher, which validates the "
            "job once and hands every rank the result; run `train --ml-root DIR` "
            "(`train --ml-root DIR --dry-run` prints the plan)")
    return RankJob.from_json(text)
