"""The job's MLflow run: made by the leader's launcher before any rank starts, ended by it with
the job's outcome.

One run per job, whoever logs into it: the built-in trainer's rank 0 (each epoch's metrics, the
model's location) and a user's script (`mlflow.start_run()` joins the run named by
MLFLOW_RUN_ID, which every rank gets). The launcher owns its start and end because only it
sees the whole job: the parameters it validated, the hosts, every restart, and an outcome a
dead rank could not report (FAILED with the job's failure reason, KILLED when stopped).
Tracking is optional: whatever goes wrong with it (a server that cannot be reached or refuses,
an answer without what it should hold, no credentials, a token that cannot be read) is a
warning (job.notices: the log and output/data/WARNING-mlflow.txt), never the job's failure:
the metrics are still in the log and in output/data. A token kept in Secrets Manager
(MLFLOW_TRACKING_TOKEN_SECRET_ARN) is read here, once, with the job's role, and handed to the
ranks in mpirun's environment, by name: its value is in no command line and no log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from container.failure import Outcome
from container.logs import log
from container.plan import LaunchPlan
from job import notices
from job.paths import MlPaths
from job.protocol import FailureKind
from job.tracking import (
    FLUSH_SECONDS,
    WARNING_FILE,
    RunLogger,
    Tracking,
    experiment_id,
    failure_text,
    read_token,
    start_run,
)
from job.validated import IMAGES

FAILURE_TAG_LIMIT = 5000  # characters of the failure reason kept in a tag


def run_tags(plan: LaunchPlan, environ: Mapping[str, str], stack: str) -> dict[str, str]:
    cluster = plan.cluster
    return {
        "sagemaker.training_job_name": environ.get("TRAINING_JOB_NAME", ""),
        "sagemaker.hosts": ",".join(cluster.hosts),
        "sagemaker.instance_type": cluster.instance_type,
        "image": IMAGES[stack],
        "mlflow.source.name": plan.job.program or "built-in trainer",
    }


def run_params(hyperparameters: Mapping[str, Any], plan: LaunchPlan) -> dict[str, Any]:
    """The hyperparameters as the job gave them, and what the launcher derived from them."""
    params = {
        **hyperparameters,
        "world_size": plan.cluster.world_size,
        "processes_per_host": plan.cluster.processes_per_host,
    }
    if plan.batches:
        batches = plan.batches
        params.update(
            {
                "global_batch": batches.global_batch,
                "per_device_batch": batches.per_device_batch,
                "accumulation_steps": batches.accumulation_steps,
                "scaled_learning_rate": batches.learning_rate,
            }
        )
    return params


def begin(
    plan: LaunchPlan,
    hyperparameters: Mapping[str, Any],
    environ: Mapping[str, str],
    stack: str,
    paths: MlPaths,
) -> tuple[RunLogger | None, dict[str, str], dict[str, str]]:
    """On the leader, when the job names a tracking server: the job's run, started, with its
    parameters and tags; the variables that tell every rank about it; and the token read from
    Secrets Manager with the job's role, for the ranks' environment, never their command
    line. Else (None, {}, {}), with a warning when tracking failed."""
    tracking = Tracking.from_environment(environ)  # a malformed ARN: the job's config error
    if tracking is None or not plan.cluster.is_leader:
        return None, {}, {}

    def warn(text: str) -> None:
        notices.warn(paths, WARNING_FILE, text, "launcher", append=True)

    try:
        secret = {}
        if tracking.token_secret:
            secret["MLFLOW_TRACKING_TOKEN"] = read_token(tracking.token_secret)
            tracking = tracking.with_token(secret["MLFLOW_TRACKING_TOKEN"])
        if tracking.plain_http_warning():
            warn(tracking.plain_http_warning())
        experiment = experiment_id(tracking, environ)
        run_id = environ.get("MLFLOW_RUN_ID") or start_run(
            tracking,
            experiment,
            environ.get("MLFLOW_RUN_NAME") or environ.get("TRAINING_JOB_NAME", ""),
        )
    except Exception as error:  # any failure of tracking, expected or not: a warning
        warn(
            f"MLflow: {failure_text(error)}; this job is not tracked (its metrics are in "
            "the log and in output/data)"
        )
        return None, {}, {}
    log.info(f"MLflow run {run_id} in experiment {experiment} at {tracking.endpoint}")
    run = RunLogger(tracking, run_id, warn)
    run.log(params=run_params(hyperparameters, plan), tags=run_tags(plan, environ, stack))
    return run, {"MLFLOW_RUN_ID": run_id, "MLFLOW_EXPERIMENT_ID": experiment}, secret


def end(run: RunLogger | None, outcome: Outcome, seconds: float = FLUSH_SECONDS) -> None:
    """The run's status from the job's outcome; a failure's exit code and reason as tags;
    sent within `seconds`, whatever the server does."""
    if run is None:
        return
    if outcome.exit_code:
        run.log(
            tags={
                "exit_code": outcome.exit_code,
                "failure_reason": outcome.reason[:FAILURE_TAG_LIMIT],
            }
        )
    run.end(
        "FINISHED"
        if outcome.exit_code == 0
        else "KILLED"
        if outcome.kind == FailureKind.STOPPED
        else "FAILED"
    )
    run.close(seconds)
