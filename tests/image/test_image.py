"""The image itself: it builds from the local base and keeps the contract."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import REPO

pytestmark = pytest.mark.container


def inspect(engine, image: str) -> dict:
    return json.loads(engine.run("image", "inspect", image).stdout)[0]


def run_in(engine, image: str, script: str) -> subprocess.CompletedProcess:
    return engine.run(
        "run", "--rm", "--network", "none", image, "bash", "-c", script, check=False, timeout=300
    )


def test_dockerfile_passes_hadolint():
    hadolint = REPO / ".venv" / "bin" / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--no-color", "Dockerfile"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_ignored_hadolint_rule_has_a_reason():
    lines = (REPO / "Dockerfile").read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            assert (
                lines[number - 1].startswith("#") and "hadolint ignore" not in lines[number - 1]
            ), f"Dockerfile line {number + 1}: an ignored rule needs a reason on the line above"


def test_horovod_version_matches_the_host_setup():
    dockerfile = re.search(
        r"^ARG HOROVOD_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M
    ).group(1)
    setup = re.search(
        r"^HOROVOD_VERSION=(\S+)$", (REPO / "scripts" / "setup.sh").read_text(), re.M
    ).group(1)
    assert dockerfile == setup


def test_prebuilt_wheel_is_looked_for_where_setup_caches_it():
    setup = re.search(r"^WHEELS=(\S+)$", (REPO / "scripts" / "setup.sh").read_text(), re.M)
    build = re.search(
        r"^HOST_WHEELS=(\S+)$", (REPO / "scripts" / "build_image.sh").read_text(), re.M
    )
    assert setup and build and setup.group(1) == build.group(1)


def test_image_metadata(engine, image):
    config = inspect(engine, image)["Config"]
    assert config["Labels"]["com.amazonaws.sagemaker.capabilities.accept-bind-to-port"] == "true"
    assert config["Entrypoint"] == ["/usr/local/bin/docker-entrypoint"]  # exec form
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "1"
    assert "8080/tcp" in config.get("ExposedPorts", {})


def test_image_contents(engine, image):
    result = run_in(
        engine,
        image,
        r"""
        set -e
        command -v train serve mpirun sshd ssh-keygen
        test ! -e /opt/ml && echo "no /opt/ml"
        ls /etc/ssh/ssh_host_* 2>/dev/null && exit 1 || echo "no host keys"
        test -d /run/sshd && echo "privsep dir"
        python -c 'import horovod.tensorflow as hvd, tensorflow as tf; \
print("tf", tf.__version__, "mpi", hvd.mpi_built(), "gloo", hvd.gloo_built())'
        ps -e -o comm= > /tmp/processes
        echo "others: $(grep -v -x -e ps -e bash /tmp/processes | tr '\n' ' ')."
    """,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for program in ("/opt/venv/bin/train", "/opt/venv/bin/serve", "mpirun", "sshd"):
        assert program in out
    assert "no /opt/ml" in out and "no host keys" in out and "privsep dir" in out
    assert "tf 2.15.1 mpi True gloo True" in out
    assert "others: ." in out, f"something else runs at start: {out}"


def test_sshd_defaults_are_key_only(engine, image):
    """Anyone starting a plain sshd in the image gets keys only, root by key only."""
    result = run_in(engine, image, "ssh-keygen -q -A && /usr/sbin/sshd -T")
    assert result.returncode == 0, result.stderr
    settings = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert settings["passwordauthentication"] == "no"
    assert settings["kbdinteractiveauthentication"] == "no"
    assert settings["permitemptypasswords"] == "no"
    assert settings["permitrootlogin"] == "without-password"
    assert settings["allowtcpforwarding"] == "no"


def test_entrypoint_execs_the_command(engine, image):
    """`docker run IMAGE X` runs X as PID 1 (so train/serve get SIGTERM themselves)."""
    result = run_in(engine, image, "echo pid=$$")
    assert result.stdout.strip() == "pid=1"
