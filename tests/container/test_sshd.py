"""The job's own sshd, for real on loopback: the job key logs in, and nothing else it could
ask for (port forwarding) is granted."""

import subprocess
import tempfile
from pathlib import Path

import pytest

from container import sshd
from job.errors import PlatformError
from container.network import free_port


@pytest.fixture
def job_sshd():
    runtime = Path(tempfile.mkdtemp(prefix="train-job-"))
    files = sshd.make_runtime(runtime)
    public_key = sshd.make_client_key(files)
    port = free_port()
    process, host_key = sshd.start_sshd(files, address="127.0.0.1", port=port,
                                        authorized_key=public_key)
    files.known_hosts.write_text(sshd.known_hosts_line("127.0.0.1", port, host_key))
    try:
        yield files, port
    finally:
        sshd.stop(process)
        subprocess.run(["rm", "-rf", str(runtime)], check=True)


def ssh(files, port, *extra):
    argv = ["ssh", *sshd.ssh_client_args(files, port).split(), *extra, "127.0.0.1", "echo ok"]
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
