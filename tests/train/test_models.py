"""The image models: built from keras.applications without downloads, initial weights from the
weights channel, per-channel normalisation (in-process)."""

import numpy as np
import pytest
import tensorflow as tf

from job.trainer_config import TrainerConfig
from train.models import BUILDERS, initial_weights_file, load_initial_weights

SHAPE = (32, 32, 3)


def build(name, seed=0):
    tf.keras.utils.set_random_seed(seed)
    mean, variance = np.full(np.prod(SHAPE), 100.0), np.full(np.prod(SHAPE), 400.0)
    return BUILDERS[name](TrainerConfig(model=name), SHAPE, 5, mean, variance)


def backbone(model):
    return next(layer for layer in model.layers if isinstance(layer, tf.keras.Model))


def test_initial_weights_from_a_notop_file_replace_the_random_ones(tmp_path):
    donor = build("mobilenet_v2", seed=1)
    (tmp_path / "weights").mkdir()
    backbone(donor).save_weights(str(tmp_path / "weights" / "mobilenet_notop.h5"))
    model = build("mobilenet_v2", seed=2)
    before = [w.numpy() for w in backbone(model).weights]
    load_initial_weights(model, initial_weights_file(tmp_path / "weights"))
    after = [w.numpy() for w in backbone(model).weights]
    donated = [w.numpy() for w in backbone(donor).weights]
    assert all(np.array_equal(a, d) for a, d in zip(after, donated))
    assert not all(np.array_equal(a, b) for a, b in zip(after, before))


def test_weights_of_another_network_are_refused_with_what_to_use(tmp_path):
    backbone(build("mobilenet_v2")).save_weights(str(tmp_path / "mobilenet_notop.h5"))
    with pytest.raises(
        ValueError,
        match="cannot load as initial weights of resnet50 without its classifier head .*_notop.h5",
    ):
        load_initial_weights(build("resnet50"), tmp_path / "mobilenet_notop.h5")


def test_the_weights_channel_holds_exactly_one_file(tmp_path):
    with pytest.raises(
        ValueError, match="must hold exactly one .h5 file of initial weights; found 0"
    ):
        initial_weights_file(tmp_path)


def test_image_models_refuse_inputs_smaller_than_32_pixels():
    with pytest.raises(ValueError, match="needs images of at least 32x32 pixels.*image_size"):
        BUILDERS["resnet50"](TrainerConfig(), (8, 8, 1), 3, np.zeros(64), np.ones(64))


def test_image_models_normalise_raw_pixels_per_channel():
    model = build("resnet50")
    normalise = model.get_layer("normalise")
    assert normalise.mean.numpy().reshape(-1).tolist() == [100.0] * 3
    assert normalise.variance.numpy().reshape(-1).tolist() == [400.0] * 3
    assert model(np.zeros((2, *SHAPE), np.float32)).shape == (2, 5)


def test_batch_normalisation_statistics_settle_within_a_short_job():
    model = build("mobilenet_v2")
    momenta = {
        layer.momentum
        for layer in backbone(model).layers
        if isinstance(layer, tf.keras.layers.BatchNormalization)
    }
    assert momenta == {0.9}
