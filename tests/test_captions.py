"""book/captions.py: the site takes each figure's caption from the markdown cell below it in the notebook."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("captions", ROOT / "book" / "captions.py")
captions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(captions)


def figure(name="fig-one"):
    return {"cell_type": "code", "source": 'save_figure(fig, "one")\nplt.show()', "outputs": [], "execution_count": 1,
            "metadata": {"mystnb": {"figure": {"name": name}, "image": {"alt": "A line."}}}}


def markdown(text, tags=()):
    return {"cell_type": "markdown", "source": text, "metadata": {"tags": list(tags)} if tags else {}}


def notebook(*cells):
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_caption_reads_the_number_and_the_text_of_a_caption_cell():
    cell = markdown("*Figure 9.1.2. Attention over\nthe $T\\times T$ *scores*.*\n", ["caption"])
    assert captions.caption(cell) == ("9.1", 2, "Attention over the $T\\times T$ *scores*.")
    assert captions.caption(markdown("*Figure 9.A.1. Softmax saturation.*", ["caption"]))[:2] == ("9.A", 1)
    assert captions.caption(markdown("*Figure 9.1.2. Untagged prose.*")) is None
    assert captions.caption(figure()) is None
    with pytest.raises(ValueError, match="must read"):
        captions.caption(markdown("Figure 9.1.2: no emphasis", ["caption"]))


def test_fill_captions_moves_each_caption_into_its_figure_and_hides_the_cell():
    nb = notebook(markdown("# 9.1 Title"), figure("fig-one"),
                  markdown("*Figure 9.1.1. The first\nfigure.*", ["caption"]), markdown("Prose."),
                  figure("fig-two"), markdown("*Figure 9.1.2. The second.*", ["caption"]))
    assert captions.fill_captions(nb) == 2
    cells = nb["cells"]
    assert cells[1]["metadata"]["mystnb"]["figure"] == {"name": "fig-one", "caption": "The first figure."}
    assert cells[4]["metadata"]["mystnb"]["figure"] == {"name": "fig-two", "caption": "The second."}
    assert cells[2]["metadata"]["tags"] == ["caption", "remove-cell"]
    assert "tags" not in cells[3]["metadata"] and cells[5]["metadata"]["tags"] == ["caption", "remove-cell"]
    assert len(cells) == 6 and cells[1]["metadata"]["mystnb"]["image"] == {"alt": "A line."}


def test_fill_captions_takes_an_nbformat_notebook_with_sources_as_line_lists():
    nb = nbformat.from_dict(notebook(figure(), markdown(["*Figure 9.2.1. Split\n", "over lines.*"], ["caption"])))
    assert captions.fill_captions(nb) == 1 and nb.cells[0].metadata.mystnb.figure.caption == "Split over lines."


@pytest.mark.parametrize("cells, message", [
    ([figure()], "should be its caption"),
    ([figure(), markdown("*Figure 9.1.1. Not tagged.*")], "should be its caption"),
    ([figure(), markdown("Figure 9.1.1 without emphasis", ["caption"])], "must read"),
])
def test_fill_captions_rejects_a_figure_without_its_caption_cell(cells, message):
    with pytest.raises(ValueError, match=message):
        captions.fill_captions(notebook(*cells))


def test_fill_captions_rejects_a_caption_written_twice():
    cell = figure()
    cell["metadata"]["mystnb"]["figure"]["caption"] = "Twice."
    with pytest.raises(ValueError, match="not in its metadata"):
        captions.fill_captions(notebook(cell, markdown("*Figure 9.1.1. Twice.*", ["caption"])))


class Logged(list):
    def warning(self, message, location=None):
        self.append((message, location))


def app(suffix):
    return SimpleNamespace(env=SimpleNamespace(doc2path=lambda docname: Path(f"/src/{docname}{suffix}")))


def test_source_read_rewrites_notebooks_only_and_warns_on_a_missing_caption(monkeypatch):
    text = json.dumps(notebook(figure(), markdown("*Figure 9.1.1. One.*", ["caption"])))
    content = [text]
    captions.source_read(app(".ipynb"), "notebooks/9.1-x", content)
    assert json.loads(content[0])["cells"][0]["metadata"]["mystnb"]["figure"]["caption"] == "One."
    content = [text]
    captions.source_read(app(".md"), "index", content)
    assert content == [text]

    from sphinx.util import logging

    logged = Logged()
    monkeypatch.setattr(logging, "getLogger", lambda name: logged)
    content = [json.dumps(notebook(figure()))]
    captions.source_read(app(".ipynb"), "notebooks/9.1-x", content)
    assert logged == [("fig-one: the cell below the figure should be its caption, tagged 'caption'", "notebooks/9.1-x")]


def test_every_stored_notebook_fills_all_its_figures():
    """What the site build does to each notebook, on the stored ones."""
    for ipynb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(ipynb.read_text())
        figures = sum(captions.is_figure(c) for c in nb["cells"])
        assert figures and captions.fill_captions(nb) == figures, ipynb.name
