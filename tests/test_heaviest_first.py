"""The test scheduler's order (tests/helpers/heaviest_first.py): heaviest files first, each
file's tests in their own order, and the table a run records."""

import json
from types import SimpleNamespace

from helpers.heaviest_first import WEIGHTS, heaviest_first, load_weights

pytest_plugins = ("pytester",)


def items(*nodeids):
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def test_files_go_heaviest_first_and_keep_their_tests_in_order():
    given = items("tests/test_a.py::one", "tests/test_b.py::one", "tests/test_a.py::two",
                  "tests/test_c.py::one", "tests/test_b.py::two", "tests/test_new.py::one")
    weights = {"tests/test_a.py": 1.0, "tests/test_b.py": 300.0, "tests/test_c.py": 20.0}
    order = [item.nodeid for item in heaviest_first(given, weights)]
    # test_new.py is not in the table: it weighs the median file (20 s), after test_c.py, which
    # came first among equals in the collection.
    assert order == ["tests/test_b.py::one", "tests/test_b.py::two", "tests/test_c.py::one",
                     "tests/test_new.py::one", "tests/test_a.py::one", "tests/test_a.py::two"]
    assert heaviest_first(given, {}) == given


def test_the_shipped_table_names_files_that_exist():
    weights = load_weights()
    assert len(weights) > 50
    tests = WEIGHTS.parent
    missing = [name for name in weights if not (tests.parent / name).is_file()]
    assert not missing, f"{WEIGHTS.name} names files that are gone: {missing}"


def test_a_run_records_each_files_seconds(pytester):
    pytester.makepyfile(test_quick="def test_one():\n    pass\n",
                        test_slow="import time\n\ndef test_one():\n    time.sleep(0.3)\n\n"
                                  "def test_two():\n    time.sleep(0.3)\n")
    table = pytester.path / "seconds.json"
    result = pytester.runpytest_inprocess("-p", "helpers.heaviest_first", "-p", "no:xdist",
                                          "--record-file-seconds", str(table))
    result.assert_outcomes(passed=3)
    seconds = json.loads(table.read_text())
    assert set(seconds) == {"test_quick.py", "test_slow.py"}
    assert seconds["test_slow.py"] >= 0.6 > seconds["test_quick.py"]
