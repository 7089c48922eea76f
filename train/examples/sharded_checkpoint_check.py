"""Sharded checkpoints (train.sharded_checkpoint) on real JAX processes, loopback only: a model
split across 2 processes is saved by each into its own folder (two hosts' /opt/ml/checkpoints),
the folders are merged (S3's prefix restored into a host), and the merged checkpoint is
restored into the same mesh, into another mesh, and into one process with 4 devices; a
half-merged folder is refused with exit code 2. Then the same from mesh 2x2 (the model axis
inside each process: process 1 holds nothing process 0 does not, and writes no shard).

    python -m train.examples.sharded_checkpoint_check   # Keras 3 + JAX: 6 phases, each new processes

Each process fills every variable (the model's and Adam's) with values that depend only on
the variable's path, so a restoring process checks each of its shards against them exactly,
without gathering anything. Prints one `CHECK ...` line per phase and exits 0 when all pass
(tests/image/test_sharded_checkpoints.py runs it in the image).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

MESHES = {"1x4": (1, 4), "2x2": (2, 2)}


def expected_value(path: str, shape: tuple[int, ...], dtype: str):
    import numpy as np

    rng = np.random.default_rng(zlib.crc32(path.encode()))
    return (rng.integers(0, 1000, size=shape) / 7).astype(dtype)


def build(mesh_name: str):
    """The model and optimizer under auto_model_parallel on `mesh_name`, every variable set."""
    import keras

    from train.layouts import auto_model_parallel

    mesh = keras.distribution.DeviceMesh(
        MESHES[mesh_name], ["batch", "model"], keras.distribution.list_devices()
    )
    keras.distribution.set_distribution(auto_model_parallel(mesh))
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(64, name="d1"),
            keras.layers.Dense(16, name="d2"),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    return model, list(model.variables) + list(optimizer.variables)


def worker(args) -> int:
    import jax
    import keras

    from train.sharded_checkpoint import IncompleteCheckpoint, restore_variables, save_variables

    if args.processes > 1:
        keras.distribution.initialize(f"127.0.0.1:{args.port}", args.processes, args.process)
    model, variables = build(args.mesh)
    where = f"process {jax.process_index()} of {jax.process_count()}, mesh {args.mesh}"
    kernel = model.get_layer("d1").kernel.value
    if args.role == "save":
        for variable in variables:
            value = expected_value(variable.path, tuple(variable.shape), variable.dtype)
            variable.assign(value)  # the same on every process: JAX checks that
        index = save_variables(Path(args.folder), variables)
        print(
            f"SAVED {where}: d1/kernel {kernel.sharding.spec}, {len(index.shards)} shards, "
            f"{index.data_bytes} bytes",
            flush=True,
        )
        return 0
    try:
        restore_variables(Path(args.folder), variables)
    except IncompleteCheckpoint as error:
        print(f"REFUSED {where}: {error}", flush=True)
        return error.exit_code
    wrong = []
    for variable in variables:
        want = expected_value(variable.path, tuple(variable.shape), variable.dtype)
        for shard in variable.value.addressable_shards:
            if not (jax.numpy.asarray(shard.data) == want[shard.index]).all():
                wrong.append(f"{variable.path}{shard.index}")
    kernel = model.get_layer("d1").kernel.value
    print(
        f"RESTORED {where}: d1/kernel {kernel.sharding.spec}, {len(variables)} variables, "
        f"{len(wrong)} shards differ {wrong[:3]}",
        flush=True,
    )
    return 1 if wrong else 0


def jax_cpu_environment(devices: int) -> dict[str, str]:
    """This process's environment for a JAX process with `devices` CPU devices, Keras on JAX."""
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        KERAS_BACKEND="jax",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )


def free_port() -> int:
    """A loopback port free now, the kernel's pick (train/ imports nothing from the launcher's
    container/, whose free_ports does the same for several ports at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_processes(role: str, mesh: str, folders: list[Path], devices: int) -> tuple[list[int], str]:
    """Start len(folders) processes of `role` (process i on folders[i]), each with `devices`
    CPU devices, joined by a loopback coordinator; their exit codes and output."""
    port, env = free_port(), jax_cpu_environment(devices)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "train.examples.sharded_checkpoint_check",
                "--role",
                role,
                "--mesh",
                mesh,
                "--folder",
                str(folder),
                "--process",
                str(number),
                "--processes",
                str(len(folders)),
                "--port",
                str(port),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for number, folder in enumerate(folders)
    ]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    return [process.returncode for process in processes], "".join(outputs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["save", "restore"])
    parser.add_argument("--mesh", default="1x4")
    parser.add_argument("--folder")
    parser.add_argument("--process", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    if args.role:
        return worker(args)
    root = Path(tempfile.mkdtemp(prefix="sharded-check-"))

    def hosts(epoch: str) -> list[Path]:  # one checkpoint folder on each host's own disk
        return [root / f"algo-{n}" / "checkpoints" / epoch for n in (1, 2)]

    def merged(epoch: str) -> Path:  # the S3 prefix restored into a host
        return root / "restored" / epoch

    half = root / "half" / "epoch-000001"  # algo-1's copy alone: algo-2's not synced yet
    phases = [
        ("save mesh 1x4 on 2 processes, one folder each", "save", "1x4", hosts("epoch-000001"), 2),
        ("restore merged into mesh 1x4 on 2 processes", "restore", "1x4", [merged("epoch-000001")] * 2, 2),
        ("restore merged into mesh 2x2 on 2 processes", "restore", "2x2", [merged("epoch-000001")] * 2, 2),
        ("restore merged into mesh 2x2 on 1 process x 4 devices", "restore", "2x2", [merged("epoch-000001")], 4),
        ("restore merged into mesh 1x4 on 1 process x 4 devices", "restore", "1x4", [merged("epoch-000001")], 4),
        ("restore a half-merged folder on 2 processes", "restore", "1x4", [half] * 2, 2),
        ("save mesh 2x2 on 2 processes, one folder each", "save", "2x2", hosts("epoch-000002"), 2),
        ("restore that merged into mesh 1x4 on 2 processes", "restore", "1x4", [merged("epoch-000002")] * 2, 2),
    ]  # fmt: skip
    failed = 0
    for title, role, mesh, folders, devices in phases:
        codes, output = run_processes(role, mesh, folders, devices)
        expected = [2] * len(folders) if folders[0] == half else [0] * len(folders)
        ok = codes == expected
        failed += not ok
        print(output.rstrip(), flush=True)
        print(f"CHECK {'ok' if ok else 'FAILED'}: {title}: exit codes {codes}", flush=True)
        if role == "save":
            epoch = folders[0].name
            for host in folders:
                shutil.copytree(host, merged(epoch), dirs_exist_ok=True)
            if epoch == half.name:
                shutil.copytree(folders[0], half, dirs_exist_ok=True)
            names = [sorted(p.name for p in (host / "shards").iterdir()) for host in folders]
            print(f"FILES {mesh} {names}", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
