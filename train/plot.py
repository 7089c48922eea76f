"""The training-history chart (history.png): one panel per metric, train and validation curves.

Drawn with Pillow rather than matplotlib: importing matplotlib and laying out a figure took
0.8-1.5 s at the end of every job, inside the teardown users wait for, for a chart
this simple. Pillow imports in milliseconds and draws this in a few more.
"""

from __future__ import annotations

import io
import math

from PIL import Image, ImageDraw, ImageFont

PANEL = (420, 300)  # width, height of one metric's panel, in pixels
MARGIN = {"left": 64, "right": 16, "top": 30, "bottom": 40}
COLOURS = {"train": (31, 119, 180), "validation": (255, 127, 14)}
AXIS, GRID, TEXT = (60, 60, 60), (225, 225, 225), (20, 20, 20)


def panels(history: dict[str, list[float]]) -> list[tuple[str, dict[str, list[float]]]]:
    """(metric, {series name: values}) per plotted metric: `loss` and `val_loss` share a
    panel; the learning rate is not plotted (it is in history.json)."""
    metrics = sorted({key.removeprefix("val_") for key in history if key != "lr"})
    return [
        (
            metric,
            {
                name: history[key]
                for name, key in (("train", metric), ("validation", f"val_{metric}"))
                if key in history
            },
        )
        for metric in metrics
    ]


def value_range(series: dict[str, list[float]]) -> tuple[float, float]:
    """The y-axis range: the finite values' span, widened when they are all equal."""
    values = [v for values in series.values() for v in values if math.isfinite(v)]
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 0.5
    return low - pad, high + pad


def _draw_panel(
    draw: ImageDraw.ImageDraw,
    origin: int,
    metric: str,
    series: dict[str, list[float]],
    font: ImageFont.FreeTypeFont | ImageFont.ImageFont,  # load_default's, by FreeType's presence
) -> None:
    left, top = origin + MARGIN["left"], MARGIN["top"]
    right, bottom = origin + PANEL[0] - MARGIN["right"], PANEL[1] - MARGIN["bottom"]
    epochs = max(len(values) for values in series.values())
    low, high = value_range(series)

    def x_at(epoch: int) -> float:  # epochs count from 1
        return left + (right - left) * ((epoch - 1) / (epochs - 1) if epochs > 1 else 0.5)

    def y_at(value: float) -> float:
        return bottom - (bottom - top) * (value - low) / (high - low)

    for tick in range(5):
        value = low + (high - low) * tick / 4
        y = y_at(value)
        draw.line([(left, y), (right, y)], fill=GRID)
        draw.text((left - 6, y), f"{value:.4g}", fill=TEXT, font=font, anchor="rm")
    step = max(1, math.ceil(epochs / 10))
    for epoch in range(1, epochs + 1, step):
        draw.text((x_at(epoch), bottom + 6), str(epoch), fill=TEXT, font=font, anchor="mt")
    draw.rectangle([left, top, right, bottom], outline=AXIS)
    draw.text(((left + right) / 2, PANEL[1] - 6), "epoch", fill=TEXT, font=font, anchor="mb")
    draw.text((left, 8), metric, fill=TEXT, font=font, anchor="lt")
    legend_right: float = right  # the legend sits in the top margin, right-aligned, one row
    for name, values in reversed(series.items()):
        points = [(x_at(i + 1), y_at(v)) for i, v in enumerate(values) if math.isfinite(v)]
        colour = COLOURS[name]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for x, y in points:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour)
        draw.text((legend_right, 8), name, fill=colour, font=font, anchor="rt")
        legend_right -= draw.textlength(name, font=font) + 12


def history_png(history: dict[str, list[float]]) -> bytes:
    """The chart as PNG bytes (no file: the caller writes it atomically)."""
    plotted = panels(history)
    image = Image.new("RGB", (PANEL[0] * max(1, len(plotted)), PANEL[1]), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=12)
    for index, (metric, series) in enumerate(plotted):
        _draw_panel(draw, index * PANEL[0], metric, series, font)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
