"""Golden tests: the whole mpirun argv for the shapes of job that matter."""

import json
from pathlib import Path

import pytest

from container.mpirun import merge_options, parse_options
from container.plan import make_plan
from job.batching import BatchPlan
from job.errors import ConfigError
from job.paths import MlPaths
from job.rank_job import Processes, RankJob
from job.sagemaker_config import Channel, JobConfig, ResourceConfig
from job.trainer_config import TrainerConfig
from job.validated import HOROVOD, TENSORFLOW, validate_hyperparameters

PYTHON = "/venv/bin/python"
ENV = {"PATH": "/venv/bin:/usr/bin"}
COMMON = ["mpirun", "--allow-run-as-root", "--tag-output"]
SAFETY = [
    "--bind-to",
    "none",
    "--map-by",
    "slot",
    "-mca",
    "pml",
    "ob1",
    "-mca",
    "btl",
    "^openib",
    "-mca",
    "orte_abort_on_non_zero_status",
    "1",
    "-mca",
    "btl_vader_single_copy_mechanism",
    "none",
]
STALL = ["-x", "HOROVOD_STALL_CHECK_TIME_SECONDS=30", "-x", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0"]
RANK = [PYTHON, "-P", "-m", "mpi4py", "-m", "train.rank_main"]
SSH = (
    "-F /run/job/ssh_config -p 22 -i /run/job/id_ed25519 -o IdentitiesOnly=yes -o BatchMode=yes "
    "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/run/job/known_hosts "
    "-o CheckHostIP=no -o ConnectTimeout=30 -o LogLevel=ERROR"
)


def job(hosts, current, hyperparameters=None, instance_type="ml.c5.xlarge", interface="eth0"):
    return JobConfig(
        MlPaths(Path("/opt/ml")),
        ResourceConfig(current, tuple(hosts), interface, instance_type),
        hyperparameters or {},
        {"train": Channel("train")},
    )


def default_job(world_size, coordinator="localhost:7777", devices=()):
    """What every rank of a job without hyperparameters runs: the trainer's defaults, 32
    samples per device, the learning rate 0.001 for 32 samples scaled to the global batch;
    every process told where the others meet (Keras 3 / JAX) and which GPUs are its own."""
    return RankJob(
        trainer=TrainerConfig(),
        batches=BatchPlan(
            world_size=world_size,
            global_batch=32 * world_size,
            per_device_batch=32,
            micro_batch=32,
            accumulation_steps=1,
            base_learning_rate=0.001,
            learning_rate=0.001 * world_size,
        ),
        processes=Processes(coordinator, world_size, devices),
    )


def rank_env(hosts, per_host, gpus=0):
    coordinator = f"{hosts[0] if len(hosts) > 1 else 'localhost'}:7777"
    devices = tuple((local % gpus,) for local in range(per_host)) if gpus else ()
    the_job = default_job(len(hosts) * per_host, coordinator, devices)
    env = [
        "-x",
        "TRAIN_ML_ROOT=/opt/ml",
        "-x",
        f"TRAIN_HOSTS={','.join(hosts)}",
        "-x",
        f"TRAIN_PROCESSES_PER_HOST={per_host}",
        "-x",
        f"TRAIN_JOB={the_job.to_json()}",
        "-x",
        "PYTHONUNBUFFERED=1",
        "-x",
        "TF_CPP_MIN_LOG_LEVEL=1",
        *STALL,
        "-x",
        "PATH=/venv/bin:/usr/bin",
    ]
    return env + (
        ["-x", "NCCL_DEBUG=WARN"]
        if gpus
        else [
            "-x",
            "OMPI_MCA_mpi_yield_when_idle=1",
            "-x",
            "HOROVOD_CYCLE_TIME=5",
            "-x",
            "TF_ENABLE_ONEDNN_OPTS=1",
        ]
    )


def plan(the_job, gpus=0, environ=ENV, stack=HOROVOD):
    """The launcher's plan for `the_job` on a host of `gpus` GPUs in the image of `stack`,
    whose container has the environment `environ`."""
    return make_plan(
        the_job,
        validate_hyperparameters(the_job.hyperparameters, environ),
        gpu_count=gpus,
        python=PYTHON,
        runtime=Path("/run/job"),
        environ=environ,
        stack=stack,
    )


def argv(the_job, gpus=0):
    return plan(the_job, gpus).mpirun


def test_single_cpu_host_runs_locally_without_ssh():
    assert list(argv(job(["algo-1"], "algo-1"))) == [
        *COMMON,
        "-np",
        "1",
        "-H",
        "localhost:1",
        *SAFETY,
        *rank_env(["algo-1"], 1),
        *RANK,
    ]


def test_single_gpu_host_runs_one_rank_per_gpu():
    assert list(argv(job(["algo-1"], "algo-1"), gpus=8)) == [
        *COMMON,
        "-np",
        "8",
        "-H",
        "localhost:8",
        *SAFETY,
        *rank_env(["algo-1"], 8, gpus=8),
        *RANK,
    ]


def test_two_hosts_over_ssh_on_the_configured_interface():
    hosts = ["algo-1", "algo-2"]
    assert list(argv(job(hosts, "algo-1", {"processes_per_host": "2"}, interface="ethwe"))) == [
        *COMMON,
        "-np",
        "4",
        "-H",
        "algo-1:2,algo-2:2",
        *SAFETY,
        "-mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-mca",
        "plm_rsh_args",
        SSH,
        "-mca",
        "btl_tcp_if_include",
        "ethwe",
        "-mca",
        "oob_tcp_if_include",
        "ethwe",
        "-x",
        "NCCL_SOCKET_IFNAME=ethwe",
        *rank_env(hosts, 2),
        *RANK,
    ]


@pytest.mark.parametrize(
    "instance_type, extra",
    [
        ("ml.p4d.24xlarge", ["-x", "FI_PROVIDER=efa", "-x", "FI_EFA_USE_DEVICE_RDMA=1"]),
        ("ml.p5.48xlarge", ["-x", "FI_PROVIDER=efa"]),
        ("ml.g5.48xlarge", ["-x", "FI_PROVIDER=efa"]),
        ("ml.g5.12xlarge", []),
    ],
)
def test_efa_instance_types_get_libfabric_settings(instance_type, extra):
    hosts = ["algo-1", "algo-2"]
    result = list(argv(job(hosts, "algo-1", instance_type=instance_type), gpus=8))
    start = result.index("NCCL_SOCKET_IFNAME=eth0") + 1
    assert result[start : start + len(extra)] == extra
    assert ("FI_PROVIDER=efa" in result) == bool(extra)


def test_user_options_override_defaults_in_place_and_add_new_ones():
    hosts = ["algo-1", "algo-2"]
    result = list(
        argv(
            job(
                hosts,
                "algo-2",
                {
                    "sagemaker_mpi_custom_mpi_options": "-mca btl_tcp_if_include eth1 -x NCCL_DEBUG=INFO --mca pml ucx -x FOO=bar --display-map"
                },
            ),
            gpus=1,
        )
    )
    assert result[result.index("btl_tcp_if_include") + 1] == "eth1"
    assert result.count("btl_tcp_if_include") == 1
    assert "NCCL_DEBUG=INFO" in result and "NCCL_DEBUG=WARN" not in result
    assert result[result.index("pml") - 1 : result.index("pml") + 2] == ["--mca", "pml", "ucx"]
    assert result[-len(RANK) - 3 : -len(RANK)] == ["-x", "FOO=bar", "--display-map"]


@pytest.mark.parametrize(
    "options, seconds",
    [
        ("", 30.0),
        ("-x HOROVOD_STALL_CHECK_TIME_SECONDS=20", 20.0),
        ("-x HOROVOD_STALL_CHECK_DISABLE=1", None),
        ("-x HOROVOD_STALL_CHECK_TIME_SECONDS=0", None),
    ],
)
def test_the_watchdog_knows_the_period_of_horovods_stall_check(options, seconds):
    """Horovod's own shutdown stays off whatever the period (the watchdog decides)."""
    the_plan = plan(job(["algo-1", "algo-2"], "algo-1", {"mpi_options": options}))
    assert the_plan.stall_check == seconds
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=0" in the_plan.mpirun


def test_a_tf_job_has_no_horovod_stall_check(tmp_path):
    assert tf_plan(tmp_path, {}).stall_check is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("eth0", "'eth0' is not an mpirun option"),
        ("-mca btl", "-mca needs 2 value(s)"),
        ("-x 'unclosed", "cannot be parsed"),
        (
            "-mca plm_rsh_args '-o StrictHostKeyChecking=no'",
            "-mca plm_rsh_args is set by the launcher",
        ),
        ("--mca plm_rsh_agent /bin/false", "-mca plm_rsh_agent is set by the launcher"),
    ],
)
def test_malformed_user_options(text, message):
    with pytest.raises(ConfigError) as error:
        parse_options(text)
    assert message in str(error.value)


