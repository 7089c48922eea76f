"""Where SageMaker puts things under /opt/ml, relative to a root that tests can move.

Only paths: nothing here touches the file system, so importing it has no effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_ML_ROOT = Path("/opt/ml")


@dataclass(frozen=True)
class MlPaths:
    """`checkpoints` and `tensorboard`: the `LocalPath` of the job's CheckpointConfig and
    TensorBoardOutputConfig when it set one (job.sagemaker_config.configured_paths reads
    them), else SageMaker's defaults under the root."""

    root: Path = DEFAULT_ML_ROOT
    checkpoints: Path | None = None
    tensorboard: Path | None = None

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def resource_config(self) -> Path:
        return self.config_dir / "resourceconfig.json"

    @property
    def hyperparameters(self) -> Path:
        return self.config_dir / "hyperparameters.json"

    @property
    def input_data_config(self) -> Path:
        return self.config_dir / "inputdataconfig.json"

    @property
    def checkpoint_config(self) -> Path:
        return self.config_dir / "checkpointconfig.json"

    @property
    def tensorboard_config(self) -> Path:
        return self.config_dir / "tensorboardoutputconfig.json"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    def channel(self, name: str) -> Path:
        return self.data_dir / name

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def tensorboard_dir(self) -> Path:
        return self.tensorboard or self.output_dir / "tensorboard"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoints or self.root / "checkpoints"

    @property
    def code_dir(self) -> Path:
        return self.root / "code"
