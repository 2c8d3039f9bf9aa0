"""A visible cell shows what is computed, not how it is styled (issue 22).

The drawing of a figure (titles, labels, ticks, legends, colour bars, annotations, reference lines, layout)
lives in `helpers.diagrams` or `helpers.plotting`, or in a cell collapsed on the site and in Jupyter
(tagged `hide-input`/`remove-input`/`remove-cell`, or `source_hidden`). A visible code cell may carry a
few lines of it, at most `MOST`.

A styling line is a line of a statement whose call is one of `STYLING` on any object (`ax.set_xlabel(...)`,
`left.legend(...)`, `fig.colorbar(...)`, `ax.spines[...]...`), any `plt.` call but `plt.subplots`,
`plt.figure` and `plt.show`, or an assignment to `plt.rcParams`; every line of a statement spread over
several lines counts. Plotting data (`ax.plot`, `ax.imshow`, `annotated_heatmap`) is not styling.
"""

import ast
import re
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("*.md"))
MOST = 4
STYLING = re.compile(
    r"set|set_\w+|legend|tick_params|grid|colorbar|annotate|text|axhline|axvline|axhspan|axvspan|axline|"
    r"tight_layout|subplots_adjust|suptitle|supxlabel|supylabel|label_outer|invert_[xy]axis|margins|"
    r"set_major_\w+|set_minor_\w+|spines|axis|title|xlabel|ylabel|xticks|yticks|xlim|ylim|xscale|yscale|"
    r"clabel|bar_label|secondary_[xy]axis|twin[xy]")
DRAWING = {"subplots", "figure", "show", "close", "subplot_mosaic"}
HIDDEN = {"hide-input", "remove-input", "remove-cell"}


def _called(node):
    """The attribute names along a call chain: ax.set_xlabel(...) -> ["set_xlabel"], plt.gca().legend() -> [...]."""
    names = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.append((node.attr, node.value))
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return names, node


def is_styling(statement):
    """Whether a simple statement styles a figure (see the module's docstring)."""
    targets = []
    if isinstance(statement, ast.Expr):
        value = statement.value
    elif isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = statement.value
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    else:
        return False
    for target in targets:                                   # plt.rcParams[...] = ..., ax.spines[...].x = ...
        names, base = _called(target)
        if isinstance(base, ast.Name) and base.id == "plt" or any(n in ("spines", "rcParams") for n, _ in names):
            return True
    if not isinstance(value, ast.Call):
        return False
    names, base = _called(value)
    if not names:
        return False
    outermost = names[-1]                                    # plt.xlabel: ("xlabel", Name plt)
    if isinstance(base, ast.Name) and base.id == "plt" and len(names) == 1:
        return outermost[0] not in DRAWING
    return any(STYLING.fullmatch(name) for name, _ in names)


def styling_lines(code):
    """How many lines of ``code`` style a figure. IPython magics (`%...`, `!...`) are left out."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines())
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return 0
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and is_styling(node):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return len(lines)


def visible(cell):
    tags = set(cell.metadata.get("tags", []))
    return cell.cell_type == "code" and not tags & HIDDEN and not cell.metadata.get("jupyter", {}).get("source_hidden")


def heavy_cells(md):
    """(cell index, first line, styling lines) of each visible cell with more than MOST lines of styling."""
    found = []
    for i, cell in enumerate(jupytext.read(md).cells):
        if visible(cell) and (n := styling_lines(cell.source)) > MOST:
            found.append((i, next((line for line in cell.source.splitlines() if line.strip()), ""), n))
    return found


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_visible_cells_carry_at_most_a_few_lines_of_styling(md):
    heavy = heavy_cells(md)
    assert not heavy, (f"{md.stem}: visible cells with more than {MOST} lines of styling; move the drawing into "
                       "helpers.diagrams (or collapse the cell with hide-input):\n"
                       + "\n".join(f"  cell {i} ({first[:50]!r}...): {n} lines" for i, first, n in heavy))


@pytest.mark.parametrize("code, n", [
    ("ax.plot(x, y)\nannotated_heatmap(ax, A)\nplt.show()", 0),
    ("fig, ax = plt.subplots(1, 2)\nax.set_xlabel('T')\nax.set(xscale='log',\n       ylabel='y')", 3),
    ("ax.legend(loc='upper left')\nfig.colorbar(im, ax=ax)\nax.text(1, 2, 's')\nax.axvline(6)", 4),
    ("plt.xlabel('x')\nplt.tight_layout()\nplt.rcParams['font.size'] = 8\nplt.show()", 3),
    ("ax.spines['top'].set_visible(False)\nax.xaxis.set_major_locator(loc)", 2),
    ("for ax in axes:\n    ax.set_title('t')\n    ax.imshow(A)\n", 1),
    ("%matplotlib inline\nax.set_ylim(0, 1)", 1),
    ("left.set(xlabel='a')\nright.set_title('b')\nsave_figure(fig, 'name')", 2),
])
def test_styling_lines_counts_styling_not_drawing(code, n):
    assert styling_lines(code) == n


def test_hidden_cells_do_not_count():
    import nbformat

    cell = nbformat.v4.new_code_cell("\n".join(f"ax.set_title('{i}')" for i in range(10)))
    assert visible(cell)
    cell.metadata["tags"] = ["hide-input"]
    assert not visible(cell)
    cell.metadata = {"jupyter": {"source_hidden": True}}
    assert not visible(cell)
