"""The job's own sshd and ssh client settings, made per job and discarded with it.

No key is baked into the image. The leader makes a fresh key pair for each job and hands the
public half to the workers over the coordinator connection (container.coordination); each host
then runs its own sshd on the job's port, bound to its own cluster address, that accepts only
that key for root (no passwords, no keyboard-interactive, no forwarding). Each host's sshd gets
a fresh host key too, which the workers send back, so mpirun's ssh checks host keys strictly
against a known_hosts file holding exactly the cluster's hosts.

The sessions each sshd starts (the MPI daemon that starts this host's ranks) get this host's
own values of the variables that describe its container, not the job (HOST_OWN_NAMES,
HOST_OWN_PREFIXES): mpirun on the leader hands every other variable to every rank by name
(container.plan), with the leader's values, which for these would be the leader's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from container.logs import log
from job.errors import PlatformError

SSHD_CONFIG = """\
# Written by the training launcher for this job only.
Port {port}
ListenAddress {address}
HostKey {runtime}/ssh_host_ed25519_key
AuthorizedKeysFile {runtime}/authorized_keys
PidFile {runtime}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
UsePAM no
StrictModes no
DisableForwarding yes
PermitTunnel no
PrintMotd no
MaxStartups 64:30:256
LogLevel ERROR
"""

# What describes one container: SageMaker gives each instance its own endpoint for the
# credentials of the job's role and its own ECS container metadata endpoints. botocore's
# ContainerProvider reads the four AWS_CONTAINER_* names (the other AWS SDKs read the same);
# ECS_CONTAINER_METADATA_URI, ECS_CONTAINER_METADATA_URI_V4 and the other ECS_* variables
# are the container agent's, each naming this container.
HOST_OWN_NAMES = frozenset(
    {
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    }
)
HOST_OWN_PREFIXES = ("ECS_",)
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell takes as a name
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def is_host_own(name: str) -> bool:
    """Whether a variable holds this host's own value, which no other host's ranks may get."""
    return name in HOST_OWN_NAMES or name.startswith(HOST_OWN_PREFIXES)


def session_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The host-own variables of `environ` that sshd can set in its sessions, and why each
    other one cannot: sshd_config holds a setting on one line, so a value with a line break
    or another control character cannot be written there (no endpoint or token has one), and
    a name a shell would not take could not reach the ranks anyway."""
    values: dict[str, str] = {}
    skipped = []
    for name in sorted(filter(is_host_own, environ)):
        if not VARIABLE_NAME.fullmatch(name):
            skipped.append(f"{name!r}: the name is not a variable name a shell accepts")
        elif _CONTROL.search(environ[name]):
            skipped.append(
                f"{name}: its value holds a line break or another control "
                "character, which sshd_config cannot hold"
            )
        else:
            values[name] = environ[name]
    return values, skipped


def setenv_line(values: Mapping[str, str]) -> str:
    """`SetEnv "NAME=value" ...`, the sshd_config setting for `values`, or nothing for none.
    sshd reads only the first SetEnv line, and splits it into words as ssh_config does:
    double quotes keep spaces and `#`, and a backslash escapes a quote or a backslash."""
    words = [
        '"' + f"{name}={value}".replace("\\", "\\\\").replace('"', '\\"') + '"'
        for name, value in values.items()
    ]
    return f"SetEnv {' '.join(words)}\n" if words else ""


def sshd_config(
    runtime: Path, *, address: str, port: int, environ: Mapping[str, str]
) -> tuple[str, list[str]]:
    """This job's sshd_config on this host, with the host-own variables of `environ` set in
    its sessions, and why any of them is left out."""
    values, skipped = session_environment(environ)
    return (
        SSHD_CONFIG.format(port=port, address=address, runtime=runtime) + setenv_line(values),
        skipped,
    )


