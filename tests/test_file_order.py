"""The order of test files for `make test`'s workers (tests/file_order.py): recorded seconds,
longest first, the committed default for what the record lacks."""

import json
from types import SimpleNamespace

from tests.file_order import Timer, longest_first


def items(*nodeids):
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def test_longest_files_first_each_whole_and_unknown_ones_last_as_collected(tmp_path):
    default, record = tmp_path / "durations.json", tmp_path / "record.json"
    default.write_text(json.dumps({"a.py": 5, "b.py": 50, "c.py": 20}))
    record.write_text(json.dumps({"c.py": 90}))  # this machine's last run of c.py: it wins
    collected = items(
        "new2.py::t", "a.py::t1", "b.py::t1", "new1.py::t", "a.py::t2", "c.py::t", "b.py::t2"
    )
    longest_first(collected, (default, record))
    assert [item.nodeid for item in collected] == [
        "c.py::t",
        "b.py::t1",
        "b.py::t2",
        "a.py::t1",
        "a.py::t2",
        "new2.py::t",
        "new1.py::t",
    ]


def test_a_session_records_its_whole_files_and_keeps_the_others(tmp_path):
    record = tmp_path / "build" / "record.json"
    Timer(record).save()  # nothing run: nothing written
    assert not record.exists()
    first = Timer(record)
    for nodeid, seconds in (
        ("a.py::t1", 1.25),
        ("a.py::t1", 0.5),
        ("a.py::t2", 3.0),
        ("b.py::t", 7.0),
    ):
        first.add(SimpleNamespace(nodeid=nodeid, duration=seconds))
    first.save()
    assert json.loads(record.read_text()) == {"a.py": 4.8, "b.py": 7.0}
    second = Timer(record)
    second.add(SimpleNamespace(nodeid="a.py::t1", duration=2.0))
    second.add(SimpleNamespace(nodeid="c.py::t", duration=1.0))
    second.partial.add("c.py")  # run in part (-k): not its time
    second.save()
    assert json.loads(record.read_text()) == {"a.py": 2.0, "b.py": 7.0}
    assert [path.name for path in record.parent.iterdir()] == ["record.json"]
