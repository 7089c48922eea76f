"""Error types that decide how a failure is reported.

`ConfigError` is the user's to fix (a hyperparameter, a channel, a config file): its message
says what to change and it is written to /opt/ml/output/failure as is. `PlatformError` is a
problem of the cluster (a host that never answered, sshd that would not start). Each carries
its `FailureKind`, which decides the exit code (job.protocol.exit_code) and travels in
a rank's failure report and in a worker's FAIL to its leader (container.messages), so the same
error means the same exit code wherever it is raised and on every host that hears of it
(`error_of`).
Anything else reaching the top-level handler is a bug in this project and is reported as such.
"""

from job.protocol import FailureKind, exit_code


class TrainError(Exception):
    """Base class of the errors the launcher reports as the job's failure reason."""

    kind = FailureKind.INTERNAL

    @property
    def exit_code(self) -> int:
        return exit_code(self.kind)


class ConfigError(TrainError):
    """Bad input from the user: configuration files, hyperparameters, data."""

    kind = FailureKind.CONFIG


class PlatformError(TrainError):
    """The cluster itself failed: name resolution, sshd, the leader or a worker vanished."""

    kind = FailureKind.CLUSTER


def error_of(kind: FailureKind) -> type[TrainError]:
    """The error that carries `kind`, for a host that raises again what another host reported
    by kind and text only (a worker that could not get ready: container.coordination), so the
    job ends with the reporting host's exit code. ValueError for a kind no error carries: a
    rank's failure, a stop or a hang is an outcome of the job, never raised before it runs."""
    for error in (ConfigError, PlatformError, TrainError):
        if error.kind is kind:
            return error
    raise ValueError(f"no error carries the failure kind {kind.value!r}")
