"""The trainer side's log (train.logs): the leader's lines alone, byte for byte as they were
printed, and a user's script's own logging left as the script set it. How each line is written
(one flushed write, the stream of the moment) is job.console's, tested with the launcher's log
in tests/container/test_logs.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from job.rank_job import DATA_HOST_ENV
from tests.conftest import ROOT
from train import keras_script
from train.logs import log
from train.rank import context_from_environment, world_rank


@pytest.mark.parametrize("rank, printed", [("0", True), ("1", False), (None, True)])
def test_the_leader_alone_prints(monkeypatch, capsys, rank, printed):
    if rank is None:
        monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)  # plain `python script.py`
    else:
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", rank)
    log.info("trainer: 100% of 50%s and {braces} stay as written")
    keras_script.say("WARNING: layout key 'd1/kernel' matched no variable")
    out, err = capsys.readouterr()
    assert out == ("trainer: 100% of 50%s and {braces} stay as written\n" if printed else "")
    assert err == (
        "launcher: WARNING: layout key 'd1/kernel' matched no variable\n" if printed else ""
    )


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "TRAIN_HOSTS": "algo-1,algo-2",
            "TRAIN_PROCESSES_PER_HOST": "2",
        },
        {DATA_HOST_ENV: "algo-3", "TRAIN_HOSTS": "algo-1,algo-2"},  # alone, no rank
    ],
)
def test_the_log_and_the_trainer_name_the_same_leader(environ, tmp_path):
    environ = {**environ, "TRAIN_ML_ROOT": str(tmp_path)}
    assert (world_rank(environ) == 0) == context_from_environment(environ).is_leader


# What a user's script does: imports our helpers, then sets up its own logging. Under mpirun
# with two ranks, as script mode runs it.
SCRIPT = """
import logging, sys
from train import keras_script, resumable
from train.logs import log

root = logging.getLogger()
print(f"RANK {resumable.OverMpi().rank} ROOT {root.handlers} {root.level}", flush=True)
logging.basicConfig(stream=sys.stdout, format="user %(name)s: %(message)s", level=logging.INFO)
logging.getLogger("mine").info("epoch 1")
log.info("trainer: resumed from /opt/ml/checkpoints/epoch-000001 at epoch 1, step 8")
keras_script.say("model.save gathers the shards of 3 variables")
"""


def test_a_scripts_ranks_print_the_leaders_lines_once_and_keep_their_own_logging():
    result = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
        + [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = sorted(result.stdout.splitlines())  # the two ranks' lines interleave
    assert out == [
        "RANK 0 ROOT [] 30",  # importing our modules added no handler, set no level
        "RANK 1 ROOT [] 30",
        "trainer: resumed from /opt/ml/checkpoints/epoch-000001 at epoch 1, step 8",
        "user mine: epoch 1",
        "user mine: epoch 1",
    ], result.stdout
    assert [line for line in result.stderr.splitlines() if "launcher: " in line] == [
        "launcher: model.save gathers the shards of 3 variables"
    ], result.stderr[-3000:]
