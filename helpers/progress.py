"""Progress for a long cell: in a notebook, a bar that fills in place and then settles back into one quiet
line; elsewhere (a script, a terminal), tqdm on stderr.

In a notebook the line is shown first ("training: 400 steps"), replaced by a bar while the loop runs, and
put back when it ends: a cell that ran to the end keeps exactly the line it started with, on any machine,
and nothing that looks like an error (tqdm's bars in a notebook go to stderr, which leaves a pink band).
"""

import html
import sys
import time

from helpers.checks import positive_int


def _in_notebook():
    """Whether this runs in a Jupyter kernel, where a display can be updated in place."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class Status:
    """What the progress display shows: the quiet line, or a bar at ``done`` of ``total``."""

    def __init__(self, desc, total, done=None, seconds=0.0):
        self.desc, self.total, self.done, self.seconds = desc, total, done, seconds

    def __repr__(self):
        if self.done is None:
            return f"{self.desc}: {self.total:,} steps"
        return f"{self.desc}: step {self.done:,} of {self.total:,}"

    def _repr_html_(self):
        style = "font-family: var(--jp-code-font-family, monospace); font-size: 85%; color: #666;"
        if self.done is None:
            return f'<div style="{style}">{html.escape(repr(self))}</div>'
        left = self.seconds / self.done * (self.total - self.done) if self.done else 0.0
        return (f'<div style="{style}">{html.escape(self.desc)}: <progress value="{self.done}" max="{self.total}"></progress>'
                f" {self.done:,} of {self.total:,}, about {left:.0f} s left</div>")


def progress(iterable, total=None, desc="working", every=0.5):
    """Yield the items of ``iterable`` (``total`` of them: ``len(iterable)`` by default) and show how far it is.

    In a notebook the display is updated at most every ``every`` seconds; a loop left early (an error,
    an interrupt, a ``break``) leaves the bar where it stopped, so the line says how far it got.
    """
    total = positive_int(len(iterable) if total is None else total, "total")
    if not _in_notebook():
        from tqdm import tqdm

        yield from tqdm(iterable, total=total, desc=desc, file=sys.stderr, mininterval=1.0, leave=False)
        return
    from IPython.display import display

    quiet = Status(desc, total)
    handle = display(quiet, display_id=True)
    start = last = time.perf_counter()
    done = 0
    finished = False
    try:
        for item in iterable:
            yield item
            done += 1
            now = time.perf_counter()
            if now - last >= every and done < total:
                handle.update(Status(desc, total, done, now - start))
                last = now
        finished = done == total
    finally:
        handle.update(quiet if finished else Status(desc, total, done, time.perf_counter() - start))
