"""Request bodies to arrays and model outputs to response bodies, one pair per media type.

Decoders turn a body into numeric arrays whose first axis is the instances (one array, or one
per named input), and report where the body stops making sense ("instance 3 (line 4), value 2:
'abc' is not a number"); whether they fit the model is `serve.validation`'s business.
Instances are numbered from 0 in request order; in CSV and JSON Lines instance i is on line
i + 1.

| media type            | request body                                    | response body            |
| --------------------- | ----------------------------------------------- | ------------------------ |
| application/json      | TensorFlow Serving's: {"instances": [...]} rows | {"predictions": [...]}   |
|                       | (objects of named inputs for several inputs),   |                          |
|                       | {"inputs": [...] or {name: [...]}} columnar,    | {"outputs": ...}         |
|                       | or a bare [...] of instances                    | {"predictions": [...]}   |
| text/csv              | one instance per line, no header                | one line each            |
| application/jsonlines | one instance per line, as in "instances"        | one JSON value each      |
| application/x-npy     | an .npy array (never unpickled)                 | the outputs              |

As TensorFlow Serving answers: one output is given without its name; several are an object
per instance (rows) or an object of named columns (columnar). A classifier's prediction is
`{"class": label, "probabilities": [...]}` in JSON and JSON Lines and `label,p0,p1,...` in
CSV. An .npy response holds the raw output array (probabilities in the order of
metadata.json's classes). CSV and JSON Lines answers end without a newline: batch transform
joins the answers of a MultiRecord request's records with its own separator.
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from job.signature import SIGNATURE, ModelInterface
from serve.errors import BadInput, NotAcceptable, UnsupportedContentType

JSON = "application/json"
CSV = "text/csv"
JSONLINES = "application/jsonlines"
NPY = "application/x-npy"
MEDIA_TYPES = (JSON, CSV, JSONLINES, NPY)  # order of preference when the client has none


@dataclass(frozen=True)
class Decoded:
    """A request's instances: one array whose first axis is the instances, or one per named
    input; `columnar` when a JSON request used the "inputs" form, answered with "outputs"."""

    inputs: npt.NDArray[Any] | dict[str, npt.NDArray[Any]]
    columnar: bool = False


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
        raise NotAcceptable(
            f"cannot answer in any type the Accept header {accept!r} allows; "
            f"accept one of {', '.join(MEDIA_TYPES)}"
        )
    return best


# Text charsets a body may declare, by Python's canonical codec name. Others are refused before
# any byte is decoded: some codecs (punycode, the compression and escape codecs) cost minutes
# of CPU on a crafted body, and no client of a model server needs them.
CHARSETS = {
    "utf-8": "utf-8",
    "ascii": "ascii",
    "iso8859-1": "latin-1",
    "utf-16": "utf-16",
    "utf-16-le": "utf-16",
    "utf-16-be": "utf-16",
}
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
            f"{', '.join(sorted(set(CHARSETS.values())))}"
        )
    try:
        return body.decode(encoding)
    except UnicodeDecodeError as error:
        raise BadInput(
            f"the body is not valid {encoding} text: {error.reason} at byte {error.start}"
        ) from None


def _lines(text: str) -> list[str]:
    return text.rstrip("\r\n").splitlines()


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise BadInput(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise BadInput(f"{what} is nested too deeply") from None


def _describe_bad_instance(instances: list[Any]) -> str:
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
            return (
                f"instance {index} has shape {list(array.shape)}, but instance 0 has shape "
                f"{list(first_shape)}"
            )
    return "the instances do not form an array of numbers"


def _instances_to_array(instances: list[Any]) -> npt.NDArray[Any]:
    try:
        array = np.array(instances)
    except (ValueError, TypeError, OverflowError):
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise BadInput(_describe_bad_instance(instances))
    return array


def _named_rows(instances: list[Any]) -> dict[str, npt.NDArray[Any]]:
    """Row-format instances that are objects of named inputs, as one array per name."""
    names = instances[0].keys()
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict) or instance.keys() != names:
            raise BadInput(
                f"instance {index} does not name the same inputs as instance 0 "
                f"({', '.join(names)}); send every instance as an object of them"
            )
    return {name: _instances_to_array([instance[name] for instance in instances]) for name in names}


def _decode_json(body: bytes, charset: str | None) -> Decoded:
    """TensorFlow Serving's request forms: {"instances": [...]} (rows; for several named inputs,
    each row an object of them), {"inputs": ...} (columnar: a list, or an object of named
    lists), an optional "signature_name", and a bare list of instances."""
    document = _json(_text(body, charset), "the body")
    if not isinstance(document, dict):
        return Decoded(_rows(document))
    signature = document.get("signature_name", SIGNATURE)
    if signature != SIGNATURE:
        raise BadInput(
            f"signature_name {signature!r} is not served; this model is served "
            f"through {SIGNATURE!r}"
        )
    keys = [key for key in ("instances", "inputs") if key in document]
    unknown = sorted(set(document) - {"instances", "inputs", "signature_name"})
    if len(keys) != 1 or unknown:
        raise BadInput(
            'a JSON object body needs exactly one of the keys "instances" or '
            f'"inputs" (and optionally "signature_name"), got keys '
            f"{sorted(document)[:10]}"
        )
    if keys == ["instances"]:
        return Decoded(_rows(document["instances"]))
    inputs = document["inputs"]
    if isinstance(inputs, dict):
        if not inputs:
            raise BadInput('"inputs" names no input')
        return Decoded(
            {
                name: _instances_to_array(value) if isinstance(value, list) else np.array(value)
                for name, value in inputs.items()
            },
            columnar=True,
        )
    return Decoded(_rows(inputs), columnar=True)


def _rows(instances: Any) -> npt.NDArray[Any] | dict[str, npt.NDArray[Any]]:
    if not isinstance(instances, list):
        raise BadInput(f"expected a list of instances, got a JSON {type(instances).__name__}")
    if instances and isinstance(instances[0], dict):
        return _named_rows(instances)
    return _instances_to_array(instances)


def _decode_jsonlines(
    body: bytes, charset: str | None
) -> npt.NDArray[Any] | dict[str, npt.NDArray[Any]]:
    """One instance per line, as in the "instances" list: an array, or an object of named
    inputs."""
    return _rows(
        [
            _json(line, f"instance {index} (line {index + 1})")
            for index, line in enumerate(_lines(_text(body, charset)))
        ]
    )


def _describe_bad_row(rows: list[list[str]]) -> str:
    for index, row in enumerate(rows):
        if len(row) != len(rows[0]):
            return (
                f"instance {index} (line {index + 1}) has {len(row)} values, but line 1 "
                f"has {len(rows[0])}"
            )
        for column, value in enumerate(row):
            try:
                float(value)
            except ValueError:
                hint = " (CSV input must not have a header row)" if index == 0 else ""
                return (
                    f"instance {index} (line {index + 1}), value {column + 1}: {value!r} is "
                    f"not a number{hint}"
                )
    return "the rows do not form a table of numbers"


def _decode_csv(body: bytes, charset: str | None) -> npt.NDArray[Any]:
    """numpy's C parser reads a table three times as fast as Python's split and float (0.2 vs
    0.6 s for a 6 MB batch-transform body here), but it skips blank lines (warning when all
    are) and names no line in its errors; when there is a blank line, or it refuses or drops
    one, the Python parse decides, so the answer and each message are the same either way."""
    lines = _lines(_text(body, charset))
    if lines and all(lines):
        try:
            table = np.loadtxt(lines, delimiter=",", dtype=np.float64, comments=None, ndmin=2)
        except ValueError:
            pass
        else:
            if len(table) == len(lines):
                return table
    rows = [line.split(",") for line in lines]
    try:
        return np.array(rows, dtype=np.float64)  # float32's range is checked in validation
    except (ValueError, OverflowError):
        raise BadInput(_describe_bad_row(rows)) from None


# What numpy's .npy header readers return (numpy publishes no types for them): the array's
# shape, whether it is in Fortran order, and its dtype.
_NpyHeader = tuple[tuple[int, ...], bool, np.dtype[Any]]


def _decode_npy(body: bytes, charset: str | None) -> npt.NDArray[Any]:
    """Read an .npy array without ever unpickling, and only as many bytes as the body holds.

    np.load would unpickle object arrays when allowed, and np.lib.format.read_array allocates
    the array its header declares before reading the data: a 100-byte body declaring a
    terabyte would exhaust memory. So the header is read and checked against the body first.
    """
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        readers: dict[tuple[int, int], Callable[[io.BytesIO], _NpyHeader]] = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }
        read_header = readers.get(version)
        if read_header is None:
            raise BadInput(f".npy format version {version} is not supported; use 1.0 or 2.0")
        shape, fortran_order, dtype = read_header(stream)
    except ValueError as error:
        raise BadInput(f"the body is not a valid .npy array: {error}") from None
    if not all(0 <= dimension <= NPY_MAX_DIMENSION for dimension in shape):
        raise BadInput(
            f"the .npy header declares shape {list(shape)}: every dimension must be "
            f"between 0 and {NPY_MAX_DIMENSION}"
        )
    if dtype.kind not in "iuf":
        refused = " (object arrays are pickles and are never loaded)" if dtype.hasobject else ""
        raise BadInput(f".npy arrays must hold numbers, got dtype {dtype}{refused}")
    data = body[stream.tell() :]
    expected = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot wrap
    if len(data) != expected:
        raise BadInput(
            f"the .npy header declares shape {list(shape)} of {dtype} "
            f"({expected} bytes), but {len(data)} bytes of data follow it"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran_order else "C")


# JSON's decoder says more (named inputs, the columnar form); the others give the instances.
Decoder = Callable[
    [bytes, "str | None"], "Decoded | npt.NDArray[Any] | dict[str, npt.NDArray[Any]]"
]
_DECODERS: dict[str, Decoder] = {
    JSON: _decode_json,
    CSV: _decode_csv,
    JSONLINES: _decode_jsonlines,
    NPY: _decode_npy,
}


def decode(body: bytes, mimetype: str, charset: str | None) -> Decoded:
    """The instances in `body`: one array with a row per instance, or one per named input."""
    decoder = _DECODERS.get(mimetype)
    if decoder is None:
        raise UnsupportedContentType(
            f"Content-Type {mimetype or '(none)'!r} is not supported; use one of "
            f"{', '.join(MEDIA_TYPES)}"
        )
    if not body:
        raise BadInput("the request body is empty: send at least one instance")
    decoded = decoder(body, charset)
    return decoded if isinstance(decoded, Decoded) else Decoded(decoded)


def _records(outputs: npt.NDArray[Any], interface: ModelInterface) -> list[Any]:
    """One JSON value per instance: the raw output (an object of named outputs when there are
    several), or a classifier's label and probabilities."""
    if outputs.dtype.names:
        return [
            {name: outputs[name][index].tolist() for name in outputs.dtype.names}
            for index in range(len(outputs))
        ]
    if interface.classes is None:
        values: list[Any] = outputs.tolist()  # a list: outputs have a batch dimension
        return values
    return [
        {"class": interface.classes[index], "probabilities": probabilities}
        for index, probabilities in zip(outputs.argmax(axis=1).tolist(), outputs.tolist())
    ]


