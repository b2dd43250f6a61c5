"""bench/mutate.py's coverage run, inside the scratch copy: the suite in-process under coverage.py with each
test's lines recorded under its pytest node id. The context is switched from pytest's hooks, once per test:
coverage's own dynamic contexts (`dynamic_context = test_function`) run Python code on every function call,
which made the simulation tests a hundred times slower.

    python bench/mutate_coverage.py DATA_FILE INCLUDED,FILES PYTEST_ARGS...
"""

from __future__ import annotations

import sys

import coverage
import pytest


def main() -> None:
    sys.path.insert(0, "")  # as `python -m pytest` has it: the tests import `tests.conftest`
    data, include, args = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    cov = coverage.Coverage(data_file=data, include=include)

    class Contexts:
        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_setup(self, item: pytest.Item) -> None:
            cov.switch_context(item.nodeid)  # fixtures' setup belongs to the test that asked for them

        def pytest_runtest_logfinish(self, nodeid: str) -> None:
            cov.switch_context("")

    cov.start()
    try:
        status = pytest.main(args, plugins=[Contexts()])
    finally:
        cov.stop()
        cov.save()
    sys.exit(int(status))


if __name__ == "__main__":
    main()
