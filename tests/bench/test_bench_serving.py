"""`make bench-serve`'s own parts, without wrk: the careful baseline must answer what the model
computes (a reference that answered wrongly or cheaply would make every ratio meaningless), wrk's
latency lines must be read in their units, and a cell is judged against its targets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.serving import (
    BASELINE,
    SERVE,
    Result,
    _percentile_ms,
    _requests_per_s,
    baseline_app,
    csv_row,
    measurements,
)
from tests.serve.serve_testing import CLASSES, INSTANCES, expected_probabilities, write_model


def test_the_baseline_answers_what_the_model_computes(tmp_path):
    write_model(tmp_path / "model")
    client = baseline_app(tmp_path).test_client()
    body = b"\n".join(csv_row(np.array(row)) for row in INSTANCES)
    answer = client.post("/invocations", data=body, headers={"Content-Type": "text/csv"})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    predictions = answer.get_json()["predictions"]
    expected = expected_probabilities(INSTANCES)
    np.testing.assert_allclose([p["probabilities"] for p in predictions], expected, rtol=1e-5)
    assert [p["class"] for p in predictions] == [CLASSES[i] for i in expected.argmax(axis=1)]
    refused = client.post(
        "/invocations",
        data=json.dumps({"instances": INSTANCES}),
        headers={"Content-Type": "application/json"},
    )
    assert refused.status_code == 415
    assert client.get("/ping").status_code == 200


WRK_LATENCY = """\
  Latency Distribution
     50%  812.00us
     75%    1.20ms
     90%    2.51ms
     99%    1.03s
"""


def test_wrk_percentiles_are_read_in_their_units():
    assert _percentile_ms(WRK_LATENCY, 50) == pytest.approx(0.812)
    assert _percentile_ms(WRK_LATENCY, 90) == pytest.approx(2.51)
    assert _percentile_ms(WRK_LATENCY, 99) == pytest.approx(1030.0)
    with pytest.raises(RuntimeError, match="no 95% latency"):
        _percentile_ms(WRK_LATENCY, 95)


def test_wrk_rate_is_read_and_its_absence_named():
    assert _requests_per_s("Requests/sec:   1234.56\nTransfer/sec: 1MB\n") == pytest.approx(1234.56)
    with pytest.raises(RuntimeError, match="no Requests/sec in wrk's output"):
        _requests_per_s(WRK_LATENCY)  # wrk that failed to connect prints no rate


def result(requests_per_s: float, p99_ms: float, non_2xx: int = 0) -> Result:
    return Result(requests_per_s, p99_ms / 2, p99_ms, 1.0, non_2xx)


def test_each_cell_is_judged_against_its_targets():
    rows = {
        row.metric: row
        for row in measurements(
            {
                "mlp": {
                    1: {SERVE: result(990, 3.0), BASELINE: result(1000, 2.5)},
                    8: {SERVE: result(2000, 16.0, non_2xx=1), BASELINE: result(1500, 10.0)},
                },
                "cnn": {
                    32: {SERVE: result(700, 50.0), BASELINE: result(300, 120.0)},
                    64: {SERVE: result(500, 130.0), BASELINE: result(400, 120.0)},
                },
            }
        )
    }
    assert rows["serve mlp c=1 throughput"].met is False  # 0.99x, target 1.0x
    assert rows["serve mlp c=1 p99"].met is True  # 1.2x, target 1.5x
    assert rows["serve mlp c=8 throughput"].met is True
    assert rows["serve mlp c=8 p99"].met is False  # 1.6x
    assert rows["serve mlp c=8 non-2xx answers"].met is False
    assert rows["serve cnn c=32 throughput"].met is True  # 2.33x, target 2.0x
    assert rows["serve cnn c=64 throughput"].met is None  # no throughput target at 64
    assert rows["serve cnn c=64 p99"].met is False  # the CNN's tail may not exceed the baseline's
