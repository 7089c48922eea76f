"""The built-in models. Inputs are normalised inside the model with statistics of a bounded
sample of the training set (gathered across ranks), so the exported model takes raw features
(raw pixel values 0..255 for images) and the inference server needs no separate preprocessing.

resnet50 and mobilenet_v2 are keras.applications networks without their classifier head,
randomly initialised: nothing can be downloaded at run time. Initial weights come from the
optional `weights` channel instead (`load_initial_weights`), for example the `*_notop.h5` file
that keras.applications publishes. On GPUs they compute in mixed precision (float16 with
float32 variables and a float32 output layer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from job.trainer_config import TrainerConfig
from train.framework import has_gpu, keras


def _normalise(inputs, mean: np.ndarray, variance: np.ndarray):
    return keras.layers.Normalization(
        mean=mean, variance=np.maximum(variance, 1e-6), name="normalise"
    )(inputs)


def mlp(
    config: TrainerConfig,
    input_shape: tuple[int, ...],
    classes: int,
    mean: np.ndarray,
    variance: np.ndarray,
) -> keras.Model:
    inputs = keras.Input(shape=input_shape, name="features")
    hidden = keras.layers.Flatten()(inputs)
    hidden = _normalise(hidden, mean.reshape(-1), variance.reshape(-1))
    for units in config.hidden_layer_sizes:
        hidden = keras.layers.Dense(units, activation="relu")(hidden)
        hidden = keras.layers.Dropout(config.dropout_rate)(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="probabilities")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


def cnn(
    config: TrainerConfig,
    input_shape: tuple[int, ...],
    classes: int,
    mean: np.ndarray,
    variance: np.ndarray,
) -> keras.Model:
    image_shape = config.image_dims or input_shape
    if int(np.prod(image_shape)) != int(np.prod(input_shape)):
        raise ValueError(
            f"image_shape {','.join(map(str, image_shape))} holds "
            f"{int(np.prod(image_shape))} values but each sample has "
            f"{int(np.prod(input_shape))}; fix the image_shape hyperparameter"
        )
    if len(image_shape) == 2:
        image_shape = (*image_shape, 1)
    if len(image_shape) != 3:
        raise ValueError(
            f"the cnn model needs images (H,W,C); samples have shape "
            f"{input_shape}: set image_shape, e.g. 28,28,1"
        )
    inputs = keras.Input(shape=input_shape, name="features")
    hidden = keras.layers.Reshape(image_shape)(inputs)
    hidden = _normalise(hidden, np.array(mean.mean()), np.array(variance.mean()))
    for filters in config.conv_filter_counts:
        hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(hidden)
        if min(hidden.shape[1], hidden.shape[2]) >= 2:
            hidden = keras.layers.MaxPooling2D()(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    hidden = keras.layers.Dropout(config.dropout_rate)(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="probabilities")(hidden)
    return keras.Model(inputs, outputs, name="cnn")


def _channel_moments(
    mean: np.ndarray, variance: np.ndarray, channels: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and variance from per-pixel ones (the law of total variance)."""
    pixel_mean = mean.reshape(-1, channels)
    channel_mean = pixel_mean.mean(axis=0)
    second = (variance.reshape(-1, channels) + pixel_mean**2).mean(axis=0)
    return channel_mean, np.maximum(second - channel_mean**2, 0)


# keras.applications' MobileNetV2 keeps 0.999 of its moving statistics per step: they need
# thousands of steps to settle, and until then the model predicts at chance outside training
# (digits, 135 steps: 7.5% validation accuracy with the same weights at 56% in training mode).
BATCH_NORM_MOMENTUM = 0.9


def _application(factory, name: str):
    def build(
        config: TrainerConfig,
        input_shape: tuple[int, ...],
        classes: int,
        mean: np.ndarray,
        variance: np.ndarray,
    ) -> keras.Model:
        if len(input_shape) != 3 or min(input_shape[:2]) < 32:
            raise ValueError(
                f"the {name} model needs images of at least 32x32 pixels; samples "
                f"have shape {input_shape}: use an image channel (image folder or "
                f"TFRecord images) and set image_size to 32 or more"
            )
        inputs = keras.Input(shape=input_shape, name="features")
        hidden = _normalise(inputs, *_channel_moments(mean, variance, input_shape[2]))
        backbone = factory(include_top=False, weights=None, input_shape=input_shape, pooling="avg")
        for layer in backbone.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = BATCH_NORM_MOMENTUM
        hidden = keras.layers.Dropout(config.dropout_rate)(backbone(hidden))
        outputs = keras.layers.Dense(
            classes, activation="softmax", dtype="float32", name="probabilities"
        )(hidden)
        return keras.Model(inputs, outputs, name=name)

    return build


BUILDERS = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet50": _application(keras.applications.ResNet50, "resnet50"),
    "mobilenet_v2": _application(keras.applications.MobileNetV2, "mobilenet_v2"),
}
IMAGE_MODELS = ("resnet50", "mobilenet_v2")


def use_mixed_precision(model: str) -> bool:
    """float16 compute for the image models on GPUs (CPUs gain nothing from it)."""
    if model in IMAGE_MODELS and has_gpu():
        keras.mixed_precision.set_global_policy("mixed_float16")
        return True
    return False


def initial_weights_file(folder: Path) -> Path:
    """The one .h5 file of the weights channel."""
    files = sorted(p for p in folder.rglob("*.h5") if not p.name.startswith((".", "_")))
    if len(files) != 1:
        raise ValueError(
            f"the weights channel ({folder}) must hold exactly one .h5 file of "
            f"initial weights; found {len(files)}"
        )
    return files[0]


def load_initial_weights(model: keras.Model, path: Path) -> None:
    """Weights of the network without its head (a keras.applications `*_notop.h5` file)."""
    if model.name not in IMAGE_MODELS:
        raise ValueError(
            f"the weights channel sets initial weights of the "
            f"{' or '.join(IMAGE_MODELS)} models; model {model.name} has none "
            f"to load"
        )
    try:
        next(layer for layer in model.layers if isinstance(layer, keras.Model)).load_weights(
            str(path)
        )
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{path}: cannot load as initial weights of {model.name} "
            f"without its classifier head ({error}); use the matching "
            f"keras.applications *_notop.h5 file"
        ) from None
