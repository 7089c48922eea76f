"""A job whose processes each trained a model of their own does not end 0 as if they had
trained one (train/apart.py): real launcher, real mpirun, 2 real TensorFlow processes on one
host, reading what TensorFlow itself recorded of the script's strategies. JAX's side runs on
the TensorFlow 2.21 image (tests/image/test_keras_jax.py); the verdict's table is in
tests/train/test_script_runner.py."""

from job.paths import MlPaths
from tests.conftest import failure_of, run_train
from train.script_runner import APART_FILE

# keras.io's "Multi-GPU distributed training with TensorFlow", cut down: the one-host strategy.
ONE_HOST_GUIDE = """
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
print("Number of devices:", strategy.num_replicas_in_sync, flush=True)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((16, 4)), np.ones((16, 2)), batch_size=8, epochs=1, verbose=0)
"""

# The same model with no distribution at all.
NO_STRATEGY = """
import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.ones((16, 4)), np.ones((16, 2)), batch_size=8, epochs=1, verbose=0)
"""


def test_the_one_host_mirrored_strategy_in_two_processes_fails_the_job(make_script_job):
    root = make_script_job("guide.py", {"processes_per_host": 2}, ONE_HOST_GUIDE)
    result = run_train(root, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    reason = failure_of(root)
    assert reason.startswith("rank "), reason
    assert (
        "TrainedApart: this job has 2 processes, but the script's tf.distribute."
        "MirroredStrategy spans the devices of one process only: each process trained its "
        "own model. To train one model across them, synchronise with Horovod"
    ) in reason, reason


def test_processes_synchronised_through_nothing_known_complete_with_a_warning(make_script_job):
    root = make_script_job("alone.py", {"processes_per_host": 2}, NO_STRATEGY)
    result = run_train(root, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    said = (
        "this job has 2 processes, but the script synchronised them with none of "
        "MultiWorkerMirroredStrategy, Horovod or keras.distribution"
    )
    assert f"rank 0: WARNING: {said}" in output, output[-3000:]
    assert (MlPaths(root).output_data_dir / APART_FILE).read_text().startswith(said)


# The same model synchronised by Horovod, through the image's helper.
HOROVOD = """
import numpy as np
import tensorflow as tf
from train import distributed

distributed.init()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer=distributed.optimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
model.fit(np.ones((16, 4)), np.ones((16, 2)), batch_size=8, epochs=1,
          callbacks=distributed.callbacks(), verbose=0)
"""


def test_processes_synchronised_by_horovod_complete_without_a_word(make_script_job):
    root = make_script_job("together.py", {"processes_per_host": 2}, HOROVOD)
    result = run_train(root, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "WARNING: this job has" not in output, output[-3000:]
    assert not (MlPaths(root).output_data_dir / APART_FILE).exists()
