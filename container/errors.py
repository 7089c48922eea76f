"""Error types that decide how a failure is reported.

`ConfigError` is the user's to fix (a hyperparameter, a channel, a config file): its message
says what to change and it is written to /opt/ml/output/failure as is. `PlatformError` is a
problem of the cluster (a host that never answered, sshd that would not start). `JobFailed`
carries the outcome of a training run that started and failed on some rank. Anything else
reaching the top-level handler is a bug in this project and is reported as such.
"""


class TrainError(Exception):
    """Base class of the errors the launcher reports as the job's failure reason."""

    exit_code = 1


class ConfigError(TrainError):
    """Bad input from the user: configuration files, hyperparameters, data."""

    exit_code = 2


class PlatformError(TrainError):
    """The cluster itself failed: name resolution, sshd, the leader or a worker vanished."""

    exit_code = 3


class JobFailed(TrainError):
    """The distributed job ran and failed; `exit_code` is the job's own."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code
