"""helpers.controls: one control, live (ipywidgets) and static (precomputed frames in html)."""

import importlib.util
import re
from pathlib import Path

import matplotlib

matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.controls import CONTROL_HTML, CONTROLS, WIDGET, control, label_of, redraw_all, static_html  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("clean", ROOT / "book" / "clean.py")
clean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clean)


@pytest.fixture(autouse=True)
def book_build(monkeypatch):
    """Most tests here are of the book's build, which draws every state (make execute); the reader's
    kernel, which draws the start state alone, has its own tests below."""
    monkeypatch.setenv("BOOK_FRAMES", "all")
    plt.close("all")                      # figures another test module left open are not a control's


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
    assert c.out.outputs[0]["data"]["text/html"] == c.frames[2], "the redraw shows what the stored frame shows"
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
    assert set(cell.outputs[0].data) == {"text/plain", "text/html", CONTROL_HTML}


def test_photographs_can_be_stored_as_jpeg():
    c = control(line, [1, 2], "slope", fmt="jpeg")
    assert c.html.count("data:image/jpeg;base64,/9j/") == 2        # /9j/ is base64 of JPEG's start-of-image marker
    with pytest.raises(ValueError):
        control(line, [1, 2], "slope", fmt="gif")


def test_what_draw_uses_is_bound_when_the_control_is_made():
    """A later rebinding of a name the notebook used (issue 19: `T = 5` in 9.2) changes nothing drawn."""
    data = {"T": 3}
    c = control(lambda s, T: line(s * T), [1, 2], "slope", T=data["T"])
    data["T"] = 5
    assert c.fixed == {"T": 3} and redraw_all([c]) == []


def test_a_control_that_draws_differently_or_raises_after_the_fact_is_reported():
    state = {"k": 1}
    c = control(lambda s: line(s * state["k"]), [1, 2], "slope")
    state["k"] = 2
    assert redraw_all([c]) == [("slope", "1", "draws a different frame"), ("slope", "2", "draws a different frame")]
    state["k"] = None
    assert [d[2].split(":")[0] for d in redraw_all([c])] == ["raised TypeError"] * 2


def test_an_error_in_a_redraw_shows_under_the_control():
    broken = []

    def draw(s):
        if broken:
            raise ValueError("x and y must have same first dimension")
        return line(s)

    c = control(draw, [1, 2, 5], "slope")
    c.build_widget()
    broken.append(True)
    c.picker.value = 5                                   # raises inside draw: shown, not only logged
    (shown,) = c.out.outputs
    assert shown["output_type"] == "error" and shown["ename"] == "ValueError"
    assert "x and y must have same first dimension" in shown["evalue"] and any("draw" in t for t in shown["traceback"])
    broken.clear()
    c.picker.value = 2                                   # and the next good state replaces the error
    assert c.out.outputs[0]["data"]["text/html"] == c.frames[1]
    assert not plt.get_fignums()


def test_every_control_made_is_registered():
    c = control(line, [1, 2], "slope")
    assert CONTROLS[-1] is c


def test_stored_html_shows_one_frame_and_says_how_to_make_it_live():
    """What JupyterLab shows unrun (text/html): the start frame alone; the site's every-state html apart."""
    bundle = control(line, [1, 2, 5], "slope", start=2)._repr_mimebundle_()
    still = bundle["text/html"]
    assert still.count("<img") == 1 and "book-frame" not in still and "oninput" not in still
    assert "Run the notebook up to this cell" in still and "slope: 2" in still and "3 states" in still
    assert bundle[CONTROL_HTML].count("<img") == 3 and "oninput" in bundle[CONTROL_HTML]
    assert re.search(r'src="([^"]+)"', still)[1] in bundle[CONTROL_HTML].split('data-label="2"')[1].split("</div>")[0]


def test_a_draw_returning_neither_figure_nor_text_is_refused_and_its_figures_closed():
    """Issue 23: None read '<pre>None</pre>', an Axes '<pre>Axes(...)</pre>', and their figures stayed open."""
    def forgot_return(s):
        line(s)

    with pytest.raises(TypeError, match="figure or a string, got NoneType"):
        control(forgot_return, [1, 2], "slope")
    assert not plt.get_fignums()
    with pytest.raises(TypeError, match="got Axes .*ax.figure"):
        control(lambda s: line(s).axes[0], [1, 2], "slope")
    assert not plt.get_fignums()
    with pytest.raises(TypeError, match="got int"):
        control(lambda s: s, [1, 2], "slope")


def test_figures_opened_by_a_draw_that_raises_are_closed():
    def fails(s):
        line(s)
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError):
        control(fails, [1, 2], "slope")
    assert not plt.get_fignums()


def test_values_must_be_a_list_not_a_string():
    """Issue 23: control(f, "abc", ...) became a three-item menu."""
    with pytest.raises(TypeError, match="values must be a list"):
        control(str, "abc", "letter")
    with pytest.raises(TypeError, match="values must be a list"):
        control(str, {1, 2}, "unordered")
    with pytest.raises(ValueError, match="two or more"):
        control(str, ["a"], "one")
    assert control(str, range(3), "n").values == [0, 1, 2]
    assert control(str, torch.tensor([1, 2]), "n").values == [1, 2]


def test_label_must_be_text():
    """Issue 23: label=123 failed with AttributeError inside html."""
    with pytest.raises(TypeError, match="label must be a string, got int"):
        control(str, [1, 2], 123)


def test_start_must_be_among_the_values():
    """Issue 23: start=5 failed with '5 is not in list'."""
    with pytest.raises(ValueError, match=r"start=5 is not among the values \['1', '2'\]"):
        control(str, [1, 2], "n", start=5)


