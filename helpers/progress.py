"""Progress for a long cell: in a notebook, a bar that fills in place and then settles back into one quiet
line; elsewhere (a script, a terminal), tqdm on stderr.

In a notebook the line is shown first ("training: 400 steps"), replaced by a bar while the work runs, and
put back when it ends: a cell that ran to the end keeps exactly the line it started with, on any machine,
and nothing that looks like an error (tqdm's bars in a notebook go to stderr, which leaves a pink band).
Work left early (an error, an interrupt) leaves the bar where it stopped, so the line says how far it got.

``progress(iterable, total, desc)`` wraps a loop; ``Bar(total, desc)`` is the same display for work counted
by hand (``update(n)``, ``set(done)``, ``close()``), such as a race's steps reported by its worker processes.

Where a cell's printed output is being collected into a string (a check cell's ``with verify(...)``, or
``contextlib.redirect_stdout(io.StringIO())``), nothing is shown: a display would escape the collection and
stand beside what it collects.
"""

import html
import io
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


def _collected():
    """Whether what the cell prints is being collected into a string rather than shown (``verify``)."""
    return isinstance(sys.stdout, io.StringIO)


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


class Bar:
    """A progress display for ``total`` steps of work, counted by hand (see the module).

    ``update(n)`` counts ``n`` more steps done, ``set(done)`` sets the count; the display follows at most
    every ``every`` seconds (tqdm's ``mininterval`` outside a notebook). ``close(finished=None)`` ends it:
    finished (by default, when the count reached ``total``) it shows the quiet line it began with, else
    how far it got. ``disable`` shows nothing at all.
    """

    def __init__(self, total, desc="working", every=0.5, disable=False):
        self.total, self.desc, self.every = positive_int(total, "total"), str(desc), float(every)
        self.done, self._handle, self._tqdm, self._closed = 0, None, None, False
        self._start = self._last = time.perf_counter()
        if disable:
            return
        if not _in_notebook():
            from tqdm import tqdm

            self._tqdm = tqdm(total=self.total, desc=self.desc, file=sys.stderr, mininterval=max(self.every, 1.0),
                              leave=False)
        elif not _collected():
            from IPython.display import display

            self._handle = display(Status(self.desc, self.total), display_id=True)

    def update(self, n=1):
        self.set(self.done + n)

    def set(self, done):
        if self._tqdm is not None and done != self.done:
            self._tqdm.update(done - self.done)
        self.done = done
        if self._handle is not None:
            now = time.perf_counter()
            if now - self._last >= self.every and done < self.total:
                self._handle.update(Status(self.desc, self.total, done, now - self._start))
                self._last = now

    def close(self, finished=None):
        if self._closed:
            return
        self._closed = True
        if self._tqdm is not None:
            self._tqdm.close()
        if self._handle is not None:
            finished = self.done >= self.total if finished is None else finished
            self._handle.update(Status(self.desc, self.total) if finished
                                else Status(self.desc, self.total, self.done, time.perf_counter() - self._start))


def progress(iterable, total=None, desc="working", every=0.5):
    """Yield the items of ``iterable`` (``total`` of them: ``len(iterable)`` by default) and show how far it is.

    In a notebook the display is updated at most every ``every`` seconds; a loop left early (an error,
    an interrupt, a ``break``) leaves the bar where it stopped, so the line says how far it got.
    """
    total = positive_int(len(iterable) if total is None else total, "total")
    bar = Bar(total, desc, every)
    finished = False
    try:
        for item in iterable:
            yield item
            bar.update(1)
        finished = bar.done == total
    finally:
        bar.close(finished)
