"""The built-in models. Inputs are normalised inside the model with statistics of the whole
training set (computed across ranks), so the exported model takes raw features and the
inference server needs no separate preprocessing step."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from train.hyperparameters import TrainerConfig


def _normalise(inputs: tf.Tensor, mean: np.ndarray, variance: np.ndarray) -> tf.Tensor:
    return tf.keras.layers.Normalization(mean=mean, variance=np.maximum(variance, 1e-6),
                                         name="normalise")(inputs)


def mlp(config: TrainerConfig, input_shape: tuple[int, ...], classes: int,
        mean: np.ndarray, variance: np.ndarray) -> tf.keras.Model:
    inputs = tf.keras.Input(shape=input_shape, name="features")
    hidden = tf.keras.layers.Flatten()(inputs)
    hidden = _normalise(hidden, mean.reshape(-1), variance.reshape(-1))
    for units in config.hidden_layer_sizes:
        hidden = tf.keras.layers.Dense(units, activation="relu")(hidden)
        hidden = tf.keras.layers.Dropout(config.dropout_rate)(hidden)
    outputs = tf.keras.layers.Dense(classes, activation="softmax", name="probabilities")(hidden)
    return tf.keras.Model(inputs, outputs, name="mlp")


def cnn(config: TrainerConfig, input_shape: tuple[int, ...], classes: int,
        mean: np.ndarray, variance: np.ndarray) -> tf.keras.Model:
    image_shape = config.image_dims or input_shape
    if int(np.prod(image_shape)) != int(np.prod(input_shape)):
        raise ValueError(f"image_shape {','.join(map(str, image_shape))} holds "
                         f"{int(np.prod(image_shape))} values but each sample has "
                         f"{int(np.prod(input_shape))}; fix the image_shape hyperparameter")
    if len(image_shape) == 2:
        image_shape = (*image_shape, 1)
    if len(image_shape) != 3:
        raise ValueError(f"the cnn model needs images (H,W,C); samples have shape "
                         f"{input_shape}: set image_shape, e.g. 28,28,1")
    inputs = tf.keras.Input(shape=input_shape, name="features")
    hidden = tf.keras.layers.Reshape(image_shape)(inputs)
    hidden = _normalise(hidden, np.array(mean.mean()), np.array(variance.mean()))
    for filters in config.conv_filter_counts:
        hidden = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(hidden)
        if min(hidden.shape[1], hidden.shape[2]) >= 2:
            hidden = tf.keras.layers.MaxPooling2D()(hidden)
    hidden = tf.keras.layers.GlobalAveragePooling2D()(hidden)
    hidden = tf.keras.layers.Dropout(config.dropout_rate)(hidden)
    outputs = tf.keras.layers.Dense(classes, activation="softmax", name="probabilities")(hidden)
    return tf.keras.Model(inputs, outputs, name="cnn")


BUILDERS = {"mlp": mlp, "cnn": cnn}
