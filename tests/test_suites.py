"""The three suites (tests/suites.py) on a suite of their own, run by pytest in-process: each
test lands in exactly the suites it belongs to, Hypothesis tests are capped only in `quick` and
held to no deadline, and `quick` says what it left to the others."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

MODULE = """
import pytest
from hypothesis import given, settings, strategies as st
from suites import first_quick

RAN = []

def test_plain():
    pass

@pytest.mark.slow
def test_heavy():
    pass

@pytest.mark.fuzz
def test_campaign():
    pass

@pytest.mark.parametrize("case", first_quick(["a", "b", "c"]))
def test_cases(case):
    pass

@settings(max_examples=50, database=None)
@given(st.integers())
def test_property(n):
    RAN.append(n)

def test_examples_ran():
    print(f"examples={len(RAN)}")

def test_no_deadline():  # no timed assertion: Hypothesis's deadline is one
    assert settings.default.deadline is None
"""


def outcome(pytester: pytest.Pytester, suite: str) -> tuple[set[str], str]:
    pytester.makeconftest('pytest_plugins = ("suites",)\n')
    pytester.makepyfile(test_module=MODULE)
    result = pytester.runpytest_inprocess("--suite", suite, "-s", "-p", "no:cacheprovider")
    passed = {
        report.nodeid.split("::")[1]
        for report in result.reprec.getreports("pytest_runtest_logreport")
        if report.when == "call" and report.passed
    }
    return passed, result.stdout.str()


@pytest.mark.parametrize(
    ("suite", "expected"),
    [
        (
            "quick",
            {
                "test_plain",
                "test_cases[a]",
                "test_property",
                "test_examples_ran",
                "test_no_deadline",
            },
        ),
        ("slow", {"test_heavy", "test_cases[b]", "test_cases[c]", "test_property"}),
        ("fuzz", {"test_campaign"}),
    ],
)
def test_each_test_runs_in_its_suites(
    pytester: pytest.Pytester, suite: str, expected: set[str]
) -> None:
    assert outcome(pytester, suite)[0] == expected


def test_everything_runs_in_full_by_default(pytester: pytest.Pytester) -> None:
    passed, output = outcome(pytester, "all")
    assert len(passed) == 9
    assert "examples=50" in output


def test_quick_caps_hypothesis_and_names_what_it_left(pytester: pytest.Pytester) -> None:
    _, output = outcome(pytester, "quick")
    assert "examples=10" in output
    assert "make fuzz: 1 tests in 1 files" in output
    assert "make test-slow: 3 tests in 1 files" in output
    assert "make test-slow: 1 Hypothesis tests with all their examples" in output
