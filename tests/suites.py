"""The three test suites, chosen with `--suite` (the Makefile's targets pass it):

- `quick` (`make test`): every test but those marked `slow` or `fuzz`, and every Hypothesis
  test with at most SMOKE_EXAMPLES examples;
- `slow` (`make test-slow`): the tests marked `slow`, and every Hypothesis test with the
  examples it asks for;
- `fuzz` (`make fuzz`): the tests marked `fuzz` (libFuzzer campaigns);
- `all` (the default, a bare `pytest`): every test, with the examples each asks for.

Hypothesis tests are found by themselves (marked `property` here), so a new one needs nothing;
a heavy test is marked `slow` or `fuzz` by its author. `.ci/run` runs the three suites, so
every test runs there at full strength. `quick` ends by saying what it left to the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import pytest
from hypothesis import is_hypothesis_test, settings

SMOKE_EXAMPLES = 10
SUITES = ("all", "quick", "slow", "fuzz")
TARGETS = {"slow": "make test-slow", "fuzz": "make fuzz"}
LEFT = "deviceplugin_left_to_other_suites"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite",
        choices=SUITES,
        default="all",
        help="quick: no slow or fuzz tests, few Hypothesis examples; slow: the slow tests and "
        "Hypothesis in full; fuzz: the libFuzzer campaigns; all (default): everything",
    )


def pytest_configure(config: pytest.Config) -> None:
    # No timed assertions on a shared machine: Hypothesis's per-example deadline is one.
    settings.register_profile("no-deadline", deadline=None)
    settings.load_profile("no-deadline")
    config.addinivalue_line(
        "markers", "slow: a heavy multi-process scenario or long run, in `make test-slow`"
    )
    config.addinivalue_line("markers", "fuzz: a libFuzzer campaign, in `make fuzz`")
    config.addinivalue_line(
        "markers", "property: a Hypothesis test (marked by tests/suites.py, not by hand)"
    )


def first_quick(values: Iterable[object]) -> list[object]:
    """Parameters of which `make test` runs the first (a smoke) and `make test-slow` the rest."""
    first, *rest = values
    return [first, *(pytest.param(value, marks=pytest.mark.slow) for value in rest)]


def suite_of(item: pytest.Item) -> str:
    """Where a test runs in full: `fuzz`, `slow`, `property` or `quick`."""
    for marker in ("fuzz", "slow", "property"):
        if item.get_closest_marker(marker) is not None:
            return marker
    return "quick"


def wanted(suite: str, kind: str) -> bool:
    if suite == "all":
        return True
    if suite == "quick":
        return kind in ("quick", "property")
    if suite == "slow":
        return kind in ("slow", "property")
    return kind == "fuzz"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite = config.getoption("suite")
    for item in items:
        function = getattr(item, "obj", None)
        if function is not None and is_hypothesis_test(function):
            item.add_marker(pytest.mark.property)
            if suite == "quick":
                cap_examples(function)
    kept, left = [], []
    for item in items:
        (kept if wanted(suite, suite_of(item)) else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
    config.stash[LEFT_KEY] = Counter(  # what the quick suite leaves: the others leave quick ones
        (TARGETS[kind], item.nodeid.split("::")[0])
        for item in left
        if (kind := suite_of(item)) in TARGETS
    )
    config.stash[CAPPED_KEY] = (
        sum(item.get_closest_marker("property") is not None for item in kept)
        if suite == "quick"
        else 0
    )


def cap_examples(function: object) -> None:
    """At most SMOKE_EXAMPLES examples, as the test's own settings say otherwise (the setting
    Hypothesis reads when the test runs; its pytest plugin sets it the same way)."""
    target = getattr(function, "__func__", function)
    own: settings = getattr(target, "_hypothesis_internal_use_settings", settings.default)
    if own.max_examples > SMOKE_EXAMPLES:
        target._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
            parent=own, max_examples=SMOKE_EXAMPLES
        )


LEFT_KEY = pytest.StashKey[Counter[tuple[str, str]]]()
CAPPED_KEY = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands what it left over to the controller, which prints it."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[LEFT] = [
            [target, path, count] for (target, path), count in left_of(session.config).items()
        ]
        output[LEFT + "_capped"] = session.config.stash.get(CAPPED_KEY, 0)


def left_of(config: pytest.Config) -> Counter[tuple[str, str]]:
    return config.stash.get(LEFT_KEY, Counter())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", {})
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    if LEFT in output and LEFT_KEY not in config.stash:
        config.stash[LEFT_KEY] = Counter(
            {(target, path): count for target, path, count in output[LEFT]}
        )
        config.stash[CAPPED_KEY] = output[LEFT + "_capped"]


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    if config.getoption("suite") != "quick" or hasattr(config, "workeroutput"):
        return
    left = left_of(config)
    write = terminalreporter.write_line
    terminalreporter.section("left to the other suites")
    for target in sorted(set(TARGETS.values())):
        files = sorted((path, count) for (to, path), count in left.items() if to == target)
        if files:
            total = sum(count for _, count in files)
            write(f"{target}: {total} tests in {len(files)} files")
            for path, count in files:
                write(f"    {path} ({count})")
    capped = config.stash.get(CAPPED_KEY, 0)
    if capped:
        write(
            f"make test-slow: {capped} Hypothesis tests with all their examples "
            f"(here at most {SMOKE_EXAMPLES} each)"
        )