def test_merge_keeps_order():
    defaults = parse_options("-np 2 -x A=1 -mca b c")
    assert [o.tokens for o in merge_options(defaults, parse_options("-x A=2 -n 4"))] == [
        ("-n", "4"),
        ("-x", "A=2"),
        ("-mca", "b", "c"),
    ]


def test_script_mode_passes_hyperparameters_as_arguments(tmp_path):
    paths = MlPaths(tmp_path)
    paths.code_dir.mkdir(parents=True)
    (paths.code_dir / "train.py").write_text("")
    the_job = JobConfig(
        paths,
        ResourceConfig("algo-1", ("algo-1",)),
        {
            "sagemaker_program": '"train.py"',
            "epochs": "3",
            "optimizer": '"adam"',
            "anything-goes": "x",
        },
        {},
    )
    launch = plan(the_job)
    assert launch.mpirun[-13:] == (
        PYTHON,
        "-P",
        "-m",
        "mpi4py",
        "-m",
        "train.script_runner",
        str(paths.code_dir / "train.py"),
        "--anything-goes",
        "x",
        "--epochs",
        "3",
        "--optimizer",
        "adam",
    )
    assert launch.batches is None


def test_builtin_mode_refuses_unknown_channels_and_pipe_mode():
    the_job = job(["algo-1"], "algo-1")
    bad = JobConfig(
        the_job.paths, the_job.resources, {}, {"train": Channel("train"), "test": Channel("test")}
    )
    with pytest.raises(ConfigError, match="unknown channel\\(s\\): test"):
        argv(bad)
    pipe = JobConfig(
        the_job.paths, the_job.resources, {}, {"train": Channel("train", input_mode="Pipe")}
    )
    with pytest.raises(ConfigError, match="Pipe input mode"):
        argv(pipe)


