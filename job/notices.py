"""Warnings a job leaves where its user looks: the log, and a file beside the model.

A job that completes but did something the user surely did not mean (saved no model, trained
one model per host) is not failed: its results may still be worth having. It is said twice:
one line in the log (CloudWatch), and a file in /opt/ml/output/data, which SageMaker uploads
as output.tar.gz beside model.tar.gz, where a user who finds the model wrong looks. Not
/opt/ml/output/failure: SageMaker reads that only when a job fails.
"""

from __future__ import annotations

import sys

from job.paths import MlPaths


def warn(paths: MlPaths, file_name: str, text: str, speaker: str, append: bool = False) -> None:
    """Say `text` in the log and in output/data/`file_name` (added to what it holds with
    `append`: a topic that several processes warn of, as MLflow's launcher and trainer); a
    file system that cannot be written loses only the file."""
    print(f"{speaker}: WARNING: {text}", file=sys.stderr, flush=True)
    target = paths.output_data_dir / file_name
    try:
        paths.output_data_dir.mkdir(parents=True, exist_ok=True)
        with target.open("a" if append else "w", encoding="utf-8") as file:
            file.write(text + "\n")
    except OSError as error:
        print(
            f"{speaker}: cannot write {target}: {error.strerror or error}",
            file=sys.stderr,
            flush=True,
        )
