"""Real mpirun, real Horovod, real processes: the trainer and the launcher end to end."""

import json
import subprocess
import time

import pytest

from tests.conftest import ROOT, TRAIN, failure_of, kill_host, newest_state, run_train


def metrics_lines(output: str) -> list[str]:
    return [
        line.split("METRICS ", 1)[1] for line in output.splitlines() if "METRICS epoch=" in line
    ]


def test_default_job_trains_to_useful_accuracy_and_exports(make_job):
    """With the checkpoint and TensorBoard folders a job's CheckpointConfig and
    TensorBoardOutputConfig name (SageMaker writes their LocalPath into input/config), and a
    profile of steps 5 to 7."""
    root = make_job(
        {"epochs": 4, "processes_per_host": 2, "learning_rate": 0.002, "profile_steps": "5,7"}
    )
    checkpoints, tensorboard = root / "my-checkpoints", root / "my-tensorboard"
    for name, local in (
        ("checkpointconfig", checkpoints),
        ("tensorboardoutputconfig", tensorboard),
    ):
        (root / "input" / "config" / f"{name}.json").write_text(
            json.dumps(
                {
                    "LocalPath": str(local),
                    "S3Uri" if name == "checkpointconfig" else "S3OutputPath": "s3://bucket/prefix",
                }
            )
        )
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 rank(s): 0@algo-1, 1@algo-1" in result.stdout
    lines = metrics_lines(result.stdout)
    assert [line.split()[0] for line in lines] == [f"epoch={n}" for n in range(1, 5)]
    metadata = json.loads((root / "model" / "metadata.json").read_text())
    assert metadata["input_shape"] == [64] and metadata["classes"] == list(range(10))
    assert metadata["final_metrics"]["val_accuracy"] > 0.9
    assert (root / "model" / "model" / "1" / "saved_model.pb").exists()
    history = json.loads((root / "output" / "data" / "history.json").read_text())
    assert len(history["val_accuracy"]) == 4
    assert (root / "output" / "data" / "history.png").read_bytes()[:4] == b"\x89PNG"
    assert list(tensorboard.rglob("events.out.tfevents.*"))
    assert list(tensorboard.glob("plugins/profile/*/*.xplane.pb"))
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch-000003", "epoch-000004"]
    assert not (root / "checkpoints").exists() and not (root / "output" / "tensorboard").exists()
    assert not (root / "output" / "failure").exists()


@pytest.mark.slow
def test_cnn_with_fixed_global_batch_and_accumulation(make_job):
    root = make_job(
        {
            "epochs": 2,
            "processes_per_host": 2,
            "model": "cnn",
            "image_shape": "8,8,1",
            "global_batch_size": 128,
            "max_device_batch_size": 16,
            "optimizer": "sgd",
            "learning_rate": 0.05,
            "fp16_allreduce": "true",
        }
    )
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "global batch 128 = 2 device(s) x 4 accumulated micro-batch(es) x 16" in result.stdout
    assert json.loads((root / "model" / "metadata.json").read_text())["model"] == "cnn"