@pytest.mark.parametrize("program", ["../train.py", "/etc/passwd", "src/../../train.py"])
def test_script_mode_refuses_a_program_outside_the_code_folder(tmp_path, program):
    paths = MlPaths(tmp_path / "ml")
    paths.code_dir.mkdir(parents=True)
    (paths.code_dir / "src").mkdir()
    (tmp_path / "ml" / "train.py").write_text("")  # it exists, but outside the code folder
    the_job = JobConfig(
        paths, ResourceConfig("algo-1", ("algo-1",)), {"sagemaker_program": program}, {}
    )
    with pytest.raises(ConfigError, match=f"program {program!r} points outside the code folder"):
        plan(the_job)


def test_every_host_gets_the_containers_environment_by_name_minus_what_is_per_host():
    """Ranks on other hosts start from ssh, which keeps none of the container's environment:
    the job's own variables travel by name (`-x NAME`, so no value is logged), except those
    that describe one host, process or rank, and the credentials and metadata endpoints of
    the leader's own container (each host's sshd gives its ranks its own)."""
    environ = {
        **ENV,
        "USER_SETTING": "on",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/x",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN": "token",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/token",
        "ECS_CONTAINER_METADATA_URI": "http://169.254.170.2/v3/x",
        "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/x",
        "HOSTNAME": "ip-10",
        "SSH_CONNECTION": "a b",
        "OMPI_MCA_foo": "1",
        "SM_CURRENT_HOST": "algo-1",
        "TRAIN_ML_ROOT": "/elsewhere",
        "BASH_FUNC_f%%": "() { :; }",
        "NCCL_SOCKET_IFNAME": "eth9",
    }  # the launcher sets that one itself
    hosts = ["algo-1", "algo-2"]
    two_hosts = plan(job(hosts, "algo-1"), environ=environ).mpirun
    forwarded = [
        two_hosts[i + 1]
        for i, token in enumerate(two_hosts)
        if token == "-x" and "=" not in two_hosts[i + 1]
    ]
    assert forwarded == ["AWS_ACCESS_KEY_ID", "AWS_REGION", "USER_SETTING"]
    assert "AKIA" not in " ".join(two_hosts)
    one_host = plan(job(["algo-1"], "algo-1"), environ=environ).mpirun
    assert "USER_SETTING" not in one_host  # local ranks inherit mpirun's environment


