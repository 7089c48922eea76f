"""The benchmarks' arithmetic and parsing, without running anything."""

import json
import math

import pytest

from bench import allreduce, cluster, jobs, training
from bench.results import Measurement, Target, markdown_table, report, text_table
from bench.runner import BenchConfig, Once, parse_arguments
from bench.sizes import FULL, TINY


def test_busbw_is_nccl_tests_definition():
    # n ranks move 2(n-1)/n of the buffer each: 2 ranks -> size/time, 8 ranks -> 1.75x.
    assert allreduce.bus_bandwidth(1_000_000, 0.001, 2) == pytest.approx(1e9)
    assert allreduce.bus_bandwidth(1_000_000, 0.001, 8) == pytest.approx(1.75e9)


def test_full_sizes_span_4_kb_to_256_mb_and_target_starts_at_4_mb():
    assert FULL.allreduce_bytes[0] == 4 * 1024 and FULL.allreduce_bytes[-1] == 256 * 1024**2
    assert allreduce.TARGET_FROM == 4 * 1024**2
    assert allreduce.iterations_for(1e-7, 0.05) == allreduce.MAX_ITERATIONS
    assert allreduce.iterations_for(2.0, 0.05) == 1  # one call when a call is slow
    assert allreduce.iterations_for(0.001, 0.05) == 50


@pytest.mark.parametrize(
    "subject, operator, threshold, value, ratio, expected",
    [
        ("ratio", ">=", 0.9, 90.0, 0.9, True),
        ("ratio", ">=", 0.9, 89.0, 0.89, False),
        ("value", "<=", 5.0, 5.0, None, True),
        ("value", "<=", 3.0, 3.5, 0.1, False),
        ("ratio", ">=", 10.0, None, None, None),
    ],
)
def test_target_met(subject, operator, threshold, value, ratio, expected):
    assert Target(subject, operator, threshold).met(value, ratio) is expected


def test_target_rejects_unknown_operator_naming_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown operator: >. Choose between >=, <="):
        Target("ratio", ">", 1.0)


def test_measurement_ratio_met_and_json():
    row = Measurement(
        item=2,
        metric="scaling",
        unit="samples/s",
        value=1800.0,
        reference=2000.0,
        reference_name="2 x 1 rank",
        target=Target("ratio", ">=", 0.9),
        samples=(1700.0, 1800.0, 1900.0),
    )
    assert row.ratio == pytest.approx(0.9) and row.met is True
    data = json.loads(json.dumps(row.as_json()))
    assert data["ratio"] == pytest.approx(0.9) and data["met"] is True
    assert data["target"] == {"subject": "ratio", "operator": ">=", "threshold": 0.9}
    assert Measurement(item=6, metric="rss", unit="MB", value=500.0).ratio is None


def test_tables_have_one_line_per_row_and_the_columns():
    rows = [
        Measurement(
            item=1,
            metric="allreduce busbw 4 MB",
            unit="GB/s",
            value=1.5,
            reference=2.0,
            reference_name="MPI_Allreduce",
            target=Target("ratio", ">=", 0.9),
        ),
        Measurement(
            item=4,
            metric="teardown",
            unit="s",
            value=2.0,
            reference=30.0,
            target=Target("value", "<=", 3.0),
        ),
    ]
    text = text_table(rows).splitlines()
    assert text[0].split() == [
        "#",
        "metric",
        "this",
        "project",
        "reference",
        "ratio",
        "target",
        "met",
    ]
    assert len(text) == 2 + len(rows)
    assert "0.75" in text[2] and text[2].rstrip().endswith("NO")
    assert "value <= 3 s" in text[3] and text[3].rstrip().endswith("yes")
    markdown = markdown_table(rows).splitlines()
    assert markdown[0] == "| # | metric | this project | reference | ratio | target | met |"
    assert len(markdown) == 2 + len(rows)


def test_report_records_machine_and_rows():
    data = report(
        [Measurement(item=6, metric="rss", unit="MB", value=1.0)],
        tiny=True,
        started=0.0,
        notes=["shared machine"],
    )
    assert data["tiny"] is True and data["machine"]["cpus"] >= 1
    assert data["measurements"][0]["metric"] == "rss" and data["notes"] == ["shared machine"]


def test_parse_metrics_reads_the_trainers_lines():
    output = (
        "[1,0]<stdout>:trainer: 2 rank(s)\n"
        "[1,0]<stdout>:METRICS epoch=1 loss=2.3 accuracy=0.1 lr=0.001 "
        "samples_per_sec=100\n"
        "[1,0]<stdout>:METRICS epoch=2 loss=1.5 accuracy=0.5 lr=0.001 "
        "samples_per_sec=250.5\n"
    )
    epochs = jobs.parse_metrics(output)
    assert [e["epoch"] for e in epochs] == [1.0, 2.0]
    run = jobs.TrainRun(seconds=1.0, epochs=epochs)
    assert run.steady_samples_per_sec() == [250.5]  # the first epoch includes tracing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-01-02T03:04:05Z", 1767323045.0),
        ("2026-01-02T03:04:05.123456789Z", 1767323045.123456789),
        ("2026-01-02T04:04:05.5+01:00", 1767323045.5),
        ("2026-01-02T03:04:05.25+00:00 METRICS epoch=1", 1767323045.25),
    ],
)
def test_parse_timestamp_keeps_nanoseconds(text, expected):
    assert cluster.parse_timestamp(text) == pytest.approx(expected, abs=1e-6)


