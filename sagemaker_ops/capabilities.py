"""What this image supports, in SageMaker's words.

The training job checks, the algorithm registration and the deploy/transform checks all read
these names. Where the container already defines a fact (the built-in channels, the S3
distributions, the checkpoint folder, the media types `serve` speaks) it is imported from
there; the rest has no other home: the MIME names of the channel formats (the trainer goes by
file suffix), the input modes the trainer can read, and the instance types.

- Training channels: `train` (required) and `validation` (optional), each a folder of
  `text/csv` files (no header, label in the first column) or `application/x-npz` files (arrays
  `x` and `y`). Read as File or FastFile: the trainer reads files, so Pipe mode (FIFOs) is not
  supported. Either S3 distribution works: ShardedByS3Key gives each host part of the objects.
- Serving (`serve`, port 8080): requests in JSON (`{"instances": ...}`), CSV rows, JSON lines
  or a .npy array; answers in the same four types, chosen by the Accept header.
- Instance types: every name below is checked against the enum in botocore's SageMaker model
  (the tests do, and so does every request before it is sent). GPU types need the GPU build of
  the image; the default build trains on CPU only.
"""

from __future__ import annotations

from job.paths import MlPaths
from job.sagemaker_config import DISTRIBUTIONS
from job.validated import BUILTIN_CHANNELS
from serve.codecs import CSV, JSONLINES, MEDIA_TYPES
from train.data import CONTENT_TYPES

TRAINING_CHANNELS = {name: name == "train" for name in BUILTIN_CHANNELS}  # name -> required
TRAINING_CONTENT_TYPES = tuple(CONTENT_TYPES)  # what the trainer reads (train/data.py)
TRAINING_INPUT_MODES = ("File", "FastFile")
S3_DISTRIBUTIONS = DISTRIBUTIONS
CHECKPOINT_LOCAL_PATH = str(MlPaths().checkpoint_dir)
TENSORBOARD_LOCAL_PATH = str(MlPaths().tensorboard_dir)  # where the trainer writes events
MAX_KEEP_ALIVE_SECONDS = 21600  # KeepAlivePeriodInSeconds' range in the API (botocore's schema)

SERVING_CONTENT_TYPES = MEDIA_TYPES  # what `serve` decodes, and answers in
SERVING_RESPONSE_TYPES = MEDIA_TYPES
LINE_CONTENT_TYPES = (CSV, JSONLINES)  # one record per line

CPU_TRAINING_INSTANCE_TYPES = (
    "ml.m5.xlarge",
    "ml.m5.2xlarge",
    "ml.m5.4xlarge",
    "ml.m5.12xlarge",
    "ml.m5.24xlarge",
    "ml.c5.2xlarge",
    "ml.c5.4xlarge",
    "ml.c5.9xlarge",
    "ml.c5.18xlarge",
    "ml.c5n.9xlarge",
    "ml.c5n.18xlarge",
    "ml.m6i.2xlarge",
    "ml.m6i.8xlarge",
    "ml.m6i.32xlarge",
    "ml.c6i.8xlarge",
    "ml.c6i.32xlarge",
)
GPU_TRAINING_INSTANCE_TYPES = (
    "ml.g4dn.xlarge",
    "ml.g4dn.12xlarge",
    "ml.g5.xlarge",
    "ml.g5.2xlarge",
    "ml.g5.12xlarge",
    "ml.g5.48xlarge",
    "ml.p3.2xlarge",
    "ml.p3.8xlarge",
    "ml.p3.16xlarge",
    "ml.p3dn.24xlarge",
    "ml.p4d.24xlarge",
    "ml.p5.48xlarge",
)
REALTIME_INSTANCE_TYPES = (
    "ml.t2.medium",
    "ml.m5.large",
    "ml.m5.xlarge",
    "ml.m5.2xlarge",
    "ml.c5.large",
    "ml.c5.xlarge",
    "ml.c5.2xlarge",
    "ml.g4dn.xlarge",
    "ml.g5.xlarge",
)
TRANSFORM_INSTANCE_TYPES = (
    "ml.m5.large",
    "ml.m5.xlarge",
    "ml.m5.2xlarge",
    "ml.m5.4xlarge",
    "ml.c5.xlarge",
    "ml.c5.2xlarge",
    "ml.c5.4xlarge",
    "ml.g4dn.xlarge",
    "ml.g5.xlarge",
)