def tf_plan(root, hyperparameters, hosts=("algo-1", "algo-2"), gpus=0, environ=ENV):
    paths = MlPaths(root)
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    (paths.code_dir / "train.py").write_text("")
    the_job = JobConfig(
        paths,
        ResourceConfig("algo-2", hosts),
        {"sagemaker_program": "train.py", **hyperparameters},
        {},
    )
    return plan(the_job, gpus, environ, TENSORFLOW)


def test_the_tf_image_runs_one_worker_per_host_with_the_tf_config_aws_writes(tmp_path):
    for hyperparameters in ({}, {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}):
        the_plan = tf_plan(
            tmp_path, hyperparameters, gpus=8
        )  # one worker drives all of a host's GPUs
        assert the_plan.cluster.processes_per_host == 1
        assert the_plan.job.tf_workers == ("algo-1:8890", "algo-2:8890")
        assert the_plan.as_json()["backend"] == "multi_worker_mirrored_strategy"
        assert json.loads(the_plan.job.worker_environment(1)["TF_CONFIG"]) == {
            "cluster": {"worker": ["algo-1:8890", "algo-2:8890"]},
            "environment": "cloud",
            "task": {"type": "worker", "index": 1},
        }
        assert "-np" in the_plan.mpirun and the_plan.mpirun[the_plan.mpirun.index("-np") + 1] == "2"
        carried = next(a for a in the_plan.mpirun if a.startswith("TRAIN_JOB="))
        assert RankJob.from_json(carried.split("=", 1)[1]).tf_workers == the_plan.job.tf_workers


def test_every_process_is_told_where_keras_distribution_meets_and_which_gpus_are_its_own(tmp_path):
    """What `keras.distribution.initialize()` with no arguments reads: the launcher's plan, not
    JAX's guess from Open MPI (which would give one process one GPU)."""
    the_plan = tf_plan(tmp_path, {}, gpus=8)  # one process per host, all its GPUs
    assert the_plan.job.worker_environment(1, 0) | {"TF_CONFIG": ""} == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "algo-1:7777",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
        "JAX_COORDINATOR_ADDRESS": "algo-1:7777",
        "JAX_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7",
        "TF_CONFIG": "",
    }
    assert "KERAS_BACKEND=jax" in the_plan.mpirun
    halves = tf_plan(tmp_path, {"processes_per_host": 2, "distribution_port": 9999}, gpus=8)
    assert [
        halves.job.worker_environment(3, local)["JAX_LOCAL_DEVICE_IDS"] for local in (0, 1)
    ] == ["0,1,2,3", "4,5,6,7"]
    assert halves.job.worker_environment(3, 1)["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "algo-1:9999"
    cpu = tf_plan(tmp_path, {})
    assert cpu.job.worker_environment(0, 0)["JAX_LOCAL_DEVICE_IDS"] == "0"
    one_host = plan(job(["algo-1"], "algo-1"), gpus=8)  # Horovod: a process per GPU
    assert one_host.job.worker_environment(5, 5)["JAX_LOCAL_DEVICE_IDS"] == "5"
    assert one_host.job.processes.coordinator == "localhost:7777"
    assert not any(token.startswith("KERAS_BACKEND=") for token in one_host.mpirun)


def test_the_jobs_own_keras_backend_wins(tmp_path):
    the_plan = tf_plan(tmp_path, {}, environ={**ENV, "KERAS_BACKEND": "tensorflow"})
    assert "KERAS_BACKEND=tensorflow" in the_plan.mpirun


def keras_settings(the_plan):
    """The Keras variables the plan sets for every rank (`-x NAME=VALUE`, in order)."""
    tokens = the_plan.mpirun
    return [
        value
        for index, value in enumerate(tokens)
        if index
        and tokens[index - 1] == "-x"
        and value.startswith(("KERAS_BACKEND=", "TF_USE_LEGACY_KERAS="))
    ]


MWMS = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}


