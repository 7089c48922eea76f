"""The Flask app with a real Keras model: every format in and out, every error with its message."""

from __future__ import annotations

import csv
import io
import json
import logging
import pickle
import threading

import numpy as np
import pytest
from serve_testing import CLASSES, INSTANCES, app_for, expected_probabilities

from serve.config import ServeConfig
from serve.model import Model

NESTED = np.array(INSTANCES).reshape(-1, 2, 2).tolist()


def npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def csv_text(rows) -> str:
    return "".join(",".join(str(value) for value in row) + "\n" for row in rows)


INTEGERS = (np.array(INSTANCES) * 4).astype(np.int16)

BODIES = {  # name: (content type, body, the instances it holds)
    "json-instances": ("application/json", json.dumps({"instances": INSTANCES}), INSTANCES),
    "json-inputs": ("application/json", json.dumps({"inputs": INSTANCES}), INSTANCES),
    "json-list": ("application/json", json.dumps(INSTANCES), INSTANCES),
    "json-nested": ("application/json", json.dumps({"instances": NESTED}), INSTANCES),
    "json-charset": ("application/json; charset=utf-8", json.dumps(INSTANCES), INSTANCES),
    "csv": ("text/csv", csv_text(INSTANCES), INSTANCES),
    "csv-charset-crlf": (
        "text/csv; charset=UTF-8",
        csv_text(INSTANCES).replace("\n", "\r\n"),
        INSTANCES,
    ),
    "csv-latin-1": ("text/csv;charset=latin-1", csv_text(INSTANCES).encode("latin-1"), INSTANCES),
    "csv-iso-8859-1": (
        "text/csv; charset=ISO-8859-1",
        csv_text(INSTANCES).encode("latin-1"),
        INSTANCES,
    ),
    "csv-us-ascii": ("text/csv; charset=us-ascii", csv_text(INSTANCES).encode("ascii"), INSTANCES),
    "json-utf-16": (
        "application/json; charset=utf-16",
        json.dumps(INSTANCES).encode("utf-16"),
        INSTANCES,
    ),
    "csv-utf-16le": (
        "text/csv; charset=UTF-16LE",
        csv_text(INSTANCES).encode("utf-16-le"),
        INSTANCES,
    ),
    "jsonlines": (
        "application/jsonlines",
        "".join(json.dumps(i) + "\n" for i in INSTANCES),
        INSTANCES,
    ),
    "npy-float32": ("application/x-npy", npy(np.array(INSTANCES, np.float32)), INSTANCES),
    "npy-float64-nested": ("application/x-npy", npy(np.array(NESTED)), INSTANCES),
    "npy-int16-big-endian": ("application/x-npy", npy(INTEGERS.astype(">i2")), INTEGERS),
    "npy-fortran-order": ("application/x-npy", npy(np.asfortranarray(INSTANCES)), INSTANCES),
}


def parse_predictions(response) -> tuple[list, np.ndarray]:
    """Labels and probabilities from a response body in any of the four formats."""
    mimetype, body = response.mimetype, response.get_data()
    if mimetype == "application/x-npy":
        probabilities = np.load(io.BytesIO(body), allow_pickle=False)
        return [CLASSES[i] for i in probabilities.argmax(axis=1)], probabilities
    if mimetype == "text/csv":
        rows = list(csv.reader(io.StringIO(body.decode())))
        return [row[0] for row in rows], np.array([row[1:] for row in rows], float)
    if mimetype == "application/json":
        document = json.loads(body)  # TF Serving answers "inputs" (columnar) with "outputs"
        records = document["outputs" if "outputs" in document else "predictions"]
    else:
        assert mimetype == "application/jsonlines"
        records = [json.loads(line) for line in body.decode().splitlines()]
    return [r["class"] for r in records], np.array([r["probabilities"] for r in records])


ACCEPTS = {
    None: "application/json",
    "": "application/json",
    "*/*": "application/json",
    "application/json": "application/json",
    "application/json; charset=utf-8": "application/json",
    "text/csv": "text/csv",
    "text/csv; charset=utf-8; q=0.9": "text/csv",
    "text/*": "text/csv",
    "application/jsonlines": "application/jsonlines",
    "application/x-npy": "application/x-npy",
    "text/html, application/json;q=0.1, application/x-npy;q=0.5": "application/x-npy",
}


