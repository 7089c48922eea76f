"""`make bench` at its tiny size: every item runs for real (mpirun, the trainer, two launchers,
the server) and the results are well formed. Numbers are never compared with targets here:
on a shared machine they say nothing about correctness."""

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# The slow tier (`make test-slow`, CI): about 30 processes that import TensorFlow, 350-600 s of
# the 2-core machine; bench/'s logic is tested in the fast tier (tests/bench/test_bench_pure.py).
pytestmark = pytest.mark.slow

ITEMS = {1, 2, 3, 4, 5, 6, 7, 10, 11}  # item 9 needs both images: tests/image/test_tf_stack.py
# ~210 CPU-seconds, most of it processes importing TensorFlow: 6 minutes at load average 7-18
# on the 2-core machine, much longer when it is busier.
BENCH_TIMEOUT = 1200


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--tiny",
            "--cluster",
            "loopback",
            "--only",
            ",".join(map(str, sorted(ITEMS))),
            "--results",
            str(results),
            "--workdir",
            str(tmp_path_factory.mktemp("work")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BENCH_TIMEOUT,
    )
    return done, results


@pytest.mark.timeout(BENCH_TIMEOUT + 60)
def test_every_item_runs_and_the_table_is_printed(tiny_run):
    done, results = tiny_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    data = json.loads((results / "bench-tiny-latest.json").read_text())
    rows = data["measurements"]
    assert {row["item"] for row in rows} == ITEMS
    assert not [row for row in rows if row["note"].startswith("FAILED")]
    table = done.stdout.splitlines()
    assert table[0].split()[:2] == ["#", "metric"]
    assert len([line for line in table if line[:1].isdigit()]) == len(rows)
    markdown = (results / "bench-tiny-latest.md").read_text().splitlines()
    assert len(markdown) == 2 + len(rows)


@pytest.mark.timeout(BENCH_TIMEOUT + 60)
def test_results_are_well_formed(tiny_run):
    _, results = tiny_run
    data = json.loads((results / "bench-tiny-latest.json").read_text())
    assert data["tiny"] is True and data["machine"]["cpus"] >= 1
    assert set(data["item_seconds"]) == {str(item) for item in ITEMS}
    for row in data["measurements"]:
        assert isinstance(row["value"], float) and math.isfinite(row["value"]), row
        assert row["value"] > 0 or row["metric"].startswith("startup"), row
        if row["reference"] is not None:
            assert row["reference"] > 0
            assert row["ratio"] == pytest.approx(row["value"] / row["reference"])
        if row["target"] is not None:
            assert isinstance(row["met"], bool), row
        assert all(math.isfinite(sample) and sample > 0 for sample in row["samples"]), row


@pytest.mark.timeout(BENCH_TIMEOUT + 60)
def test_each_item_measured_what_it_says(tiny_run):
    _, results = tiny_run
    rows = json.loads((results / "bench-tiny-latest.json").read_text())["measurements"]
    by_item = {item: [row for row in rows if row["item"] == item] for item in ITEMS}
    allreduce = [row for row in by_item[1] if "busbw" in row["metric"]]
    assert [row["details"]["bytes"] for row in allreduce] == [4096, 65536]
    assert all(len(row["details"]["mpi_seconds"]) >= 2 for row in allreduce)
    scaling, capacity = by_item[2]
    assert scaling["reference_name"] == "2 x 1 rank x 1 thread"
    assert len(scaling["details"]["two_ranks"]["rank_peak_rss_bytes"][0][0]) == 2  # 2 ranks
    assert capacity["details"]["pair"]["copies"] == 2
    assert capacity["value"] == scaling["value"]
    accumulation, ceiling = by_item[3]
    assert accumulation["details"]["accumulated"]["hyperparameters"]["max_device_batch_size"] == "8"
    assert ceiling["details"]["micro_batch"] == 8 and ceiling["details"]["onednn"] == "1"
    assert ceiling["details"]["shapes"] == [[8, 16], [16, 10]]  # the tiny MLP's layers
    startup, teardown = by_item[4]
    assert startup["details"]["mode"] == "loopback" and "127.0.0.2" in startup["metric"]
    breakdown = startup["details"]["breakdown_seconds"]
    assert "first host started -> hosts_ready" in breakdown
    assert teardown["value"] >= 0
    assert {row["metric"].split(",")[0] for row in by_item[5]} == {
        "channel reader",
        "tf.data training_input",
    }
    scale, image, parity = by_item[7]
    channel_mb = scale["details"]["channel_mb"]
    assert 3.5 < channel_mb["4x"] / channel_mb["1x"] < 4.5  # the larger channel is 4x
    assert image["reference_name"] == "2-rank cnn job consumption"
    assert parity["reference_name"] == "the same job on one CSV file (by record)"
    restart, lost = by_item[10]
    assert restart["details"]["reported_before_restart"] >= 10  # killed after epoch 10
    assert 0 < restart["details"]["kill_to_restart_line"] < restart["value"]
    assert lost["value"] == restart["details"]["reported_before_restart"] - (
        restart["details"]["resumed_at_epoch"] - 1
    )
    assert 0 <= lost["value"] <= 4  # checkpoints every 4 steps
    [served] = by_item[11]
    assert served["details"]["local"] and served["details"]["served"]  # both, one process
    assert served["reference_name"] == "the same pipeline in the reading process"
    rank, serving = by_item[6]
    assert rank["value"] > 100 and serving["details"]["requests"] == 3  # MB: TF is loaded
