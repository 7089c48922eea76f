"""Property: whatever body and headers a client sends, the answer is never a 5xx, an error is
always `{"error": "..."}`, and the server keeps answering valid requests afterwards."""

from __future__ import annotations

import io
import json

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from serve_testing import INSTANCES

from serve import codecs
from tests.fuzzing import fuzz

MEDIA_TYPES = ["application/json", "text/csv", "application/jsonlines", "application/x-npy"]

numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(
    st.one_of(numbers, st.none(), st.booleans(), st.text(max_size=5)),
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(st.sampled_from(["instances", "inputs", "x"]), children, max_size=2),
    ),
    max_leaves=40,
)


near_instances = st.lists(
    st.one_of(
        st.lists(numbers, min_size=3, max_size=5),
        st.lists(st.lists(numbers, min_size=1, max_size=3), min_size=1, max_size=3),
    ),
    max_size=4,
)
json_documents = st.one_of(
    json_values, near_instances, near_instances.map(lambda rows: {"instances": rows})
)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


npy_bodies = st.one_of(
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)).map(
        npy_bytes
    ),
    # a valid .npy whose bytes are then cut short or extended
    st.tuples(hnp.arrays(np.float32, (2, 4)).map(npy_bytes), st.integers(-40, 40)).map(
        lambda pair: pair[0][: pair[1]] if pair[1] < 0 else pair[0] + bytes(pair[1])
    ),
)
csv_bodies = st.lists(
    st.lists(st.one_of(numbers.map(str), st.text(max_size=3)), max_size=6), max_size=5
).map(lambda rows: "\n".join(",".join(r) for r in rows).encode())
raw_bodies = st.one_of(st.binary(max_size=300), st.text(max_size=200).map(str.encode))

# (content type, body): mostly a body of the type it claims to be, so that the fuzzing
# reaches the decoders and validation, not only the content-type check.
typed_bodies = st.one_of(
    st.tuples(st.just("application/x-npy"), npy_bodies),
    st.tuples(st.just("text/csv"), csv_bodies),
    st.tuples(st.just("application/json"), json_documents.map(lambda v: json.dumps(v).encode())),
    st.tuples(
        st.just("application/jsonlines"),
        st.lists(json_documents, max_size=4).map(
            lambda values: "\n".join(json.dumps(v) for v in values).encode()
        ),
    ),
    st.tuples(st.sampled_from(MEDIA_TYPES), raw_bodies | npy_bodies | csv_bodies),
)

header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
content_types = st.one_of(
    st.sampled_from(MEDIA_TYPES + ["", "text/plain", "application/octet-stream"]),
    st.tuples(st.sampled_from(MEDIA_TYPES), header_text).map(lambda p: f"{p[0]}; {p[1]}"),
    st.tuples(
        st.sampled_from(MEDIA_TYPES),
        st.sampled_from(["utf-8", "UTF-16", "latin-1", "ascii", "klingon", ""]),
    ).map(lambda p: f"{p[0]}; charset={p[1]}"),
    header_text,
)
accepts = st.one_of(
    st.none(), st.sampled_from(MEDIA_TYPES + ["*/*", "text/*", "image/png"]), header_text
)


def assert_clean_answer(response) -> None:
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert set(response.get_json()) == {"error"}
        assert response.get_json()["error"]


@fuzz(
    "serve request bodies",
    max_examples=300,
    typed_body=typed_bodies,
    accept=st.sampled_from([None, *MEDIA_TYPES]),
)
def test_no_body_makes_the_server_fail(client, typed_body, accept):
    content_type, body = typed_body
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept else {})}
    assert_clean_answer(client.post("/invocations", data=body, headers=headers))


VALID_BODIES = [json.dumps(INSTANCES).encode(), b"1,2,3,4\n5,6,7,8\n", b"[1, 2, 3, 4]\n"]


@fuzz(
    "serve request headers",
    max_examples=300,
    content_type=content_types,
    accept=accepts,
    body=st.sampled_from(VALID_BODIES) | raw_bodies,
    method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE"]),
    path=st.sampled_from(["/invocations"] * 3 + ["/ping", "/execution-parameters", "/x"]),
)
def test_no_headers_make_the_server_fail(client, content_type, accept, body, method, path):
    headers = {"Content-Type": content_type, **({"Accept": accept} if accept is not None else {})}
    assert_clean_answer(client.open(path, method=method, data=body, headers=headers))


def test_the_server_still_answers_after_fuzzing(client):
    """Runs after the property above (file order) on the same app."""
    response = client.post("/invocations", json={"instances": INSTANCES})
    assert response.status_code == 200
    assert len(response.get_json()["predictions"]) == len(INSTANCES)


def python_csv_table(text: str) -> np.ndarray | None:
    """The obvious reading of a CSV body: a line per instance, Python's float for each value;
    None when that reading fails (the rows differ in length or a value is not a number)."""
    rows = [line.split(",") for line in text.rstrip("\r\n").splitlines()]
    if any(len(row) != len(rows[0]) for row in rows):
        return None
    try:
        return np.array([[float(value) for value in row] for row in rows], dtype=np.float64)
    except (ValueError, OverflowError):
        return None


csv_texts = st.one_of(
    csv_bodies.map(bytes.decode),
    # the characters at the edges of both parsers: blanks, line breaks numpy does not split
    # on, underscores and non-ASCII digits Python's float accepts, comment and quote marks
    st.text(
        st.sampled_from(list('0123456789.,eE+-_ \tnaifINFty\n\r\x0b\x0c\u2028#"\u0661x')),
        max_size=30,
    ),
    st.lists(
        st.lists(
            st.sampled_from(
                [
                    "1",
                    " 2 ",
                    "1_0",
                    "\u0661",
                    "nan",
                    "-inf",
                    "1e400",
                    "",
                    "1e-400",
                    "3.",
                    ".5",
                    "0x1",
                ]
            ),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    ).map(lambda rows: "\n".join(",".join(r) for r in rows)),
)


@fuzz("serve CSV decoder", max_examples=2000, text=csv_texts)
def test_a_csv_body_reads_as_python_would_read_it_line_by_line(text):
    """The decoder takes numpy's C parser when it can; whatever the body, the table (or the
    refusal) is the one a line-by-line parse with Python's float gives."""
    expected = python_csv_table(text)
    try:
        table = codecs.decode(text.encode(), "text/csv", None).inputs
    except codecs.BadInput:
        assert expected is None or expected.size == 0
    else:
        assert expected is not None
        np.testing.assert_array_equal(table, expected, strict=True)
