"""Controls to turn: live in Jupyter, and still working on the static site, without kernel or network.

``control(draw, values, label, **fixed)`` shows ``draw(value, **fixed)`` (a matplotlib figure, or
text) under a slider, or a menu when the values are words. Everything ``draw`` needs besides the value
is passed in ``fixed`` and bound when the control's cell runs (as ipywidgets' ``fixed``), so a later
cell that rebinds a notebook global (``T = 5``) changes nothing the control draws.

One display carries three renderings of the same control:

- ``application/vnd.jupyter.widget-view+json``: an ipywidgets slider or dropdown. In a live kernel
  (JupyterLab, VS Code, Colab) moving it calls ``draw`` again, so the notebook's own torch code
  recomputes the figure; an error it raises shows under the control.
- ``application/vnd.book.control+html`` (``CONTROL_HTML``): every state drawn now, by the same
  ``draw``, as small inline images behind a plain ``<input type="range">`` or ``<select>`` whose few
  lines of inline JavaScript show one frame at a time. The site renders this one (book/conf.py); it
  needs no kernel, no widget manager and nothing from another host. Only the book's build draws it:
  with ``BOOK_FRAMES=all`` in the environment (`make execute` sets it). A reader's run draws the start
  state alone, which is all a live kernel shows (the slider draws the others when it reaches them), so
  a control's cell costs one frame, not a dozen (issue 21: 2 to 3 s a control cell).
- ``text/html``: the start state alone, with a line saying that running the cell makes it live. This is
  what a viewer that knows neither of the two shows: JupyterLab opening the stored notebook unrun (it
  sanitizes untrusted html, which would strip the frame switching and show every frame at once),
  GitHub, nbviewer.

The output of a control cell varies (widget ids change on every run, image pixels with the CPU), so the
cell is tagged ``nbval-ignore-output`` (CONTRIBUTING.md), and book/clean.py stores all but the live widget.
``CONTROLS`` keeps every control made in this process, for the test that redraws them all after Run
All (tests/test_chapter.py, in `make guarantees`).
"""

import base64
import html
import io
import math
import numbers
import os
import traceback
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

WIDGET = "application/vnd.jupyter.widget-view+json"
CONTROL_HTML = "application/vnd.book.control+html"
CONTROLS = []                         # every Control made in this process, oldest first

# Shows frame k of the control the input sits in. Inline, so the page needs no script file; written
# with single quotes only, since it lives in a double-quoted attribute.
SWITCH = ("const c=this.closest('.book-control'),f=c.querySelectorAll('.book-frame'),"
          "k=this.tagName==='SELECT'?this.selectedIndex:+this.value;"
          "f.forEach((e,i)=>{e.hidden=i!==k;});"
          "const o=c.querySelector('output');if(o){o.textContent=f[k].dataset.label;}"
          "this.setAttribute('aria-valuetext',f[k].dataset.label);")
OPTIONS = ("start", "dpi", "alt", "fmt")


def every_state():
    """Whether a control draws every state when it is made, for the site (``BOOK_FRAMES=all``), or only
    its start state, as in a reader's kernel (``BOOK_FRAMES`` unset or empty). Any other value is refused:
    ``BOOK_FRAMES=1`` meant as "all" would otherwise store a notebook the site cannot use."""
    value = os.environ.get("BOOK_FRAMES", "")
    if value not in ("", "all"):
        raise ValueError(f"BOOK_FRAMES must be 'all' (draw every state, for the site) or empty, got {value!r}")
    return value == "all"


