"""Keras 3 across hosts on the TensorFlow 2.21 image: JAX's backend with keras.distribution,
started by the same launcher. The script is one in the shape of keras.io's distribution guide
(train/examples/keras_guide_script.py): `keras.distribution.initialize()` with no arguments
finds every process of every host from what the launcher's plan put in its environment, and
a script that never joins the others fails the job for training one model per process; `serve`
answers the `.keras` model it saved."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    add_code,
    code_folder,
    compose_cluster,
    failure,
    http,
    leader_checkpoints,
    local_cluster,
    logs,
    restart,
    run_offline,
    serving,
    wait_for_log,
)
from test_tf_stack import (  # noqa: F401
    HOSTS,
    LAUNCH,
    fault_seconds,
    run_to_end,
    signal_in_epoch_3,
    tf_image,
)

from tests.container.test_watchdog import all_at_once

pytestmark = pytest.mark.container

SCRIPT = Path(__file__).parents[2] / "train" / "examples" / "keras_guide_script.py"
GUIDE = {
    key: value
    for key, value in LAUNCH.items()
    if key != "sagemaker_multi_worker_mirrored_strategy_enabled"
} | {"sagemaker_program": SCRIPT.name}


@pytest.fixture
def code(tmp_path) -> Path:
    return code_folder(tmp_path, SCRIPT)


def guide_spec(tmp_path, image, data, **hyperparameters) -> local_cluster.ClusterSpec:
    """Two hosts with every train file each (Keras splits each global batch between the
    processes: every process must see as many batches)."""
    values = {k: str(v) for k, v in {**GUIDE, **hyperparameters}.items()}
    return local_cluster.ClusterSpec(
        hosts=2, workdir=tmp_path / "cluster", data=data, image=image, hyperparameters=values
    )


def test_a_keras_guide_script_trains_on_two_hosts_as_one_job(
    engine, tf_image, data, tmp_path, code
):
    spec = guide_spec(tmp_path, tf_image, data, epochs=3)
    codes, output = run_to_end(engine, spec, "keras-jax", code)
    assert codes == {"algo-1": 0, "algo-2": 0}, output
    assert "process 0 of 2 on algo-1: 2 devices, Keras 3.15.1 on jax" in output, output[-3000:]
    assert "process 1 of 2 on algo-2: 2 devices, Keras 3.15.1 on jax" in output, output[-3000:]
    weights = re.findall(r"WEIGHTS process \d: (\w+)", output)
    assert len(weights) == 2 and len(set(weights)) == 1, output[-3000:]
    assert float(re.search(r"ACCURACY ([\d.]+)", output)[1]) > 0.8, output[-3000:]
    leader_paths = local_cluster.host_paths(spec, "algo-1")
    assert (leader_paths.model_dir / "model.keras").is_file()
    assert not any(local_cluster.host_paths(spec, "algo-2").model_dir.iterdir())
    assert not (leader_paths.output_data_dir / "WARNING-trained-apart.txt").exists()
    assert failure(spec, "algo-1") == failure(spec, "algo-2") == ""
    # serve answers the Keras 3 model the script trained on JAX, from its .keras file
    rows = np.loadtxt(data / "validation" / "digits.csv", delimiter=",")[:50]
    with serving(engine, tf_image, leader_paths.model_dir) as url:
        status, answer = http(
            "POST",
            f"{url}/invocations",
            json.dumps({"instances": (rows[:, 1:] / 16).tolist()}).encode(),
            {"Content-Type": "application/json"},
            timeout=60,
        )
    assert status == 200, answer
    logits = np.array(json.loads(answer)["predictions"])
    assert logits.shape == (50, 10) and (logits.argmax(axis=1) == rows[:, 0]).mean() > 0.8


def test_a_script_that_never_joins_the_others_fails_the_job(engine, tf_image, data, tmp_path, code):
    """Without `keras.distribution.initialize()` each process trains alone: the job does not
    end 0 as if it had trained one model; it fails as a configuration error naming the fix."""
    spec = guide_spec(tmp_path, tf_image, data, epochs=1, initialize="false")
    codes, output = run_to_end(engine, spec, "keras-alone", code)
    assert codes == {"algo-1": 2, "algo-2": 2}, output
    said = (
        "TrainedApart: this job has 2 processes, but the script's JAX ran with 1: each "
        "process trained its own model. Call keras.distribution.initialize() with no "
        "arguments"
    )
    for host in ("algo-1", "algo-2"):
        assert said in failure(spec, host), failure(spec, host)


def test_a_process_that_raises_fails_the_job_naming_it(engine, tf_image, data, tmp_path, code):
    """The others wait for it in a collective: it must leave at once, not sit in JAX's
    shutdown barrier (up to 300 s) waiting for them."""
    spec = guide_spec(tmp_path, tf_image, data, **{"fail-on-process": 1})
    codes, output = run_to_end(engine, spec, "keras-raises", code)
    assert codes == {"algo-1": 1, "algo-2": 1}, output
    for host in ("algo-1", "algo-2"):
        assert failure(spec, host).startswith(
            "rank 1 on host algo-2 failed (exit code 1): ValueError: process 1 cannot parse its "
            "data (at keras_guide_script.py, line"
        ), failure(spec, host)


def run_alone(engine, image, script: str, *environment: str) -> str:
    """`python -c script` in one container of `image` with no network, Keras 3 on JAX and
    `environment` (NAME=VALUE); its output, once it exited 0."""
    settings = [
        item for variable in ("KERAS_BACKEND=jax", *environment) for item in ("-e", variable)
    ]
    result = run_offline(engine, image, "python", "-c", script, options=settings)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    return output


# Two JAX processes on one host under script mode's hooks (train.keras_script.install); the
# second freezes once they joined. How long the first lives on says which heartbeat JAX used.
HEARTBEATS = r"""
import os, signal, subprocess, sys, threading, time

