"""Hands SageMaker SDK 3's own driver to this image's launcher. The image installs this file as
the top-level module `byoc_sdk_handover` with a `.pth` file that imports it, so that it runs at
the start of every interpreter of the image's Python (a `sitecustomize` would lose to the one
Debian's Python ships).

`ModelTrainer(source_code=SourceCode(entry_script=...))` replaces the image's entry point with
its `sm_train.sh`, which ends in `python3 .../sm_drivers/distributed_drivers/<driver>.py`. Left
alone, its basic driver runs the script on every host as a separate one-process job (all
writing the same model folder), its MPI driver needs ssh keys baked into the image and puts
every rank on the first host, and a failing rank leaves a generic failure file. When Python
starts one of those drivers, this module replaces the process with `train`, which reads the
same SourceCode (job.source_code) and runs the entry script as one job across the hosts with
the launcher's guarantees. sm_train.sh waits for it and exits with its code.

Python imports this for every interpreter in the image, ranks and users' scripts included, so
it only looks at sys.argv and imports nothing but the standard library: a user's module named
like one of ours must still win in script mode.
"""

import os
import sys

DRIVERS = ("basic_script_driver.py", "mpi_driver.py", "torchrun_driver.py")


def sdk_driver(argv: list[str]) -> str:
    """The SDK driver `argv` starts, or "" when it starts anything else."""
    script = os.path.abspath(argv[0]) if argv and argv[0] else ""
    folder, name = os.path.split(script)
    if name in DRIVERS and folder.endswith(os.path.join("sm_drivers", "distributed_drivers")):
        return name
    return ""


def take_over() -> None:
    driver = sdk_driver(sys.argv)
    if driver:
        print(
            f"image: SageMaker SDK's {driver} is handed to this image's launcher: train", flush=True
        )
        os.execvp("train", ["train"])


take_over()
