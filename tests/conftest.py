import sys
from pathlib import Path

# Let the tests import their shared helpers as `helpers.NAME` (tests/helpers/).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402 - after the path, like the helpers it imports

from helpers.executor_plans import user_capturer, zoo_capturer  # noqa: E402


# The executor tests' captures, made once per test module that asks for them.
@pytest.fixture(scope="module")
def zoo_captures():
    return zoo_capturer()


@pytest.fixture(scope="module")
def user_capture():
    return user_capturer()
