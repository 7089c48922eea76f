"""Script mode: run the user's own script on every rank, as SageMaker's framework containers do.

    python -P -m mpi4py -m train.script_runner /opt/ml/code/train.py --epochs 3 ...

The script gets the SM_* environment that the sagemaker-training toolkit defines (made by the
toolkit's own code, for this rank's host: SM_CURRENT_HOST is this rank's host, never the
leader's), the hyperparameters as `--name value` arguments, and runs as `__main__` from the
code folder with its own folder on sys.path, so a script written for AWS's containers runs
unmodified. The hyperparameters come from the job the launcher validated (job.rank_job), never
from hyperparameters.json again.

Every process is also told its place among the job's processes for Keras 3 and JAX
(job.rank_job.Processes), so a script written from Keras's distribution guide joins the job with
no setting of its own. A script whose processes are known to have trained one model each (its
JAX ran with fewer processes than the job has, or a one-host MirroredStrategy ran in several)
fails the job, naming the fix; one that synchronised them with nothing this image knows is
warned about (train.apart). A script that imports Keras 3 gets, from train.keras_script: its
ModelParallel layout keys that match no variable named in the log, and model.save/get_weights
of a model split across hosts gathered onto every process, with no torn file left.

The user's modules win over ours: `train.py`, `job.py` or a `serve/` package beside the script
is what `import train` gives the script, even though this runner already imported our packages
of those names (the runner keeps the objects it holds; only the names are handed over).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from job import notices
from job.rank_job import DATA_HOST_ENV, RankJob, read_rank_job
from job.sagemaker_config import read_channels, read_resources, resource_document
from train import apart, keras_script
from train.rank import RankContext, run_rank


def sm_environment(context: RankContext, job: RankJob) -> dict[str, str]:
    """The toolkit's SM_* variables for this rank."""
    paths = context.paths
    for folder in (
        paths.model_dir,
        paths.output_data_dir,
        paths.checkpoint_dir,
        paths.tensorboard_dir,
    ):
        folder.mkdir(parents=True, exist_ok=True)  # SageMaker makes them; local runs may not
    os.environ["SAGEMAKER_BASE_DIR"] = str(paths.root)  # read by the toolkit at import
    from sagemaker_training import environment

    resources = read_resources(paths.resource_config)
    # Every host of every instance group, and this host's group: the toolkit derives the
    # heterogeneous-cluster variables from them (SM_CURRENT_INSTANCE_GROUP, SM_IS_HETERO,
    # SM_INSTANCE_GROUPS_DICT, SM_DISTRIBUTION_HOSTS ...), those of AWS's containers.
    resource_config = resource_document(resources, context.host)
    training = [g.name for g in resources.instance_groups if set(g.hosts) & set(context.hosts)]
    channels = {
        name: {
            "ContentType": c.content_type,
            "TrainingInputMode": c.input_mode,
            "S3DistributionType": c.distribution,
        }
        for name, c in read_channels(paths.input_data_config, paths.data_dir).items()
    }
    env = environment.Environment(
        resource_config=resource_config,
        input_data_config=channels,
        hyperparameters={
            **job.script_hyperparameters,
            "sagemaker_distribution_instance_groups": training,
        },
    )
    # The names SDK 3's driver (sm_drivers/scripts/environment.py) adds to the toolkit's, so
    # scripts written for ModelTrainer find them too.
    sdk3 = {
        "SM_MASTER_ADDR": context.hosts[0],
        "SM_MASTER_PORT": job.processes.coordinator.rpartition(":")[2],
        "SM_SOURCE_DIR": str(paths.code_dir),
        "SM_ENTRY_SCRIPT": job.program,
    }
    # Where SageMaker syncs checkpoints and uploads TensorBoard events: the LocalPath of the
    # job's CheckpointConfig and TensorBoardOutputConfig, which the toolkit does not tell.
    folders = {
        "SM_CHECKPOINT_DIR": str(paths.checkpoint_dir),
        "SM_TENSORBOARD_DIR": str(paths.tensorboard_dir),
    }
    return {**sdk3, **folders, **{key: str(value) for key, value in env.to_env_vars().items()}}


# The top-level names this project installs (pyproject.toml's package list).
OUR_PACKAGES = ("job", "container", "train", "serve", "sagemaker_ops")


def shadowed(script: Path, names: tuple[str, ...] = OUR_PACKAGES) -> list[str]:
    """Our package names that a module or regular package beside `script` claims.

    The script itself does not count: a `train.py` that says `from train import distributed`
    (the most common script name, using our helper) means ours. A folder without __init__.py
    is only a namespace portion, which loses to an installed package anyway, so it does not
    count either (a data folder called `model/` stays data).
    """
    folder = script.parent
    return [
        name
        for name in names
        if name != script.stem
        and ((folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file())
    ]


def release(names: list[str]) -> None:
    """Forget our imported modules under these names, so the next import finds the user's."""
    for key in [key for key in sys.modules if key.partition(".")[0] in names]:
        del sys.modules[key]


def main(context: RankContext) -> None:
    script, arguments = Path(sys.argv[1]).resolve(), sys.argv[2:]
    job = read_rank_job()
    os.environ.update(sm_environment(context, job))
    data_host = bool(os.environ.get(DATA_HOST_ENV))
    if not data_host:  # a data host's script is no process of the ranks' job
        os.environ.update(job.worker_environment(context.rank, context.local_rank))
    # AWS's containers run the script from the code folder: files shipped beside it open by
    # their relative names, and relative outputs land there, not among the image's code.
    os.chdir(context.paths.code_dir)
    sys.argv = [str(script), *arguments]
    sys.path.insert(0, str(script.parent))
    release(shadowed(script))
    keras_script.install()  # once the script imports Keras 3: layout warnings, saves across hosts
    runpy.run_path(str(script), run_name="__main__")
    if not data_host:
        check_trained_together(context, mwms=bool(job.tf_workers))


APART_FILE = "WARNING-trained-apart.txt"


def check_trained_together(context: RankContext, mwms: bool) -> None:
    """Fail this rank (TrainedApart, exit code 2 for the job) when the script's processes are
    known to have trained one model each; warn, on the leader, when they synchronised through
    nothing this image knows. Every rank decides alike: each sees the same stacks."""
    said = apart.verdict(context.world_size, apart.observe(), mwms)
    if said and said.fails:
        raise apart.TrainedApart(said.text)
    if said and context.is_leader:
        notices.warn(context.paths, APART_FILE, said.text, f"rank {context.rank}")


if __name__ == "__main__":
    run_rank(main)
