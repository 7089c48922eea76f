"""Checkpoints in users' scripts (train.resumable) on real launchers, mpirun and Horovod ranks:
a script stopped like a spot interruption and run again resumes where it stood."""

import json
import re
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT, failure_of, run_train, stop_job

# A custom loop whose every step is fixed (its data are chosen by the step), with Adam, so a
# resume that lost or mangled any variable (the optimizer's moments, its step count) ends with
# other weights.
LOOP = """
import os, time
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from train import distributed
from train.resumable import Checkpoints

distributed.init()
tf.keras.utils.set_random_seed(1)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
optimizer = tf.keras.optimizers.Adam(0.01)
checkpoints = Checkpoints(model, optimizer, every_minutes=0)
start = checkpoints.restore()
if start.folder is None:
    hvd.broadcast_variables(model.variables, 0)

@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    variables = model.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

data = np.random.default_rng(0).normal(size=(60, 8, 7)).astype("float32")
rank = distributed.rank()
print("starting at step", start.step, start.extra, flush=True)
for step in range(start.step, 60):
    train_step(data[step, rank::2, :4], data[step, rank::2, 4:])
    time.sleep(0.05)
    print("step", step + 1, flush=True)
    checkpoints.after_step(step=step + 1, note="loop")
if distributed.is_leader():
    np.savez(os.path.join(os.environ["SM_MODEL_DIR"], "final.npz"),
             *[v.numpy() for v in model.variables + optimizer.variables])
"""

# Keras fit with the callback, as the docs show it.
FIT = """
import json, os
import numpy as np
import tensorflow as tf
from train import distributed
from train.resumable import Checkpoints

distributed.init()
x = np.random.default_rng(0).normal(size=(1200, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
x, y = distributed.shard(x, y)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(2)])
model.compile(optimizer=distributed.optimizer(tf.keras.optimizers.Adam(1e-3)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
checkpoints = Checkpoints(model)
start = checkpoints.restore()
print("initial_epoch", start.epoch, flush=True)
history = model.fit(x, y, batch_size=4, epochs=4, initial_epoch=start.epoch,
                    callbacks=[*distributed.callbacks(), checkpoints.callback()],
                    verbose=distributed.verbose())
if distributed.is_leader():
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "epochs.json"), "w") as out:
        json.dump(history.epoch, out)
"""


def final_weights(root) -> list[np.ndarray]:
    with np.load(root / "model" / "final.npz") as arrays:
        return [arrays[f"arr_{index}"] for index in range(len(arrays.files))]


def never_stopped() -> list[np.ndarray]:
    """LOOP's 60 steps in this process, each on the whole batch that 2 ranks split (the mean
    of their two halves' mean gradients is the whole batch's)."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    optimizer = tf.keras.optimizers.Adam(0.01)
    data = np.random.default_rng(0).normal(size=(60, 8, 7)).astype("float32")
    for batch in data[:, np.r_[0:8:2, 1:8:2]]:  # rank 0's rows, then rank 1's
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(batch[:, :4]) - batch[:, 4:]) ** 2)
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
    return [v.numpy() for v in model.variables + optimizer.variables]


def test_a_loop_stopped_and_run_again_ends_with_the_weights_of_one_never_stopped(make_script_job):
    stopped = make_script_job("loop.py", {"processes_per_host": 2}, LOOP)
    output = stop_job(stopped, "[1,0]<stdout>:step 20")
    [folder] = (stopped / "checkpoints").glob("epoch-*")
    assert failure_of(stopped).endswith(  # the launcher read the leader's stop line
        f"checkpoint saved in {folder}; a restarted job resumes from it"
    ), output[-3000:]
    saved = json.loads((folder / "state.json").read_text())
    assert 20 <= saved["step"] < 60 and saved["extra"] == {"note": "loop"}, saved
    again = run_train(stopped)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"starting at step {saved['step']} {{'note': 'loop'}}" in again.stdout
    assert f"checkpoints: resumed from {folder} (epoch 0, step {saved['step']})" in again.stdout
    expected, got = never_stopped(), final_weights(stopped)
    assert len(expected) == len(got) == 2 + 5  # kernel, bias; Adam's step, 2 moments each
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_fit_stopped_mid_epoch_resumes_that_epoch_with_its_weights(make_script_job):
    root = make_script_job("fit.py", {"processes_per_host": 2}, FIT)
    output = stop_job(root, "Epoch 2/4")
    assert "initial_epoch 0" in output
    folders = sorted((root / "checkpoints").glob("epoch-*"))
    assert [f.name for f in folders] == ["epoch-000001", "epoch-000001.1"], folders
    stopped_at = json.loads((folders[-1] / "state.json").read_text())["step"]
    assert stopped_at > json.loads((folders[0] / "state.json").read_text())["step"]
    again = run_train(root)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "initial_epoch 1" in again.stdout
    assert f"(epoch 1, step {stopped_at})" in again.stdout
    assert json.loads((root / "output" / "data" / "epochs.json").read_text()) == [1, 2, 3]


# FIT's shape, 2 epochs, stopped after `fit` returned (the script exports its model then): the
# checkpoint of epoch 2's end is what a restart uses, though no rank saved at the stop.
STOPPED_AFTER_FIT = (
    FIT.replace("epochs=4", "epochs=2")
    + """