def test_parse_timestamp_rejects_other_text():
    with pytest.raises(ValueError, match="not an RFC 3339 timestamp"):
        cluster.parse_timestamp("launcher: job completed")


def test_timeline_from_the_leaders_lines():
    lines = [
        (10.0, "TRAIN-MARK hosts_ready\n"),
        (10.1, "launcher: all 2 hosts ready\n"),
        (14.0, "[1,0]<stdout>:TRAIN-MARK ranks_up\n"),
        (14.5, "[1,0]<stdout>:TRAIN-MARK data_read\n"),
        (18.0, "[1,0]<stdout>:METRICS epoch=1 loss=1\n"),
        (18.2, "METRICS epoch=2 loss=1\n"),
        (19.0, "[1,0]<stdout>:TRAIN-MARK model_exported\n"),
        (19.2, "[1,0]<stdout>:TRAIN-MARK model_exported\n"),  # only the first counts
        (19.5, "TRAIN-MARK job_done\n"),
        (19.6, "TRAIN-MARK no_such_mark\n"),
    ]
    steps, marks = cluster.mark_times(lines)
    assert steps == [18.0, 18.2]
    assert marks == {
        "hosts_ready": 10.0,
        "ranks_up": 14.0,
        "data_read": 14.5,
        "model_exported": 19.0,
        "job_done": 19.5,
    }
    timeline = cluster.Timeline(
        hosts_started=[9.0, 9.5], hosts_exited=[20.0, 20.5], steps=steps, marks=marks
    )
    assert timeline.startup() == pytest.approx(9.0)
    assert timeline.teardown() == pytest.approx(2.3)
    breakdown = timeline.breakdown()
    assert list(breakdown)[0] == "first host started -> hosts_ready"
    assert sum(breakdown.values()) == pytest.approx(11.5)


def test_cluster_job_is_one_optimizer_step_per_epoch():
    values = cluster.job_hyperparameters(FULL)
    x, _ = cluster.cluster_data(FULL)
    global_batch = 2 * int(values["processes_per_host"]) * int(values["per_device_batch_size"])
    assert math.ceil(len(x) / global_batch) == 1


def test_trainer_jobs_fix_one_thread_and_switch_off_checkpoints():
    values = training.hyperparameters(TINY, ranks=2, per_device_batch=32, max_device_batch=8)
    assert values["mpi_options"] == "-x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1"
    assert values["checkpoint_every_epochs"] == "0" and values["processes_per_host"] == "2"
    assert all(isinstance(v, str) for v in values.values())


def test_a_copy_that_printed_no_throughput_leaves_its_run_unmeasured():
    """Copies' throughputs are summed per run; one copy with no epoch rate makes that run's sum
    unknown (None, which the median skips) rather than failing the whole item."""
    measured = jobs.TrainRun(1.0, [{"epoch": 1.0, "samples_per_sec": 50.0}] * 3)
    silent = jobs.TrainRun(1.0, [{"epoch": 1.0}])
    two_copies = training.Configuration("2 copies", {}, copies=2)
    two_copies.runs = [[measured, measured], [measured, silent]]
    assert two_copies.run_throughputs() == [100.0, None]
    assert two_copies.throughput() == 100.0


def test_bench_config_names_the_valid_items():
    with pytest.raises(ValueError, match=r"Unknown item\(s\): \[8\]. Choose between 1, 2, 3"):
        BenchConfig(
            tiny=True,
            items=(1, 8),
            results=None,
            workdir=None,
            cluster_mode="auto",
            image="x",
            mpi_options="",
        )
    with pytest.raises(SystemExit):
        parse_arguments(["--cluster", "kubernetes"])


def test_a_shared_step_runs_once_and_its_failure_fails_every_item_that_needs_it():
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("the trainer runs failed")

    step = Once(failing)
    assert step.result() is None  # never runs it
    for _ in range(2):
        with pytest.raises(RuntimeError, match="the trainer runs failed"):
            step()
    assert len(calls) == 1 and step.result() is None

    def succeeding():
        calls.append(2)
        return len(calls)

    counted = Once(succeeding)
    assert counted() == counted() == 2 and counted.result() == 2 and calls == [1, 2]


def test_items_2_and_3_share_the_one_rank_job_in_one_interleaved_loop(monkeypatch, tmp_path):
    """Item 3's whole batch is item 2's 1-rank job (same hyperparameters): it runs once, in
    the same loop as every other configuration, and only the selected items' jobs run."""
    loops = []
    monkeypatch.setattr(training, "run_interleaved", lambda c, *_: loops.append(c))
    both = training.TrainerJobs.run(TINY, tmp_path, scaling=True, capacity=True, accumulation=True)
    [configurations] = loops
    assert [c.name for c in configurations] == ["1rank", "2ranks", "2jobs", "accumulate4"]
    assert both.pair.hyperparameters == both.one.hyperparameters and both.pair.copies == 2
    assert both.accumulated.hyperparameters == {
        **both.one.hyperparameters,
        "max_device_batch_size": str(TINY.per_device_batch // TINY.accumulation_steps),
    }
    training.TrainerJobs.run(TINY, tmp_path, scaling=False, capacity=False, accumulation=True)
    assert [c.name for c in loops[1]] == ["1rank", "accumulate4"]
    with pytest.raises(ValueError, match="the 2-rank job was not run"):
        training.TrainerJobs(TINY, both.one).scaling_rows()
