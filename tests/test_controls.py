"""helpers.controls: one control, live (ipywidgets) and static (precomputed frames in html)."""

import importlib.util
import re
from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from helpers.controls import WIDGET, control, label_of, static_html  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("clean", ROOT / "book" / "clean.py")
clean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clean)


def line(slope):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [0, slope])
    return fig


def frames(html):
    return re.findall(r'<div class="book-frame" data-label="([^"]*)"( hidden)?>', html)


def test_one_frame_per_value_drawn_by_draw_and_only_the_start_shown():
    calls = []
    c = control(lambda s: calls.append(s) or line(s), [1, 2, 5], "slope", start=2)
    assert calls == [1, 2, 5]
    assert frames(c.html) == [("1", " hidden"), ("2", ""), ("5", " hidden")]
    assert c.html.count("data:image/png;base64,") == 3
    assert len(set(re.findall(r'src="([^"]+)"', c.html))) == 3, "different states should draw different frames"
    assert '<input type="range" min="0" max="2" step="1" value="1"' in c.html
    assert not plt.get_fignums(), "every frame's figure is closed once drawn"


def test_words_get_a_menu_and_text_is_escaped():
    c = control(lambda w: f"<{w}>", ["none", "causal"], "mask")
    assert "<select" in c.html and "<option selected>none</option><option>causal</option>" in c.html
    assert "<pre>&lt;causal&gt;</pre>" in c.html and 'type="range"' not in c.html


def test_nothing_in_the_html_loads_from_elsewhere():
    html = control(line, [1, 2], "slope").html
    assert not re.search(r"(src|href)=\"(?!data:)", html) and "<script" not in html


def test_labels_read_as_in_the_text():
    assert [label_of(v) for v in (1000, 0.5, 1e-4, "causal")] == ["1,000", "0.5", "0.0001", "causal"]


def test_static_html_refuses_what_cannot_be_a_control():
    with pytest.raises(ValueError):
        static_html(["<pre>a</pre>"], ["a"], "one state")
    with pytest.raises(ValueError):
        static_html(["a", "b"], ["a", "b"], "start out of range", start=2)


def test_the_live_control_redraws_with_the_new_value():
    calls = []
    c = control(lambda s: calls.append(s) or line(s), [1, 2, 5], "slope")
    bundle = c._repr_mimebundle_()
    assert {"text/plain", "text/html", WIDGET} <= set(bundle)
    assert bundle[WIDGET]["model_id"] == c.widget.model_id
    c.picker.value = 5                                   # what moving the slider does
    assert calls == [1, 2, 5, 5]
    assert type(c.picker).__name__ == "SelectionSlider"
    assert type(control(str, ["a", "b"], "word").build_widget().children[0]).__name__ == "Dropdown"
    assert not plt.get_fignums()


def test_clean_stores_the_html_rendering_without_the_live_widget():
    bundle = control(line, [1, 2], "slope")._repr_mimebundle_()
    cell = nbformat.v4.new_code_cell("control(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb = nbformat.v4.new_notebook(cells=[cell], metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}})
    assert not clean.is_clean(nb)
    clean.clean(nb)
    assert clean.is_clean(nb) and "widgets" not in nb.metadata
    assert set(cell.outputs[0].data) == {"text/plain", "text/html"}


def test_photographs_can_be_stored_as_jpeg():
    c = control(line, [1, 2], "slope", fmt="jpeg")
    assert c.html.count("data:image/jpeg;base64,/9j/") == 2        # /9j/ is base64 of JPEG's start-of-image marker
    with pytest.raises(ValueError):
        control(line, [1, 2], "slope", fmt="gif")
