"""helpers.verify: a check cell shows one line when its checks hold, and got against expected when one fails."""

import IPython.display
import pytest

from helpers import verify as module
from helpers.verify import verify


@pytest.fixture
def shown(monkeypatch):
    seen = []
    monkeypatch.setattr(IPython.display, "display", seen.append)
    return seen


def test_checks_that_hold_show_one_line_with_every_line_beneath(shown):
    with verify("Figure 9.9.1") as c:
        print("weights sum to one:", True)
        c.same("visible tokens per row", [1, 2, 3], [1, 2, 3])
        print("scores from -1.5 to 1.1")
    (checks,) = shown
    assert checks.held and checks.summary() == "✓ Figure 9.9.1: 2 checks hold; 1 more value below"
    assert repr(checks).splitlines() == ["✓ Figure 9.9.1: 2 checks hold; 1 more value below", "  weights sum to one: True",
                                         "  visible tokens per row: [1, 2, 3]", "  scores from -1.5 to 1.1"]
    assert checks._repr_html_().startswith('<details class="book-checks"><summary>✓ Figure 9.9.1')


def test_a_failed_check_is_loud_with_got_against_expected(shown):
    with verify("the listing") as c:
        print("equal to the package's version:", False)
        c.same("parameters", 1087, 1088)
    (checks,) = shown
    assert not checks.held and checks.summary() == "✗ the listing: 2 of 2 checks failed"
    text = repr(checks)
    assert "FAILED parameters: 1087  (expected 1088, got 1087)" in text
    assert "FAILED equal to the package's version: False  (expected True)" in text
    assert "#c0392b" in checks._repr_html_() and "expected 1088" in checks._repr_html_()


def test_a_failure_counts_once_and_only_a_final_false_fails(shown):
    with verify("x") as c:
        c.same("flag", False, True)                 # prints "flag: False": one failure, not two
        print("False positives are rare: 0.1")      # False not at the end: a fact
    (checks,) = shown
    assert [line for line, _ in checks.failed] == ["flag: False"]


def test_every_verdict_on_a_line_counts_and_can_fail(shown):
    """9.A printed "symmetric: True ; rows sum to zero: True ; positive semidefinite: True" on one line: only the
    last verdict was read, so a False before it passed, and the summary counted the line as one check."""
    with verify("z"):
        print("symmetric: True ; rows sum to zero: True ; positive semidefinite: True")
        print("hidden: [True, False] with is_causal=True: True")     # data and an argument, then one verdict
    assert shown[0].held and shown[0].count == 4 and shown[0].summary() == "✓ z: 4 checks hold"
    with verify("z"):
        print("symmetric: True ; rows sum to zero: False ; positive semidefinite: True")
        print("the slow pairs: positive: False; from 0.49 to 0.42")
    assert [line for line, _ in shown[1].failed] == [
        "symmetric: True ; rows sum to zero: False ; positive semidefinite: True",
        "the slow pairs: positive: False; from 0.49 to 0.42"]


def test_an_error_inside_still_shows_what_ran_and_propagates(shown):
    with pytest.raises(ZeroDivisionError):
        with verify("y"):
            print("first: True")
            _ = 1 / 0
    assert shown[0].lines == ["first: True"]


def test_html_is_escaped(shown):
    with verify("<b>"):
        print("a < b: True")
    assert "&lt;b&gt;" in shown[0]._repr_html_() and "a &lt; b" in shown[0]._repr_html_()
    assert module.VERDICT.search("x: True.")


def test_the_summary_counts_as_checks_only_verdicts_and_compared_values(shown):
    """A learner's review of 9.3: "13 checks hold" counted four lines of bare values, which a reader cannot see
    checked. Only verdicts and ``same`` lines are counted as checks; the other lines are values below."""
    with verify("v") as c:
        print("pair 0 turns by 1.000 rad")
        c.same("weights", 2, 2)
    with verify("w"):
        print("from 0.49 to 0.42")
        print("k = q: 1.00")
    assert shown[0].summary() == "✓ v: 1 check holds; 1 more value below"
    assert shown[1].summary() == "✓ w: 2 values below" and shown[1].count == 0
