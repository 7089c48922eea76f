"""SDK 3's `ModelTrainer(source_code=SourceCode(...), distributed=MPI(...))` as the launcher
sees it: the `code` and `sm_drivers` channels, sourcecode.json and distributed.json written as
the SDK writes them (`model_dump()` of its pydantic configs, hyperparameters through its
`safe_serialize`: strings as they are, the rest as JSON). The SDK's own local container mode
running the image is in tests/image/test_sdk_local_mode.py."""

import json
import subprocess
import sys
import tarfile

import pytest

from container.network import free_port
from container.sdk_handover import sdk_driver
from job.errors import ConfigError
from job.paths import MlPaths
from job.source_code import read_source_code
from job.validated import validate_hyperparameters
from tests.conftest import failure_of, run_train, write_json
from tests.container.test_multi_host import HOSTS, start
from tests.helpers import loopback_hyperparameters
from tests.s3_server import uninstall, write_wheel

IGNORE = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"]


def sdk3_files(
    root,
    entry_script="train.py",
    command=None,
    requirements=None,
    source_dir="/home/me/src",
    distributed=None,
):
    """What ModelTrainer writes into the sm_drivers channel."""
    drivers = root / "input" / "data" / "sm_drivers"
    write_json(
        drivers / "sourcecode.json",
        {
            "source_dir": source_dir,
            "requirements": requirements,
            "entry_script": entry_script,
            "command": command,
            "ignore_patterns": IGNORE,
        },
    )
    write_json(drivers / "distributed.json", distributed or {})
    config = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(config.read_text())
    for name in ("code", "sm_drivers"):
        channels[name] = {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}
    config.write_text(json.dumps(channels))
    (root / "input" / "data" / "code").mkdir(exist_ok=True)
    return root / "input" / "data" / "code"


