"""Whether the kernel's out-of-memory killer ended a rank, from this container's memory cgroup.

A rank that outgrows its container's memory limit (on SageMaker: the instance's memory) is
killed by the kernel with SIGKILL, and mpirun only says `exited on signal 9 (Killed)`, which a
user's own `kill -9` or a crashed helper also says. The container's memory cgroup counts each
kill its OOM killer made, which turns "likely out of memory" into a fact:

- cgroup v2 (Docker and podman on current kernels, SageMaker's newer hosts):
  `/sys/fs/cgroup/memory.events` (`oom_kill N`) and the limit in `memory.max` (`max` when
  there is none);
- cgroup v1 (older hosts, these machines' podman): `/sys/fs/cgroup/memory/memory.oom_control`
  (`oom_kill N`, kernels since 4.13) and `memory.limit_in_bytes` (about 2**63 when unlimited).

Inside a container both paths are its own cgroup. A host reads only its own: the leader
confirms a kill of a rank on its own host from its cgroup and one on a worker's host from what
that worker's launcher read of its own, asked over the coordinator (container.coordination's
MEMORY; container.failure.summarize words it); a worker's copy of the leader's reason adds its
own finding when the leader's does not name it (container.failure.relayed).

The kernel counts since the container started, which is not the failure's time: with
`max_restarts` (container.restarts) an OOM kill in attempt 1 would make any later SIGKILL (a
user's `kill -9`, a crashed helper) read as out of memory for certain, and so would a kill of
whatever the host ran before the job. So every reading that proves a kill counts only the
kills since the attempt started (`since`): the leader reads its own cgroup and asks each
worker's at the start of every attempt (container.train_cli.supervise,
container.coordination.Leader.start_attempt); a worker's own finding counts from when its
launcher started, since it is not told of restarts.
Parsing and the difference are pure (tested on the kernels' texts); `read_memory` is the one
effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from job.hints import OUT_OF_MEMORY

CGROUP = Path("/sys/fs/cgroup")
# cgroup v1 writes its "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB
# pages); anything this large is no limit a host could have.
_UNLIMITED = 2**60

# What to change, for the memory of the host rather than of a device: the model's share first
# (what `model_parallel` splits), then the batch's (job.hints' advice for device memory).
ADVICE = (
    "set model_parallel=N (backend=jax) to split the model's weights and optimizer state over "
    "N devices, or choose an instance type with more memory, or " + OUT_OF_MEMORY.partition(": ")[2]
)


@dataclass(frozen=True)
class CgroupMemory:
    """This container's memory cgroup: OOM kills counted so far, and its limit in bytes (None:
    no limit of its own)."""

    oom_kills: int
    limit: int | None


def _count(text: str, key: str) -> int | None:
    """The value of `key` in a flat-keyed cgroup file (`key value` per line)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == key and fields[1].isdigit():
            return int(fields[1])
    return None


def _limit(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.isdigit() and int(value) < _UNLIMITED else None


def parse_v2(events: str, maximum: str | None) -> CgroupMemory | None:
    """memory.events and memory.max of cgroup v2; None when `events` counts no OOM kills (a
    kernel older than 4.13 or another file)."""
    kills = _count(events, "oom_kill")
    return None if kills is None else CgroupMemory(kills, _limit(maximum))


def parse_v1(oom_control: str, limit_in_bytes: str | None) -> CgroupMemory | None:
    """memory.oom_control and memory.limit_in_bytes of cgroup v1; None as in parse_v2."""
    kills = _count(oom_control, "oom_kill")
    return None if kills is None else CgroupMemory(kills, _limit(limit_in_bytes))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_memory(root: Path = CGROUP) -> CgroupMemory | None:
    """This container's memory cgroup (v2, else v1); None when neither can be read."""
    events = _read(root / "memory.events")
    if events is not None:
        return parse_v2(events, _read(root / "memory.max"))
    oom_control = _read(root / "memory" / "memory.oom_control")
    if oom_control is not None:
        return parse_v1(oom_control, _read(root / "memory" / "memory.limit_in_bytes"))
    return None


def since(now: CgroupMemory | None, start: CgroupMemory | None) -> CgroupMemory | None:
    """The OOM kills counted between two readings of one cgroup (`start` taken when the attempt
    started, `now` after it failed), at the limit read now; None when either is unknown: a
    count without its start may hold kills of an earlier attempt."""
    if now is None or start is None:
        return None
    return CgroupMemory(max(now.oom_kills - start.oom_kills, 0), now.limit)


def counting_from_now(
    read: Callable[[], CgroupMemory | None] = read_memory,
) -> Callable[[], CgroupMemory | None]:
    """A reader of this container's cgroup that counts only the kills from this call on."""
    start = read()
    return lambda: since(read(), start)


def size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def counted_in(host: str) -> str:
    """The words that say a host's own cgroup proved the kill: a reason that has them needs no
    second finding of that host (container.failure.relayed)."""
    return f"counted in {host}'s memory cgroup"


def _evidence(memory: CgroupMemory | None, host: str) -> str | None:
    """At what limit, and how many OOM kills `host`'s cgroup counted; None when it counted none
    (or could not be read): then a SIGKILL may have had another sender."""
    if memory is None or memory.oom_kills == 0:
        return None
    limit = (
        f"at {host}'s memory limit of {size(memory.limit)}"
        if memory.limit
        else f"when {host} ran out of memory (no container limit)"
    )
    kills = "1 OOM kill" if memory.oom_kills == 1 else f"{memory.oom_kills} OOM kills"
    return f"{limit} ({kills} {counted_in(host)})"


def killed(memory: CgroupMemory | None, host: str) -> str | None:
    """Why a rank on `host` died of SIGKILL, when `host`'s cgroup (`memory`) proves it; else
    None."""
    evidence = _evidence(memory, host)
    if evidence is None:
        return None
    return f"out of memory: the kernel's OOM killer killed it {evidence}; {ADVICE}"


def host_ran_out(host: str, memory: CgroupMemory | None, advise: bool = True) -> str | None:
    """A host's own finding, for its copy of a failure the leader reported (with ADVICE unless
    the reason already gives it); None when its cgroup counted no OOM kill."""
    evidence = _evidence(memory, host)
    if evidence is None:
        return None
    found = (
        f"host {host} ran out of memory: the kernel's OOM killer killed a process there {evidence}"
    )
    return f"{found}; {ADVICE}" if advise else found
