"""A real S3 API server on loopback for the submit-directory tests: moto's server mode, run
as its own process (`moto_server`), and a tiny pure-Python wheel made on the spot, so a
source_dir's requirements.txt installs with no network."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from container.network import free_port

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def client(self, **credentials):
        import boto3

        keys = {
            "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            **credentials,
        }
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **keys)

    def environment(self) -> dict[str, str]:
        """What a job on this 'AWS' sees: credentials and the S3 endpoint."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def upload(self, bucket: str, key: str, path: Path) -> str:
        client = self.client()
        if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
            client.create_bucket(Bucket=bucket)
        client.upload_file(str(path), bucket, key)
        return f"s3://{bucket}/{key}"


def start_moto(port: int, **environment: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", **environment},
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            return process
        except requests.ConnectionError as refused:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto_server did not start on port {port}") from refused
            time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_server():
    port = free_port()
    process = start_moto(port)
    yield S3Server(f"http://127.0.0.1:{port}")
    process.terminate()
    process.wait(timeout=10)


def write_wheel(folder: Path, name: str, version: str, source: str) -> Path:
    """A pure-Python wheel of one module `name` holding `source`, written by hand (a wheel is
    a zip with a dist-info folder), so no build tool or index is needed."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def uninstall(name: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-y", "-q", name], capture_output=True
    )
