"""The launch plan: which hosts, how many ranks, what each rank runs, and the mpirun argv.

`make_plan` is pure: everything it needs (the job config, the GPU count, the Python
interpreter, the environment) comes in as arguments, so `train --dry-run` and the golden tests
see exactly the plan a real launch would execute. What each rank runs (the trainer's config
and batch plan, or the script and its hyperparameters) is decided here once and travels to
every rank in its environment (job.rank_job).

Ranks are placed with `--map-by slot` over the sorted host list, so rank r runs on
hosts[r // processes_per_host]. Each rank derives its own host from that (the hosts and
processes per host travel in its environment) instead of inheriting the leader's
SM_CURRENT_HOST, and checks the placement against OpenMPI's local rank at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container import mpirun
from container.sshd import VARIABLE_NAME, SshFiles, is_host_own, ssh_client_args
from job.batching import BatchPlan, plan_batches
from job.errors import ConfigError
from job.hyperparameters import decode
from job.launch_config import LaunchConfig
from job.mesh import Mesh, forced_devices
from job.rank_job import DATA_HOST_ENV, DATA_SERVICE_ENV, Processes, RankJob
from job.sagemaker_config import JobConfig, training_groups
from job.trainer_config import JAX
from job.validated import (
    HOROVOD,
    TENSORFLOW,
    JobHyperparameters,
    check_builtin_channels,
    check_groups,
    choose_backend,
)

# Horovod's stall check names the ranks the others have waited for in a collective for longer
# than its period, checking once a period (so 1-2 periods after the wait began; Horovod's
# default period is 60 s, 30 here: a rank that never comes is named within a minute or so).
# The launcher's watchdog reads that and decides (container.watchdog), so Horovod's own
# shutdown of a job stalled for 10 minutes is off (0): it would also kill a leader that
# evaluates or saves alone.
STALL_CHECK, STALL_CHECK_SECONDS = "HOROVOD_STALL_CHECK_TIME_SECONDS", "30"
STALL_ENV = {STALL_CHECK: STALL_CHECK_SECONDS, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}
# CPU-only hosts (measured in docs/performance.md, "Training"):
# - OpenMPI busy-polls by default, so Horovod's background thread (an MPI collective every
#   HOROVOD_CYCLE_TIME, 1 ms by default) takes CPU from TensorFlow's compute threads while it
#   waits for the other ranks (runnable 95% of the time). Yield while idle, coordinate every
#   5 ms: 2-rank scaling efficiency 0.52 -> 0.87.
# - TensorFlow enables its oneDNN kernels by default only on CPUs with AVX-512 VNNI/BF16 or
#   AMX; elsewhere a Dense layer's backward matmul (dy @ W^T) runs Eigen's transposed kernel,
#   2.3-3.8x slower: with oneDNN on, training is 1.25x faster and accumulating 4 micro-batches
#   of 64 1.6x faster.
# `-x NAME=VALUE` in mpi_options overrides any of them.
CPU_RANK_ENV = {
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "HOROVOD_CYCLE_TIME": "5",
    "TF_ENABLE_ONEDNN_OPTS": "1",
}


@dataclass(frozen=True)
class ClusterPlan:
    """`hosts`: those that run ranks; `data_hosts`: those of a heterogeneous job's other
    instance groups, which run the script on their own (container.data_host)."""

    hosts: tuple[str, ...]
    current_host: str
    processes_per_host: int
    interface: str
    instance_type: str
    data_hosts: tuple[str, ...] = ()

    @property
    def is_data_host(self) -> bool:
        return self.current_host in self.data_hosts

    @property
    def leader(self) -> str:
        return self.hosts[0]

    @property
    def is_leader(self) -> bool:
        return self.current_host == self.leader

    @property
    def workers(self) -> list[str]:
        return list(self.hosts[1:])

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.processes_per_host

    def host_of_rank(self, rank: int) -> str:
        index = rank // self.processes_per_host
        return (
            self.hosts[index] if 0 <= index < len(self.hosts) else f"<unknown host of rank {rank}>"
        )


@dataclass(frozen=True)
class LaunchPlan:
    cluster: ClusterPlan
    launch: LaunchConfig
    job: RankJob  # what every rank runs
    script_args: tuple[str, ...]
    ignored_hyperparameters: tuple[str, ...]
    command: mpirun.Command  # what the leader runs, as data (rendered by `mpirun`)
    # On a data host: the script alone, not under mpirun, and its environment.
    data_command: tuple[str, ...] = ()
    data_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def batches(self) -> BatchPlan | None:
        return self.job.batches

    @property
    def mpirun(self) -> tuple[str, ...]:
        """The argv the leader runs (and logs, and `--dry-run` prints)."""
        return mpirun.render(self.command)

    @property
    def stall_check(self) -> float | None:
        """The period of Horovod's stall check for this job (an `-x` in mpi_options replaces
        the default); None without Horovod or with the check disabled."""
        if self.job.tf_workers:
            return None
        if (self.command.rank_variable("HOROVOD_STALL_CHECK_DISABLE") or "0") != "0":
            return None
        period = self.command.rank_variable(STALL_CHECK)
        try:
            seconds = float(STALL_CHECK_SECONDS if period is None else period)
        except ValueError:
            return None
        return seconds if seconds > 0 else None

    def as_json(self) -> dict[str, Any]:
        cluster = self.cluster
        plan: dict[str, Any] = {
            "hosts": list(cluster.hosts),
            "data_hosts": list(cluster.data_hosts),
            "current_host": cluster.current_host,
            "leader": cluster.leader,
            "is_leader": cluster.is_leader,
            "processes_per_host": cluster.processes_per_host,
            "world_size": cluster.world_size,
            "network_interface": cluster.interface,
            "instance_type": cluster.instance_type,
            "efa": mpirun.is_efa(cluster.instance_type),
            "mode": "script" if self.job.program else "builtin",
            "backend": "multi_worker_mirrored_strategy" if self.job.tf_workers else "horovod",
            "tf_workers": list(self.job.tf_workers),
            "program": self.job.program or None,
            "script_args": list(self.script_args),
            "ignored_hyperparameters": list(self.ignored_hyperparameters),
            "mpirun": list(self.mpirun),
        }
        if self.batches:
            plan.update(
                per_device_batch=self.batches.per_device_batch,
                micro_batch=self.batches.micro_batch,
                accumulation_steps=self.batches.accumulation_steps,
                global_batch=self.batches.global_batch,
                learning_rate=self.batches.learning_rate,
                batch_derivation=self.batches.derivation(),
            )
        return plan


def rank_command(python: str, module: str, *args: str) -> list[str]:
    """How a rank starts: `python -P -m mpi4py -m MODULE ARGS`.

    mpi4py aborts every rank when one raises before train.rank.run_rank takes over (which
    ends a failed rank itself). `-P` keeps the working directory off sys.path:
    ranks inherit mpirun's directory (remote ones too), which is the user's code folder when
    SDK 3's sm_train.sh started the launcher, and a user's train.py there would otherwise
    replace this image's `train` package before the rank program is even found.
    """
    return [python, "-P", "-m", "mpi4py", "-m", module, *args]


def processes_per_host(launch: LaunchConfig, gpu_count: int, backend: str = HOROVOD) -> int:
    """The hyperparameter when given, else Horovod's one rank per GPU (also the built-in
    trainer's on JAX: its batch plan is per device), else one (MultiWorkerMirroredStrategy: one
    worker drives all of its host's GPUs)."""
    return launch.processes_per_host or (max(gpu_count, 1) if backend == HOROVOD else 1)


