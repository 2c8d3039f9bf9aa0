"""helpers.progress: in a notebook the display ends on the line it started with; elsewhere tqdm on stderr; inside a
check cell nothing."""

import contextlib
import io

import IPython.display
import pytest

from helpers import progress as module
from helpers.progress import Bar, Status, progress


class Handle:
    def __init__(self, shown):
        self.shown = [shown]

    def update(self, obj):
        self.shown.append(obj)


@pytest.fixture
def notebook(monkeypatch):
    handles = []

    def display(obj, display_id=False):
        handles.append(Handle(obj))
        return handles[-1]

    monkeypatch.setattr(module, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    return handles


def test_a_finished_loop_shows_the_line_it_started_with(notebook):
    assert list(progress(range(5), desc="training", every=0.0)) == [0, 1, 2, 3, 4]
    shown = [repr(s) for s in notebook[0].shown]
    assert shown[0] == shown[-1] == "training: 5 steps"
    assert "training: step 1 of 5" in shown and "<progress" in notebook[0].shown[1]._repr_html_()


def test_a_loop_left_early_says_how_far_it_got(notebook):
    with pytest.raises(RuntimeError):
        for i in progress(range(10), desc="training"):
            if i == 3:
                raise RuntimeError("stop")
    assert repr(notebook[0].shown[-1]) == "training: step 3 of 10"


def test_outside_a_notebook_it_is_tqdm_on_stderr(capsys):
    assert list(progress(iter(range(3)), total=3, desc="x")) == [0, 1, 2]
    assert capsys.readouterr().out == ""


def test_bad_totals_are_refused():
    with pytest.raises(ValueError, match="total"):
        list(progress(iter(range(3)), total=0))
    with pytest.raises(TypeError):
        list(progress(iter(range(3))))                      # no len and no total


def test_the_line_is_escaped():
    assert "&lt;b&gt;" in Status("<b>", 3)._repr_html_()


def test_a_bar_counted_by_hand_ends_on_its_quiet_line_or_says_how_far_it_got(notebook):
    bar = Bar(10, desc="race", every=0.0)
    bar.update(4)
    bar.set(7)
    bar.close()                                             # not all done: how far it got
    bar.close()                                             # once
    assert [repr(s) for s in notebook[0].shown] == ["race: 10 steps", "race: step 4 of 10", "race: step 7 of 10",
                                                    "race: step 7 of 10"]
    done = Bar(10, desc="race", every=0.0)
    done.update(3)
    done.close(finished=True)                               # told it finished, whatever the count
    assert repr(notebook[1].shown[-1]) == "race: 10 steps"
    Bar(5, desc="quiet", disable=True).close()
    assert len(notebook) == 2                               # disabled: nothing shown


def test_inside_a_check_cell_nothing_is_shown(notebook, capsys):
    """9.4's check cell trains the listing's train_lm for 5 steps inside ``verify``: a progress line there
    stood beside the check's one line (a display escapes the collected output)."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert list(progress(range(3), desc="training")) == [0, 1, 2]
    assert notebook == [] and capsys.readouterr() == ("", "")


def test_outside_a_notebook_a_bar_is_tqdm_on_stderr(capsys):
    bar = Bar(3, desc="x", every=0.0)
    bar.update(3)
    bar.close()
    assert capsys.readouterr().out == ""
