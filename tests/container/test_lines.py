"""Whole lines from mpirun's tagged output (container/lines.py): the pure reassembly, and a real
job whose four ranks print multi-argument lines unbuffered, all at once, as SageMaker users'
scripts do: every line reaches the log whole, under its rank's tag, and SageMaker's metric
regexes (sagemaker_ops/metrics.py, the ones `sagemaker-ops` attaches) read every value."""

import re
from collections import Counter

from container.lines import WholeLines
from sagemaker_ops import metrics
from tests.conftest import run_train


def feed(lines: WholeLines, *output: str) -> list[str]:
    return [line for output_line in output for line in lines.feed(output_line)]


def test_a_piece_ends_its_ranks_line_only_where_an_output_line_ends():
    lines = WholeLines()
    assert feed(
        lines,
        "[1,1]<stdout>:metric step=1054 loss[1,0]<stdout>:metri"
        "[1,0]<stdout>:c step=705 loss=0.0014 rank=0\n",
    ) == ["[1,0]<stdout>:metric step=705 loss=0.0014 rank=0"]
    assert feed(
        lines, "[1,1]<stderr>:a warning\n", "[1,1]<stdout>:=0.0031[1,1]<stdout>: rank=1\n"
    ) == ["[1,1]<stderr>:a warning", "[1,1]<stdout>:metric step=1054 loss=0.0031 rank=1"]
    assert lines.pending == {}


def test_mpirun_s_own_lines_and_empty_lines_pass_through():
    lines = WholeLines()
    assert feed(lines, "--------------------\n", "\n", "[1,0]<stdout>:\n") == [
        "--------------------",
        "",
        "[1,0]<stdout>:",
    ]


def test_unfinished_lines_come_out_at_the_end_or_when_too_long():
    lines = WholeLines(longest=10)
    assert feed(lines, "[1,0]<stdout>:12345[1,1]<stdout>:abc\n") == ["[1,1]<stdout>:abc"]
    assert feed(lines, "[1,0]<stdout>:67890[1,1]<stdout>:x\n") == [
        "[1,0]<stdout>:1234567890",
        "[1,1]<stdout>:x",
    ]
    assert feed(lines, "[1,2]<stdout>:died mid-") == []  # mpirun's output ended here
    assert lines.rest() == ["[1,2]<stdout>:died mid-"]
    assert lines.rest() == []


CHATTY = """
import os
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for step in range(1500):
    print("metric", "step=%d" % step, "loss=%.4f" % (1 / (step + 1)), "rank=%d" % rank)
    if step % 100 == 0:
        print("METRICS", "epoch=%d" % (step // 100 + 1), "loss=%.4f" % (rank + step / 1000),
              "accuracy=0.%d" % rank, "val_loss=%.3f" % (step / 10))
"""
TORN = re.compile(r"^\[1,(\d)\]<stdout>:metric step=(\d+) loss=([\d.]+) rank=(\d)$")


def test_lines_that_four_ranks_print_in_pieces_reach_the_log_whole(make_script_job):
    root = make_script_job("chatty.py", {"processes_per_host": 4}, CHATTY)
    result = run_train(root, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "metric" in line]
    broken = [
        line
        for line in lines
        if not (found := TORN.match(line))
        or found[1] != found[4]
        or float(found[3]) != round(1 / (int(found[2]) + 1), 4)
    ]
    print(f"{len(lines)} metric lines, {len(broken)} torn")
    assert not broken, broken[:5]
    assert Counter(TORN.match(line)[1] for line in lines) == {str(r): 1500 for r in range(4)}

    recorded = metrics.extract(result.stdout, metrics.definitions())
    expected = sorted(
        (epoch, rank + (epoch - 1) / 10, (epoch - 1) * 10.0)
        for rank in range(4)
        for epoch in range(1, 16)
    )
    assert (
        sorted(zip(recorded["epoch"], recorded["train:loss"], recorded["validation:loss"]))
        == expected
    )
    assert sorted(recorded["train:accuracy"]) == sorted([0.0, 0.1, 0.2, 0.3] * 15)
