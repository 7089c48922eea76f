"""One `ModelTrainer` job, or one endpoint, in the SageMaker Python SDK 3's local container mode,
as a user runs them.

    .venv-sdk3/bin/python tests/image/sdk3_job.py SPEC.json

Runs in the SDK's own virtualenv (scripts/setup_sdk3.sh; the SDK is a test-only dependency,
kept out of the image and the project's venv). SPEC: image, hosts, root (the SDK's
local_container_root), hyperparameters, channels {name: folder}, and optionally source_code
(SourceCode's fields), mpi (MPI's fields) and environment. Or, with `snippet`: that Python
code as it is (the README's), run from the working directory.

No address but loopback is reached: telemetry is opted out through the SDK's own config file,
AWS credentials and the region are given so that boto3 never asks the instance metadata
service, and every connection to another address is refused and recorded in SPEC's
`refused` file, which the test checks is empty. The SDK runs `docker compose` and `docker`;
the test puts its podman shims first on PATH.
"""

import ipaddress
import json
import socket
import sys
from pathlib import Path


def guard_network(record: Path) -> None:
    connect = socket.socket.connect

    def loopback_only(self, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None:
            try:
                allowed = ipaddress.ip_address(host).is_loopback
            except ValueError:
                allowed = host == "localhost"
            if not allowed:
                with record.open("a") as out:
                    out.write(f"{host}\n")
                raise OSError(f"test: connection to {host} refused (loopback only)")
        return connect(self, address)

    socket.socket.connect = loopback_only


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
        training_image=spec["image"], training_mode=Mode.LOCAL_CONTAINER,
        compute=Compute(instance_type="local", instance_count=spec["hosts"]),
        hyperparameters=spec.get("hyperparameters") or None,
        source_code=SourceCode(**spec["source_code"]) if spec.get("source_code") else None,
        distributed=MPI(**spec["mpi"]) if spec.get("mpi") is not None else None,
        environment=spec.get("environment") or None,
        local_container_root=spec["root"], base_job_name="sdk3-test")
    trainer.train(input_data_config=[
        InputData(channel_name=name, data_source=folder)
        for name, folder in spec["channels"].items()], wait=True)


if __name__ == "__main__":
    main(sys.argv[1])
