"""The built-in trainer's hyperparameters: the one definition of each name, type and range.

The launcher validates a job's hyperparameters.json against this before starting anything,
every rank parses it again into the same `TrainerConfig`, and the SageMaker algorithm
specification is generated from it. This module imports no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from job.hyperparameters import hp

JAX = "jax"  # backend=jax: Keras 3 on JAX (train.framework)
BACKEND_ENV = "TRAIN_KERAS_BACKEND"  # how train.rank_main tells train.framework before it loads


@dataclass(frozen=True)
class TrainerConfig:
    """What the built-in Horovod/Keras trainer does; every field is a hyperparameter."""

    model: str = hp(
        "mlp",
        "Built-in model: mlp (tabular data), cnn (small images), or resnet50 or "
        "mobilenet_v2 (keras.applications, randomly initialised or from the weights channel; "
        "images of at least 32x32).",
        choices=("mlp", "cnn", "resnet50", "mobilenet_v2"),
    )
    epochs: int = hp(10, "Passes over the training data.", minimum=1, maximum=100000)
    global_batch_size: int = hp(
        0,
        "Samples per optimizer step across all devices. 0 = per_device_batch_size x "
        "world size. When set, the same job gives the same optimisation on any device count: "
        "the per-device batch and gradient accumulation are derived from it.",
        minimum=0,
        maximum=10_000_000,
    )
    per_device_batch_size: int = hp(
        32, "Samples per device per step when global_batch_size is 0.", minimum=1, maximum=1_000_000
    )
    max_device_batch_size: int = hp(
        256,
        "The most samples one device computes at once (its memory cap); larger "
        "per-device batches are split into accumulated micro-batches.",
        minimum=1,
        maximum=1_000_000,
    )
    learning_rate: float = hp(
        0.001,
        "Learning rate for base_batch_size samples per step; scaled linearly to the "
        "global batch when scale_learning_rate is true.",
        minimum=1e-12,
        maximum=100.0,
    )
    base_batch_size: int = hp(
        32,
        "The batch that learning_rate was tuned for (linear scaling reference).",
        minimum=1,
        maximum=10_000_000,
    )
    scale_learning_rate: bool = hp(
        True, "Multiply learning_rate by global batch / base_batch_size (Goyal et al. 2017)."
    )
    warmup_epochs: float = hp(
        1.0,
        "Epochs over which the learning rate ramps linearly from learning_rate to the "
        "scaled rate (gradual warmup); 0 disables.",
        minimum=0.0,
        maximum=1000.0,
    )
    optimizer: str = hp("adam", "Optimizer: adam or sgd (with momentum).", choices=("adam", "sgd"))
    momentum: float = hp(0.9, "Momentum of the sgd optimizer.", minimum=0.0, maximum=0.999)
    fp16_allreduce: bool = hp(False, "Compress gradients to float16 for the allreduce.")
    backend: str = hp(
        "tensorflow",
        "tensorflow: tf.keras (Keras 2) with Horovod, or MultiWorkerMirroredStrategy "
        "on the TensorFlow 2.21 image; jax: Keras 3 on JAX with keras.distribution (the "
        "TensorFlow 2.21 image only).",
        choices=("tensorflow", "jax"),
    )
    model_parallel: int = hp(
        1,
        "backend=jax only: the devices each model is split over (the size of the device "
        "mesh's model axis). Every kernel and embedding is sharded over them (a model's own "
        "get_layout_map, if it has one, decides first), so each device holds about "
        "1/model_parallel of the weights and optimizer state; the job's devices / "
        "model_parallel are data-parallel replicas, which the global batch and the learning "
        "rate's linear scaling count. Must divide the job's device count. 1 = data "
        "parallelism (every device holds the whole model).",
        minimum=1,
        maximum=65536,
    )
    hidden_units: str = hp("256,128", "mlp: comma-separated sizes of the hidden layers.")
    conv_filters: str = hp("32,64", "cnn: comma-separated filter counts of the conv blocks.")
    dropout_rate: float = hp(0.1, "Dropout after each hidden block.", minimum=0.0, maximum=0.9)
    image_shape: str = hp(
        "",
        "cnn: shape of one image as H,W,C (e.g. 8,8,1) when the data holds flat rows; "
        "empty = the data's own shape.",
    )
    image_size: int = hp(
        0,
        "Images (image folders, TFRecord image features) are resized to image_size x "
        "image_size pixels; 0 = the size of the channel's first image.",
        minimum=0,
        maximum=4096,
    )
    augment: bool = hp(
        False,
        "Image data: a random horizontal flip and a random crop (of the image padded "
        "by 1/8) of every training image.",
    )
    feature_key: str = hp(
        "image",
        "TFRecord: the tf.train.Example feature with the sample (a float or int64 "
        "list, or encoded JPEG/PNG bytes).",
    )
    label_key: str = hp("label", "TFRecord: the tf.train.Example int64 feature with the class.")
    shuffle_buffer: int = hp(
        10000, "Samples in the shuffle buffer of each rank.", minimum=1, maximum=100_000_000
    )
    seed: int = hp(
        1234, "Random seed for weights, shuffling and dropout.", minimum=0, maximum=2**31 - 1
    )
    checkpoint_every_epochs: int = hp(
        1,
        "Epochs between checkpoints to the checkpoint folder; 0 disables.",
        minimum=0,
        maximum=100000,
    )
    checkpoint_every_minutes: float = hp(
        30.0,
        "Minutes of training between checkpoints inside an epoch, so a failure or restart "
        "loses at most that much; 0: at epoch ends only.",
        minimum=0,
        maximum=100000,
    )
    keep_checkpoints: int = hp(
        2, "Newest checkpoints kept; older ones are deleted.", minimum=1, maximum=1000
    )
    profile_steps: str = hp(
        "",
        "Training batches to profile, counted from this run's start, as first,last (such as "
        "20,30): a trace in the TensorBoard folder's plugins/profile; empty: none.",
    )

    def __post_init__(self) -> None:
        if self.model_parallel > 1 and self.backend != JAX:
            raise ValueError(
                f"hyperparameter model_parallel={self.model_parallel} splits the model over "
                f"devices with Keras 3 on JAX only, but backend={self.backend}; set "
                "backend=jax (the TensorFlow 2.21 image) or model_parallel=1"
            )
        for name in ("hidden_units", "conv_filters"):
            if not _positive_ints(getattr(self, name)):
                raise ValueError(
                    f"hyperparameter {name}={getattr(self, name)!r} is invalid: expected "
                    "comma-separated positive integers such as 256,128"
                )
        if self.profile_steps and (
            len(steps := _positive_ints(self.profile_steps)) != 2 or steps[0] > steps[1]
        ):
            raise ValueError(
                f"hyperparameter profile_steps={self.profile_steps!r} is invalid: expected the "
                "first and last step to profile, such as 20,30"
            )
        if self.image_shape and len(_positive_ints(self.image_shape)) != 3:
            raise ValueError(
                f"hyperparameter image_shape={self.image_shape!r} is invalid: expected H,W,C "
                "such as 28,28,1"
            )

    @property
    def hidden_layer_sizes(self) -> list[int]:
        return _positive_ints(self.hidden_units)

    @property
    def conv_filter_counts(self) -> list[int]:
        return _positive_ints(self.conv_filters)

    @property
    def profiled_steps(self) -> tuple[int, ...] | int:
        """Keras TensorBoard's profile_batch: (first, last), or 0 for none."""
        return tuple(_positive_ints(self.profile_steps)) if self.profile_steps else 0

    @property
    def image_dims(self) -> tuple[int, ...] | None:
        return tuple(_positive_ints(self.image_shape)) if self.image_shape else None


def _positive_ints(text: str) -> list[int]:
    """Parse '256,128' into [256, 128]; [] when anything is not a positive integer."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        return []
    return values if values and all(v > 0 for v in values) else []
