"""A stop mid-epoch saves its checkpoint at the agreed step, without the epoch's validation pass
(train.callbacks.StopOnRequest): on real mpirun and Horovod, with a validation set whose pass
takes several times the stop grace."""

import numpy as np

from tests.conftest import failure_of, newest_state, stop_job

GRACE = 10  # seconds


def test_a_stop_saves_without_waiting_for_a_validation_pass_longer_than_the_grace(make_job):
    """Batches of 1 and the validation set 150 times over: 27,000 validation steps a rank, a
    pass far longer than GRACE, while the stop itself takes a few seconds. With Keras' own
    `stop_training` that pass ran before `fit` returned: the grace ran out with the pass still
    running, the ranks were killed and the checkpoint was lost (measured before the fix: "no
    checkpoint was confirmed within the grace of 10 s")."""
    root = make_job(
        {
            "epochs": 2,
            "processes_per_host": 2,
            "per_device_batch_size": 1,
            "stop_grace": GRACE,
        }
    )
    validation = next((root / "input" / "data" / "validation").glob("*.csv"))
    rows = np.loadtxt(validation, delimiter=",", ndmin=2)
    np.savetxt(validation, np.concatenate([rows] * 150), delimiter=",", fmt="%g")

    output = stop_job(root, "training from epoch ", 0.5)  # inside epoch 1 (718 steps a rank)
    assert "TRAIN-STOPPED checkpoint saved" in output, output[-3000:]
    assert failure_of(root).startswith(
        "training was stopped by a signal (job stopped, max runtime or spot reclaim); "
        "checkpoint saved in"
    ), failure_of(root)
    state = newest_state(root)
    assert state["interrupted"] is True and state["epochs_done"] == 0, state
    assert "METRICS epoch=1 " not in output  # no epoch-end callbacks after the stop either
