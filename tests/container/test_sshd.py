"""The job's own sshd, for real on loopback: the job key logs in, and nothing else it could
ask for (port forwarding) is granted; ssh reaches it by a cluster host name that no name
service knows, through the job's client config."""

import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from container import sshd
from container.network import free_port
from job.errors import PlatformError

HOST = "algo-7"  # a SageMaker-style name that does not resolve on this machine


@pytest.fixture
def session_env():
    """Variables of the launcher's environment while it starts sshd (a test parametrizes it)."""
    return {}


@pytest.fixture
def job_sshd(monkeypatch, session_env):
    for name, value in session_env.items():
        monkeypatch.setenv(name, value)
    runtime = Path(tempfile.mkdtemp(prefix="train-job-"))
    files = sshd.make_runtime(runtime)
    public_key = sshd.make_client_key(files)
    port = free_port()
    process, host_key = sshd.start_sshd(
        files, address="127.0.0.1", port=port, authorized_key=public_key
    )
    files.known_hosts.write_text(sshd.known_hosts_line(HOST, port, host_key))
    files.client_config.write_text(sshd.client_config({HOST: "127.0.0.1"}, port))
    try:
        yield files, port
    finally:
        sshd.stop(process)
        subprocess.run(["rm", "-rf", str(runtime)], check=True)


def ssh(files, port, *extra, command="echo ok"):
    argv = ["ssh", *sshd.ssh_client_args(files, port).split(), *extra, HOST, command]
    for _ in range(50):  # sshd needs a moment to listen
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if "Connection refused" not in result.stderr:
            return result
    return result


def test_the_job_key_logs_in_but_gets_no_forwarding(job_sshd):
    files, port = job_sshd
    plain = ssh(files, port)
    assert (plain.returncode, plain.stdout) == (0, "ok\n"), plain.stderr
    forward = ssh(files, port, "-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9")
    assert forward.returncode == 255 and "forwarding failed" in forward.stderr, forward.stderr
    assert (files.runtime / "authorized_keys").read_text().startswith("restrict ssh-ed25519 ")


def test_a_runtime_folder_others_can_read_is_refused(tmp_path):
    tmp_path.chmod(0o755)
    with pytest.raises(PlatformError, match="readable by others"):
        sshd.make_runtime(tmp_path)


HOST_OWN = {
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/a b\"c'd\\e #f $HOME `x`",
    "ECS_CONTAINER_METADATA_URI_V4": "http://169.254.170.2/v4/caf\u00e9-2",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN": "",
}


@pytest.mark.parametrize(
    "session_env",
    [{**HOST_OWN, "ECS_AGENT_URI": "two\nlines", "USER_SETTING": "the launcher's own"}],
)
def test_sessions_get_this_hosts_own_values_exactly(capsys, job_sshd):
    """What starts the ranks over ssh gets this host's credentials and metadata endpoints,
    quotes, backslashes, `#`, `$` and all; a value sshd_config cannot hold is left out with
    the reason in the log. Nothing else of the launcher's environment: sshd starts sessions
    afresh (the rest comes from mpirun, by name)."""
    files, port = job_sshd
    result = ssh(files, port, command="env -0")
    assert result.returncode == 0, result.stderr
    session = dict(line.split("=", 1) for line in result.stdout.split("\0") if line)
    assert {name: session.get(name) for name in HOST_OWN} == HOST_OWN
    assert "ECS_AGENT_URI" not in session and "USER_SETTING" not in session
    assert (
        "launcher: the ranks this host's sshd starts do not get ECS_AGENT_URI: its value "
        "holds a line break or another control character, which sshd_config cannot hold"
    ) in capsys.readouterr().out


def test_no_setenv_without_host_own_variables():
    text, skipped = sshd.sshd_config(
        Path("/run/job"),
        address="10.0.0.1",
        port=2222,
        environ={"PATH": "/usr/bin", "AWS_REGION": "eu-west-1"},
    )
    assert "SetEnv" not in text and skipped == []


def test_a_host_reached_by_its_pinned_address_is_still_checked_by_its_name(job_sshd, tmp_path):
    """The name service is never asked (the name does not resolve here), and the host key is
    checked under the name: a different key for that name is refused."""
    files, port = job_sshd
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(HOST, port)
    assert ssh(files, port).stdout.strip() == "ok"
    genuine = files.known_hosts.read_text()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True
    )
    files.known_hosts.write_text(
        sshd.known_hosts_line(HOST, port, (tmp_path / "other.pub").read_text())
    )
    impostor = ssh(files, port)
    files.known_hosts.write_text(genuine)
    assert impostor.returncode == 255 and "Host key verification failed" in impostor.stderr, (
        impostor.stderr
    )
