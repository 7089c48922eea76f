"""The SageMaker Python SDK's local container mode, driven as a user drives it.

    .venv-sdk3/bin/python tests/image/sdk_job.py SPEC.json
    .venv-sdk2/bin/python tests/image/sdk_job.py SPEC.json      (snippets only)

Runs in the SDK's own virtualenv (scripts/setup_sdk.sh; the SDK is a test-only dependency,
kept out of the image and the project's venv). SPEC: one SDK 3 `ModelTrainer` job with
image, hosts, root (the SDK's
local_container_root), hyperparameters, channels {name: folder}, and optionally source_code
(SourceCode's fields), mpi (MPI's fields) and environment. Or, with `snippet`: that Python
code as it is (the README's), run from the working directory.

No address but loopback is reached: telemetry is opted out through the SDK's own config file,
AWS credentials and the region are given so that boto3 never asks the instance metadata
service, and every name lookup or connection for anything else is refused and recorded in
SPEC's `refused` file, which the test checks is empty. The SDK runs `docker compose` and `docker`;
the test puts its podman shims first on PATH.
"""

import ipaddress
import json
import socket
import sys
from pathlib import Path


def guard_network(record: Path) -> None:
    """Refuse (and record) any name lookup or connection that is not loopback."""
    connect, lookup = socket.socket.connect, socket.getaddrinfo

    def loopback(host) -> bool:
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host == "localhost"

    def refuse(host):
        with record.open("a") as out:
            out.write(f"{host}\n")
        raise OSError(f"test: {host} refused (loopback only)")

    def checked_connect(self, address):
        if isinstance(address, tuple) and not loopback(address[0]):
            refuse(address[0])
        return connect(self, address)

    def checked_lookup(host, *args, **kwargs):
        if host is not None and not loopback(host if isinstance(host, str) else host.decode()):
            refuse(host)
        return lookup(host, *args, **kwargs)

    socket.socket.connect = checked_connect
    socket.getaddrinfo = checked_lookup


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    guard_network(Path(spec["refused"]))
    if "snippet" in spec:  # a user's code, as it stands in the README
        exec(compile(spec["snippet"], "README.md", "exec"), {"__name__": "__main__"})
        return
    from sagemaker.core.training.configs import Compute, InputData, SourceCode
    from sagemaker.train.distributed import MPI
    from sagemaker.train.model_trainer import Mode, ModelTrainer

    trainer = ModelTrainer(
        training_image=spec["image"],
        training_mode=Mode.LOCAL_CONTAINER,
        compute=Compute(instance_type="local", instance_count=spec["hosts"]),
        hyperparameters=spec.get("hyperparameters") or None,
        source_code=SourceCode(**spec["source_code"]) if spec.get("source_code") else None,
        distributed=MPI(**spec["mpi"]) if spec.get("mpi") is not None else None,
        environment=spec.get("environment") or None,
        local_container_root=spec["root"],
        base_job_name="sdk3-test",
    )
    trainer.train(
        input_data_config=[
            InputData(channel_name=name, data_source=folder)
            for name, folder in spec["channels"].items()
        ],
        wait=True,
    )


if __name__ == "__main__":
    main(sys.argv[1])
