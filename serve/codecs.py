"""Request bodies to arrays and model outputs to response bodies, one pair per media type.

Decoders turn a body into a numeric array whose first axis is the instances, and report where
the body stops making sense ("instance 3 (line 4), value 2: 'abc' is not a number"); whether
that array fits the model is `serve.validation`'s business. Instances are numbered from 0 in
request order; in CSV and JSON Lines instance i is on line i + 1.

| media type            | request body                                 | response body          |
| --------------------- | -------------------------------------------- | ---------------------- |
| application/json      | {"instances": [...]}, {"inputs": [...]}, [...] | {"predictions": [...]} |
| text/csv              | one instance per line, no header             | one line each          |
| application/jsonlines | one JSON array per line                      | one object each        |
| application/x-npy     | an .npy array (never unpickled)              | the outputs            |

A classifier's prediction is `{"class": label, "probabilities": [...]}` in JSON and JSON Lines
and `label,p0,p1,...` in CSV; other models' outputs are returned as they are. An .npy
response holds the raw output array (probabilities in the order of metadata.json's classes).
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import math
from typing import Any, Callable

import numpy as np

from serve.errors import BadInput, NotAcceptable, UnsupportedContentType
from serve.metadata import ModelMetadata

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
MEDIA_TYPES = (JSON, CSV, JSONLINES, NPY)  # order of preference when the client has none


def _quality(media_type: str, ranges: list[tuple[str, float]]) -> float:
    """The q of the most specific range in the Accept header that covers `media_type`."""
    wildcard = media_type.split("/")[0] + "/*"
    specificity, quality = -1, 0.0
    for media_range, q in ranges:
        rank = {media_type: 2, wildcard: 1, "*/*": 0, "*": 0}.get(media_range, -1)
        if rank > specificity:
            specificity, quality = rank, q
    return quality


@functools.lru_cache(maxsize=256)  # clients repeat their Accept header on every request
def negotiate(accept: str | None) -> str:
    """The response media type for an Accept header, comparing media types only.

    Parameters other than q are ignored, so `application/json; charset=utf-8` is JSON
    (werkzeug's own matching would treat it as a different type). No header, an empty one
    or `*/*` gives JSON; ties go to the order of MEDIA_TYPES.
    """
    if not accept or not accept.strip():
        return JSON
    ranges = []
    for item in accept.split(","):
        media_range, *parameters = item.split(";")
        quality = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        ranges.append((media_range.strip().lower(), quality))
    best, best_quality = None, 0.0
    for media_type in MEDIA_TYPES:
        quality = _quality(media_type, ranges)
        if quality > best_quality:
            best, best_quality = media_type, quality
    if best is None:
        raise NotAcceptable(f"cannot answer in any type the Accept header {accept!r} allows; "
                            f"accept one of {', '.join(MEDIA_TYPES)}")
    return best


# Text charsets a body may declare, by Python's canonical codec name. Others are refused before
# any byte is decoded: some codecs (punycode, the compression and escape codecs) cost minutes
# of CPU on a crafted body, and no client of a model server needs them.
CHARSETS = {"utf-8": "utf-8", "ascii": "ascii", "iso8859-1": "latin-1", "utf-16": "utf-16",
            "utf-16-le": "utf-16", "utf-16-be": "utf-16"}
# Largest dimension an .npy header may declare; numpy itself refuses beyond this.
NPY_MAX_DIMENSION = 2**31 - 1


def _text(body: bytes, charset: str | None) -> str:
    encoding = charset or "utf-8"
    try:
        known = codecs.lookup(encoding).name in CHARSETS
    except LookupError:
        known = False
    if not known:
        raise UnsupportedContentType(
            f"charset {encoding!r} is not supported; use one of "
            f"{', '.join(sorted(set(CHARSETS.values())))}")
    try:
        return body.decode(encoding)
    except UnicodeDecodeError as error:
        raise BadInput(f"the body is not valid {encoding} text: {error.reason} at byte "
                       f"{error.start}") from None


def _lines(text: str) -> list[str]:
    return text.rstrip("\r\n").splitlines()


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise BadInput(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise BadInput(f"{what} is nested too deeply") from None


def _describe_bad_instance(instances: list) -> str:
    """Name the first instance that keeps `instances` from being one array of numbers."""
    first_shape = None
    for index, instance in enumerate(instances):
        try:
            array = np.array(instance)
        except (ValueError, TypeError, OverflowError):
            return f"instance {index} is not a regular array: its rows differ in length"
        if array.dtype.kind not in "iuf":
            return f"instance {index} is not a number or an array of numbers"
        if first_shape is None:
            first_shape = array.shape
        elif array.shape != first_shape:
            return (f"instance {index} has shape {list(array.shape)}, but instance 0 has shape "
                    f"{list(first_shape)}")
    return "the instances do not form an array of numbers"


def _instances_to_array(instances: list) -> np.ndarray:
    try:
        array = np.array(instances)
    except (ValueError, TypeError, OverflowError):
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise BadInput(_describe_bad_instance(instances))
    return array


def _decode_json(body: bytes, charset: str | None) -> np.ndarray:
    document = _json(_text(body, charset), "the body")
    if isinstance(document, dict):
        keys = [key for key in ("instances", "inputs") if key in document]
        if len(keys) != 1:
            raise BadInput('a JSON object body needs exactly one of the keys "instances" or '
                           f'"inputs", got keys {sorted(document)[:10]}')
        document = document[keys[0]]
        if isinstance(document, dict):
            raise BadInput(f'"{keys[0]}" holds named inputs, but the model has one input: '
                           "send a list of instances")
    if not isinstance(document, list):
        raise BadInput(f"expected a list of instances, got a JSON {type(document).__name__}")
    return _instances_to_array(document)


def _decode_jsonlines(body: bytes, charset: str | None) -> np.ndarray:
    return _instances_to_array([
        _json(line, f"instance {index} (line {index + 1})")
        for index, line in enumerate(_lines(_text(body, charset)))])


def _describe_bad_row(rows: list[list[str]]) -> str:
    for index, row in enumerate(rows):
        if len(row) != len(rows[0]):
            return (f"instance {index} (line {index + 1}) has {len(row)} values, but line 1 "
                    f"has {len(rows[0])}")
        for column, value in enumerate(row):
            try:
                float(value)
            except ValueError:
                hint = " (CSV input must not have a header row)" if index == 0 else ""
                return (f"instance {index} (line {index + 1}), value {column + 1}: {value!r} is "
                        f"not a number{hint}")
    return "the rows do not form a table of numbers"


def _decode_csv(body: bytes, charset: str | None) -> np.ndarray:
    rows = [line.split(",") for line in _lines(_text(body, charset))]
    try:
        return np.array(rows, dtype=np.float64)  # float32's range is checked in validation
    except (ValueError, OverflowError):
        raise BadInput(_describe_bad_row(rows)) from None


def _decode_npy(body: bytes, charset: str | None) -> np.ndarray:
    """Read an .npy array without ever unpickling, and only as many bytes as the body holds.

    np.load would unpickle object arrays when allowed, and np.lib.format.read_array allocates
    the array its header declares before reading the data: a 100-byte body declaring a
    terabyte would exhaust memory. So the header is read and checked against the body first.
    """
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise BadInput(f".npy format version {version} is not supported; use 1.0 or 2.0")
        shape, fortran_order, dtype = read_header(stream)
    except ValueError as error:
        raise BadInput(f"the body is not a valid .npy array: {error}") from None
    if not all(0 <= dimension <= NPY_MAX_DIMENSION for dimension in shape):
        raise BadInput(f"the .npy header declares shape {list(shape)}: every dimension must be "
                       f"between 0 and {NPY_MAX_DIMENSION}")
    if dtype.kind not in "iuf":
        refused = " (object arrays are pickles and are never loaded)" if dtype.hasobject else ""
        raise BadInput(f".npy arrays must hold numbers, got dtype {dtype}{refused}")
    data = body[stream.tell():]
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot wrap
    if len(data) != expected:
        raise BadInput(f"the .npy header declares shape {list(shape)} of {dtype} "
                       f"({expected} bytes), but {len(data)} bytes of data follow it")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


Decoder = Callable[[bytes, "str | None"], np.ndarray]
_DECODERS: dict[str, Decoder] = {JSON: _decode_json, CSV: _decode_csv,
                                 JSONLINES: _decode_jsonlines, NPY: _decode_npy}


def decode(body: bytes, mimetype: str, charset: str | None) -> np.ndarray:
    """The instances in `body`, as an array with one row per instance."""
    decoder = _DECODERS.get(mimetype)
    if decoder is None:
        raise UnsupportedContentType(
            f"Content-Type {mimetype or '(none)'!r} is not supported; use one of "
            f"{', '.join(MEDIA_TYPES)}")
    if not body:
        raise BadInput("the request body is empty: send at least one instance")
    return decoder(body, charset)


def _records(outputs: np.ndarray, metadata: ModelMetadata) -> list:
    if metadata.classes is None:
        return outputs.tolist()
    return [{"class": metadata.classes[index], "probabilities": probabilities}
            for index, probabilities in zip(outputs.argmax(axis=1).tolist(), outputs.tolist())]


def _encode_json(outputs: np.ndarray, metadata: ModelMetadata) -> bytes:
    return json.dumps({"predictions": _records(outputs, metadata)}).encode()


def _encode_jsonlines(outputs: np.ndarray, metadata: ModelMetadata) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in _records(outputs, metadata)).encode()


def _encode_csv(outputs: np.ndarray, metadata: ModelMetadata) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    flat = outputs.reshape(len(outputs), -1).tolist()
    if metadata.classes is None:
        writer.writerows(flat)
    else:
        labels = outputs.argmax(axis=1).tolist()
        writer.writerows([metadata.classes[label], *row] for label, row in zip(labels, flat))
    return text.getvalue().encode()


def _encode_npy(outputs: np.ndarray, metadata: ModelMetadata) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, outputs, allow_pickle=False)
    return buffer.getvalue()


_ENCODERS: dict[str, Callable[[np.ndarray, ModelMetadata], bytes]] = {
    JSON: _encode_json, CSV: _encode_csv, JSONLINES: _encode_jsonlines, NPY: _encode_npy}


def encode(outputs: np.ndarray, metadata: ModelMetadata, mimetype: str) -> bytes:
    """The response body for `outputs` in `mimetype`, one of MEDIA_TYPES."""
    return _ENCODERS[mimetype](outputs, metadata)