def invoke(client, content_type, body, accept=None):
    headers = {"Content-Type": content_type}
    if accept is not None:
        headers["Accept"] = accept
    return client.post("/invocations", data=body, headers=headers)


@pytest.mark.parametrize("body_name", BODIES)
def test_every_content_type_gives_the_models_predictions(client, body_name):
    content_type, body, instances = BODIES[body_name]
    response = invoke(client, content_type, body)
    assert response.status_code == 200, response.get_data(as_text=True)
    labels, probabilities = parse_predictions(response)
    expected = expected_probabilities(instances)
    assert labels == [CLASSES[i] for i in expected.argmax(axis=1)]
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("accept", ACCEPTS)
def test_every_accept_gives_its_format(client, accept):
    response = invoke(client, "text/csv", csv_text(INSTANCES), accept)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == ACCEPTS[accept]
    labels, probabilities = parse_predictions(response)
    expected = expected_probabilities(INSTANCES)
    assert labels == [CLASSES[i] for i in expected.argmax(axis=1)]
    np.testing.assert_allclose(probabilities, expected, rtol=1e-5, atol=1e-7)


def test_json_answer_is_exactly_one_record_per_instance(client):
    response = invoke(client, "application/json", json.dumps({"instances": INSTANCES[:1]}))
    body = response.get_json()
    assert list(body) == ["predictions"]
    [record] = body["predictions"]
    assert set(record) == {"class", "probabilities"}
    assert record["class"] == CLASSES[int(expected_probabilities(INSTANCES[:1]).argmax())]
    assert sum(record["probabilities"]) == pytest.approx(1.0, abs=1e-6)


PICKLED_OBJECTS = npy(np.array([{"not": "numbers"}, [1, 2]], dtype=object))