def _encode_json(outputs: npt.NDArray[Any], interface: ModelInterface, columnar: bool) -> bytes:
    """Rows answer {"predictions": [one value per instance]}; TensorFlow Serving answers a
    columnar request with {"outputs": ...}, an object of named outputs when there are several."""
    if not columnar:
        return json.dumps({"predictions": _records(outputs, interface)}).encode()
    if outputs.dtype.names:
        return json.dumps(
            {"outputs": {name: outputs[name].tolist() for name in outputs.dtype.names}}
        ).encode()
    return json.dumps({"outputs": _records(outputs, interface)}).encode()


def _encode_jsonlines(
    outputs: npt.NDArray[Any], interface: ModelInterface, columnar: bool
) -> bytes:
    """One line per instance, with no newline after the last: batch transform's
    AssembleWith=Line adds the separator itself, so a trailing one would become a blank line."""
    return "\n".join(json.dumps(record) for record in _records(outputs, interface)).encode()


def _flat(outputs: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if outputs.dtype.names:
        return np.concatenate(
            [outputs[name].reshape(len(outputs), -1) for name in outputs.dtype.names], axis=1
        )
    return outputs.reshape(len(outputs), -1)


def _encode_csv(outputs: npt.NDArray[Any], interface: ModelInterface, columnar: bool) -> bytes:
    """One line per instance (several outputs side by side), no newline after the last."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    flat = _flat(outputs).tolist()
    if interface.classes is None:
        writer.writerows(flat)
    else:
        labels = outputs.argmax(axis=1).tolist()
        writer.writerows([interface.classes[label], *row] for label, row in zip(labels, flat))
    return text.getvalue().removesuffix("\n").encode()


def _encode_npy(outputs: npt.NDArray[Any], interface: ModelInterface, columnar: bool) -> bytes:
    if outputs.dtype.names:
        raise NotAcceptable(
            f"an .npy answer holds one array, but the model has "
            f"{len(outputs.dtype.names)} outputs "
            f"({', '.join(outputs.dtype.names)}); accept application/json"
        )
    buffer = io.BytesIO()
    np.save(buffer, outputs, allow_pickle=False)
    return buffer.getvalue()


_ENCODERS: dict[str, Callable[[npt.NDArray[Any], ModelInterface, bool], bytes]] = {
    JSON: _encode_json,
    CSV: _encode_csv,
    JSONLINES: _encode_jsonlines,
    NPY: _encode_npy,
}


def encode(
    outputs: npt.NDArray[Any], interface: ModelInterface, mimetype: str, *, columnar: bool = False
) -> bytes:
    """The response body for `outputs` in `mimetype`, one of MEDIA_TYPES; `columnar` when the
    request used JSON's "inputs" form."""
    return _ENCODERS[mimetype](outputs, interface, columnar)
