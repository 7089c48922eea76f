"""The mpirun command line, built by pure functions so golden tests can pin every argument.

The defaults follow what AWS's sagemaker-training toolkit passes with the fixes its users asked
for: user options given through the `mpi_options` hyperparameter *replace* a default with the
same key instead of being appended after it (an `-mca btl_tcp_if_include eth1` wins over the
interface from resourceconfig.json; `-x NCCL_DEBUG=INFO` wins over the default WARN), and
`python -m mpi4py` runs the rank program so an uncaught exception on one rank aborts all of
them instead of leaving the others blocked in a collective.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from job.errors import ConfigError

# Instance families with Elastic Fabric Adapter: libfabric must be told to use it.
EFA_FAMILIES = (
    "ml.p4d.",
    "ml.p4de.",
    "ml.p5.",
    "ml.p5e.",
    "ml.p5en.",
    "ml.trn1.",
    "ml.trn1n.",
    "ml.trn2.",
)
EFA_INSTANCES = ("ml.g5.48xlarge", "ml.g6.48xlarge", "ml.p3dn.24xlarge")
# GPUDirect RDMA over EFA is available (and must be switched on) only on these.
EFA_RDMA_FAMILIES = ("ml.p4d.", "ml.p4de.")

# MCA parameters that decide how mpirun reaches the other hosts: the launcher's ssh with the
# job's key and strict host-key checking. A user's value would silently weaken that.
RESERVED_MCA = ("plm_rsh_args", "plm_rsh_agent")

# Options that take a fixed number of values; every other option takes one value when the
# next token is not itself an option.
_ARITY = {"mca": 2, "x": 1}


@dataclass(frozen=True)
class Option:
    """One mpirun option with its values; `key` says which other option it replaces."""

    tokens: tuple[str, ...]

    @property
    def key(self) -> str:
        name = self.tokens[0].lstrip("-")
        if name == "mca":
            return f"mca:{self.tokens[1]}"
        if name == "x":
            return f"x:{self.tokens[1].split('=', 1)[0]}"
        return {"H": "host", "n": "np", "c": "np"}.get(name, name)


def is_efa(instance_type: str) -> bool:
    return instance_type.startswith(EFA_FAMILIES) or instance_type in EFA_INSTANCES


def parse_options(text: str) -> list[Option]:
    """Split the user's `mpi_options` string into options; ConfigError when malformed."""
    try:
        tokens = shlex.split(text)
    except ValueError as error:
        raise ConfigError(
            f"hyperparameter mpi_options={text!r} cannot be parsed: {error}"
        ) from None
    options, index = [], 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("-"):
            raise ConfigError(
                f"hyperparameter mpi_options: {token!r} is not an mpirun option (options "
                f"start with '-', e.g. \"-x NCCL_DEBUG=INFO -mca btl_tcp_if_include eth0\")"
            )
        arity = _ARITY.get(token.lstrip("-"))
        if arity is None:
            arity = 1 if index + 1 < len(tokens) and not tokens[index + 1].startswith("-") else 0
        values = tokens[index + 1 : index + 1 + arity]
        if len(values) < arity:
            raise ConfigError(f"hyperparameter mpi_options: {token} needs {arity} value(s)")
        if token.lstrip("-") == "mca" and values[0] in RESERVED_MCA:
            raise ConfigError(
                f"hyperparameter mpi_options: -mca {values[0]} is set by the launcher (its ssh "
                f"uses the job's own key and checks host keys strictly); remove it from "
                f"mpi_options"
            )
        options.append(Option((token, *values)))
        index += 1 + arity
    return options


def merge_options(defaults: list[Option], overrides: list[Option]) -> list[Option]:
    """Defaults in order with each overridden one replaced in place; new options appended."""
    by_key = {option.key: option for option in overrides}
    merged = [by_key.pop(option.key, option) for option in defaults]
    return merged + [option for option in overrides if option.key in by_key]


def default_options(
    *,
    hosts: tuple[str, ...],
    processes_per_host: int,
    interface: str,
    instance_type: str,
    rank_env: dict[str, str],
    ssh_args: str | None,
    forwarded: tuple[str, ...] = (),
) -> list[Option]:
    """The launcher's defaults for one job. `ssh_args` is None on a single host (no ssh);
    `forwarded` names variables every rank gets with mpirun's own value (`-x NAME`), unless
    an option here already sets them."""
    world_size = len(hosts) * processes_per_host
    multi_host = ssh_args is not None
    host_list = (
        ",".join(f"{host}:{processes_per_host}" for host in hosts)
        if multi_host
        else f"localhost:{processes_per_host}"
    )
    # Long options with two dashes: Open MPI 4 takes both spellings, Open MPI 5's prterun
    # reads `-bind-to` as the program to run.
    options = [
        Option(("--allow-run-as-root",)),
        Option(("--tag-output",)),
        Option(("-np", str(world_size))),
        Option(("-H", host_list)),
        Option(("--bind-to", "none")),
        Option(("--map-by", "slot")),
        Option(("-mca", "pml", "ob1")),
        Option(("-mca", "btl", "^openib")),
        Option(("-mca", "orte_abort_on_non_zero_status", "1")),
        Option(("-mca", "btl_vader_single_copy_mechanism", "none")),
    ]
    if ssh_args is not None:  # multi_host
        options += [
            Option(("-mca", "plm_rsh_no_tree_spawn", "1")),
            Option(("-mca", "plm_rsh_args", ssh_args)),
            Option(("-mca", "btl_tcp_if_include", interface)),
            Option(("-mca", "oob_tcp_if_include", interface)),
            Option(("-x", f"NCCL_SOCKET_IFNAME={interface}")),
        ]
    if is_efa(instance_type):
        options.append(Option(("-x", "FI_PROVIDER=efa")))
        if instance_type.startswith(EFA_RDMA_FAMILIES):
            options.append(Option(("-x", "FI_EFA_USE_DEVICE_RDMA=1")))
    explicit = [Option(("-x", f"{name}={value}")) for name, value in rank_env.items()]
    if multi_host:  # local ranks inherit mpirun's environment anyway
        taken = {option.key for option in options + explicit}
        options += [
            option
            for option in (Option(("-x", name)) for name in forwarded)
            if option.key not in taken
        ]
    return options + explicit


def build_argv(options: list[Option], rank_command: list[str]) -> list[str]:
    return ["mpirun", *(token for option in options for token in option.tokens), *rank_command]


def with_environment(
    argv: tuple[str, ...], env: Mapping[str, str], forwarded: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """`argv` with every rank given `env` too, and mpirun's own value of each `forwarded`
    name (a secret, which the command line must not hold): values known only once the job
    has started (its MLflow run, a token read from Secrets Manager), not when its plan was
    made."""
    return (
        argv[0],
        *(token for name, value in env.items() for token in ("-x", f"{name}={value}")),
        *(token for name in forwarded for token in ("-x", name)),
        *argv[1:],
    )