@dataclass(frozen=True)
class SshFiles:
    """The per-job files, all inside one private runtime folder."""

    runtime: Path

    @property
    def client_key(self) -> Path:
        return self.runtime / "id_ed25519"

    @property
    def host_key(self) -> Path:
        return self.runtime / "ssh_host_ed25519_key"

    @property
    def known_hosts(self) -> Path:
        return self.runtime / "known_hosts"

    @property
    def client_config(self) -> Path:
        return self.runtime / "ssh_config"


def ssh_client_args(files: SshFiles, port: int) -> str:
    """What mpirun passes to ssh (plm_rsh_args): the job key, strict host checking, and the
    job's own client config (`client_config`) in place of the image's."""
    return (
        f"-F {files.client_config} -p {port} -i {files.client_key} -o IdentitiesOnly=yes "
        f"-o BatchMode=yes -o StrictHostKeyChecking=yes "
        f"-o UserKnownHostsFile={files.known_hosts} -o CheckHostIP=no -o ConnectTimeout=30 "
        f"-o LogLevel=ERROR"
    )


def client_config(addresses: Mapping[str, str], port: int) -> str:
    """ssh's config for the job: each host's name pinned to the address the leader verified
    when that host joined. ssh then never asks the name service, which can fail for a moment
    while the cluster's containers come and go (podman's resolver reloads, glibc moves on to a
    server that has never heard of algo-2: "Could not resolve hostname"); host keys are still
    checked against the name (HostKeyAlias), as known_hosts holds them."""
    return "".join(
        f"Host {host}\n  HostName {address}\n  HostKeyAlias {_known_name(host, port)}\n"
        for host, address in addresses.items()
    )


def known_hosts_line(host: str, port: int, host_public_key: str) -> str:
    return f"{_known_name(host, port)} {host_public_key.strip()}\n"


def _known_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _require(program: str) -> str:
    path = shutil.which(program) or (
        f"/usr/sbin/{program}" if Path(f"/usr/sbin/{program}").exists() else None
    )
    if not path:
        raise PlatformError(
            f"{program} is not installed; multi-host jobs need OpenSSH in the image: "
            f"apt-get install -y openssh-server openssh-client"
        )
    return path


def _keygen(path: Path) -> str:
    if not path.exists():
        subprocess.run(
            [
                _require("ssh-keygen"),
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "training-job",
                "-f",
                str(path),
            ],
            check=True,
            capture_output=True,
        )
    return path.with_suffix(".pub").read_text().strip()


def make_runtime(runtime: Path) -> SshFiles:
    """The job's files in `runtime`, a private folder made by tempfile.mkdtemp (0700)."""
    if runtime.stat().st_mode & 0o077:
        raise PlatformError(f"the job's runtime folder {runtime} is readable by others")
    return SshFiles(runtime)


def make_client_key(files: SshFiles) -> str:
    """The job's key pair (leader only); returns the public key."""
    return _keygen(files.client_key)


def start_sshd(
    files: SshFiles, *, address: str, port: int, authorized_key: str
) -> tuple[subprocess.Popen[bytes], str]:
    """Start sshd for this job, its sessions given this host's own values of the host-own
    variables (from this process's environment); returns the process and this host's public
    host key."""
    host_public_key = _keygen(files.host_key)
    authorized = files.runtime / "authorized_keys"
    authorized.write_text(f"restrict {authorized_key}\n")
    authorized.chmod(0o600)
    text, skipped = sshd_config(files.runtime, address=address, port=port, environ=os.environ)
    for reason in skipped:
        log.info(f"the ranks this host's sshd starts do not get {reason}")
    config = files.runtime / "sshd_config"
    config.write_text(text, encoding="utf-8", errors="surrogateescape")  # the values' own bytes
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    sshd = _require("sshd")
    check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
    if check.returncode:
        raise PlatformError(f"sshd rejected its configuration: {check.stderr.strip()}")
    process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)])
    return process, host_public_key


def stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