CHILD = '''
import os, signal
from train import keras_script
keras_script.install()
import jax, keras
if os.environ["CALL"] == "keras":
    keras.distribution.initialize()
else:  # the script's own heartbeat
    jax.distributed.initialize(os.environ["KERAS_DISTRIBUTION_JOB_ADDRESSES"], 2,
                               int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"]),
                               heartbeat_timeout_seconds=5)
print("JOINED", flush=True)
if jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
signal.pause()
'''

def case(call, planned, port):
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env={**os.environ, "CALL": call, "TRAIN_JAX_HEARTBEAT_SECONDS": planned,
                 "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"localhost:{port}",
                 "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                 "KERAS_DISTRIBUTION_PROCESS_ID": str(process)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for process in (0, 1)
    ]
    output = []
    for line in children[0].stdout:
        output.append(line)
        if line.startswith("JOINED"):
            break
    joined = time.monotonic()
    threading.Thread(target=lambda: output.extend(children[0].stdout), daemon=True).start()
    try:
        code = children[0].wait(timeout=90)
    except subprocess.TimeoutExpired:
        code = "none"
    seconds = time.monotonic() - joined
    for child in children:
        child.kill()
    said = sum("JAX's heartbeat timeout is" in line for line in output)
    print(f"{call} planned {planned}: exit {code} after {seconds:.1f} s, said {said}", flush=True)
    print("".join(line for line in output if "heartbeat timeout is" in line), flush=True)

runs = [threading.Thread(target=case, args=("keras", "5", 7701)),
        threading.Thread(target=case, args=("explicit", "1000", 7702))]
for run in runs:
    run.start()
for run in runs:
    run.join()
