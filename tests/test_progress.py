"""helpers.progress: in a notebook the display ends on the line it started with; elsewhere tqdm on stderr."""

import IPython.display
import pytest

from helpers import progress as module
from helpers.progress import Status, progress


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