print("fit returned, exporting", flush=True)
if start.folder is None:  # an export that outlasts the stop (the rerun has nothing to wait for)
    from train.rank import StopRequest
    StopRequest.event.wait(120)
"""
)


def test_a_stop_after_the_last_epochs_checkpoint_names_it_as_the_restart_point(make_script_job):
    """Not "no checkpoint was confirmed" alone: the failure file names the checkpoint the rerun
    resumes from, picked as the rerun's rank 0 picks it."""
    root = make_script_job("fit.py", {"processes_per_host": 2}, STOPPED_AFTER_FIT)
    output = stop_job(root, "[1,0]<stdout>:fit returned")
    folder = root / "checkpoints" / "epoch-000002"
    assert folder.is_dir(), output[-3000:]
    reason = failure_of(root)
    assert reason.startswith("training was stopped by a signal"), reason
    assert re.search(
        rf"; no checkpoint was confirmed at the stop; a restarted job resumes from "
        rf"{re.escape(str(folder))} \(epoch 2, step \d+, saved \d+ s ago\)$",
        reason,
    ), reason
    again = run_train(root)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"checkpoints: resumed from {folder} (epoch 2," in again.stdout, again.stdout[-3000:]
    assert again.stdout.count("initial_epoch 2") == 2, again.stdout[-3000:]  # both ranks


BAD_MODELS = """
import sys
import tensorflow as tf
from train.resumable import Checkpoints

unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(2)])
unbuilt.compile(optimizer="adam", loss="mse")
uncompiled = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
for make in (lambda: Checkpoints(unbuilt, directory=sys.argv[1]).restore(),
             lambda: Checkpoints(uncompiled, directory=sys.argv[1])):
    try:
        make()
    except ValueError as error:
        print("ValueError:", error)
"""


def test_a_model_it_cannot_checkpoint_is_named_with_the_way_out(tmp_path):
    """In its own process: MPI started inside pytest's would set Open MPI's singleton variables
    in the C environment, which every later mpirun of the worker inherits and fails on."""
    done = subprocess.run(
        [sys.executable, "-c", BAD_MODELS, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = [line for line in done.stdout.splitlines() if line.startswith("ValueError")]
    assert len(errors) == 2, done.stdout + done.stderr[-3000:]
    assert "build the model before restoring it" in errors[0]
    assert "compile the model first" in errors[1]


# A script whose save outlasts the job's stop_grace: its stop is honoured after a step, and the
# step never ends (an upload to a store that stopped answering).
STUCK = """
import time
import tensorflow as tf
from train.resumable import Checkpoints

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
model.compile(optimizer="adam", loss="mse")
checkpoints = Checkpoints(model, every_minutes=0)
checkpoints.restore()

def upload_to_a_store_that_stopped_answering():
    while True:
        time.sleep(0.1)

print("uploading", flush=True)
upload_to_a_store_that_stopped_answering()
"""


def test_a_stop_whose_save_outlasts_the_grace_says_so_and_shows_where_it_was(make_script_job):
    root = make_script_job("stuck.py", {"stop_grace": 3}, STUCK)
    output = stop_job(root, "[1,0]<stdout>:uploading")
    assert failure_of(root).endswith(
        "no checkpoint was confirmed within the grace of 3 s, so the ranks were killed; their "
        "Python stacks are in the log: raise stop_grace if saving takes longer; there is no "
        f"checkpoint in {root / 'checkpoints'}: a restarted job starts afresh"
    ), output[-3000:]
    assert "the ranks did not stop within the grace of 3 s; asking every rank" in output
    assert "in upload_to_a_store_that_stopped_answering" in output, output[-3000:]


def test_a_stop_whose_save_fails_names_the_rank_and_the_error(make_script_job):
    """The folder the script chose cannot be written: the stop ends the job as stopped (143),
    and the failure file says that nothing was saved, and why."""
    script = STUCK.replace("every_minutes=0", "every_minutes=0, directory='/dev/null/ckpt'")
    script = script.replace(
        "        time.sleep(0.1)", "        time.sleep(0.1)\n        checkpoints.after_step(step=1)"
    )
    root = make_script_job("unwritable.py", {"stop_grace": 60}, script)
    output = stop_job(root, "[1,0]<stdout>:uploading")
    reason = failure_of(root)
    assert "; no checkpoint was confirmed: rank 0 on host " in reason, output[-3000:]
    assert "NotADirectoryError" in reason and "/dev/null/ckpt" in reason, reason
