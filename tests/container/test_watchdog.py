"""The progress watchdog (container/watchdog.py): hung jobs end as a named failure, exit code 4,
with every rank's Python stack in the log, and working jobs are left alone. Real jobs on real
mpirun: a rank frozen with SIGSTOP, a rank that sleeps before its first allreduce (default
settings), every rank blocked on a FIFO with no writer (a dead mount), a script that deadlocks
after printing; and an unmodified Horovod script, a leader working alone without a line for
longer than `progress_timeout` while the other rank waits. The allowances are the shortest the
launcher accepts (120 s: job.launch_config.MIN_PROGRESS_TIMEOUT), so those jobs (and a slow
HTTP call's, and a hang across two hosts), mostly waiting, run at once (all_at_once), each asserted on its own. Each prints the seconds from the
fault to the launcher's exit (the numbers of docs/training.md's fault table); none asserts a
time."""

import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from container.lines import WholeLines
from container.watchdog import IO_WAIT_LIMIT, ProgressWatch, where
from job.protocol import active_line, progress_line
from tests.conftest import TRAIN, failure_of, run_train
from tests.container.test_multi_host import cluster, start  # noqa: F401 (a fixture)
from tests.waiting import eventually


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watch(script_mode=False, world_size=2, **kwargs):
    clock = Clock()
    made = ProgressWatch(
        timeout=30,
        first_timeout=600,
        script_mode=script_mode,
        host_of_rank=lambda rank: f"algo-{rank + 1}",
        world_size=world_size,
        clock=clock,
        **kwargs,
    )
    return made, clock


def test_progress_lines_are_swallowed_and_move_the_deadline():
    made, clock = watch()
    clock.now += 599
    assert made.overdue() is None  # before the first step: first_timeout
    assert made.observe(f"[1,1]<stdout>:{progress_line(7)}\n") is True
    clock.now += 29
    assert made.overdue() is None
    clock.now += 2
    assert made.overdue() == pytest.approx(31)
    assert made.steps == {1: 7}


def test_stdout_counts_in_script_mode_only_and_stderr_never():
    for script_mode in (False, True):
        made, clock = watch(script_mode)
        clock.now += 700
        assert made.observe("[1,0]<stdout>:epoch 3 loss 0.1\n") is False
        assert made.observe("[1,0]<stderr>:[Stall check] waiting\n") is False
        assert (made.overdue() is None) is script_mode


def faulthandler_dump(folder, code: str) -> list[str]:
    """A real stack dump: a script that registers faulthandler like every rank, blocks in
    `code` (from line 4 of blocked.py), and gets SIGUSR2."""
    script = folder / "blocked.py"
    script.write_text(
        "import faulthandler, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR2, all_threads=True)\n"
        "print('ready', flush=True)\n" + code
    )
    process = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "ready\n"
    time.sleep(0.2)
    process.send_signal(signal.SIGUSR2)
    time.sleep(0.5)
    process.kill()
    return process.communicate()[1].splitlines()


def test_the_reason_names_each_ranks_step_and_place(tmp_path):
    made, clock = watch()
    made.observe(f"[1,0]<stdout>:{progress_line(412)}")
    made.observe(f"[1,1]<stdout>:{progress_line(411)}")
    made.observe("[1,0]<stderr>:Missing ranks:")
    made.observe("[1,0]<stderr>:1: [DistributedAdam_Allreduce/HorovodAllreduce_grads_0]")
    clock.now += 40
    made.fire(made.overdue())
    lines = faulthandler_dump(tmp_path, "time.sleep(60)\n")
    # as mpirun forwards it: pieces of a line, and pieces of two ranks' lines on one line,
    # which the supervisor puts together (container.lines) before the watch sees them
    whole = WholeLines()
    output = [
        f"[1,0]<stderr>:{lines[0][:16]}[1,1]<stderr>:{lines[0]}\n",
        f"[1,0]<stderr>:{lines[0][16:]}\n",
        *(f"[1,0]<stderr>:{line[:9]}[1,0]<stderr>:{line[9:]}\n" for line in lines[1:]),
    ]
    for output_line in output:
        for line in whole.feed(output_line):
            made.observe(line)
    reason = made.reason()
    assert reason.startswith(
        "no progress for 40 s (progress_timeout 30 s): rank 0 on algo-1 "
        "last finished step 412, in <module> (blocked.py:4); rank 1 on "
        "algo-2 last finished step 411, gave no stack (stopped, or stuck "
        "outside Python). Horovod's stall check: rank(s) 1 never submitted "
        "DistributedAdam_Allreduce/HorovodAllreduce_grads_0."
    ), reason


