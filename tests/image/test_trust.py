"""The images' trust boundaries, read from the built images.

- Trust store: an image trusts exactly what Debian's ca-certificates package trusts. The build
  machine reaches PyPI through a TLS-inspecting proxy whose CA (in
  /usr/local/share/ca-certificates here) the build's downloads need; it reaches them as a
  build secret and must be nowhere in the image: not in the bundle, not in a pip config, not in
  the image's config or history.
- SCRIPT_MODE=off: the image built for others runs only its built-in trainer; a job that brings
  its own script is refused (exit 2) by the real launcher in the container.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from conftest import IMAGE, run_offline, run_script, unique
from test_tf_stack import tf_image  # noqa: F401

from job.validated import BUILTIN_ONLY_MARKER

pytestmark = pytest.mark.container

BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
DEBIAN_CAS = "/usr/share/ca-certificates/mozilla"
HOST_EXTRA_CAS = Path("/usr/local/share/ca-certificates")
PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
# What the build is given its trust with (scripts/build_image.sh, the Dockerfile), and the
# variables through which a process would pick up another CA bundle.
BUILD_TRUST = ("build_ca", "/run/secrets", "PIP_CERT")
CA_VARIABLES = (
    "PIP_CERT",
    "PIP_CONFIG_FILE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
)
BUILTIN_ONLY_IMAGE = f"{IMAGE}-builtin-only"


def certificates(text: str) -> set[bytes]:
    """The DER bytes of every PEM certificate in `text`."""
    return {base64.b64decode("".join(body.split())) for body in PEM.findall(text)}


def copy_out(engine, image: str, paths: list[str], into: Path) -> None:
    """`paths` of `image`'s file system copied into `into` (a container created, never run)."""
    name = unique("trust")
    engine.run("create", "--name", name, image)
    try:
        for path in paths:
            engine.run("cp", f"{name}:{path}", str(into))
    finally:
        engine.run("rm", "-f", name, check=False)


@pytest.fixture(params=["image", "tf_image"])
def any_image(request) -> str:
    """Both images built on the local Debian base: Horovod's and TensorFlow 2.21's."""
    return request.getfixturevalue(request.param)


def test_the_bundle_is_exactly_debians_and_holds_no_ca_of_the_build_machine(
    engine, any_image, tmp_path
):
    copy_out(engine, any_image, [BUNDLE, DEBIAN_CAS], tmp_path)
    bundle = certificates((tmp_path / "ca-certificates.crt").read_text())
    debian = set().union(
        *(certificates(path.read_text()) for path in (tmp_path / "mozilla").glob("*.crt"))
    )
    assert len(debian) > 100 and bundle == debian
    for extra in sorted(HOST_EXTRA_CAS.glob("*.crt")):
        ours = certificates(extra.read_text())
        assert ours and not ours & bundle, f"{extra} is trusted by {any_image}"


def test_no_pip_config_or_ca_variable_and_nothing_of_the_builds_trust(engine, any_image):
    listed = engine.run(
        "run",
        "--rm",
        "--network",
        "none",
        any_image,
        "bash",
        "-c",
        "python -m pip config list; ls -A /usr/local/share/ca-certificates; "
        "ls -d /etc/pip.conf /etc/xdg/pip /root/.config/pip /root/.pip "
        "/run/secrets 2>/dev/null; true",
        timeout=120,
    )
    assert listed.stdout == ""
    config = engine.run("image", "inspect", any_image).stdout
    environment = json.loads(config)[0]["Config"]["Env"]
    assert not [v for v in environment if v.split("=", 1)[0] in CA_VARIABLES], environment
    history = engine.run("history", "--no-trunc", "--format", "{{.CreatedBy}}", any_image).stdout
    for word in BUILD_TRUST:
        assert word not in config and word not in history, word


@pytest.fixture(scope="session")
def builtin_only_image(engine, image) -> str:
    """The CPU image built with SCRIPT_MODE=off: every layer but the marker's from `image`."""
    result = run_script(
        ["bash", "scripts/build_image.sh"],
        {
            **engine.env,
            "VARIANT": "cpu",
            "IMAGE": BUILTIN_ONLY_IMAGE,
            "BUILD_ARGS": "--build-arg SCRIPT_MODE=off",
        },
        900,
    )
    if result.returncode:
        pytest.fail(f"image build failed (exit {result.returncode}):\n{result.stderr[-6000:]}")
    yield BUILTIN_ONLY_IMAGE
    engine.run("rmi", BUILTIN_ONLY_IMAGE, check=False)


def test_an_image_built_for_others_refuses_a_jobs_own_script(
    engine, image, builtin_only_image, make_script_job
):
    has_marker = f"test -e {BUILTIN_ONLY_MARKER}"
    for built, expected in ((image, 1), (builtin_only_image, 0)):
        assert (
            engine.run(
                "run", "--rm", "--network", "none", built, "bash", "-c", has_marker, check=False
            ).returncode
            == expected
        )
    root = make_script_job(
        "train.py", {"epochs": "1"}, "open('/opt/ml/output/ran', 'w').write('yes')\n"
    )
    ran = run_offline(engine, builtin_only_image, "train", options=("-v", f"{root}:/opt/ml"))
    assert ran.returncode == 2, ran.stdout + ran.stderr
    reason = (root / "output" / "failure").read_text()
    assert reason.startswith("this algorithm runs only its built-in trainer")
    assert "leave out hyperparameter sagemaker_program" in reason
    assert not (root / "output" / "ran").exists()
