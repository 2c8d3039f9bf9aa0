"""Figure captions, written once: in the markdown cell below each figure, which Jupyter shows.

A figure cell carries its `mystnb` metadata (`figure: name:` and `image: alt:`) but no caption; the
markdown cell right below it, tagged `caption`, reads `*Figure 9.N.k. The caption.*`. The site needs the
caption in the figure's metadata, where myst-nb makes a numbered `<figcaption>` of it, so when Sphinx
reads a notebook (its `source-read` event, before myst-nb parses the text) `fill_captions` copies each
caption cell's text into the metadata of the figure above it and tags the caption cell `remove-cell`,
so the page shows it once, under the figure, with Sphinx's own number. Only what Sphinx parses
changes: the notebook on disk, and the copy a reader downloads from the site, keep their caption cells.

`tests/test_notebooks.py` checks that every figure has its caption cell, numbered in order.
"""

import json
import re

TAG = "caption"
# *Figure 9.1.2. The text, over one or more lines.*  (number: section, figure)
CAPTION = re.compile(r"\A\*Figure (\d+\.[0-9A-Z]+)\.(\d+)\. (.+)\*\Z", re.S)


def source(cell):
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def caption(cell):
    """``(section, k, text)`` of a caption cell (``("9.1", 2, "The ...")``), or None for any other cell.

    The text has its whitespace collapsed; it is MyST markdown (math, emphasis) as written.
    """
    if cell.get("cell_type") != "markdown" or TAG not in cell.get("metadata", {}).get("tags", []):
        return None
    found = CAPTION.match(source(cell).strip())
    if not found:
        raise ValueError(f"a cell tagged {TAG!r} must read '*Figure 9.N.k. The caption.*', got {source(cell)[:60]!r}")
    return found[1], int(found[2]), " ".join(found[3].split())


def is_figure(cell):
    return cell.get("cell_type") == "code" and "figure" in cell.get("metadata", {}).get("mystnb", {})


def fill_captions(nb):
    """Copy each caption cell's text into the figure cell above it and hide the caption cell; in place.

    ``nb`` is a notebook as a dict (parsed JSON or nbformat). Returns the number of captions filled.
    Raises ValueError when a figure has no caption cell below it, or already has a caption in its metadata.
    """
    cells = nb["cells"]
    filled = 0
    for i, cell in enumerate(cells):
        if not is_figure(cell):
            continue
        figure = cell["metadata"]["mystnb"]["figure"]
        name = figure.get("name", f"cell {i}")
        if "caption" in figure:
            raise ValueError(f"{name}: the caption belongs in the markdown cell below the figure, not in its metadata")
        found = caption(cells[i + 1]) if i + 1 < len(cells) else None
        if found is None:
            raise ValueError(f"{name}: the cell below the figure should be its caption, tagged {TAG!r}")
        figure["caption"] = found[2]
        tags = cells[i + 1]["metadata"]["tags"]
        tags.append("remove-cell")
        filled += 1
    return filled


def source_read(app, docname, content):
    """Sphinx's ``source-read`` handler: fill the captions of a notebook before myst-nb parses it."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    nb = json.loads(content[0])
    try:
        if fill_captions(nb):
            content[0] = json.dumps(nb, ensure_ascii=False)
    except ValueError as error:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(f"{error}", location=docname)