"""


@pytest.mark.slow
def test_the_ranks_heartbeat_applies_to_keras_and_yields_to_the_scripts_own(engine, tf_image):
    """keras.distribution.initialize() under the hook takes the planned heartbeat (5 s here:
    the process left waiting is aborted within seconds, not after JAX's 100 s), said once, by
    process 0; a script passing its own heartbeat_timeout_seconds keeps it (5 s, though 1000 s
    is planned) and nothing is said."""
    output = run_alone(engine, tf_image, HEARTBEATS)
    print(output[-1500:])
    for call, planned, said in (("keras", "5", 1), ("explicit", "1000", 0)):
        found = re.search(
            rf"{call} planned {planned}: exit (\S+) after ([\d.]+) s, said (\d)", output
        )
        assert found, output[-3000:]
        assert found[1] == "-6" and float(found[2]) < 40, found[0]  # JAX's abort, in seconds
        assert int(found[3]) == said, found[0]
    assert (
        "launcher: JAX's heartbeat timeout is 5 s, not its default 100 s "
        "(TRAIN_JAX_HEARTBEAT_SECONDS, longer than progress_timeout and first_progress_timeout)"
    ) in output, output[-3000:]


@pytest.mark.slow
def test_faults_end_the_job_naming_the_process(engine, tf_image, data, tmp_path, code):
    """Three faults, each in a job of its own once the leader trains epoch 3, the jobs run at
    once (all_at_once), each asserted on its own: the frozen process's job mostly waits out
    progress_timeout (120 s), which the others fill. On a 2-core host shared with other
    tests, these three and the SIGTERM job one after another took 292 s; these three at once
    207 s, then the SIGTERM job 32 s.

    - A frozen process: the process on algo-1 waits in a collective for the frozen one and
      wants no CPU: the launcher's watchdog ends the job within progress_timeout, naming the
      frozen process. JAX's own heartbeat (100 s by default) would abort the waiting process
      first, as "rank 0 killed by signal 6": the ranks get one longer than the watchdog's
      allowances (train.jax_heartbeat). The threads of JAX's distributed runtime, awake every
      10 ms whatever the process does, are not counted as the waiting process's demand for
      the CPU (train.activity), else the job would run on.
    - A killed host (either): the survivor's JAX sees its peer's connection reset within
      seconds; the launcher names the lost host, as on the other stacks."""

    def frozen(name):
        spec = guide_spec(tmp_path / name, tf_image, data, epochs=100000, progress_timeout=120)
        with compose_cluster(engine, spec, "keras-frozen", edit=add_code(code)) as cluster:
            cluster.compose("up", "-d", capture=True, timeout=300)
            wait_for_log(cluster, "algo-1", "Epoch 3/", timeout=300)
            fault_at = time.time()
            engine.run(
                "exec",
                cluster.containers()["algo-2"],
                "pkill",
                "-STOP",
                "-f",
                "train.script_runner",
            )
            # 130 s after the freeze when measured, once 237 s on a crowded host: a ceiling
            # well past that, still far below JAX's own 1860 s heartbeat
            codes = cluster.wait_all_exited(420)
            print(
                "\nKeras 3 on JAX: SIGSTOP to algo-2's process, last exit "
                f"{fault_seconds(engine, cluster, fault_at):.1f} s after it"
            )
            output, leader = logs(cluster), cluster.logs("algo-1")
        assert codes == {"algo-1": 4, "algo-2": 4}, output
        # said at the start: the stacks at the end push it out of `output`'s tails
        assert "launcher: JAX's heartbeat timeout is 1860 s, not its default 100 s" in leader
        reason = failure(spec, "algo-1")
        assert reason.startswith("no progress for ") and "(progress_timeout 120 s)" in reason, (
            reason
        )
        # once mpirun wakes the frozen process to end it, its stack joins the other's
        assert re.search(r"rank 1 on algo-2|ranks 0, 1 on algo-1, algo-2", reason), reason

    def killed(victim, codes, survivor, cause):
        def case(name):
            spec = guide_spec(tmp_path / name, tf_image, data, epochs=100000)
            exited, output = signal_in_epoch_3(engine, spec, code, "KILL", victim, "Keras 3 on JAX")
            assert exited == codes, output
            assert failure(spec, survivor).startswith(cause), failure(spec, survivor)

        return case

    all_at_once(
        {
            "a frozen process is named by the watchdog": frozen,
            "a killed worker host is named": killed(
                "algo-2", {"algo-1": 3, "algo-2": 137}, "algo-1", "lost contact with host algo-2"
            ),
            "a killed leader host is named": killed(
                "algo-1",
                {"algo-1": 137, "algo-2": 3},
                "algo-2",
                "lost contact with the leader algo-1: ",
            ),
        }
    )


def test_sigterm_stops_every_process_with_143(engine, tf_image, data, tmp_path, code):
    """SageMaker's stop: every process leaves (together, so JAX's shutdown barrier is met at
    once) and both hosts report the stop. Alone: run at once with the fault jobs, the stop took
    38-39 s (its ranks' stop grace is 30 s) instead of 8.4 s, too near NO_HANG (60 s)."""
    spec = guide_spec(tmp_path, tf_image, data, epochs=100000)
    codes, output = signal_in_epoch_3(engine, spec, code, "TERM", "algo-1", "Keras 3 on JAX")
    assert codes == {"algo-1": 143, "algo-2": 143}, output
    for host in HOSTS:
        assert failure(spec, host).startswith("training was stopped by a signal"), failure(
            spec, host
        )


# A user's script with the checkpoint helper (train.resumable), on Keras 3 over JAX
# (keras.distribution) or on tf_keras under MultiWorkerMirroredStrategy: the same few lines.
RESUMABLE = """
import argparse, os
import numpy as np
from train.resumable import Checkpoints

parser = argparse.ArgumentParser()
parser.add_argument("--stack", choices=["jax", "mwms"])
stack = parser.parse_known_args()[0].stack
if stack == "jax":
    import jax
    import keras
    keras.distribution.initialize()
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    process, processes = jax.process_index(), jax.process_count()
else:
    import tensorflow as tf
    keras = tf.keras
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    process = strategy.cluster_resolver.task_id
# Steps on 8 features are fast on either stack: 6000 rows keep an epoch long enough (~5 s)
# for the stop sent once "Epoch 2/4" is logged to land inside epoch 2 (with 1200 rows, JAX's
# epoch once ended before the stop arrived)
x = np.random.default_rng(0).normal(size=(6000, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")

def build():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

if stack == "jax":
    model = build()
    x, y = x[process::processes], y[process::processes]
else:
    with strategy.scope():
        model = build()
checkpoints = Checkpoints(model)
start = checkpoints.restore()
print("initial_epoch", start.epoch, flush=True)
model.fit(x, y, batch_size=4 if stack == "jax" else 8, epochs=4, initial_epoch=start.epoch,
          callbacks=[checkpoints.callback()], verbose=2 if process == 0 else 0)
print("trained to the end", flush=True)
"""


@pytest.mark.parametrize("stack", ["jax", pytest.param("mwms", marks=pytest.mark.slow)])
def test_a_script_with_the_checkpoint_helper_resumes_after_a_stop(
    engine, tf_image, data, tmp_path, stack
):
    """SIGTERM to the leader in epoch 2 of 4: every process stops after the same step and the
    leader saves; the job run again starts from that checkpoint's epoch, with its weights."""
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "resumable.py").write_text(RESUMABLE)
    launch = GUIDE if stack == "jax" else {**LAUNCH}
    spec = guide_spec(
        tmp_path, tf_image, data, **{**launch, "sagemaker_program": "resumable.py", "stack": stack}
    )
    with compose_cluster(engine, spec, f"resumable-{stack}", edit=add_code(folder)) as cluster:
        cluster.compose("up", "-d", capture=True, timeout=300)
        wait_for_log(cluster, "algo-1", "Epoch 2/4", timeout=300)
        engine.run("kill", "--signal", "TERM", cluster.containers()["algo-1"])
        codes = cluster.wait_all_exited(60)
        stopped = cluster.logs("algo-1")
        assert codes == {"algo-1": 143, "algo-2": 143}, stopped[-3000:]
        folders = leader_checkpoints(spec)
        assert [f.name for f in folders] == ["epoch-000001", "epoch-000001.1"], stopped[-3000:]
        for host in ("algo-1", "algo-2"):  # the leader relayed what its ranks confirmed
            assert failure(spec, host).startswith(
                "training was stopped by a signal (job stopped, max runtime or spot reclaim); "
                "checkpoint saved in /opt/ml/checkpoints/epoch-000001.1; a restarted job "
                "resumes from it"
            ), failure(spec, host)
        restart(cluster, spec)
        codes = cluster.wait_all_exited(300)
        resumed = cluster.logs("algo-1")
    assert codes == {"algo-1": 0, "algo-2": 0}, resumed[-3000:]
    assert (
        "checkpoints: resumed from /opt/ml/checkpoints/epoch-000001.1 (epoch 1, step" in resumed
    ), resumed[-3000:]
    assert "initial_epoch 1" in resumed and "trained to the end" in resumed


