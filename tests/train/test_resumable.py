"""Checkpoints in users' scripts (train.resumable) on real launchers, mpirun and Horovod ranks:
a script stopped like a spot interruption and run again resumes where it stood."""

import json
import signal
import subprocess

import numpy as np
import pytest

from tests.conftest import TRAIN, failure_of, run_train

# A custom loop whose every step is fixed (its data are chosen by the step), with Adam, so a
# resume that lost or mangled any variable (the optimizer's moments, its step count) ends with
# other weights.
LOOP = '''
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
'''

# Keras fit with the callback, as the docs show it.
FIT = '''
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
'''


def stop_after(root, line_start: str) -> str:
    """Run the job, SIGTERM its launcher once a line starts with `line_start`; the output."""
    job = subprocess.Popen([str(TRAIN), "--ml-root", str(root)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in job.stdout:
        seen.append(line)
        if line_start in line:
            break
    job.send_signal(signal.SIGTERM)
    output = "".join(seen) + job.communicate(timeout=120)[0]
    assert job.returncode == 143, output[-3000:]
    assert failure_of(root).startswith("training was stopped by a signal"), failure_of(root)
    return output


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
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
    return [v.numpy() for v in model.variables + optimizer.variables]


def test_a_loop_stopped_and_run_again_ends_with_the_weights_of_one_never_stopped(
        make_script_job):
    stopped = make_script_job("loop.py", {"processes_per_host": 2}, LOOP)
    output = stop_after(stopped, "[1,0]<stdout>:step 20")
    assert "checkpoints: stopped on request; saved in" in output, output[-3000:]
    [folder] = (stopped / "checkpoints").glob("epoch-*")
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
    output = stop_after(root, "Epoch 2/4")
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


def test_a_model_it_cannot_checkpoint_is_named_with_the_way_out(tmp_path):
    import tensorflow as tf
    from train.resumable import Checkpoints

    unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    unbuilt.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="build the model before restoring it"):
        Checkpoints(unbuilt, directory=tmp_path).restore()
    uncompiled = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="compile the model first"):
        Checkpoints(uncompiled, directory=tmp_path)
