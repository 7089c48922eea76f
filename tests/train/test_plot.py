"""The history chart: which curves share a panel, and a PNG that really decodes."""

import io
import math

import pytest
from PIL import Image

from train.export import write_history
from train.plot import COLOURS, PANEL, history_png, panels, value_range

HISTORY = {
    "loss": [1.0, 0.5, 0.25],
    "val_loss": [1.1, 0.7, 0.5],
    "accuracy": [0.2, 0.6, 0.9],
    "lr": [0.1, 0.1, 0.1],
    "samples_per_sec": [900.0, 1800.0, 1850.0],
}


def test_train_and_validation_share_a_panel_and_lr_is_left_out():
    assert panels(HISTORY) == [
        ("accuracy", {"train": HISTORY["accuracy"]}),
        ("loss", {"train": HISTORY["loss"], "validation": HISTORY["val_loss"]}),
        ("samples_per_sec", {"train": HISTORY["samples_per_sec"]}),
    ]


@pytest.mark.parametrize(
    "series, expected",
    [
        ({"train": [0.0, 1.0]}, (-0.05, 1.05)),
        ({"train": [2.0, 2.0]}, (1.9, 2.1)),  # flat curve: widened around the value
        ({"train": [0.0]}, (-0.5, 0.5)),
        ({"train": [math.nan, math.inf]}, (0.0, 1.0)),  # nothing finite to scale to
        ({"train": [1.0, math.nan], "validation": [3.0]}, (0.9, 3.1)),
    ],
)
def test_value_range(series, expected):
    assert value_range(series) == pytest.approx(expected)


def test_png_has_one_panel_per_metric_with_both_curves_drawn():
    image = Image.open(io.BytesIO(history_png(HISTORY)))
    assert image.format == "PNG" and image.size == (3 * PANEL[0], PANEL[1])
    loss_panel = image.convert("RGB").crop((PANEL[0], 0, 2 * PANEL[0], PANEL[1]))
    colours = {colour for _, colour in loss_panel.getcolors(maxcolors=100_000)}
    assert COLOURS["train"] in colours and COLOURS["validation"] in colours


def test_odd_histories_still_give_a_png(tmp_path):
    for history in ({}, {"loss": [math.nan]}, {"loss": [3.0]}, {"lr": [0.1]}):
        assert Image.open(io.BytesIO(history_png(history))).format == "PNG"
    write_history(HISTORY, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["history.json", "history.png"]