MODEL_PARALLEL = Path(__file__).parents[2] / "train" / "examples" / "keras_model_parallel_script.py"


def test_a_guide_model_parallel_script_is_warned_and_saves_a_model_split_across_hosts(
    engine, tf_image, data, tmp_path
):
    """keras.io's ModelParallel code on 2 hosts x 2 devices, mesh 1x4 (the model axis across
    the hosts): the guide's key "d1/kernel" matches no path and is named in the log with the
    key that would; ".*d1/kernel" splits the kernel, and `model.save` on every process writes
    the whole model on process 0 (Keras alone raises there and leaves a broken file), equal to
    what `get_weights` returns, with no partial file left."""
    values = {
        k: str(v)
        for k, v in {
            **GUIDE,
            "sagemaker_program": MODEL_PARALLEL.name,
            "layout-keys": "d1/kernel,.*d1/kernel",
        }.items()
    }
    spec = local_cluster.ClusterSpec(
        hosts=2,
        workdir=tmp_path / "cluster",
        data=data,
        image=tf_image,
        hyperparameters=values,
        environment={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    )
    codes, output = run_to_end(engine, spec, "keras-mp", code_folder(tmp_path, MODEL_PARALLEL))
    assert codes == {"algo-1": 0, "algo-2": 0}, output
    assert (
        "launcher: WARNING: layout key 'd1/kernel' matched no variable; paths look like "
        "'sequential/d1/kernel' (LayoutMap matches a key against the whole path: "
        "'.*d1/kernel' would match 'sequential/d1/kernel')"
    ) in output, output[-3000:]
    assert "ModelParallel sharded none" not in output, output[-3000:]
    assert (
        "process 0: d1 kernel PartitionSpec(None, 'model')" in output
        or "process 0: d1 kernel P(None, 'model')" in output
    ), output[-3000:]
    assert "launcher: model.save gathers the shards of 3 variables" in output, output[-3000:]
    weights = re.findall(r"WEIGHTS process \d: (\w+)", output)
    assert len(weights) == 2 and len(set(weights)) == 1, output[-3000:]
    assert "LOADED 4 arrays, equal to get_weights: True" in output, output[-3000:]
    model_dir = local_cluster.host_paths(spec, "algo-1").model_dir
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.keras"]
    assert not any(local_cluster.host_paths(spec, "algo-2").model_dir.iterdir())


# keras.io's ModelParallel code as the guide writes it (a functional model, unnamed layers),
# then the same model under auto_model_parallel, then a save that fails: one process with 4
# devices, under the hooks script mode installs (train.keras_script.install).
ONE_PROCESS = """
import os, tempfile
from train import keras_script
keras_script.install()
import keras
import numpy as np
from keras import layers
from train.layouts import auto_model_parallel

devices = keras.distribution.list_devices()
mesh = keras.distribution.DeviceMesh((1, 4), ["data", "model"], devices)
layout_map = keras.distribution.LayoutMap(mesh)  # the guide's, as written
layout_map["d1/kernel"] = (None, "model")
layout_map["d1/bias"] = ("model",)
layout_map["d2/output"] = ("data", None)
keras.distribution.set_distribution(
    keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data"))

def guide():
    inputs = layers.Input(shape=(28, 28, 1))
    y = layers.Flatten()(inputs)
    y = layers.Dense(units=200, use_bias=False, activation="relu")(y)
    y = layers.Dropout(0.4)(y)
    y = layers.Dense(units=10, activation="softmax")(y)
    model = keras.Model(inputs=inputs, outputs=y)
    model.compile(loss="mse")
    return model

x, y = np.zeros((16, 28, 28, 1), "float32"), np.zeros((16, 10), "float32")
guide().fit(x, y, batch_size=16, verbose=0)
keras.distribution.set_distribution(auto_model_parallel(mesh, batch_dim_name="data"))
model = guide()
model.fit(x, y, batch_size=16, verbose=0)
print("AUTO", [(tuple(v.shape), tuple(v.value.sharding.spec)) for v in model.trainable_variables])

class Unsaveable(layers.Layer):
    def save_own_variables(self, store):
        raise OSError("disk full")

folder = tempfile.mkdtemp()
try:
    keras.Sequential([layers.Input((4,)), Unsaveable()]).save(os.path.join(folder, "m.keras"))
except OSError as error:
    print("SAVE FAILED", error, "LEFT", os.listdir(folder))
"""


def test_the_guides_keys_all_replicated_warned_auto_layout_splits_and_no_torn_save(
    engine, tf_image
):
    """Against the image's pinned Keras: every key of the guide matches nothing in its own
    model (paths `dense/kernel`), and the run that split nothing is named; auto_model_parallel
    splits each kernel on a dimension the model axis divides; a save that raises leaves no
    file behind (Keras alone leaves a partial `.keras`)."""
    output = run_alone(
        engine, tf_image, ONE_PROCESS, "XLA_FLAGS=--xla_force_host_platform_device_count=4"
    )
    for key in ("d1/kernel", "d1/bias", "d2/output"):
        assert (
            f"launcher: WARNING: layout key '{key}' matched no variable; paths look like "
            "'dense/kernel', 'dense_1/bias', 'dense_1/kernel'"
        ) in output, output[-3000:]
    assert (
        "launcher: WARNING: ModelParallel sharded none of the 3 trainable variables of "
        "model 'functional'"
    ) in output, output[-3000:]
    assert output.count("ModelParallel sharded none") == 1, output[-3000:]  # not the auto one
    assert (
        "AUTO [((784, 200), (None, 'model')), ((200, 10), ('model', None)), ((10,), (None,))]"
    ) in output, output[-3000:]
    assert "SAVE FAILED disk full LEFT []" in output, output[-3000:]