def label_of(value):
    """How a value reads beside the control: 1,000 rather than 1000, NumPy numbers as Python's."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return f"{int(value):,}"
    return f"{float(value):g}" if isinstance(value, numbers.Real) and not isinstance(value, bool) else str(value)


def _dpi(dpi):
    """``dpi``, a positive finite number (savefig's errors for "72" or NaN do not name it)."""
    if isinstance(dpi, bool) or not isinstance(dpi, numbers.Real) or not 0 < dpi < math.inf:
        raise ValueError(f"dpi must be a positive finite number, got {dpi!r}")
    return dpi


def render(drawn, dpi=72, alt="", fmt="png"):
    """One frame as html: a figure becomes an inline image (and is closed), text a <pre> block.

    ``fmt="jpeg"`` suits photographs, which PNG barely compresses. Anything else than a matplotlib
    figure or a string is refused (TypeError): ``None`` from a ``draw`` that forgot its ``return``, or
    an Axes where the figure was meant.
    """
    if fmt not in ("png", "jpeg"):
        raise ValueError(f"fmt must be png or jpeg, got {fmt!r}")
    _dpi(dpi)
    if isinstance(drawn, Figure):
        buffer = io.BytesIO()
        options = {"metadata": {"Software": None}} if fmt == "png" else {"pil_kwargs": {"quality": 80}}
        drawn.savefig(buffer, format=fmt, dpi=dpi, **options)
        plt.close(drawn)
        data = base64.b64encode(buffer.getvalue()).decode()
        return f'<img src="data:image/{fmt};base64,{data}" alt="{html.escape(alt)}">'
    if isinstance(drawn, str):
        return f"<pre>{html.escape(drawn)}</pre>"
    hint = " (return ax.figure, not the Axes)" if hasattr(drawn, "figure") and isinstance(drawn.figure, Figure) else ""
    raise TypeError(f"draw must return a matplotlib figure or a string, got {type(drawn).__name__}{hint}")


def static_html(frames, labels, label, start=0, words=False):
    """The control as plain html: a range input (numbers) or a select (``words``) over precomputed frames."""
    n = len(frames)
    if n < 2 or len(labels) != n or not 0 <= start < n:
        raise ValueError(f"need two or more frames with one label each and 0 <= start < {n}")
    name = html.escape(label)
    if words:
        options = "".join(f"<option{' selected' if k == start else ''}>{html.escape(v)}</option>" for k, v in enumerate(labels))
        picker = f'<label>{name} <select oninput="{SWITCH}">{options}</select></label>'
    else:
        picker = (f'<label>{name} <input type="range" min="0" max="{n - 1}" step="1" value="{start}" '
                  f'aria-valuetext="{html.escape(labels[start])}" oninput="{SWITCH}"> '
                  f"<output>{html.escape(labels[start])}</output></label>")
    shown = "".join(f'<div class="book-frame" data-label="{html.escape(v)}"{"" if k == start else " hidden"}>{f}</div>'
                    for k, (v, f) in enumerate(zip(labels, frames, strict=True)))
    return f'<div class="book-control">{picker}{shown}</div>'


def still_html(frame, labels, label, start=0):
    """The control as one frame, its start state, under a line saying how to make it live."""
    states = ", ".join(labels) if len(labels) <= 8 else f"{labels[0]}, {labels[1]}, ..., {labels[-1]}"
    note = (f"<p><strong>{html.escape(label)}: {html.escape(labels[start])}</strong>, one of {len(labels)} states "
            f"({html.escape(states)}). <em>Run the notebook up to this cell to turn the control</em> "
            f"(the book's web page switches between the states without a kernel).</p>")
    return f'<div class="book-control-still">{note}{frame}</div>'


class Control:
    """A control over ``values``: ipywidgets in a live kernel, precomputed frames in html (see module)."""

    def __init__(self, draw, values, label, start=None, dpi=72, alt="", fmt="png", fixed=None):
        if not callable(draw):
            raise TypeError(f"draw must be a function of the value, got {type(draw).__name__}")
        if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):
            values = values.tolist()                     # a numpy array or a tensor of states
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"values must be a list of the states, got {type(values).__name__} {values!r:.60}")
        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__} {label!r:.60}")
        if not isinstance(alt, str):
            raise TypeError(f"alt must be a string, got {type(alt).__name__}")
        if fmt not in ("png", "jpeg"):
            raise ValueError(f"fmt must be png or jpeg, got {fmt!r}")
        _dpi(dpi)
        self.draw, self.values, self.label = draw, list(values), label
        self.dpi, self.alt, self.fmt, self.fixed = dpi, alt, fmt, dict(fixed or {})
        if len(self.values) < 2:
            raise ValueError(f"values must hold two or more states, got {self.values!r}")
        self.labels = [label_of(v) for v in self.values]
        if len(set(self.labels)) < len(self.labels):
            raise ValueError(f"values must read differently, got {self.labels}")
        same = [k for k, v in enumerate(self.values) if v == start and isinstance(v, bool) == isinstance(start, bool)]
        if start is not None and not same:
            raise ValueError(f"start={start!r} is not among the values {self.labels}")
        self.start = same[0] if start is not None else 0        # True == 1, but a start of 1 is not the state True
        # Every state for the site; in a reader's kernel the start state alone (None for the others).
        every = every_state()
        self.frames = [self.frame(v) if every or k == self.start else None for k, v in enumerate(self.values)]
        self.words = all(isinstance(v, str) for v in self.values)
        self.html = static_html(self.frames, self.labels, label, self.start, self.words) if every else None
        self.still = still_html(self.frames[self.start], self.labels, label, self.start)
        self.widget = None
        CONTROLS.append(self)

    def frame(self, value):
        """``draw(value, **fixed)`` as html; the figures it opened are closed, also when it fails."""
        before = set(plt.get_fignums())
        try:
            return render(self.draw(value, **self.fixed), self.dpi, self.alt, self.fmt)
        finally:
            for number in set(plt.get_fignums()) - before:
                plt.close(number)

    def redraw(self, value):
        """Show ``value``'s state under the control, or the error that drawing it raised."""
        try:
            shown = {"output_type": "display_data", "metadata": {},
                     "data": {"text/html": self.frame(value), "text/plain": f"{self.label}: {label_of(value)}"}}
        except Exception as error:                       # the reader sees it under the control, not in a log
            shown = {"output_type": "error", "ename": type(error).__name__, "evalue": str(error),
                     "traceback": "".join(traceback.format_exception(error)).rstrip().split("\n")}
        self.out.outputs = (shown,)
        return shown

    def build_widget(self):
        """The live control: moving it calls ``draw`` and redraws in an Output widget."""
        import ipywidgets as widgets

        # The picker is followed by its index, not its value: values may be equal and still different states
        # (1 and True, 0.0 and False), and a change between them would not change the value.
        options = list(zip(self.labels, self.values, strict=True))
        common = dict(options=options, index=self.start, description=self.label,
                      style={"description_width": "initial"}, layout={"width": "28em"})
        # A slider redraws when released, not at every value it passes (each redraw runs torch and matplotlib).
        self.picker = (widgets.Dropdown(**common) if self.words
                       else widgets.SelectionSlider(continuous_update=False, **common))
        self.out = widgets.Output()
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"text/html": self.frames[self.start], "text/plain": self.labels[self.start]}},)
        self.picker.observe(lambda change: self.redraw(self.values[change["new"]]), names="index")
        self.widget = widgets.VBox([self.picker, self.out])
        return self.widget

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": f"control: {self.label}, {len(self.values)} states", "text/html": self.still}
        if self.html is not None:
            bundle[CONTROL_HTML] = self.html
        try:
            widget = self.widget or self.build_widget()
        except ImportError:          # without ipywidgets the html renderings still work
            return bundle
        live = widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        if WIDGET in live:
            bundle[WIDGET] = live[WIDGET]
        return bundle


