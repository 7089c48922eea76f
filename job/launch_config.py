"""The launcher's own hyperparameters: how the cluster is formed, not what is trained.

These keys are consumed by the launcher and never reach the rank program or a user's script.
The SageMaker training toolkit's names are accepted as aliases so jobs written for AWS's
framework containers keep working. Any other `sagemaker_*` key (the SDK adds several, such as
sagemaker_job_name or sagemaker_region) is consumed and ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from job.hyperparameters import hp, parse

SDK_PREFIX = "sagemaker_"
# A healthy rank can sit idle this long: as Keras's `fit` returns, tf.data's autotuning thread
# ends only when its optimisation period (at most a minute) runs out, and `fit` waits for it
# (measured up to 44 s on a crowded 2-core host), using no CPU and printing nothing.
QUIET_END = 60.0
# The shortest progress allowance the watchdog (container.watchdog) may be given: twice that
# quiet. Shorter ones ended healthy jobs as hung, so they are refused, not warned about.
MIN_PROGRESS_TIMEOUT = 2 * QUIET_END
# JAX's coordination service aborts every process once one has sent no heartbeat for
# jax.distributed.initialize's heartbeat_timeout_seconds (100 s by default; Keras passes none and
# JAX reads no environment variable for it), which would end a job with a frozen process before
# the watchdog, which names that process, fires. The ranks get a longer one in this variable
# (train.jax_heartbeat applies it), this far past the watchdog's longer allowance: its check
# once a second, the ranks' few seconds to print their stacks, and the stop itself.
JAX_HEARTBEAT_ENV = "TRAIN_JAX_HEARTBEAT_SECONDS"
JAX_HEARTBEAT_MARGIN = 60
# The settings that make a job run the caller's own code: a script, an archive of it, or
# mpirun options (`-x LD_PRELOAD=...` or an ssh agent of their choosing run anything). An image
# built for others to run (SCRIPT_MODE=off) refuses them and its algorithm leaves them out.
OWN_CODE = ("program", "submit_directory", "mpi_options")


@dataclass(frozen=True)
class LaunchConfig:
    """Cluster formation settings, each a hyperparameter of the job."""

    processes_per_host: int = hp(
        0,
        "Ranks per host; 0 = one per visible GPU, or 1 on CPU-only hosts.",
        minimum=0,
        maximum=1024,
        aliases=("sagemaker_mpi_num_of_processes_per_host",),
    )
    mpi_options: str = hp(
        "",
        'Extra mpirun options, e.g. "-x NCCL_DEBUG=WARN -mca btl_tcp_if_include eth1"; '
        "an option given here replaces the launcher's default for the same key.",
        aliases=("sagemaker_mpi_custom_mpi_options",),
    )
    program: str = hp(
        "",
        "Script mode: a Python file under /opt/ml/code to run on every rank instead of "
        "the built-in trainer (also read from SAGEMAKER_PROGRAM).",
        aliases=("sagemaker_program",),
    )
    submit_directory: str = hp(
        "",
        "The SDK's source_dir: an s3:// or file:// URI or a path of a .tar.gz or a folder, "
        "unpacked into /opt/ml/code on every host (its requirements.txt installed) before any "
        "rank starts (also read from SAGEMAKER_SUBMIT_DIRECTORY).",
        aliases=("sagemaker_submit_directory",),
    )
    submit_directory_max_mb: int = hp(
        0,
        "The most megabytes (MiB) the submit directory's archive may unpack to; the member "
        "that would pass it stops the job before it is written. 0 = half the space free on the "
        "code folder's disk.",
        minimum=0,
        maximum=10_000_000,
    )
    host_timeout: float = hp(
        600.0,
        "Seconds for every host name to resolve and every worker to become ready; "
        "then the job fails naming the hosts that never answered.",
        minimum=1.0,
        maximum=86400.0,
    )
    leader_timeout: float = hp(
        900.0,
        "Seconds a worker waits for the leader to answer at start before failing.",
        minimum=1.0,
        maximum=86400.0,
    )
    heartbeat_timeout: float = hp(
        30.0,
        "Seconds of silence after which a worker gives up on its leader, or the leader "
        "on a worker that is not yet ready.",
        minimum=2.0,
        maximum=3600.0,
    )
    stop_grace: float = hp(
        90.0,
        "Seconds between SIGTERM and forcing the ranks down; the trainer saves a "
        "checkpoint in that time. SageMaker kills everything 120 s after SIGTERM.",
        minimum=1.0,
        maximum=3600.0,
    )
    max_restarts: int = hp(
        0,
        "Times the leader runs every rank on every host again after a rank failed or the "
        "job hung; each run resumes from the newest checkpoint. Never after a configuration or "
        "data error (exit 2), a stop (143) or a lost host (3), nor after the same failure twice "
        "with no newer checkpoint. 0: a failure ends the job.",
        minimum=0,
        maximum=100,
    )
    progress_timeout: float = hp(
        300.0,
        "Seconds in which no rank made progress (an optimizer step; in script mode a "
        "line on stdout or distributed.heartbeat()) or used the CPU, after which the job fails "
        "as hung (exit code 4), with every rank's Python stack in the log; at least "
        f"{MIN_PROGRESS_TIMEOUT:g} (a healthy rank may sit idle up to {QUIET_END:g} s as "
        "Keras's fit returns); 0 turns the watchdog off.",
        minimum=0.0,
        maximum=604800.0,
    )
    first_progress_timeout: float = hp(
        1800.0,
        "The same allowance before the first progress (a download that does not use "
        "the CPU); a rank the others wait for in a collective is named sooner, after "
        "Horovod's stall check.",
        minimum=MIN_PROGRESS_TIMEOUT,
        maximum=604800.0,
    )
    mpi_enabled: bool = hp(
        False,
        'Ranks synchronise with Horovod over mpirun (the SDK\'s distribution={"mpi": '
        '{"enabled": True}}); needs the Horovod image.',
        aliases=("sagemaker_mpi_enabled",),
    )
    multi_worker_mirrored_strategy: bool = hp(
        False,
        "Ranks synchronise with TensorFlow's MultiWorkerMirroredStrategy, each told its "
        'place in TF_CONFIG (the SDK\'s distribution={"multi_worker_mirrored_strategy": '
        '{"enabled": True}}); needs the TensorFlow 2.21 image. Neither set: the image\'s own.',
        aliases=("sagemaker_multi_worker_mirrored_strategy_enabled",),
    )
    tf_worker_port: int = hp(
        8890,
        "MultiWorkerMirroredStrategy: the port of a host's TensorFlow worker (AWS's "
        "TensorFlow containers use 8890); a host's further workers take the next ports. A job "
        "whose ranks run on one host takes free ports instead.",
        minimum=1,
        maximum=65000,
    )
    distribution_port: int = hp(
        7777,
        "Port on the leader where every process of the job meets to start Keras 3's "
        "keras.distribution (JAX's coordinator; KERAS_DISTRIBUTION_JOB_ADDRESSES, "
        "JAX_COORDINATOR_ADDRESS); also SM_MASTER_PORT. A job whose ranks run on one host "
        "takes a free port instead.",
        minimum=1,
        maximum=65535,
    )
    distribution_instance_groups: str = hp(
        "",
        "Heterogeneous clusters: the instance groups whose hosts run the ranks, as a JSON "
        'list or comma-separated names (the SDK\'s distribution={..., "instance_groups": '
        "[...]}); the other groups' hosts run the script on their own. Empty: the job's one "
        "group (a job of several groups must name them).",
        aliases=("sagemaker_distribution_instance_groups",),
    )
    data_service_port: int = hp(
        6000,
        "Heterogeneous clusters, built-in trainer: the port of the tf.data service "
        "dispatcher on the first data host; every data host's worker takes the next port.",
        minimum=1,
        maximum=65534,
    )
    sshd_port: int = hp(22, "Port of the job's own sshd on every host.", minimum=1, maximum=65535)
    coordinator_port: int = hp(
        29499,
        "Port on the leader where workers learn the job's SSH key and its outcome.",
        minimum=1,
        maximum=65535,
    )

    def __post_init__(self) -> None:
        """Refuses a watchdog allowance that would end a healthy job as hung (job.hyperparameters
        turns the ValueError into the configuration error, exit code 2)."""
        if 0 < self.progress_timeout < MIN_PROGRESS_TIMEOUT:
            raise ValueError(
                f"hyperparameter progress_timeout={self.progress_timeout:g} is too short: a "
                f"healthy rank may sit idle up to {QUIET_END:g} s (as Keras's fit returns, "
                f"tf.data's autotuning winds down), which the watchdog would end as hung; set "
                f"it to {MIN_PROGRESS_TIMEOUT:g} or more (the minimum), or 0 to turn the "
                "watchdog off"
            )

    def jax_heartbeat(self) -> dict[str, str]:
        """The ranks' JAX heartbeat timeout, {JAX_HEARTBEAT_ENV: seconds}: longer than both of
        the watchdog's allowances, so that the watchdog ends a job with a frozen process first
        (a process frozen before the first progress waits for first_progress_timeout). Empty
        when the watchdog is off: JAX's own heartbeat is then what ends a frozen process."""
        if not self.progress_timeout:
            return {}
        longest = max(self.progress_timeout, self.first_progress_timeout)
        return {JAX_HEARTBEAT_ENV: str(math.ceil(longest) + JAX_HEARTBEAT_MARGIN)}


def split_hyperparameters(
    raw: Mapping[str, Any],
) -> tuple[LaunchConfig, dict[str, Any], tuple[str, ...]]:
    """(the launcher's settings, the user's hyperparameters, the ignored SDK keys)."""
    launch, rest = parse(LaunchConfig, raw, allow_unknown=True)
    ignored = tuple(sorted(k for k in rest if k.startswith(SDK_PREFIX)))
    return launch, {k: v for k, v in rest.items() if k not in ignored}, ignored