@pytest.mark.slow
def test_killed_job_resumes_from_its_checkpoint(make_job):
    root = make_job({"epochs": 400, "processes_per_host": 2})
    job = subprocess.Popen(
        [str(TRAIN), "--ml-root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not (root / "checkpoints" / "epoch-000002").exists():
        assert time.monotonic() < deadline and job.poll() is None, "no checkpoint appeared"
        time.sleep(0.2)
    kill_host(job)  # no warning: like a lost spot instance
    done = newest_state(root)
    hyperparameters = root / "input" / "config" / "hyperparameters.json"
    hyperparameters.write_text(
        json.dumps({"epochs": str(done["epochs_done"] + 2), "processes_per_host": "2"})
    )
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"resumed from {root / 'checkpoints'}/epoch-{done['epochs_done']:06d}" in result.stdout
    epochs = [line.split()[0] for line in metrics_lines(result.stdout)]
    assert epochs == [f"epoch={done['epochs_done'] + 1}", f"epoch={done['epochs_done'] + 2}"]
    history = json.loads((root / "output" / "data" / "history.json").read_text())
    assert len(history["loss"]) == done["epochs_done"] + 2  # the curves span both runs


def test_k_micro_batches_equal_one_big_batch(make_script_job):
    root = make_script_job("accumulate.py", {"processes_per_host": 2}, ACCUMULATION_SCRIPT)
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads((root / "output" / "data" / "accumulation.json").read_text())
    assert report["max_difference"] < 1e-5, report
    assert report["max_difference_single"] < 1e-5, report  # averaged over ranks, not summed
    assert report["max_change"] > 1e-3, report  # the steps really moved the weights


ACCUMULATION_SCRIPT = '''
import json, os
import numpy as np
import tensorflow as tf
from train import distributed
from job.batching import plan_batches
from train.sync import Horovod
from train.trainer import compile_for_training
from job.trainer_config import TrainerConfig
from train.schedule import WarmupSchedule

distributed.init()
sync = Horovod(fp16_allreduce=False)
rng = np.random.default_rng(distributed.rank())
x = rng.normal(size=(64, 8)).astype("float32")
y = rng.integers(0, 3, size=64)

def trained(accumulation):
    tf.keras.utils.set_random_seed(7)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="tanh"),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    start = [w.numpy() for w in model.weights]
    plan = plan_batches(world_size=distributed.size(), global_batch_size=128,
                        per_device_batch_size=1, max_device_batch_size=64 // accumulation,
                        learning_rate=0.5, base_batch_size=128, scale_learning_rate=True)
    assert plan.accumulation_steps == accumulation, plan
    config = TrainerConfig(optimizer="sgd", momentum=0.0)
    # what the trainer fits: Keras' step (k=1) or AccumulatingModel (k=4)
    stepper, _ = compile_for_training(sync, model, config, plan, WarmupSchedule(0.5, 0.5, 0))
    stepper.fit(x, y, batch_size=plan.per_device_batch, epochs=2, shuffle=False, verbose=0)
    return start, [w.numpy() for w in model.weights]

def single_process():
    """Plain Keras on every rank's 64 rows at once: one batch of 128 per step."""
    tf.keras.utils.set_random_seed(7)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="tanh"),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    parts = [np.random.default_rng(r) for r in range(distributed.size())]
    xs = [(g.normal(size=(64, 8)).astype("float32"), g.integers(0, 3, size=64)) for g in parts]
    model.fit(np.concatenate([p[0] for p in xs]), np.concatenate([p[1] for p in xs]),
              batch_size=64 * distributed.size(), epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]

start, big = trained(1)
_, accumulated = trained(4)
if distributed.is_leader():
    reference = single_process()
    report = {"max_difference": max(float(np.abs(a - b).max()) for a, b in zip(big, accumulated)),
              "max_difference_single": max(float(np.abs(a - b).max())
                                           for a, b in zip(reference, accumulated)),
              "max_change": max(float(np.abs(a - b).max()) for a, b in zip(big, start))}
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "accumulation.json"), "w") as out:
        json.dump(report, out)
'''


def test_diverged_weights_fail_loudly(make_script_job):
    root = make_script_job(
        "diverge.py",
        {"processes_per_host": 2},
        "import tensorflow as tf\n"
        "from train import distributed\n"
        "from train.sync import Horovod\n"
        "from train.trainer import verify_identical_weights\n"
        "distributed.init()\n"
        "sync = Horovod(fp16_allreduce=False)\n"
        "model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1, kernel_initializer='ones')])\n"
        "verify_identical_weights(sync, model)\n"  # identical: passes
        "if distributed.rank() == 1:\n"
        "    model.layers[0].kernel.assign_add(tf.ones((2, 1)) * 1e-6)\n"
        "verify_identical_weights(sync, model)\n",
    )
    result = run_train(root)
    assert result.returncode == 1
    failure = failure_of(root)
    assert "model weights differ between ranks after training" in failure, failure
    assert failure.startswith("rank ") and "(exit code" in failure


def test_a_bare_assert_in_a_users_script_names_its_file_and_line(make_script_job):
    root = make_script_job(
        "checks.py",
        {"processes_per_host": 2},
        "from mpi4py import MPI\n"
        "rows = [1, 2] if MPI.COMM_WORLD.rank == 1 else [1, 2, 3]\n"
        "assert len(rows) == 3\n",
    )
    result = run_train(root, timeout=120)
    assert result.returncode == 1
    assert failure_of(root).startswith(
        "rank 1 on host algo-1 failed (exit code 1): "
        "AssertionError (at checks.py, line 3: "
        "assert len(rows) == 3)"
    ), failure_of(root)


def test_a_failing_rank_stops_the_job_within_seconds(make_script_job):
    root = make_script_job(
        "fail.py",
        {"processes_per_host": 2},
        "import time\n"
        "from mpi4py import MPI\n"
        "comm = MPI.COMM_WORLD\n"
        "comm.barrier()\n"
        "if comm.rank == 1:\n"
        "    raise ValueError('column 7 holds text where a number was expected')\n"
        "comm.barrier()  # rank 0 would wait here forever without the abort\n",
    )
    started = time.monotonic()
    result = run_train(root, timeout=120)
    assert result.returncode == 1
    failure = failure_of(root)
    assert failure.startswith(
        "rank 1 on host algo-1 failed (exit code 1): ValueError: column 7 "
        "holds text where a number was expected"
    ), failure
    print(f"failing job ended after {time.monotonic() - started:.1f} s")


def test_script_mode_gets_sagemaker_environment_and_arguments(make_job):
    root = make_job(
        {
            "sagemaker_program": '"probe.py"',
            "processes_per_host": 2,
            "epochs": "3",
            "optimizer": '"adam"',
            "sagemaker_region": '"us-east-1"',
        }
    )
    (root / "code").mkdir()  # the program name arrives JSON-quoted, as framework estimators send it
    (root / "code" / "probe.py").write_text(
        "import json, os, sys\n"
        "from mpi4py import MPI\n"
        "keys = ['SM_CURRENT_HOST', 'SM_HOSTS', 'SM_MODEL_DIR', 'SM_CHANNEL_TRAIN', 'SM_NUM_GPUS', 'SM_HPS']\n"
        "out = os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], f'rank{MPI.COMM_WORLD.rank}.json')\n"
        "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'shipped': open('shipped.txt').read(),\n"
        "           **{k: os.environ.get(k) for k in keys}}, open(out, 'w'))\n"
    )
    (root / "code" / "shipped.txt").write_text("beside the script")
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in (0, 1):
        seen = json.loads((root / "output" / "data" / f"rank{rank}.json").read_text())
        assert seen["argv"] == ["--epochs", "3", "--optimizer", "adam"]
        assert (seen["cwd"], seen["shipped"]) == (str(root / "code"), "beside the script")
        assert seen["SM_CURRENT_HOST"] == "algo-1" and json.loads(seen["SM_HOSTS"]) == ["algo-1"]
        assert seen["SM_MODEL_DIR"] == str(root / "model")
        assert seen["SM_CHANNEL_TRAIN"] == str(root / "input" / "data" / "train")
        assert json.loads(seen["SM_HPS"]) == {"epochs": 3, "optimizer": "adam"}


USERS_MODULES = ("train", "serve", "container", "job", "utils", "model")


def test_a_users_modules_win_over_the_images_packages_of_the_same_name(make_script_job):
    """`from train import build_model` in a user's main.py found our package before."""
    root = make_script_job(
        "main.py",
        {"processes_per_host": 2},
        "import json, os\n"
        "from mpi4py import MPI\n"
        "from train import build_model\n"
        "import serve, container, job, utils, model\n"
        "names = {m.__name__: m.OWNER for m in (serve, container, job, utils, model)}\n"
        "out = os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], f'rank{MPI.COMM_WORLD.rank}.json')\n"
        "json.dump({'train': build_model(), **names}, open(out, 'w'))\n"
        "assert job.OWNER == 'nobody', 'the failure report still works after the hand-over'\n",
    )
    code = root / "code"
    for name in USERS_MODULES[1:3] + USERS_MODULES[4:]:
        (code / f"{name}.py").write_text("OWNER = 'user'\n")
    (code / "train.py").write_text("def build_model():\n    return 'user'\n")
    (code / "job").mkdir()  # a package, not a module
    (code / "job" / "__init__.py").write_text("OWNER = 'user'\n")
    result = run_train(root, timeout=120)
    assert result.returncode == 1
    for rank in (0, 1):
        seen = json.loads((root / "output" / "data" / f"rank{rank}.json").read_text())
        assert seen == dict.fromkeys(USERS_MODULES, "user")
    failure = failure_of(root)
    assert "AssertionError: the failure report still works after the hand-over" in failure, failure


def test_a_data_folder_named_like_our_package_does_not_hide_the_helper(make_script_job):
    root = make_script_job(
        "main.py",
        {"processes_per_host": 1},
        "import os\n"
        "from train import distributed\n"
        "distributed.init()\n"
        "open(os.path.join(os.environ['SM_OUTPUT_DATA_DIR'], 'size'), 'w').write(str(distributed.size()))\n",
    )
    (root / "code" / "train").mkdir()  # data, no __init__.py
    (root / "code" / "train" / "rows.csv").write_text("1,2\n")
    result = run_train(root, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (root / "output" / "data" / "size").read_text() == "1"


@pytest.mark.slow
def test_example_user_script_trains(make_script_job):
    example = ROOT / "train" / "examples" / "keras_script.py"
    root = make_script_job(
        "keras_script.py", {"processes_per_host": 2, "epochs": 2}, example.read_text()
    )
    result = run_train(root)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (root / "model" / "model" / "1" / "saved_model.pb").exists()
    metadata = json.loads((root / "model" / "metadata.json").read_text())  # distributed.export
    assert (metadata["model_path"], metadata["classes"]) == ("model/1", list(range(10)))
    assert len(json.loads((root / "output" / "data" / "history.json").read_text())["loss"]) == 2


def test_a_rank_killed_by_a_signal_is_named_with_the_likely_cause(make_script_job):
    root = make_script_job(
        "oom.py",
        {"processes_per_host": 2},
        "import os, signal, time\nfrom mpi4py import MPI\nMPI.COMM_WORLD.barrier()\n"
        "if MPI.COMM_WORLD.rank == 1:\n    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does\n"
        "time.sleep(60)\n",
    )
    result = run_train(root, timeout=120)
    assert result.returncode == 137, result.returncode  # 128 + SIGKILL, as mpirun reports it
    assert failure_of(root).startswith(
        "rank 1 on host algo-1 was killed by signal 9 (Killed) - likely out of memory"
    ), failure_of(root)