def control(draw, values, label, /, *, start=None, dpi=72, alt="", fmt="png", **fixed):
    """Show ``draw(value, **fixed)`` under a control over ``values``, live in Jupyter and static on the site.

    ``draw(value, **fixed)`` returns a matplotlib figure or a string; it is called for the start value
    now (for every value when the book is built: ``BOOK_FRAMES=all``, the site's frames) and again
    whenever a reader moves the control in a live kernel. Pass in
    ``fixed`` (keyword arguments) everything it uses from the notebook: they are bound now, so the
    control draws the same after later cells have rebound those names. Keep ``values`` (a list) to a
    handful (5 to 12): each becomes a frame stored in the notebook, an image at ``dpi`` (``fmt="jpeg"``
    for photographs). ``start`` is the value shown first; ``alt`` describes the frames.
    """
    return Control(draw, values, label, start, dpi, alt, fmt, fixed)


def redraw_all(controls=None):
    """Draw every state of every control again; return the states that differ from the frames drawn when
    each control's cell ran, as ``(label, value, what happened)``. Empty when every control is faithful.

    Each state goes through the live path, the widget's ``redraw``, as if a reader had picked it. A state
    not drawn when its control was made (a reader's kernel: see ``every_state``) is only checked to draw
    without an error; run with ``BOOK_FRAMES=all`` to compare them all.
    """
    differ = []
    for c in CONTROLS if controls is None else controls:
        if c.widget is None:
            c.build_widget()
        before = c.out.outputs                           # what the control shows for its picker's value
        for value, frame in zip(c.values, c.frames, strict=True):
            shown = c.redraw(value)
            if shown["output_type"] == "error":
                differ.append((c.label, label_of(value), f"raised {shown['ename']}: {shown['evalue']}"))
            elif frame is not None and shown["data"]["text/html"] != frame:
                differ.append((c.label, label_of(value), "draws a different frame"))
        c.out.outputs = before                           # so that it still shows the state its picker is at
    return differ
