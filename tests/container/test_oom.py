"""This container's memory cgroup, read as the kernels write it (container.oom): the texts
below are real files, cgroup v1's as read inside a podman container on these machines
(kernel 6.18, `--memory 512m`), cgroup v2's as kernel 6.x writes them."""

from container.oom import (
    ADVICE,
    CgroupMemory,
    counted_in,
    counting_from_now,
    host_ran_out,
    killed,
    parse_v1,
    parse_v2,
    read_memory,
    since,
)
from job.hints import OUT_OF_MEMORY

V2_EVENTS = "low 0\nhigh 0\nmax 1873\noom 2\noom_kill 2\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
V1_UNLIMITED = "9223372036854771712\n"  # PAGE_COUNTER_MAX pages of 4 KiB


def test_cgroup_v2_counts_oom_kills_and_its_limit():
    assert parse_v2(V2_EVENTS, "3221225472\n") == CgroupMemory(2, 3 * 2**30)
    assert parse_v2(V2_EVENTS, "max\n") == CgroupMemory(2, None)
    assert parse_v2(V2_EVENTS.replace("oom_kill 2", "oom_kill 0"), None) == CgroupMemory(0, None)
    # memory.events before kernel 4.13 has no oom_kill line: nothing is known
    assert parse_v2("low 0\nhigh 0\nmax 0\noom 0\n", "max\n") is None


def test_cgroup_v1_counts_oom_kills_and_its_limit():
    assert parse_v1(V1_OOM_CONTROL, "536870912\n") == CgroupMemory(1, 512 * 2**20)
    assert parse_v1(V1_OOM_CONTROL, V1_UNLIMITED) == CgroupMemory(1, None)
    assert parse_v1("oom_kill_disable 0\nunder_oom 0\n", None) is None


def test_read_memory_takes_v2_then_v1_and_none_without_either(tmp_path):
    assert read_memory(tmp_path) is None
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text(V1_OOM_CONTROL)
    (v1 / "memory.limit_in_bytes").write_text("3221225472\n")
    assert read_memory(tmp_path) == CgroupMemory(1, 3 * 2**30)
    (tmp_path / "memory.events").write_text(V2_EVENTS)
    assert read_memory(tmp_path) == CgroupMemory(2, None)  # no memory.max: no limit known
    (tmp_path / "memory.max").write_text("max\n")
    assert read_memory(tmp_path) == CgroupMemory(2, None)


def test_only_the_kills_since_the_attempt_started_count():
    """Two readings of one cgroup, as the kernels write them: the start (an earlier attempt's
    kill already counted) and after the failure; the limit is the one read last."""
    v2_start = parse_v2(V2_EVENTS.replace("oom_kill 2", "oom_kill 1"), "max\n")
    assert since(parse_v2(V2_EVENTS, "3221225472\n"), v2_start) == CgroupMemory(1, 3 * 2**30)
    assert since(parse_v2(V2_EVENTS, None), parse_v2(V2_EVENTS, None)) == CgroupMemory(0, None)
    v1_start = parse_v1(V1_OOM_CONTROL, "536870912\n")
    later = V1_OOM_CONTROL.replace("oom_kill 1", "oom_kill 4")
    assert since(parse_v1(later, "536870912\n"), v1_start) == CgroupMemory(3, 512 * 2**20)
    assert killed(since(parse_v1(V1_OOM_CONTROL, None), v1_start), "algo-1") is None
    # a start that could not be read may hide an earlier attempt's kill: nothing is known
    assert since(parse_v1(later, None), None) is None
    assert since(None, v1_start) is None


def test_a_reader_counting_from_now_leaves_out_the_kills_before_it(tmp_path):
    """This container's cgroup files (v2), rewritten as the kernel counts a kill: a reader
    made after the first kill sees only the second."""
    (tmp_path / "memory.events").write_text(V2_EVENTS.replace("oom_kill 2", "oom_kill 1"))
    (tmp_path / "memory.max").write_text("3221225472\n")
    memory = counting_from_now(lambda: read_memory(tmp_path))
    assert memory() == CgroupMemory(0, 3 * 2**30)
    (tmp_path / "memory.events").write_text(V2_EVENTS)
    assert memory() == CgroupMemory(1, 3 * 2**30)
    assert counting_from_now(lambda: read_memory(tmp_path))() == CgroupMemory(0, 3 * 2**30)
    assert counting_from_now(lambda: read_memory(tmp_path / "none"))() is None


def test_a_kill_is_named_out_of_memory_only_when_the_cgroup_counted_one():
    assert killed(None, "algo-2") is None
    assert killed(CgroupMemory(0, 3 * 2**30), "algo-2") is None
    assert killed(CgroupMemory(1, 3 * 2**30), "algo-2") == (
        "out of memory: the kernel's OOM killer killed it at algo-2's memory limit of "
        f"3.0 GiB (1 OOM kill counted in algo-2's memory cgroup); {ADVICE}"
    )
    assert (
        "when algo-1 ran out of memory (no container limit) (3 OOM kills counted in algo-1's"
        in (killed(CgroupMemory(3, None), "algo-1"))
    )
    assert "memory limit of 512 MiB" in killed(CgroupMemory(1, 512 * 2**20), "algo-1")
    assert counted_in("algo-2") in killed(CgroupMemory(1, None), "algo-2")


def test_a_hosts_own_finding_names_it_and_advises_once():
    memory = CgroupMemory(1, 3 * 2**30)
    assert host_ran_out("algo-2", CgroupMemory(0, None)) is None
    found = host_ran_out("algo-2", memory)
    assert found.startswith(
        "host algo-2 ran out of memory: the kernel's OOM killer killed a process there at "
        "algo-2's memory limit of 3.0 GiB (1 OOM kill counted in algo-2's memory cgroup)"
    )
    assert found.endswith(ADVICE)
    assert not host_ran_out("algo-2", memory, advise=False).endswith(ADVICE)


def test_the_advice_names_the_model_axis_first_and_keeps_the_batch_advice_of_device_memory():
    assert ADVICE.startswith("set model_parallel=N (backend=jax) to split the model's weights")
    assert ADVICE.endswith(OUT_OF_MEMORY.partition(": ")[2])
    assert "out of device memory" not in ADVICE
