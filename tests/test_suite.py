"""The suite's own organisation under pytest-xdist (``make test``: ``-n 2 --dist loadfile``; tests/README.md
"Time"): the files that share a run made once a session are one work unit, so no worker makes it again."""

from pathlib import Path

import conftest
import pytest

HERE = Path(__file__).resolve().parent
# The session fixtures that launch processes (tests/README.md: "Shared runs"): tens of seconds each.
SHARED_RUNS = ("dist_steps", "two_rank_sampling_run", "trl_two_processes")


def _users(fixture: str) -> list[str]:
    """The test files that name ``fixture`` (as an argument, through a fixture of their own, or in a
    helper that adds to its cases), as pytest's node ids begin."""
    return sorted(f"tests/{path.name}" for path in HERE.glob("test_*.py")
                  if path.name != Path(__file__).name and fixture in path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("fixture", SHARED_RUNS)
def test_the_files_sharing_a_run_are_one_unit(fixture):
    users = _users(fixture)
    assert len(users) >= 2, f"{fixture} is used by {users}: update SHARED_RUNS"
    units = {path: conftest.xdist_unit(f"{path}::test_x") for path in users}
    assert len(set(units.values())) == 1, (
        f"{fixture} would be made once per worker: add its files to tests/conftest.py's XDIST_UNITS as one unit ({units})")


def test_every_shared_run_is_a_session_fixture():
    text = (HERE / "conftest.py").read_text(encoding="utf-8")
    for fixture in SHARED_RUNS:
        assert f'@pytest.fixture(scope="session")\ndef {fixture}(' in text


def test_the_longest_units_named_exist():
    units = {conftest.xdist_unit(f"tests/{path.name}::t") for path in HERE.glob("test_*.py")}
    assert set(conftest.XDIST_LONGEST_FIRST) <= units, set(conftest.XDIST_LONGEST_FIRST) - units
    assert set(conftest.XDIST_UNITS) <= {f"tests/{path.name}" for path in HERE.glob("test_*.py")}


def test_a_test_keeps_its_file_as_its_unit_unless_grouped():
    assert conftest.xdist_unit("tests/test_loss.py::test_x[a-b]") == "tests/test_loss.py"
    assert conftest.xdist_unit("tests/test_prompts.py::test_x") == conftest.xdist_unit("tests/test_distributed.py::test_y")