def plan(root):
    result = run_train(root, "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout[result.stdout.index("\n{") + 1 :])  # after the fetch's line


# --- reading the SDK's files ------------------------------------------------------------------


def test_a_job_without_sm_drivers_has_no_source_code(make_job):
    assert read_source_code(MlPaths(make_job({}))) is None


def test_mpi_settings_become_the_launchers(make_job):
    root = make_job({})
    sdk3_files(
        root,
        distributed={
            "process_count_per_node": 3,
            "mpi_additional_options": ["-x", "NCCL_DEBUG=INFO"],
        },
    )
    source = read_source_code(MlPaths(root))
    assert (
        source.entry_script,
        source.distribution,
        source.processes_per_host,
        source.mpi_options,
    ) == ("train.py", "mpi", 3, ("-x", "NCCL_DEBUG=INFO"))
    settings = validate_hyperparameters({"mpi_options": "-x NCCL_DEBUG=WARN"}, {}, source)
    # the hyperparameter comes last, so it wins for the same key
    assert settings.launch.mpi_options == "-x NCCL_DEBUG=INFO -x NCCL_DEBUG=WARN"
    assert settings.program == "train.py" and settings.launch.processes_per_host == 3
    assert settings.launch.submit_directory == str(root / "input" / "data" / "code")


def test_a_hyperparameter_beats_the_sdk_files(make_job):
    root = make_job({})
    sdk3_files(root, distributed={"process_count_per_node": 3, "mpi_additional_options": None})
    settings = validate_hyperparameters(
        {"processes_per_host": "1", "sagemaker_program": "other.py"},
        {},
        read_source_code(MlPaths(root)),
    )
    assert (settings.program, settings.launch.processes_per_host) == ("other.py", 1)


@pytest.mark.parametrize(
    "distributed, message",
    [
        ({"process_count_per_node": None, "smp": None}, "use distributed=MPI"),
        (
            {"process_count_per_node": 0, "mpi_additional_options": None},
            "process_count_per_node must be a positive whole number, got 0",
        ),
        (
            {"process_count_per_node": 2, "mpi_additional_options": "-x A=1"},
            "mpi_additional_options must be a list of strings",
        ),
        ({"pipeline_parallel": 4}, "unknown distributed= configuration"),
    ],
)
def test_distributed_configs_this_image_cannot_run(make_job, distributed, message):
    root = make_job({})
    sdk3_files(root, distributed=distributed)
    result = run_train(root)
    assert result.returncode == 2
    assert message in failure_of(root)


def test_a_shell_entry_script_is_refused_with_the_way_out(make_job):
    root = make_job({})
    sdk3_files(root, entry_script="run.sh")
    assert run_train(root).returncode == 2
    assert "give a .py file (a shell script can run as SourceCode(command=...))" in failure_of(root)


def test_broken_sdk_files_name_the_file(make_job):
    root = make_job({})
    sdk3_files(root)
    (root / "input" / "data" / "sm_drivers" / "distributed.json").write_text("{not json")
    with pytest.raises(ConfigError, match="distributed.json .*is not valid JSON"):
        read_source_code(MlPaths(root))


# --- what the launcher plans ---------------------------------------------------------------


def test_the_entry_script_runs_in_script_mode_with_the_sdks_arguments(make_job):
    # SDK 3 sends no sagemaker_* keys; strings as they are, everything else as JSON
    root = make_job({"epochs": "3", "optimizer": "adam", "layers": "[64, 32]"})
    code = sdk3_files(
        root, distributed={"process_count_per_node": 2, "mpi_additional_options": ["-x", "FOO=1"]}
    )
    (code / "train.py").write_text("print('hi')\n")
    job = plan(root)
    assert (job["mode"], job["program"], job["processes_per_host"]) == ("script", "train.py", 2)
    assert job["script_args"] == ["--epochs", "3", "--layers", "[64, 32]", "--optimizer", "adam"]
    assert job["mpirun"][job["mpirun"].index("FOO=1") - 1] == "-x"


def test_the_builtin_trainer_behind_command_train_ignores_the_sdk_channels(make_job):
    root = make_job({"epochs": 1})
    sdk3_files(root, entry_script=None, command="exec train")
    assert plan(root)["mode"] == "builtin"


def test_a_users_own_code_channel_is_still_an_unknown_channel(make_job):
    root = make_job({"epochs": 1})
    (root / "input" / "data" / "code").mkdir()
    config = root / "input" / "config" / "inputdataconfig.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "code": {}}))
    assert run_train(root).returncode == 2
    assert "unknown channel(s): code" in failure_of(root)


def test_a_tar_gz_source_dir_is_unpacked_into_the_code_folder(make_job, tmp_path):
    root = make_job({})
    code = sdk3_files(root, source_dir="s3://bucket/prefix/sourcedir.tar.gz")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('from the archive')\n")
    with tarfile.open(code / "sourcedir.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "src" / "train.py", arcname="train.py")
    result = run_train(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "from the archive" in result.stdout
    assert (root / "code" / "train.py").is_file()


# --- the SDK's driver handed to the launcher -----------------------------------------------


@pytest.mark.parametrize(
    "argv, driver",
    [
        (["/opt/ml/input/data/sm_drivers/distributed_drivers/mpi_driver.py"], "mpi_driver.py"),
        (
            ["/opt/ml/input/data/sm_drivers/distributed_drivers/basic_script_driver.py"],
            "basic_script_driver.py",
        ),
        (["/opt/ml/input/data/code/mpi_driver.py"], ""),  # a user's file of that name
        (["/opt/ml/input/data/sm_drivers/scripts/environment.py"], ""),
        (["-c"], ""),
        ([""], ""),
        ([], ""),
    ],
)
def test_which_processes_are_the_sdks_drivers(argv, driver):
    assert sdk_driver(argv) == driver


# --- for real: two hosts on loopback ------------------------------------------------------

SCRIPT = """
import os, sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
import {package} as shipped

hvd.init()
assert sys.argv[1:] == ["--epochs", "2"], sys.argv
assert os.environ["SM_ENTRY_SCRIPT"] == "train.py" and os.environ["SM_MASTER_ADDR"] == "127.0.0.1"
scale = float(open("scale.txt").read())  # shipped beside the script, opened relative
table = np.loadtxt(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "digits.csv"), delimiter=",")
table = table[hvd.rank():len(table) // 2 * 2:hvd.size()]
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01)),
              loss="sparse_categorical_crossentropy")
model.fit(table[:, 1:] / scale, table[:, 0], batch_size=32, epochs=shipped.EPOCHS, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
if hvd.rank() == int(os.environ.get("FAIL_RANK", "-1")):
    assert model.count_params() == 0, "the model has weights"
open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank{{hvd.rank()}}-{{os.environ['SM_CURRENT_HOST']}}"), "w")
if hvd.rank() == 0:
    model.save(os.path.join(os.environ["SM_MODEL_DIR"], "model.keras"))
"""


@pytest.fixture
def sdk3_cluster(make_job, tmp_path):
    package = f"sdk3_shipped_{free_port()}"
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT.format(package=package))
    (source / "scale.txt").write_text("16.0\n")
    wheel = write_wheel(source / "wheels", package, "1.0", "EPOCHS = 2\n")
    (source / "requirements-train.txt").write_text(f"./wheels/{wheel.name}\n")
    ports = loopback_hyperparameters()
    roots = {}
    for host in HOSTS:
        roots[host] = make_job({**ports, "epochs": "2"}, hosts=HOSTS, current=host)
        code = sdk3_files(
            roots[host],
            requirements="requirements-train.txt",
            distributed={"process_count_per_node": 1, "mpi_additional_options": None},
        )
        subprocess.run(["cp", "-r", f"{source}/.", str(code)], check=True)
    yield roots
    uninstall(package)


def start_in_code_channel(root, env=None):
    """The launcher as sm_train.sh starts it: from the code channel, where a train.py lies
    (ranks inherit mpirun's directory; it must not shadow the image's `train` package)."""
    return start(root, env, cwd=root / "input" / "data" / "code")


def run_cluster(roots, env=None):
    worker = start_in_code_channel(roots[HOSTS[1]], env)
    leader = start_in_code_channel(roots[HOSTS[0]], env)
    output = leader.communicate(timeout=300)[0]
    worker.communicate(timeout=60)
    return leader.returncode, worker.returncode, output


def test_the_entry_script_trains_across_two_hosts(sdk3_cluster):
    leader, worker, output = run_cluster(sdk3_cluster)
    assert leader == worker == 0, output[-3000:]
    assert "installing requirements-train.txt of the submit directory" in output
    data = sdk3_cluster[HOSTS[0]] / "output" / "data"
    assert sorted(p.name for p in data.iterdir()) == ["rank0-127.0.0.1", "rank1-127.0.0.2"]
    assert (sdk3_cluster[HOSTS[0]] / "model" / "model.keras").is_file()


def test_a_failing_rank_names_its_host_and_line(sdk3_cluster):
    leader, worker, output = run_cluster(sdk3_cluster, {"FAIL_RANK": "1"})
    assert leader == worker == 1, output[-3000:]
    reason = failure_of(sdk3_cluster[HOSTS[1]])
    assert reason.startswith(
        "rank 1 on host 127.0.0.2 failed (exit code 1): "
        "AssertionError: the model has weights (at train.py, line"
    ), reason


def test_the_handover_is_plain_python():
    """It runs in every interpreter of the image: importing it must not import our packages."""
    probe = (
        "import sys, runpy; runpy.run_path(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('job', 'container', 'train', 'serve')))"
    )
    import container.sdk_handover as module

    result = subprocess.run(
        [sys.executable, "-c", probe, module.__file__], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
