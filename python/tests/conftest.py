"""Shared pytest setup: where the package, the test helpers and the C library
load from, and a fresh random seed per test that a failure report prints
(FFPA_TEST_SEED replays it)."""

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
SOURCE_TREE = TESTS_DIR.parent  # python/, which holds ffpa_attn/

# The helper modules next to the tests import by name, whatever pytest's import mode.
sys.path.insert(0, str(TESTS_DIR))
# An installed ffpa_attn wins, with the library it carries (or FFPA_LIBRARY's);
# a source checkout (CI, no pip install) tests python/ffpa_attn with the library
# CI builds (build/libffpa.so in the checkout), unless FFPA_LIBRARY names one.
BUILT_LIBRARY = SOURCE_TREE.parent / "build" / "libffpa.so"
if importlib.util.find_spec("ffpa_attn") is None:
    sys.path.insert(0, str(SOURCE_TREE))
    if not os.environ.get("FFPA_LIBRARY") and BUILT_LIBRARY.exists():
        os.environ["FFPA_LIBRARY"] = str(BUILT_LIBRARY)

SEED_KEY = pytest.StashKey[int]()


@pytest.fixture(autouse=True)
def seed(request: pytest.FixtureRequest) -> int:
    """This test's seed; it also seeds torch (CPU and every CUDA device) when torch is loaded."""
    replay = os.environ.get("FFPA_TEST_SEED")
    value = int(replay) if replay else random.SystemRandom().randrange(2**63)
    request.node.stash[SEED_KEY] = value
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(value)
    return value


@pytest.fixture
def rng(seed: int) -> random.Random:
    """Random shape draws of this test, from its seed."""
    return random.Random(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and SEED_KEY in item.stash:
        seed_value = item.stash[SEED_KEY]
        report.sections.append(("random seed", f"seed {seed_value}: FFPA_TEST_SEED={seed_value} replays this test"))