@pytest.mark.parametrize(
    "hyperparameters, environ, settings",
    [
        # nothing asked for, tf.keras kept as tf_keras: `import keras` is Keras 3 on JAX
        ({}, {}, ["TF_USE_LEGACY_KERAS=1", "KERAS_BACKEND=jax"]),
        # the SDK's distribution={"multi_worker_mirrored_strategy": ...}: a TensorFlow program
        (MWMS, {}, ["TF_USE_LEGACY_KERAS=1"]),
        # ... whose tf.keras the job made Keras 3 (stock TensorFlow 2.21): Keras 3 on TensorFlow
        (MWMS, {"TF_USE_LEGACY_KERAS": "0"}, ["TF_USE_LEGACY_KERAS=0"]),
        (
            {"multi_worker_mirrored_strategy": True},
            {"TF_USE_LEGACY_KERAS": "false"},
            ["TF_USE_LEGACY_KERAS=false"],
        ),
        # no distribution asked for, but tf.keras made Keras 3: still TensorFlow's Keras
        ({}, {"TF_USE_LEGACY_KERAS": "0"}, ["TF_USE_LEGACY_KERAS=0"]),
        ({}, {"TF_USE_LEGACY_KERAS": "True"}, ["TF_USE_LEGACY_KERAS=True", "KERAS_BACKEND=jax"]),
        # the job's own KERAS_BACKEND wins, whatever it asked for
        (
            MWMS,
            {"TF_USE_LEGACY_KERAS": "0", "KERAS_BACKEND": "jax"},
            ["TF_USE_LEGACY_KERAS=0", "KERAS_BACKEND=jax"],
        ),
        ({}, {"KERAS_BACKEND": "torch"}, ["TF_USE_LEGACY_KERAS=1", "KERAS_BACKEND=torch"]),
    ],
)
def test_a_tensorflow_program_keeps_tensorflows_keras(tmp_path, hyperparameters, environ, settings):
    """The Keras backend follows what the job asked for: a job that asks for
    MultiWorkerMirroredStrategy or makes `tf.keras` Keras 3 runs a TensorFlow program, and
    KERAS_BACKEND=jax under its `tf.keras` had each host train its own model on JAX while the
    strategy reported every host's replicas (and every host exited 0)."""
    the_plan = tf_plan(tmp_path, hyperparameters, environ={**ENV, **environ})
    assert keras_settings(the_plan) == settings


def rank_variable(the_plan, name):
    """The value the plan gives every rank for `name` (`-x NAME=VALUE`), or None."""
    tokens = the_plan.mpirun
    values = [
        value.partition("=")[2]
        for index, value in enumerate(tokens)
        if index and tokens[index - 1] == "-x" and value.startswith(f"{name}=")
    ]
    return values[-1] if values else None


@pytest.mark.parametrize(
    "hyperparameters, seconds",
    [
        ({}, "1860"),  # first_progress_timeout 1800 is the longer allowance, + 60
        ({"progress_timeout": 120}, "1860"),
        ({"progress_timeout": 120, "first_progress_timeout": 120}, "180"),
        ({"progress_timeout": 3600.5, "first_progress_timeout": 120}, "3661"),
        ({"progress_timeout": 0}, None),  # no watchdog: JAX's own heartbeat ends a frozen rank
        (MWMS, "1860"),  # a script may still use JAX
    ],
)
def test_the_tf_images_ranks_get_a_jax_heartbeat_longer_than_the_watchdogs(
    tmp_path, hyperparameters, seconds
):
    """JAX's 100 s heartbeat aborted the process waiting for a frozen one before the
    watchdog (120 s at least) could name the frozen one: the ranks get a longer heartbeat."""
    the_plan = tf_plan(tmp_path, hyperparameters)
    assert rank_variable(the_plan, "TRAIN_JAX_HEARTBEAT_SECONDS") == seconds
    assert rank_variable(plan(job(["algo-1"], "algo-1")), "TRAIN_JAX_HEARTBEAT_SECONDS") is None


