"""Controls to turn: live in Jupyter, and still working on the static site, without kernel or network.

``control(draw, values, label)`` shows ``draw(value)`` (a matplotlib figure, or text) under a slider,
or a menu when the values are words. One display carries two renderings of the same control:

- ``application/vnd.jupyter.widget-view+json``: an ipywidgets slider or dropdown. In a live kernel
  (JupyterLab, VS Code, Colab) moving it calls ``draw`` again, so the notebook's own torch code
  recomputes the figure.
- ``text/html``: every state drawn now, by the same ``draw``, as small inline PNGs behind a plain
  ``<input type="range">`` or ``<select>`` whose few lines of inline JavaScript show one frame at a
  time. The site renders this one (book/conf.py); it needs no kernel, no widget manager and nothing
  from another host.

The output of a control cell varies (widget ids change on every run, PNG pixels with the CPU), so the
cell is tagged ``nbval-ignore-output`` (README), and book/clean.py stores only the html rendering.
"""

import base64
import html
import io

import matplotlib.pyplot as plt

WIDGET = "application/vnd.jupyter.widget-view+json"

# Shows frame k of the control the input sits in. Inline, so the page needs no script file; written
# with single quotes only, since it lives in a double-quoted attribute.
SWITCH = ("const c=this.closest('.book-control'),f=c.querySelectorAll('.book-frame'),"
          "k=this.tagName==='SELECT'?this.selectedIndex:+this.value;"
          "f.forEach((e,i)=>{e.hidden=i!==k;});"
          "const o=c.querySelector('output');if(o){o.textContent=f[k].dataset.label;}"
          "this.setAttribute('aria-valuetext',f[k].dataset.label);")


def label_of(value):
    """How a value reads beside the control: 1,000 rather than 1000."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def render(drawn, dpi=72, alt="", fmt="png"):
    """One frame as html: a figure becomes an inline image (and is closed), text a <pre> block.

    ``fmt="jpeg"`` suits photographs, which PNG barely compresses.
    """
    if fmt not in ("png", "jpeg"):
        raise ValueError(f"fmt must be png or jpeg, got {fmt!r}")
    if hasattr(drawn, "savefig"):
        buffer = io.BytesIO()
        options = {"metadata": {"Software": None}} if fmt == "png" else {"pil_kwargs": {"quality": 80}}
        drawn.savefig(buffer, format=fmt, dpi=dpi, **options)
        plt.close(drawn)
        data = base64.b64encode(buffer.getvalue()).decode()
        return f'<img src="data:image/{fmt};base64,{data}" alt="{html.escape(alt)}">'
    return f"<pre>{html.escape(str(drawn))}</pre>"


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


class Control:
    """A control over ``values``: ipywidgets in a live kernel, precomputed frames in html (see module)."""

    def __init__(self, draw, values, label, start=None, dpi=72, alt="", fmt="png"):
        self.draw, self.values, self.label = draw, list(values), label
        self.labels = [label_of(v) for v in self.values]
        self.start = self.values.index(start) if start is not None else 0
        self.frames = [render(draw(v), dpi, alt, fmt) for v in self.values]
        self.words = all(isinstance(v, str) for v in self.values)
        self.html = static_html(self.frames, self.labels, label, self.start, self.words)
        self.widget = None

    def build_widget(self):
        """The live control: moving it calls ``draw`` and redraws in an Output widget."""
        import ipywidgets as widgets
        from IPython.display import HTML, display

        options = list(zip(self.labels, self.values, strict=True))
        common = dict(options=options, value=self.values[self.start], description=self.label,
                      style={"description_width": "initial"}, layout={"width": "28em"})
        # A slider redraws when released, not at every value it passes (each redraw runs torch and matplotlib).
        self.picker = (widgets.Dropdown(**common) if self.words
                       else widgets.SelectionSlider(continuous_update=False, **common))
        self.out = widgets.Output()
        with self.out:
            display(HTML(self.frames[self.start]))

        def redraw(change):
            drawn = self.draw(change["new"])
            with self.out:
                self.out.clear_output(wait=True)
                display(drawn) if hasattr(drawn, "savefig") else print(drawn)
            if hasattr(drawn, "savefig"):
                plt.close(drawn)

        self.picker.observe(redraw, names="value")
        self.widget = widgets.VBox([self.picker, self.out])
        return self.widget

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": f"control: {self.label}, {len(self.values)} states", "text/html": self.html}
        try:
            widget = self.widget or self.build_widget()
        except ImportError:          # without ipywidgets the html rendering still works where scripts run
            return bundle
        live = widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        if WIDGET in live:
            bundle[WIDGET] = live[WIDGET]
        return bundle


def control(draw, values, label, start=None, dpi=72, alt="", fmt="png"):
    """Show ``draw(value)`` under a control over ``values``, live in Jupyter and static on the site.

    ``draw(value)`` returns a matplotlib figure or text; it is called once per value now (the
    site's frames) and again whenever a reader moves the control in a live kernel. Keep ``values`` to
    a handful (5 to 12): each becomes a frame stored in the notebook, a PNG at ``dpi`` (``fmt="jpeg"``
    for photographs). ``alt`` describes the frames.
    """
    return Control(draw, values, label, start, dpi, alt, fmt)