def test_a_working_rank_keeps_the_job_alive_without_printing():
    made, clock = watch()
    made.observe(f"[1,0]<stdout>:{progress_line(3)}")
    for _ in range(10):  # 100 s without a step, rank 1 computing
        clock.now += 10
        assert made.observe(f"[1,1]<stderr>:{active_line(0.93)}") is True  # swallowed
        assert made.overdue() is None
    clock.now += 31
    assert made.overdue() == pytest.approx(31)
    assert made.steps == {0: 3}


def test_ranks_the_others_wait_for_are_named_after_the_stall_check():
    made, clock = watch(world_size=4, straggler_timeout=60)
    clock.now += 10
    made.observe(f"[1,0]<stderr>:{active_line(1.0)}")
    clock.now += 70  # rank 0 waits in a collective; rank 1 did nothing since the start
    made.observe(
        "[1,0]<stderr>:[2026-12-04 10:00:00: W stall_inspector.cc:105] One or more "
        "tensors were submitted to be reduced ..."
    )
    made.observe("[1,0]<stderr>:Missing ranks:")
    made.observe("[1,0]<stderr>:1: [HorovodAllreduce_0]")
    made.observe("[1,0]<stderr>:2, 3: [HorovodAllreduce_1]")
    made.observe("[1,0]<stderr>:some later warning")
    assert made.waited_for == {1, 2, 3}
    clock.now += 1  # ranks 2 and 3 are working
    made.observe(f"[1,2]<stderr>:{active_line(1.0)}")
    made.observe(f"[1,3]<stdout>:{progress_line(None)}")
    assert made.overdue() == pytest.approx(81)  # rank 1, long before first_timeout (600)
    made.fire(81)
    assert made.reason().startswith(
        "rank 1 on algo-2 did nothing for 81 s while the other ranks waited for it in a "
        "collective (Horovod's stall check, every 60 s): ranks 0, 1, 2, 3 on algo-1, algo-2, "
        "algo-3, algo-4 finished no step, gave no stack"
    ), made.reason()
    assert (
        "Horovod's stall check: rank(s) 1 never submitted HorovodAllreduce_0; rank(s) 2, 3 "
        "never submitted HorovodAllreduce_1."
    ) in made.reason()


def test_a_rank_working_alone_is_not_a_straggler():
    made, clock = watch(straggler_timeout=60)
    made.observe(f"[1,1]<stdout>:{progress_line(5)}")
    for _ in range(60):  # ten minutes: rank 0 evaluates alone, rank 1 waits for it
        clock.now += 10
        made.observe("[1,0]<stderr>:Missing ranks:")
        made.observe("[1,0]<stderr>:0: [HorovodAllreduce_0]")
        assert made.overdue() is None
        made.observe(f"[1,0]<stderr>:{active_line(1.0)}")
    assert made.overdue() is None


def test_a_rank_waiting_on_the_network_works_for_a_bounded_time():
    """Rank 0 in a slow HTTP call (its pulses say io=network), rank 1 waiting for it in a
    collective: no hang while the wait lasts up to IO_WAIT_LIMIT, a hang named as such after."""
    made, clock = watch(straggler_timeout=30)
    made.observe(f"[1,0]<stdout>:{progress_line(5)}")
    made.observe(f"[1,1]<stdout>:{progress_line(5)}")
    for _ in range(round(IO_WAIT_LIMIT / 10) + 4):  # the wait began at 110
        clock.now += 10
        made.observe("[1,1]<stderr>:Missing ranks:")
        made.observe("[1,1]<stderr>:0: [HorovodAllreduce_0]")
        assert made.observe(f"[1,0]<stderr>:{active_line(0.0, 'network')}") is True
        if clock.now <= 110 + IO_WAIT_LIMIT:
            assert made.overdue() is None, clock.now
    assert made.overdue() == pytest.approx(30)  # case 2: rank 0, idle since the limit
    made.fire(30)
    assert made.reason().startswith(
        f"rank 0 on algo-1 did nothing for 30 s while the other ranks waited for it in a "
        f"collective (Horovod's stall check, every 30 s): rank 0 on algo-1 last finished step "
        f"5, waiting on the network for {IO_WAIT_LIMIT + 30:.0f} s (a wait on I/O counts as work "
        f"for {IO_WAIT_LIMIT:g} s), gave no stack"
    ), made.reason()
    made, clock = watch()  # a wait that ends starts the next one's allowance afresh
    made.observe(f"[1,0]<stderr>:{active_line(0.0, 'disk')}")
    clock.now += IO_WAIT_LIMIT
    made.observe(f"[1,0]<stderr>:{active_line(1.0)}")
    made.observe(f"[1,0]<stderr>:{active_line(0.0, 'disk')}")
    assert made.io_waits == {0: ("disk", clock.now)}


