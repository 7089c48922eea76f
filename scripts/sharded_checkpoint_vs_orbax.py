"""Measure train.sharded_checkpoint against Orbax (orbax-checkpoint 0.12.8) on 2 JAX processes x
2 CPU devices on loopback, a 64 MiB model on mesh 1x4 (the model axis across processes): save
and restore seconds, bytes on each host's disk, and whether each works on per-host disks that
are merged afterwards (SageMaker: every host's /opt/ml/checkpoints goes to one S3 prefix, and
the whole prefix comes back into every host at the next start).

Per-host disks are real here: each process runs in its own mount namespace (`unshare -m`,
root) where the same path, CKPT, is a bind mount of that host's own folder, as on two
SageMaker hosts. A dev tool, not part of the image (Orbax is not installed there):

    python3.11 -m venv /tmp/k3o && /tmp/k3o/bin/pip install keras==3.15.1 jax==0.10.2 \\
        numpy orbax-checkpoint==0.12.8
    /tmp/k3o/bin/python scripts/sharded_checkpoint_vs_orbax.py

Prints a `PHASE` line per phase with each process's result (its whole output is left in
$TMPDIR/sharded-vs-orbax-<phase>-<process>.log). `orbax-local` is Orbax with
`MultiprocessingOptions(primary_host=None)`, its setting for hosts with local storage only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: the project's modules beside it

from container.network import free_port  # noqa: E402
from train.examples.sharded_checkpoint_check import MESHES, jax_cpu_environment  # noqa: E402

CKPT = "/tmp/sharded-vs-orbax-ckpt"  # the path every "host" writes, each onto its own disk
ARRAYS = 4  # each 2048 x 2048 float32 (16 MiB), split over the model axis; one replicated bias


def model_arrays(mesh_name: str):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = np.array(jax.devices()).reshape(MESHES[mesh_name])
    mesh = Mesh(devices, ("batch", "model"))
    split = NamedSharding(mesh, PartitionSpec(None, "model"))
    whole = NamedSharding(mesh, PartitionSpec())
    values = {
        f"w{n}": np.random.default_rng(n).standard_normal((2048, 2048), np.float32)
        for n in range(ARRAYS)
    }
    values["b"] = np.arange(2048, dtype=np.float32)
    shardings = {name: split if name != "b" else whole for name in values}
    arrays = {
        name: jax.make_array_from_callback(v.shape, shardings[name], lambda index, v=v: v[index])
        for name, v in values.items()
    }
    return values, arrays


def exact(values, arrays) -> bool:
    import numpy as np

    return all(
        np.array_equal(np.asarray(shard.data), values[name][shard.index])
        for name, array in arrays.items()
        for shard in array.addressable_shards
    )


def worker(args) -> dict:
    import faulthandler

    import jax

    faulthandler.dump_traceback_later(120)  # where a hung phase waits, before its kill at 150 s
    jax.distributed.initialize(f"127.0.0.1:{args.port}", args.processes, args.process)
    values, arrays = model_arrays(args.mesh)
    folder = Path(args.folder)
    result = {"process": jax.process_index(), "phase": args.phase}
    if args.impl == "ours":
        from train.sharded_checkpoint import restore_arrays, save_arrays
    else:
        import orbax.checkpoint as ocp
    started = time.perf_counter()  # after the imports: Orbax's take seconds
    try:
        if args.impl == "ours":
            if args.role == "save":
                save_arrays(folder / "ours", sorted(arrays.items()))
            else:
                names = sorted(arrays)
                got = restore_arrays(folder / "ours", [(n, arrays[n]) for n in names])
                restored = dict(zip(names, got))
        else:
            # orbax-local: every host its own primary, Orbax's setting for local storage only
            local = ocp.options.MultiprocessingOptions(primary_host=None)
            checkpointer = (
                ocp.StandardCheckpointer(multiprocessing_options=local)
                if args.impl == "orbax-local" and args.role == "save"
                else ocp.StandardCheckpointer()
            )
            if args.role == "save":
                checkpointer.save(folder / "orbax", arrays)
                checkpointer.wait_until_finished()
            else:
                abstract = {
                    n: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                    for n, a in arrays.items()
                }
                restored = checkpointer.restore(folder / "orbax", abstract)
        if args.role == "restore":
            jax.block_until_ready(list(restored.values()))
            result["exact"] = exact(values, restored)
        result["seconds"] = round(time.perf_counter() - started, 2)
    except Exception as error:  # the measurement: what fails, and how
        result["error"] = f"{type(error).__name__}: {error}"[:400]
    if args.role == "save":
        result["files"] = sorted(
            str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
        )[:12]
        result["bytes"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()
    return result


def run(
    phase: str, role: str, impl: str, mesh: str, disks: list[Path] | None, folder: str
) -> list[dict]:
    """2 processes of one phase; with `disks`, process i sees disks[i] at `folder`."""
    port = free_port()
    env = {**jax_cpu_environment(2), "PYTHONPATH": str(REPO)}
    processes = []
    for number in range(2):
        argv = [sys.executable, __file__, "--phase", phase, "--role", role, "--impl", impl,
                "--mesh", mesh, "--folder", folder, "--process", str(number), "--port", str(port)]  # fmt: skip
        if disks:
            Path(folder).mkdir(parents=True, exist_ok=True)
            mount = f'mount --bind {disks[number]} {folder} && exec "$@"'
            argv = ["unshare", "-m", "sh", "-c", mount, "sh", *argv]
        processes.append(
            subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    results = []
    for number, process in enumerate(processes):
        try:
            output = process.communicate(timeout=150)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0] + "\n(killed after 150 s)"
        log = (
            Path(tempfile.gettempdir()) / f"sharded-vs-orbax-{phase.replace(' ', '_')}-{number}.log"
        )
        log.write_text(output)  # the whole output, for a failure's first cause
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        if lines:
            results.append(json.loads(lines[-1][7:]))
        else:
            errors = [line for line in output.splitlines() if "Error" in line or "error" in line]
            results.append({"rc": process.returncode, "error": errors[:3] or output[-600:]})
    print(f"PHASE {phase}: {json.dumps(results)}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("phase", "role", "impl", "mesh", "folder"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--process", type=int)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.role:
        worker(args)
        return
    root = Path(tempfile.mkdtemp(prefix="sharded-vs-orbax-"))
    for impl in ("ours", "orbax", "orbax-local"):
        hosts = [root / impl / f"algo-{n}" for n in (1, 2)]
        for host in hosts:
            host.mkdir(parents=True)
        run(f"{impl} save, per-host disks", "save", impl, "1x4", hosts, CKPT)
        union = root / impl / "restored"
        for host in hosts:
            shutil.copytree(host, union, dirs_exist_ok=True)
        run(f"{impl} restore merged, mesh 1x4", "restore", impl, "1x4", None, str(union))
        run(f"{impl} restore merged, mesh 2x2", "restore", impl, "2x2", None, str(union))
        if impl == "orbax-local":
            continue
        shared = root / impl / "shared"
        run(f"{impl} save, one shared folder", "save", impl, "1x4", None, str(shared))
        run(f"{impl} restore shared, mesh 1x4", "restore", impl, "1x4", None, str(shared))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