def npy_header(shape: tuple, data: bytes) -> bytes:
    """An .npy body whose header declares `shape` of float32, whatever data follows."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue() + data


TERABYTE_HEADER = npy_header((10**6, 10**6, 4), bytes(32))

ERRORS = [
    # (content type, body, status, exact error message)
    ("application/json", "", 400, "the request body is empty: send at least one instance"),
    (
        "application/json",
        "{oops",
        400,
        "the body is not valid JSON: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)",
    ),
    (
        "application/json",
        '{"data": [[1, 2, 3, 4]]}',
        400,
        'a JSON object body needs exactly one of the keys "instances" or "inputs" (and '
        "optionally \"signature_name\"), got keys ['data']",
    ),
    (
        "application/json",
        '{"inputs": {"x": [[1, 2, 3, 4]]}}',
        400,
        "the model's inputs are input_1; missing: input_1; unknown: x",
    ),
    (
        "application/json",
        '{"instances": [[1, 2, 3, 4]], "signature_name": "predict"}',
        400,
        "signature_name 'predict' is not served; this model is served through 'serving_default'",
    ),
    ("application/json", "4", 400, "expected a list of instances, got a JSON int"),
    ("application/json", "[]", 400, "there are no instances to predict"),
    (
        "application/json",
        "[[1, 2, 3]]",
        400,
        "each instance has shape [3], but the model expects [2, 2] (or a flat row of 4 values)",
    ),
    (
        "application/json",
        "[1, 2, 3, 4]",
        400,
        "each instance has shape [], but the model expects [2, 2] (or a flat row of 4 values)",
    ),
    (
        "application/json",
        "[[1, 2, 3, 4], [1, 2, 3]]",
        400,
        "instance 1 has shape [3], but instance 0 has shape [4]",
    ),
    (
        "application/json",
        '[[1, 2, 3, 4], [1, "2", 3, 4]]',
        400,
        "instance 1 is not a number or an array of numbers",
    ),
    (
        "application/json",
        "[[1, 2, 3, 4], [1, null, 3, 4]]",
        400,
        "instance 1 is not a number or an array of numbers",
    ),
    (
        "application/json",
        "[[[1, 2], [3]]]",
        400,
        "instance 0 is not a regular array: its rows differ in length",
    ),
    (
        "application/json",
        "[[1, 2, 3, 4], [1, NaN, 3, 4]]",
        400,
        "instance 1 has a value at position [0, 1] that is NaN, infinite or beyond the float32 "
        "range",
    ),
    (
        "application/json",
        '{"instances": [[[1, 2], [3, -Infinity]]]}',
        400,
        "instance 0 has a value at position [1, 1] that is NaN, infinite or beyond the float32 "
        "range",
    ),
    ("application/json", "[" + "[" * 100000 + "]" * 100001, 400, "the body is nested too deeply"),
    (
        "text/csv",
        "1,2,3,4\n5,6,7,1e39\n",
        400,
        "instance 1 has a value at position [1, 1] that is NaN, infinite or beyond the float32 "
        "range",
    ),
    (
        "text/csv",
        "1,2,3,4\nnan,6,7,8\n",
        400,
        "instance 1 has a value at position [0, 0] that is NaN, infinite or beyond the float32 "
        "range",
    ),
    (
        "text/csv",
        "a,b,c,d\n1,2,3,4\n",
        400,
        "instance 0 (line 1), value 1: 'a' is not a number (CSV input must not have a header row)",
    ),
    ("text/csv", "1,2,3,4\n1,2,3\n", 400, "instance 1 (line 2) has 3 values, but line 1 has 4"),
    ("text/csv", "1,2,3,4\n1,,3,4\n", 400, "instance 1 (line 2), value 2: '' is not a number"),
    (
        "text/csv",
        "1,2,3\n4,5,6\n",
        400,
        "each instance has shape [3], but the model expects [2, 2] (or a flat row of 4 values)",
    ),
    ("text/csv", "\n\n", 400, "there are no instances to predict"),
    (
        "text/csv",
        b"\xff1,2,3,4",
        400,
        "the body is not valid utf-8 text: invalid start byte at byte 0",
    ),
    (
        "text/csv; charset=klingon",
        "1,2,3,4",
        415,
        "charset 'klingon' is not supported; use one of ascii, latin-1, utf-16, utf-8",
    ),
    (
        "text/csv; charset=punycode",
        "1,2,3,4-" + "z" * 100000,
        415,
        "charset 'punycode' is not supported; use one of ascii, latin-1, utf-16, utf-8",
    ),
    (
        "application/json; charset=zlib",
        "[[1, 2, 3, 4]]",
        415,
        "charset 'zlib' is not supported; use one of ascii, latin-1, utf-16, utf-8",
    ),
    (
        "application/jsonlines",
        "[1, 2, 3, 4]\n[1, 2,\n",
        400,
        "instance 1 (line 2) is not valid JSON: Expecting value: line 1 column 7 (char 6)",
    ),
    (
        "application/x-npy",
        PICKLED_OBJECTS,
        400,
        ".npy arrays must hold numbers, got dtype object (object arrays are pickles and are never "
        "loaded)",
    ),
    (
        "application/x-npy",
        npy(np.array(["a", "b"])),
        400,
        ".npy arrays must hold numbers, got dtype <U1",
    ),
    (
        "application/x-npy",
        npy(np.array([[True] * 4])),
        400,
        ".npy arrays must hold numbers, got dtype bool",
    ),
    (
        "application/x-npy",
        npy(np.zeros((2, 4), np.float32))[:-4],
        400,
        "the .npy header declares shape [2, 4] of float32 (32 bytes), but 28 bytes of data "
        "follow it",
    ),
    (
        "application/x-npy",
        TERABYTE_HEADER,
        400,
        "the .npy header declares shape [1000000, 1000000, 4] of float32 (16000000000000 bytes), "
        "but 32 bytes of data follow it",
    ),
    (
        "application/x-npy",
        npy_header((-1, 4), b""),
        400,
        "the .npy header declares shape [-1, 4]: every dimension must be between 0 and 2147483647",
    ),
    (
        "application/x-npy",
        npy_header((-2, -2), bytes(16)),
        400,
        "the .npy header declares shape [-2, -2]: every dimension must be between 0 and 2147483647",
    ),
    (
        "application/x-npy",
        npy_header((0, 10**20), b""),
        400,
        "the .npy header declares shape [0, 100000000000000000000]: every dimension must be "
        "between 0 and 2147483647",
    ),
    (
        "application/x-npy",
        npy(np.zeros((2, 3), np.float32)),
        400,
        "each instance has shape [3], but the model expects [2, 2] (or a flat row of 4 values)",
    ),
    (
        "application/x-npy",
        npy(np.float32(1.0)),
        400,
        "expected a list of instances, got a single number",
    ),
    (
        "application/x-npy",
        npy(np.zeros((0, 4), np.float32)),
        400,
        "there are no instances to predict",
    ),
    (
        "application/x-npy",
        npy(np.array([[1, 2, 3, np.inf]], np.float32)),
        400,
        "instance 0 has a value at position [1, 1] that is NaN, infinite or beyond the float32 "
        "range",
    ),
    (
        "text/plain",
        "1,2,3,4",
        415,
        "Content-Type 'text/plain' is not supported; use one of "
        "application/json, text/csv, application/jsonlines, "
        "application/x-npy",
    ),
    (
        "",
        "1,2,3,4",
        415,
        "Content-Type '(none)' is not supported; use one of application/json, "
        "text/csv, application/jsonlines, application/x-npy",
    ),
]


@pytest.mark.parametrize(
    "content_type, body, status, message",
    ERRORS,
    ids=[f"{i}-{e[0] or 'none'}" for i, e in enumerate(ERRORS)],
)
def test_bad_requests_say_what_is_wrong(client, content_type, body, status, message):
    response = invoke(client, content_type, body)
    assert (response.status_code, response.get_json()) == (status, {"error": message})


def test_a_pickle_is_never_loaded(client, tmp_path):
    class Bomb:
        def __reduce__(self):
            return (open, (str(tmp_path / "exploded"), "w"))

    for body in (pickle.dumps([Bomb()]), npy(np.array([Bomb()], dtype=object))):
        response = invoke(client, "application/x-npy", body)
        assert response.status_code == 400
        assert not (tmp_path / "exploded").exists()
    assert response.get_json()["error"].endswith("(object arrays are pickles and are never loaded)")
    raw = invoke(client, "application/x-npy", pickle.dumps([1.0, 2.0]))
    assert raw.get_json()["error"].startswith(
        "the body is not a valid .npy array: the magic string is not correct"
    )


def test_unacceptable_accept_is_406(client):
    response = invoke(client, "text/csv", "1,2,3,4", "text/html, application/xml")
    assert (response.status_code, response.get_json()) == (
        406,
        {
            "error": "cannot answer in any type the Accept header 'text/html, application/xml' "
            "allows; accept one of application/json, text/csv, application/jsonlines, "
            "application/x-npy"
        },
    )


def test_body_over_the_payload_limit_is_413(client, config):
    document = json.dumps({"instances": INSTANCES})
    at_limit = document + " " * (config.max_payload_bytes - len(document))
    assert invoke(client, "application/json", at_limit).status_code == 200
    response = invoke(client, "application/json", at_limit + " ")
    assert (response.status_code, response.get_json()) == (
        413,
        {
            "error": "the request body is larger than 1 MB, the limit set by "
            "SAGEMAKER_MAX_PAYLOAD_IN_MB; split it into smaller requests"
        },
    )


def test_unknown_path_is_404_and_wrong_method_405(client):
    missing = client.get("/predict")
    assert (missing.status_code, missing.get_json()) == (
        404,
        {
            "error": "no such path '/predict'; use GET /ping, POST /invocations, "
            "GET /execution-parameters, GET /metrics"
        },
    )
    wrong = client.get("/invocations")
    assert (wrong.status_code, wrong.get_json()) == (
        405,
        {"error": "GET is not allowed on /invocations; use OPTIONS, POST"},
    )
    assert wrong.headers["Allow"] == "OPTIONS, POST"
    assert client.put("/ping").status_code == 405


def test_ping_and_execution_parameters(client, config):
    ping = client.get("/ping")
    assert (ping.status_code, ping.get_data()) == (200, b"")
    parameters = client.get("/execution-parameters")
    assert parameters.get_json() == {
        "MaxConcurrentTransforms": 8,
        "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": 1,
    }


def test_metrics_count_requests_and_instances(client):
    before = client.get("/metrics").get_json()
    invoke(client, "text/csv", csv_text(INSTANCES))
    after = client.get("/metrics").get_json()
    assert after["requests"] - before["requests"] == 1
    assert after["instances"] - before["instances"] == len(INSTANCES)


def test_failed_requests_are_logged_without_payloads(client, caplog):
    with caplog.at_level(logging.INFO, logger="serve.app"):
        invoke(client, "text/csv", "12345.5,2,3,4\n")
        invoke(client, "text/csv", "98765.5,2,3\n")
        client.get("/ping")
        client.get("/predict")
    fields = [record.fields for record in caplog.records]
    assert [(f["method"], f["path"], f["status"]) for f in fields] == [
        ("POST", "/invocations", 400),
        ("GET", "/predict", 404),
    ]
    assert all(isinstance(f["latency_ms"], float) for f in fields)
    assert "12345" not in caplog.text and "98765" not in caplog.text


def unready_app(model: Model, timeout_s: int = 30, predict=None):
    config = ServeConfig(ml_root=model.model_dir.parent, timeout_s=timeout_s)
    return app_for(config, model, predict).test_client()


def test_ping_is_503_while_the_model_loads(config):
    client = unready_app(Model(config.model_dir), timeout_s=1)
    for response in (client.get("/ping"), invoke(client, "text/csv", "1,2,3,4")):
        assert (response.status_code, response.get_json()) == (
            503,
            {"error": "the model is still loading; retry when GET /ping answers 200"},
        )


def test_a_request_to_a_worker_still_loading_waits_for_its_model(config):
    model = Model(config.model_dir)
    client = unready_app(model, timeout_s=60)
    model.load_in_background()
    response = invoke(client, "text/csv", ",".join(["1"] * 4))
    assert response.status_code == 200, response.get_json()
    assert model.ready


def test_a_broken_model_is_never_healthy_and_says_why(tmp_path, caplog):
    model = Model(tmp_path / "model")
    with caplog.at_level(logging.ERROR, logger="serve.model"):
        model.load_in_background().join()
    reason = (
        f"no model to serve: {tmp_path}/model does not exist; SageMaker unpacks the model "
        "artifact (model.tar.gz) there"
    )
    assert reason in caplog.text
    client = unready_app(model)
    for response in (client.get("/ping"), invoke(client, "text/csv", "1,2,3,4")):
        assert (response.status_code, response.get_json()) == (
            503,
            {"error": f"the model failed to load: {reason}"},
        )


def test_a_model_fault_is_a_logged_500(loaded_model, caplog):
    def broken(batch):
        raise RuntimeError("the accelerator caught fire")

    client = unready_app(loaded_model, predict=broken)
    with caplog.at_level(logging.ERROR, logger="serve.app"):
        response = invoke(client, "text/csv", "1,2,3,4")
    assert (response.status_code, response.get_json()) == (
        500,
        {"error": "the server failed to answer; the cause is in its log"},
    )
    assert "RuntimeError: the accelerator caught fire" in caplog.text
    assert "POST /invocations" in caplog.text


def test_a_stuck_model_call_fails_waiting_requests_at_their_deadline_and_then_ping(loaded_model):
    release, stuck_call = threading.Event(), threading.Event()

    def stuck(batch):
        stuck_call.set()
        release.wait(60)
        return loaded_model.predict(batch)

    client = unready_app(loaded_model, timeout_s=1, predict=stuck)
    first = threading.Thread(target=invoke, args=(client, "text/csv", "1,2,3,4"))
    first.start()
    try:
        assert stuck_call.wait(30)
        response = invoke(client, "text/csv", "1,2,3,4")
        assert (response.status_code, response.get_json()) == (
            503,
            {
                "error": "no prediction within 1 s (SAGEMAKER_MODEL_SERVER_TIMEOUT): the server is "
                "overloaded"
            },
        )
        ping = client.get("/ping")
        assert ping.status_code == 503
        assert "a model call has not returned for" in ping.get_json()["error"]
    finally:
        release.set()
        first.join()
    assert client.get("/ping").status_code == 200