def test_where_takes_the_main_thread_and_the_users_own_frame(tmp_path):
    stack = faulthandler_dump(
        tmp_path,
        (
            "import threading, queue\n"
            "threading.Thread(target=lambda: time.sleep(60), daemon=True).start()\n"
            "def wait_for_batch():\n    queue.Queue().get()\n"
            "wait_for_batch()\n"
        ),
    )
    assert re.fullmatch(r"in wait \(threading\.py:\d+\) from blocked\.py:7", where(stack)), stack
    assert where([]) == "gave no stack (stopped, or stuck outside Python)"


# --- for real: a 2-rank job on one host ----------------------------------------------------

PROBE = """
import os, sys, time
if os.environ.get("FAULT") == "dead_mount":  # a FIFO with no writer: open() never returns
    open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "pipe")).read()
import horovod.tensorflow as hvd
import tensorflow as tf
from train import distributed

hvd.init()
here = os.environ["SM_OUTPUT_DATA_DIR"]
open(os.path.join(here, f"pid{hvd.rank()}"), "w").write(str(os.getpid()))
print("started", flush=True)  # stdout: progress in script mode
fault = os.environ.get("FAULT")
if fault == "sleep_before_allreduce" and hvd.rank() == 1:
    time.sleep(100000)
if fault == "deadlock_after_printing":
    import threading
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
for step in range(1000000):
    hvd.allreduce(tf.constant([1.0]))
    distributed.heartbeat(step)
    if step == 5:
        open(os.path.join(here, f"running{hvd.rank()}"), "w")
    if fault == "leader_alone" and step == 5 and hvd.rank() == 0:
        started = time.monotonic()  # work alone, printing nothing, while rank 1 waits:
        while time.monotonic() - started < 130:  # longer than progress_timeout, a third of
            sum(i * i for i in range(100000))  # a core (pulses count from a tenth)
            time.sleep(0.02)
    if fault == "slow_http" and step == 5 and hvd.rank() == 0:  # rank 1 waits meanwhile
        import urllib.request
        urllib.request.urlopen(os.environ["SLOW_URL"], timeout=60).read()
    if fault in ("leader_alone", "slow_http") and step == 8:
        break
    time.sleep(0.05)
"""

# A public-style Horovod script (horovod/examples/tensorflow2/tensorflow2_keras_mnist.py's
# shape): nothing of ours imported, `fit(verbose=2)` prints one line per epoch. Its input
# pipeline does without tf.data's autotuning, whose thread keeps `fit` from returning, idle,
# for up to its optimisation period (up to a minute; measured up to 44 s here) after the last
# step: that is what the 120 s minimum of progress_timeout is for, not what this test is about.
LONG_EPOCHS = """
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
rng = np.random.default_rng(hvd.rank())
images, labels = rng.random((8192, 256), dtype=np.float32), rng.integers(0, 10, 8192)
options = tf.data.Options()
options.autotune.enabled = False
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(8192).batch(32)
dataset = dataset.with_options(options)
model = tf.keras.Sequential([tf.keras.Input((256,)),
                             tf.keras.layers.Dense(1024, activation="relu"),
                             tf.keras.layers.Dense(1024, activation="relu"),
                             tf.keras.layers.Dense(10)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(dataset, steps_per_epoch=1200, epochs=2, verbose=2 if hvd.rank() == 0 else 0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
"""


