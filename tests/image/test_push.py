"""scripts/build_and_push.sh against a real registry on loopback: Debian's
docker-registry, started here on a free port with its storage in a temporary folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request

import pytest
from conftest import run_script

from container.network import free_port

BASE_IMAGE = "localhost/sagemaker-byoc-base:bookworm"  # scripts/make_base_image.sh

pytestmark = pytest.mark.container

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@pytest.fixture
def registry(tmp_path):
    binary = shutil.which("docker-registry")
    assert binary, "docker-registry is missing: run make container-setup"
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(REGISTRY_CONFIG.format(root=tmp_path / "storage", port=port))
    process = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except OSError:
                assert process.poll() is None, process.stderr.read()
                assert time.monotonic() < deadline, "the registry never answered"
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def image_id(engine, name: str) -> str:
    return engine.run("image", "inspect", "--format", "{{.Id}}", name).stdout.strip()


def test_push_to_a_registry_and_pull_back(engine, image, registry):
    """The script pushes NAME:VARIANT as it finds it (SKIP_BUILD=1): here the local Debian base
    image (123 MB) under a name of its own. Pushing the 2 GB product image would spend ~50 s of
    both cores gzipping layers and prove nothing more about the script, which treats every
    image alike; the build step it skips is `make test`'s own image-build phase (the `image`
    fixture: building the image makes the base image first)."""
    local, tag = "push-probe", "pushtest"
    remote = f"{registry}/{local}:{tag}"
    engine.run("tag", BASE_IMAGE, f"{local}:cpu")
    try:
        result = run_script(
            ["bash", "scripts/build_and_push.sh", local, tag],
            {**engine.env, "VARIANT": "cpu", "SKIP_BUILD": "1", "REGISTRY": registry},
            600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        assert result.stdout.strip().splitlines()[-1] == remote
        assert f"pushed {remote} in" in result.stderr

        with urllib.request.urlopen(
            f"http://{registry}/v2/{local}/tags/list", timeout=10
        ) as answer:
            assert tag in json.loads(answer.read())["tags"]

        engine.run("rmi", remote)  # only the tag: the image stays as the base image
        assert engine.run("image", "inspect", remote, check=False).returncode != 0
        tls = [] if engine.name == "docker" else ["--tls-verify=false"]
        engine.run("pull", *tls, remote, timeout=300)
        assert image_id(engine, remote) == image_id(engine, BASE_IMAGE)
    finally:
        engine.run("rmi", remote, f"{local}:cpu", check=False)
