"""The order of test files for `make test`'s workers (tests/file_order.py): recorded seconds,
longest first, the committed default for what the record lacks."""

import json
from types import SimpleNamespace

from tests.file_order import Timer, longest_first


def items(*nodeids, slow=()):
    return [
        SimpleNamespace(nodeid=nodeid, keywords={"slow": 1} if nodeid in slow else {})
        for nodeid in nodeids
    ]


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
        first.add(SimpleNamespace(nodeid=nodeid, duration=seconds, keywords={}))
    first.save()
    assert json.loads(record.read_text()) == {"a.py": 4.8, "b.py": 7.0}
    second = Timer(record)
    second.add(SimpleNamespace(nodeid="a.py::t1", duration=2.0, keywords={}))
    second.add(SimpleNamespace(nodeid="c.py::t", duration=1.0, keywords={}))
    second.partial.add("c.py")  # run in part (-k): not its time
    second.save()
    assert json.loads(record.read_text()) == {"a.py": 2.0, "b.py": 7.0}
    assert [path.name for path in record.parent.iterdir()] == ["record.json"]


def test_a_files_slow_tests_are_timed_and_ordered_as_a_file_of_their_own(tmp_path):
    """`make test` and `make test-slow` run different tests of one file: each tier's order
    follows what that tier took, and neither session's record overwrites the other's."""
    record = tmp_path / "record.json"
    fast, slow = Timer(record), Timer(record)
    fast.add(SimpleNamespace(nodeid="a.py::quick", duration=2.0, keywords={}))
    slow.add(SimpleNamespace(nodeid="a.py::long", duration=90.0, keywords={"slow": 1}))
    slow.add(SimpleNamespace(nodeid="b.py::long", duration=30.0, keywords={"slow": 1}))
    fast.save()
    slow.save()
    assert json.loads(record.read_text()) == {"a.py [slow]": 90.0, "b.py [slow]": 30.0, "a.py": 2.0}
    collected = items("b.py::long", "a.py::long", slow=("b.py::long", "a.py::long"))
    longest_first(collected, (record,))
    assert [item.nodeid for item in collected] == ["a.py::long", "b.py::long"]