@pytest.fixture
def job(make_script_job, make_job, tmp_path):
    processes = []

    def start(hyperparameters, fault=None, builtin=False, prepare=None, name=None, env=None):
        """A job under tmp_path/`name` (jobs that run at once each need a name of their own)."""
        values = {"processes_per_host": 2, **hyperparameters}
        root = (
            make_job(values, name=name)
            if builtin
            else make_script_job("probe.py", values, PROBE, name=name)
        )
        if prepare:
            prepare(root)
        process = subprocess.Popen(
            [str(TRAIN), "--ml-root", str(root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {}), "FAULT": fault or ""},
        )
        processes.append(process)
        return root, process

    yield start
    for process in processes:  # nothing stopped or stuck may outlive the test
        family = (
            [process.pid]
            + [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
            if process.poll() is None
            else []
        )
        for pid in family:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def wait_for(path, process, timeout=120):
    def appeared():
        assert process.poll() is None, process.communicate()[0][-3000:]
        return path.exists()

    eventually(appeared, f"{path} never appeared", timeout)


def finish(process, fault_at, case):
    output = process.communicate(timeout=300)[0]
    print(f"{case}: fault -> launcher exit: {time.monotonic() - fault_at:.1f} s")
    return output


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    for process in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if (
                process.environ().get("OMPI_COMM_WORLD_RANK") == str(rank)
                and "python" in process.name()
            ):
                return process.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no process of rank {rank}")


def all_at_once(cases) -> None:
    """Run every case (name -> function) in a thread of its own and wait for all of them.
    Each case mostly waits (the 120 s allowance, then the launcher's teardown): one after
    another the seven took 1006 s, at once 233 s (on a busy 2-core machine). A case
    that fails does not stop the others; the test then fails naming each failed case with its
    own message."""
    failures = {}

    def run(name, case):
        try:
            case(name)
        except BaseException as error:  # an assertion or a timeout: this case's failure alone
            failures[name] = f"{type(error).__name__}: {error}"

    threads = [
        threading.Thread(target=run, args=(name, case), name=name) for name, case in cases.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, "\n\n".join(
        f"case {name!r} failed: {message}" for name, message in sorted(failures.items())
    )


@pytest.mark.slow
def test_hung_jobs_end_named_and_working_ones_survive(job, cluster):
    """Seven jobs at once, each asserted on its own (a failure names its case): see each
    case's docstring."""

    def a_rank_of_the_builtin_trainer_frozen_with_sigstop(name):
        """Horovod's stall check off: case 1 (no rank works) is the one under test, not
        case 2."""
        root, process = job(
            {
                "progress_timeout": 120,
                "epochs": 1000,
                "checkpoint_every_epochs": 1,
                "mpi_options": "-x HOROVOD_STALL_CHECK_DISABLE=1",
            },
            builtin=True,
            name=name,
        )
        wait_for(root / "checkpoints", process)  # epoch 1 is done: steps are being made
        os.kill(rank_pid(process, 1), signal.SIGSTOP)
        output = finish(process, time.monotonic(), name)
        assert process.returncode == 4, output[-3000:]
        reason = failure_of(root)
        assert reason.startswith("no progress for "), reason
        assert "(progress_timeout 120 s): " in reason, reason
        # the frozen rank prints its stack only if mpirun's teardown continues it in time
        assert re.search(
            r"rank 1 on algo-1 last finished step \d+, (gave no stack|in )", reason
        ) or re.search(r"ranks 0, 1 on algo-1 last finished step \d+, in ", reason), reason
        assert "TRAIN-PROGRESS" not in output, output[-3000:]  # swallowed
        assert "Current thread 0x" in output, output[-3000:]  # the stacks are in the log

    def a_rank_that_sleeps_before_its_first_allreduce_with_default_settings(name):
        """progress_timeout 300 and first_progress_timeout 1800 would wait far longer: the
        rank the other waits for is named once Horovod's stall check (every 30 s) finds it
        idle."""
        root, process = job({}, "sleep_before_allreduce", name=name)
        wait_for(root / "output" / "data" / "pid1", process)
        output = finish(process, time.monotonic(), name)
        assert process.returncode == 4, output[-3000:]
        reason = failure_of(root)
        assert reason.startswith("rank 1 on algo-1 did nothing for "), reason
        assert (
            "while the other ranks waited for it in a collective (Horovod's stall check, "
            "every 30 s)" in reason
        ), reason
        assert "rank 1 on algo-1 finished no step, in <module> (probe.py:" in reason, reason
        assert "rank(s) 1 never submitted" in reason, reason

    def a_leader_working_alone_while_the_other_rank_waits_survives(name):
        """Horovod's stall check (every 2 s here) names rank 0 as missing the whole time, and
        no rank prints for 130 s, longer than progress_timeout (120 s, the minimum): rank 0 is
        working, a third of a core, so its pulses keep the job alive and nothing fires
        (Horovod's own stall shutdown, formerly 600 s, is off: one arbiter decides)."""
        root, process = job(
            {"progress_timeout": 120, "mpi_options": "-x HOROVOD_STALL_CHECK_TIME_SECONDS=2"},
            "leader_alone",
            name=name,
        )
        output = process.communicate(timeout=400)[0]
        assert process.returncode == 0, output[-3000:]
        assert "Missing ranks:" in output and "0: [" in output, output[-3000:]

    def every_rank_blocked_on_a_dead_mount(name):
        """Before TensorFlow is even imported: the allowance before the first progress."""
        root, process = job(
            {"first_progress_timeout": 120},
            "dead_mount",
            name=name,
            prepare=lambda root: os.mkfifo(root / "input/data/train/pipe"),
        )
        output = finish(process, time.monotonic(), name)
        assert process.returncode == 4, output[-3000:]
        reason = failure_of(root)
        assert "(first_progress_timeout 120 s) (none since the start)" in reason, reason
        assert "ranks 0, 1 on algo-1 finished no step, in <module> (probe.py:" in reason, (
            reason + output[-4000:]
        )

    def a_script_that_deadlocks_after_printing(name):
        root, process = job({"progress_timeout": 120}, "deadlock_after_printing", name=name)
        wait_for(root / "output" / "data" / "pid1", process)
        output = finish(process, time.monotonic(), name)
        assert process.returncode == 4, output[-3000:]
        reason = failure_of(root)
        assert "(progress_timeout 120 s)" in reason, reason  # the print counted as progress
        assert "ranks 0, 1 on algo-1 finished no step, in <module> (probe.py:" in reason, reason

    def a_rank_in_a_slow_http_call_while_the_other_waits_survives(name):
        """Rank 0 waits 25 s for a loopback HTTP server (a slow tracking server) while rank 1
        waits for it in an allreduce; Horovod's stall check (every 2 s here) names rank 0 the
        whole time, and no rank uses the CPU. Rank 0's pulse says it waits on the network:
        not a hang (before, the watchdog ended the job within seconds, as a rank that did
        nothing)."""

        class Slow(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                time.sleep(25)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            root, process = job(
                {"mpi_options": "-x HOROVOD_STALL_CHECK_TIME_SECONDS=2"},
                "slow_http",
                name=name,
                env={"SLOW_URL": f"http://127.0.0.1:{server.server_port}/"},
            )
            output = process.communicate(timeout=300)[0]
        finally:
            server.shutdown()
            server.server_close()
        assert process.returncode == 0, output[-3000:]
        assert "Missing ranks:" in output and "0: [" in output, output[-3000:]

    def a_hang_on_the_worker_host_ends_every_host_with_the_same_code(name):
        """Two hosts, the default allowances: Horovod's stall check names the worker's rank
        first."""
        roots = cluster({}, "probe.py", PROBE)
        env = {"FAULT": "sleep_before_allreduce"}
        worker, leader = start(roots["127.0.0.2"], env), start(roots["127.0.0.1"], env)
        leader_output = leader.communicate(timeout=240)[0]
        worker_output = worker.communicate(timeout=60)[0]
        assert leader.returncode == worker.returncode == 4, leader_output[-3000:]
        assert "rank 1 on 127.0.0.2 finished no step, in <module> (probe.py:" in failure_of(
            roots["127.0.0.1"]
        ), failure_of(roots["127.0.0.1"])
        assert failure_of(roots["127.0.0.2"]).startswith("rank 1 on 127.0.0.2 did nothing for "), (
            worker_output[-3000:]
        )

    all_at_once(
        {
            case.__name__: case
            for case in (
                a_rank_of_the_builtin_trainer_frozen_with_sigstop,
                a_rank_that_sleeps_before_its_first_allreduce_with_default_settings,
                a_leader_working_alone_while_the_other_rank_waits_survives,
                every_rank_blocked_on_a_dead_mount,
                a_script_that_deadlocks_after_printing,
                a_rank_in_a_slow_http_call_while_the_other_waits_survives,
                a_hang_on_the_worker_host_ends_every_host_with_the_same_code,
            )
        }
    )


@pytest.mark.slow
def test_an_unmodified_script_completes_under_the_shortest_allowances(make_script_job):
    """The rank that prints nothing (verbose=0) is heard through its pulse; a silence longer
    than progress_timeout is the leader-alone test's."""
    root = make_script_job(
        "mnist_style.py",
        {"processes_per_host": 2, "progress_timeout": 120, "first_progress_timeout": 120},
        LONG_EPOCHS,
    )
    started = time.monotonic()
    result = run_train(root, timeout=300)
    print(f"2 epochs in {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, "\n".join(
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "<stdout>" in line or line.startswith("launcher:")
    )
    epochs = re.findall(r"^\[1,0\]<stdout>:1200/1200 - (\d+)s ", result.stdout, re.MULTILINE)
    assert len(epochs) == 2, result.stdout[-3000:]
    print(f"seconds per epoch, as Keras printed them: {epochs}")
    assert "TRAIN-ACTIVE" not in result.stdout + result.stderr  # swallowed