def test_fixed_arguments_may_share_the_names_of_controls_own():
    """9.1's draw takes `values` (the stored values), which is also control's second parameter."""
    c = control(lambda s, values, label: line(s * values[0]), [1, 2], "slope", values=[3], label="x")
    assert c.fixed == {"values": [3], "label": "x"} and c.values == [1, 2] and c.label == "slope"


def test_the_site_shows_every_frame_and_the_stored_notebook_keeps_both():
    """book/conf.py swaps the every-state html into text/html as Sphinx reads a notebook (what the page renders)."""
    import json
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("conf", ROOT / "book" / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    bundle = control(line, [1, 2], "slope")._repr_mimebundle_()
    cell = nbformat.v4.new_code_cell("control(...)")
    cell.outputs = [nbformat.v4.new_output("display_data", data={k: v for k, v in bundle.items() if k != WIDGET})]
    content = [nbformat.writes(nbformat.v4.new_notebook(cells=[cell]))]
    app = SimpleNamespace(env=SimpleNamespace(doc2path=lambda name: f"{name}.ipynb"))
    conf.control_frames(app, "notebooks/9.1", content)
    data = json.loads(content[0])["cells"][0]["outputs"][0]["data"]
    assert data["text/html"] == bundle[CONTROL_HTML] and CONTROL_HTML not in data


# The review that passed bad input to the helpers.
def test_numpy_numbers_read_as_python_numbers():
    """A list of NumPy ints read 1000 (an array of them, converted by tolist, read 1,000)."""
    import numpy as np

    assert [label_of(v) for v in (np.int64(1000), np.float32(0.5), np.float64(1e-4), np.bool_(True))] == [
        "1,000", "0.5", "0.0001", "True"]
    assert control(str, [np.int64(1000), np.int64(2000)], "T").labels == ["1,000", "2,000"]


@pytest.mark.parametrize("dpi", ["72", float("nan"), 0, -5, float("inf"), True])
def test_dpi_must_be_a_positive_finite_number(dpi):
    with pytest.raises(ValueError, match=f"dpi must be a positive finite number, got {re.escape(repr(dpi))}"):
        control(line, [1, 2], "slope", dpi=dpi)
    assert not plt.get_fignums()


# A reader's kernel (issue 21: each control cell took 2 to 3 s drawing every state for the site).
def test_a_readers_kernel_draws_the_start_state_alone_and_the_rest_when_reached(monkeypatch):
    monkeypatch.delenv("BOOK_FRAMES")
    calls = []
    c = control(lambda s: calls.append(s) or line(s), [1, 2, 5], "slope", start=2)
    assert calls == [2] and c.frames[0] is None and c.frames[2] is None
    bundle = c._repr_mimebundle_()
    assert CONTROL_HTML not in bundle, "no every-state html with one state drawn"
    assert bundle["text/html"].count("<img") == 1 and "Run the notebook up to this cell" in bundle["text/html"]
    assert WIDGET in bundle
    c.picker.value = 5                                   # the slider draws the state it reaches
    assert calls == [2, 5] and c.out.outputs[0]["data"]["text/html"].startswith("<img")
    c.picker.value = 2
    assert c.out.outputs[0]["data"]["text/html"] == c.frames[1]
    assert not plt.get_fignums()


def test_a_readers_kernel_compares_the_start_state_and_checks_the_others_draw(monkeypatch):
    monkeypatch.setenv("BOOK_FRAMES", "")
    state = {"k": 1}
    c = control(lambda s: line(s * state["k"]), [1, 2], "slope")
    assert redraw_all([c]) == []
    state["k"] = 2
    assert redraw_all([c]) == [("slope", "1", "draws a different frame")]
    state["k"] = None
    assert [d[2].split(":")[0] for d in redraw_all([c])] == ["raised TypeError"] * 2


def test_only_all_means_every_state_and_other_values_are_refused(monkeypatch):
    """The reader-flow review: BOOK_FRAMES=1 drew the start state alone, without a word."""
    monkeypatch.setenv("BOOK_FRAMES", "")
    assert control(str, [1, 2], "n").html is None
    for value in ("1", "ALL", "yes", " all"):
        monkeypatch.setenv("BOOK_FRAMES", value)
        with pytest.raises(ValueError, match=f"BOOK_FRAMES must be 'all' .* or empty, got {value!r}"):
            control(str, [1, 2], "n")
    monkeypatch.setenv("BOOK_FRAMES", "all")
    assert control(str, [1, 2], "n").html.count('class="book-frame"') == 2


def test_redraw_all_leaves_each_control_showing_its_pickers_state():
    """The reader-flow review: after redraw_all a control showed its last state, its slider the start."""
    c = control(line, [1, 2, 5], "slope", start=2)
    c.build_widget()
    shown = c.out.outputs
    assert redraw_all([c]) == [] and c.out.outputs == shown and c.picker.value == 2


def test_states_that_compare_equal_are_still_told_apart():
    """Bad input to the helpers: with values [1, True, 2] the slider moved to True still showed 1 (True == 1,
    so the value did not change), and [0.0, False, 1.0] with start=False opened on 0.0."""
    calls = []
    c = control(lambda s: calls.append(repr(s)) or f"state {s!r}", [1, True, 2], "x")
    c.build_widget()
    c.picker.index = 1                                   # what the slider sends when it is moved
    assert calls[-1] == "True" and "state True" in c.out.outputs[0]["data"]["text/html"]
    d = control(lambda s: f"state {s!r}", [0.0, False, 1.0], "y", start=False)
    d.build_widget()
    assert d.picker.index == 1 and d.picker.label == "False"
