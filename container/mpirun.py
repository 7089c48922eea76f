"""The mpirun command line: a `Command` (data) that one pure function, `render`, turns into the
argv, so golden tests can pin every argument and nothing parses the argv back.

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
from dataclasses import dataclass, field, replace

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

    @classmethod
    def variable(cls, name: str, value: str | None = None) -> Option:
        """`-x NAME=VALUE`, or `-x NAME` (mpirun's own value) when `value` is None."""
        return cls(("-x", name if value is None else f"{name}={value}"))

    @property
    def variable_value(self) -> str | None:
        """The value of a `-x NAME=VALUE` option; None for any other."""
        if self.tokens[0].lstrip("-") != "x" or "=" not in self.tokens[1]:
            return None
        return self.tokens[1].split("=", 1)[1]


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


@dataclass(frozen=True)
class Command:
    """One job's mpirun command as data: what `render` turns into the argv, once, where it is
    logged and run. Nothing reads the argv back: what the ranks will be given is asked of
    this (`rank_variable`), and what is known only once the job has started (its MLflow run,
    a secret read then) is added with `started`, not spliced into a finished argv.

    `environment`: every rank's variables, set by value (`-x NAME=VALUE`); `forwarded`: the
    container's variables that ranks on other hosts get by name with mpirun's own value
    (`-x NAME`); `user_options`: the job's `mpi_options`, each replacing the launcher's
    option of the same key in place, new ones after; `ssh_args`: None on one host (no ssh).
    """

    hosts: tuple[str, ...]
    processes_per_host: int
    interface: str
    instance_type: str
    ssh_args: str | None
    environment: Mapping[str, str]
    program: tuple[str, ...]
    forwarded: tuple[str, ...] = ()
    user_options: tuple[Option, ...] = ()
    # Known once the job has started; given to every rank on every host, first in the argv.
    started_environment: Mapping[str, str] = field(default_factory=dict)
    started_secrets: tuple[str, ...] = ()  # by name: the command line never holds a secret

    def started(self, environment: Mapping[str, str], secrets: tuple[str, ...] = ()) -> Command:
        """This command with every rank given `environment` too, and mpirun's own value of
        each of `secrets`: values known only once the job has started (its MLflow run, a
        token read from Secrets Manager), not when its plan was made."""
        return replace(
            self,
            started_environment={**self.started_environment, **environment},
            started_secrets=(*self.started_secrets, *secrets),
        )

    def rank_variable(self, name: str) -> str | None:
        """The value the command sets for `name` in every rank: the job's `-x NAME=VALUE`
        in mpi_options, else the launcher's `environment`, else the started one; None when it
        sets no value (a name forwarded with `-x NAME` takes mpirun's own)."""
        for option in reversed(self.user_options):
            if option.key == f"x:{name}":
                return option.variable_value
        return self.environment.get(name, self.started_environment.get(name))


def default_options(command: Command) -> list[Option]:
    """The launcher's options for `command`, before the job's own: each of its `forwarded`
    variables only where no option here already sets it, and only across hosts (local ranks
    inherit mpirun's environment anyway)."""
    hosts, processes_per_host = command.hosts, command.processes_per_host
    interface, instance_type, ssh_args = command.interface, command.instance_type, command.ssh_args
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
            Option.variable("NCCL_SOCKET_IFNAME", interface),
        ]
    if is_efa(instance_type):
        options.append(Option.variable("FI_PROVIDER", "efa"))
        if instance_type.startswith(EFA_RDMA_FAMILIES):
            options.append(Option.variable("FI_EFA_USE_DEVICE_RDMA", "1"))
    explicit = [Option.variable(name, value) for name, value in command.environment.items()]
    if multi_host:
        taken = {option.key for option in options + explicit}
        options += [
            option
            for option in (Option.variable(name) for name in command.forwarded)
            if option.key not in taken
        ]
    return options + explicit


def render(command: Command) -> tuple[str, ...]:
    """The argv of `command`: the launcher's defaults for its hosts and environment, merged
    with the job's options, then the program every rank runs."""
    started = [
        *(Option.variable(name, value) for name, value in command.started_environment.items()),
        *(Option.variable(name) for name in command.started_secrets),
    ]
    options = started + merge_options(default_options(command), list(command.user_options))
    return ("mpirun", *(token for option in options for token in option.tokens), *command.program)