def tf_workers(cluster: ClusterPlan, port: int) -> tuple[str, ...]:
    """Every TensorFlow worker's address in rank order: a host's first worker on `port`, its
    next ones on the ports after it (several workers on one host need ports of their own).
    A one-host job's workers meet on localhost: its name need not resolve."""
    return tuple(
        f"{host if cluster.multi_host else 'localhost'}:{port + local}"
        for host in cluster.hosts
        for local in range(cluster.processes_per_host)
    )


def processes(cluster: ClusterPlan, port: int, gpu_count: int) -> Processes:
    """The job's processes for Keras 3 / JAX: process 0's host is where they meet (localhost on
    one host: its name need not resolve), and each process of a host gets an even share of its
    GPUs (all of them for the one process per host of the TensorFlow 2.21 image)."""
    per_host = cluster.processes_per_host
    share = max(1, gpu_count // per_host) if gpu_count else 0
    devices = (
        tuple(
            tuple((local * share + index) % gpu_count for index in range(share))
            for local in range(per_host)
        )
        if gpu_count
        else ()
    )
    return Processes(
        f"{cluster.leader if cluster.multi_host else 'localhost'}:{port}",
        cluster.world_size,
        devices,
    )


@dataclass(frozen=True)
class JobPort:
    """Ports in a row that something of the job listens on, on this host: `setting` is the
    hyperparameter that moves them, `listener` says what listens there. `movable`: only the
    leader's own processes connect there (a job whose ranks run on one host), so the leader
    may give it any free port; a port that other hosts were told cannot change. `own_address`:
    the listener binds this host's cluster address only (the launcher's sshd and coordinator),
    not every address, so on a machine that several hosts of a job share (a local cluster,
    the tests' loopback hosts) another host's listener on the same port is no conflict."""

    setting: str
    port: int
    count: int
    listener: str
    movable: bool = False
    own_address: bool = False


def host_ports(plan: LaunchPlan) -> tuple[JobPort, ...]:
    """Every port the job listens on on this host, by the host's kind, which the host makes
    sure of before it starts them (container.ports). The leader: process 0's JAX coordinator,
    which the ranks are always told (a script may also listen on it, as SM_MASTER_PORT), and
    with other hosts the launcher's coordinator. The leader and every worker: under
    MultiWorkerMirroredStrategy the gRPC servers of the host's TensorFlow workers, and with
    other hosts the launcher's own sshd (mpirun reaches the ranks through it). A data host of
    the built-in trainer: its tf.data service (train.data_service: the dispatcher on the
    first data host, a worker on the next port of every one); a script's data host listens
    where its script says, which the launcher cannot know."""
    cluster, launch = plan.cluster, plan.launch
    if cluster.is_data_host:
        if plan.job.program:
            return ()
        if cluster.current_host == cluster.data_hosts[0]:
            return (
                JobPort(
                    "data_service_port",
                    launch.data_service_port,
                    2,
                    "the tf.data service's dispatcher and worker",
                ),
            )
        return (
            JobPort(
                "data_service_port",
                launch.data_service_port + 1,
                1,
                "the tf.data service's worker (on data_service_port + 1)",
            ),
        )
    one_host = not cluster.multi_host
    ports = []
    if cluster.is_leader:
        ports.append(
            JobPort(
                "distribution_port",
                launch.distribution_port,
                1,
                "JAX's coordinator for keras.distribution",
                one_host,
            )
        )
    if plan.job.tf_workers:
        ports.append(
            JobPort(
                "tf_worker_port",
                launch.tf_worker_port,
                cluster.processes_per_host,
                "this host's MultiWorkerMirroredStrategy workers",
                one_host,
            )
        )
    if cluster.multi_host:
        ports.append(
            JobPort("sshd_port", launch.sshd_port, 1, "the job's own sshd", own_address=True)
        )
    if cluster.is_leader and (cluster.multi_host or cluster.data_hosts):
        ports.append(
            JobPort(
                "coordinator_port",
                launch.coordinator_port,
                1,
                "the launcher's coordinator for the other hosts",
                own_address=True,
            )
        )
    return tuple(ports)


def trainer_mesh(layout: Processes, environ: Mapping[str, str], model_parallel: int) -> Mesh:
    """The built-in trainer's data x model mesh on JAX, as the launcher can know it: each
    process's GPUs, or on CPU XLA_FLAGS' forced device count; ConfigError when the model axis
    does not fit it (every process checks again against the devices JAX finds)."""
    local = len(layout.devices[0]) if layout.devices else forced_devices(environ)
    mesh = Mesh(layout.count, local, model_parallel)
    problem = mesh.problem()
    if problem:
        raise ConfigError(problem)
    return mesh


def script_arguments(hyperparameters: Mapping[str, Any]) -> tuple[str, ...]:
    """Hyperparameters as `--name value` arguments, the way SageMaker's framework containers
    pass them to a script (the sagemaker-training toolkit's own mapping)."""
    from sagemaker_training import mapping

    return tuple(mapping.to_cmd_args({k: decode(v) for k, v in hyperparameters.items()}))


# Variables that describe one host, one process or one rank: never handed from the leader's
# container to the ranks of the others (each host's ssh session, OpenMPI and the SageMaker
# toolkit set their own).
PER_HOST_NAMES = frozenset(
    {
        "HOSTNAME",
        "HOME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "TERM",
        "SHELL",
        "USER",
        "LOGNAME",
        "MAIL",
        "DISPLAY",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
PER_HOST_PREFIXES = ("SSH_", "OMPI_", "PMIX_", "OPAL_", "PRTE_", "ORTE_", "HYDRA_", "TRAIN_", "SM_")


def forwarded_environment(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names of the container's variables every rank on every host gets (`-x NAME`).

    Ranks on other hosts start from an ssh session, which keeps none of the container's
    environment, so without this a job's `environment=` (credentials, the region, a user's
    settings) reached only the leader's ranks. AWS's toolkit passes the whole environment;
    so do we, by name, so that values (secrets among them) never appear in the logged
    command, minus what belongs to one host: what ssh, OpenMPI and the launcher set on each
    host, and the credentials and metadata endpoints of each host's own container, which
    every host's sshd sets in its sessions with that host's values (container.sshd); the
    leader's ranks inherit the leader's from mpirun.
    """
    return tuple(
        sorted(
            name
            for name in environ
            if VARIABLE_NAME.fullmatch(name)
            and name not in PER_HOST_NAMES
            and not name.startswith(PER_HOST_PREFIXES)
            and not is_host_own(name)
        )
    )


# What TensorFlow itself takes for "tf.keras is tf_keras" (tensorflow/__init__.py reads
# TF_USE_LEGACY_KERAS as one of these), and what the launcher sets when the job says nothing.
LEGACY_KERAS_VALUES, LEGACY_KERAS = ("true", "True", "1"), "1"


def keras_backend(launch: LaunchConfig, environ: Mapping[str, str]) -> str | None:
    """The KERAS_BACKEND of a TensorFlow 2.21 image's ranks, from what the job asked for.

    The job's own value always wins. Else JAX, for `import keras` in a job that asked for no
    distribution and kept `tf.keras` as tf_keras: Keras 3 trains across hosts only there
    (keras.distribution), and keras.io's guide needs no setting of its own. Else none, which
    is TensorFlow's own default: a job that asks for MultiWorkerMirroredStrategy (the SDK's
    `distribution=`, sagemaker_multi_worker_mirrored_strategy_enabled) or makes `tf.keras`
    Keras 3 (TF_USE_LEGACY_KERAS=0) runs a TensorFlow program, and JAX under its `tf.keras`
    trains one model per host while the strategy still reports every host's replicas.
    """
    if "KERAS_BACKEND" in environ:
        return environ["KERAS_BACKEND"]
    tf_keras_is_keras2 = environ.get("TF_USE_LEGACY_KERAS", LEGACY_KERAS) in LEGACY_KERAS_VALUES
    return JAX if tf_keras_is_keras2 and not launch.multi_worker_mirrored_strategy else None


def rank_environment(
    job: JobConfig,
    cluster: ClusterPlan,
    rank_job: RankJob,
    gpu_count: int,
    environ: Mapping[str, str],
    launch: LaunchConfig,
    data_service: str = "",
) -> dict[str, str]:
    env = {
        "TRAIN_ML_ROOT": str(job.paths.root),
        "TRAIN_HOSTS": ",".join(cluster.hosts),
        **({DATA_SERVICE_ENV: data_service} if data_service else {}),
        "TRAIN_PROCESSES_PER_HOST": str(cluster.processes_per_host),
        **rank_job.environment(),
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": "1",
        **({} if rank_job.tf_workers else STALL_ENV),
    }
    for name in ("PATH", "LD_LIBRARY_PATH"):
        if environ.get(name):
            env[name] = environ[name]
    if rank_job.tf_workers:
        # MultiWorkerMirroredStrategy's model.fit fails under Keras 3, so `tf.keras` means
        # tf_keras (Keras 2) for these ranks unless the job's environment says otherwise.
        env["TF_USE_LEGACY_KERAS"] = environ.get("TF_USE_LEGACY_KERAS", LEGACY_KERAS)
        backend = keras_backend(launch, environ)
        if backend:
            env["KERAS_BACKEND"] = backend
        env.update(launch.jax_heartbeat())  # longer than the watchdog's (train.jax_heartbeat)
    if gpu_count:
        env["NCCL_DEBUG"] = "WARN"
    else:
        env.update(
            {
                name: value
                for name, value in CPU_RANK_ENV.items()
                if not (rank_job.tf_workers and name.startswith("HOROVOD_"))
            }
        )
    return env


def make_plan(
    job: JobConfig,
    settings: JobHyperparameters,
    *,
    gpu_count: int,
    python: str,
    runtime: Path,
    environ: Mapping[str, str],
    stack: str = HOROVOD,
) -> LaunchPlan:
    """Check the rest of what the job says (its hyperparameters are `settings`, validated
    once by job.validated) and decide exactly what will run on this image's `stack`."""
    launch = settings.launch
    resources = job.resources
    backend = choose_backend(settings, stack)
    keras_on_jax = settings.trainer is not None and settings.trainer.backend == JAX
    training = training_groups(resources.instance_groups, launch.distribution_instance_groups)
    hosts = tuple(sorted(host for group in training for host in group.hosts))
    data_hosts = tuple(sorted(set(resources.hosts) - set(hosts)))
    check_groups(job, settings, training, data_hosts)
    cluster = ClusterPlan(
        hosts=hosts,
        current_host=resources.current_host,
        processes_per_host=processes_per_host(
            launch, gpu_count, HOROVOD if keras_on_jax else backend
        ),
        interface=resources.network_interface_name,
        instance_type=training[0].instance_type if data_hosts else resources.instance_type,
        data_hosts=data_hosts,
    )
    workers = tf_workers(cluster, launch.tf_worker_port) if backend == TENSORFLOW else ()
    layout = processes(cluster, launch.distribution_port, gpu_count)
    args: tuple[str, ...] = ()
    trainer = settings.trainer
    if trainer is None:  # script mode: job.validated sets `program` and no trainer config
        script = settings.program_file(job.paths.code_dir)
        args = script_arguments(settings.user)
        rank_job = RankJob(
            program=settings.program,
            script_hyperparameters=settings.script,
            tf_workers=workers,
            processes=layout,
        )
        command = rank_command(python, "train.script_runner", str(script), *args)
    else:
        check_builtin_channels(job)
        mesh = (
            trainer_mesh(layout, environ, trainer.model_parallel)
            if keras_on_jax
            else Mesh(cluster.world_size, 1)
        )
        rank_job = RankJob(
            trainer=trainer,
            tf_workers=workers,
            processes=layout,
            batches=plan_batches(
                world_size=mesh.readers,
                model_parallel=mesh.model_parallel,
                global_batch_size=trainer.global_batch_size,
                per_device_batch_size=trainer.per_device_batch_size,
                max_device_batch_size=trainer.max_device_batch_size,
                learning_rate=trainer.learning_rate,
                base_batch_size=trainer.base_batch_size,
                scale_learning_rate=trainer.scale_learning_rate,
            ),
        )
        command = rank_command(python, "train.rank_main")
    ssh_args = ssh_client_args(SshFiles(runtime), launch.sshd_port) if cluster.multi_host else None
    data_service = (
        f"grpc://{data_hosts[0]}:{launch.data_service_port}"
        if data_hosts and not settings.program
        else ""
    )
    mpirun_command = mpirun.Command(
        hosts=cluster.hosts,
        processes_per_host=cluster.processes_per_host,
        interface=cluster.interface,
        instance_type=cluster.instance_type,
        ssh_args=ssh_args,
        environment=rank_environment(
            job, cluster, rank_job, gpu_count, environ, launch, data_service
        ),
        program=tuple(command),
        forwarded=forwarded_environment(environ),
        user_options=tuple(mpirun.parse_options(launch.mpi_options)),
    )
    data_command: tuple[str, ...] = ()
    data_env: Mapping[str, str] = {}
    if cluster.is_data_host:
        data_command = (
            (python, "-P", "-m", "train.script_runner", str(script), *args)
            if settings.program
            else (python, "-P", "-m", "train.data_service")
        )
        data_env = {
            **rank_environment(job, cluster, rank_job, 0, environ, launch, data_service),
            DATA_HOST_ENV: cluster.current_host,
        }
    return LaunchPlan(
        cluster=cluster,
        launch=launch,
        job=rank_job,
        script_args=args,
        ignored_hyperparameters=settings.ignored,
        command=mpirun_command,
        data_command=data_command,
        data_env=data_env,
    )
