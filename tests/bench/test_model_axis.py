"""Item 12's parsing and bookkeeping (bench.model_axis), without running a job: the footprint
line as the trainer writes it (train.layouts.footprint, so a change of its wording fails here,
not in a 5-minute benchmark), the search's widths, and which failures end a search."""

import pytest

from bench.model_axis import CAPACITY_FULL, CAPACITY_TINY, Capacity, ContainerRun, Footprint, Search
from train.layouts import footprint

# the MLP 256-1024-1024-10 (item 2's): three kernels split on their last dimension, biases whole
MLP = [((256, 1024), 4, (None, "model")), ((1024,), 4, ()), ((1024, 1024), 4, (None, "model"))]
MLP += [((1024,), 4, ()), ((1024, 10), 4, (None, None)), ((10,), 4, ())]


@pytest.mark.parametrize("axis, per_device", [(1, 5.3e6), (2, 2.7e6), (4, 1.4e6)])
def test_the_footprint_is_read_from_the_trainer_s_own_line(axis, per_device):
    line = f"trainer: {footprint(MLP, {'batch': 4 // axis, 'model': axis}, 'model')}\n"
    found = Footprint.parse(f"[1,0]<stdout>:{line}")
    assert found.parameters == 1.3e6 and found.whole_bytes == 5.3e6
    assert found.device_bytes == pytest.approx(per_device) and found.model_axis == axis


def test_small_models_are_counted_in_thousands_and_kilobytes():
    found = Footprint.parse(
        "trainer: 6.6K parameters, 26.3 kB; 6.9 kB per device over a model axis of 4"
    )
    assert (found.parameters, found.whole_bytes, found.device_bytes) == (6600, 26300, 6900)


def test_a_log_without_the_line_is_an_error_that_shows_the_log():
    with pytest.raises(RuntimeError, match="(?s)no footprint line.*the log's tail"):
        Footprint.parse("the log's tail")


def test_widths_grow_by_sqrt_2_so_parameters_about_double():
    assert Capacity(2**30, 2048, 4, 512).widths() == [2048, 2896, 4096, 5792]
    for capacity in (CAPACITY_FULL, CAPACITY_TINY):
        assert all(width % 4 == 0 for width in capacity.widths())  # a model axis of 4 splits them


def run(returncode: int, failure: str = "", parameters: str = "9.2M") -> ContainerRun:
    said = f"trainer: {parameters} parameters, 36.8 MB; 9.2 MB per device over a model axis of 4"
    return ContainerRun(returncode, said if returncode == 0 else "", failure, 12.0, 2**30)


def test_a_search_ends_at_its_first_job_killed_for_memory():
    search = Search(4)
    search.record(2896, run(0))
    search.record(4096, run(0, parameters="17.9M"))
    assert not search.ended
    killed = "rank 0 on host algo-1 was killed by signal 9 (Killed) - likely out of memory"
    search.record(5792, run(1, killed))
    assert search.ended
    largest = search.largest()
    assert largest is not None and (largest.width, largest.parameters) == (4096, 17.9e6)
    killed_first = Search(1)
    killed_first.record(2896, run(137))  # the container's first process killed
    assert killed_first.ended and killed_first.largest() is None


def test_a_job_that_fails_for_another_reason_fails_the_item():
    with pytest.raises(RuntimeError, match="width 2896: .* exit code 2, not for memory: bad"):
        Search(4).record(2896, run(2, "bad hyperparameter"))