def test_several_workers_on_a_host_take_the_next_ports(tmp_path):
    the_plan = tf_plan(tmp_path, {"processes_per_host": 2, "tf_worker_port": 9000})
    assert the_plan.job.tf_workers == ("algo-1:9000", "algo-1:9001", "algo-2:9000", "algo-2:9001")


@pytest.mark.parametrize(
    "hyperparameters, stack, message",
    [
        (
            {"sagemaker_mpi_enabled": "true"},
            "tf",
            "asks for Horovod (sagemaker_mpi_enabled, the SDK's distribution={'mpi': ...}), which this "
            "image (the TensorFlow 2.21 image (docker build --build-arg STACK=tf)) does not have; run "
            "it on the Horovod image",
        ),
        (
            {"sagemaker_multi_worker_mirrored_strategy_enabled": True},
            "horovod",
            "asks for MultiWorkerMirroredStrategy (sagemaker_multi_worker_mirrored_strategy_enabled, "
            "distribution={'multi_worker_mirrored_strategy': ...}), which this image (the Horovod image",
        ),
        (
            {
                "sagemaker_mpi_enabled": "true",
                "sagemaker_multi_worker_mirrored_strategy_enabled": "true",
            },
            "tf",
            "set one distribution",
        ),
        (
            {"sagemaker_multi_worker_mirrored_strategy_enabled": "maybe"},
            "tf",
            "multi_worker_mirrored_strategy='maybe' is invalid: expected true or false",
        ),
    ],
)
def test_a_distribution_the_image_cannot_serve_is_refused_naming_the_image(
    hyperparameters, stack, message
):
    the_job = job(["algo-1"], "algo-1", {"sagemaker_program": "train.py", **hyperparameters})
    with pytest.raises(ConfigError) as error:
        plan(the_job, stack=stack)
    assert message in str(error.value)


def test_the_builtin_trainer_on_the_tf_image_gets_the_same_batch_plan_and_its_workers():
    the_plan = plan(job(["algo-1", "algo-2"], "algo-1"), stack=TENSORFLOW)
    assert the_plan.job.batches == default_job(2).batches
    assert the_plan.job.tf_workers == ("algo-1:8890", "algo-2:8890")
    assert the_plan.mpirun[-6:] == tuple(RANK)
    assert "TF_USE_LEGACY_KERAS=1" in the_plan.mpirun
    assert not any(a.startswith("HOROVOD_") for a in the_plan.mpirun)


def test_the_horovod_image_keeps_its_plan_when_the_sdk_says_mpi():
    the_job = job(["algo-1", "algo-2"], "algo-1", {"sagemaker_mpi_enabled": "true"})
    assert plan(the_job).job == default_job(2, "algo-1:7777") and plan(the_job).mpirun == argv(
        job(["algo-1", "algo-2"], "algo-1")
    )


def test_the_builtin_trainer_on_jax_runs_a_process_per_gpu_and_only_where_jax_is():
    """backend=jax: Keras 3 on JAX, whose batch plan is per device like Horovod's (one process
    per GPU, each told its own); the Horovod image has no JAX and says which image has."""
    the_job = job(["algo-1", "algo-2"], "algo-1", {"backend": "jax"})
    the_plan = plan(the_job, gpus=4, stack=TENSORFLOW)
    assert the_plan.cluster.processes_per_host == 4 and the_plan.job.batches.world_size == 8
    assert [
        the_plan.job.worker_environment(5, local)["JAX_LOCAL_DEVICE_IDS"] for local in range(4)
    ] == ["0", "1", "2", "3"]
    assert the_plan.job.trainer.backend == "jax"
    with pytest.raises(
        ConfigError,
        match=r"backend=jax trains the built-in model with Keras 3 "
        r"on JAX, which the Horovod image .* does not have; "
        r"run it on the TensorFlow 2.21 image",
    ):
        plan(the_job, stack=HOROVOD)
