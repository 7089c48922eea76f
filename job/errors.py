"""Error types that decide how a failure is reported.

`ConfigError` is the user's to fix (a hyperparameter, a channel, a config file): its message
says what to change and it is written to /opt/ml/output/failure as is. `PlatformError` is a
problem of the cluster (a host that never answered, sshd that would not start). Each carries
its `FailureKind`, which decides the exit code (job.protocol.exit_code) and travels in
a rank's failure report, so the same error means the same exit code wherever it is raised.
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
