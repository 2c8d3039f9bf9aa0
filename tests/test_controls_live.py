"""After Run All, every control redraws every state as it drew it when its cell ran (issue 19).

For each notebook with controls: run it top to bottom in one kernel (nbclient), then, in that same
kernel, move every control through every state through its live path (the widget's redraw, as a
reader's slider would) and compare each frame with the one drawn when the control's cell ran. Same
code, same process, same thread count: the image bytes must be identical, so they are compared
exactly. A control whose `draw` read a notebook global that a later cell rebinds fails here, by
drawing something else or raising.

Slow (it executes the notebooks again: 9.4's race is most of it), so it runs with the chapter's other
re-executions in `make guarantees` (CI).
"""

import json
import re
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.chapter

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(r"^control\(", re.M)
CONTROLLED = [p for p in sorted((ROOT / "notebooks").glob("*.md")) if CALL.search(p.read_text())]
PROBE = """
import json
from helpers.controls import CONTROLS, redraw_all
print(json.dumps({"controls": [c.label for c in CONTROLS], "differ": redraw_all()}))
"""


def test_the_chapter_has_controls():
    assert len(CONTROLLED) >= 6, [p.name for p in CONTROLLED]


@pytest.mark.parametrize("path", CONTROLLED, ids=[p.stem for p in CONTROLLED])
def test_after_run_all_every_control_redraws_every_state_as_its_cell_drew_it(path):
    nb = jupytext.read(path)                               # the source; the stored .ipynb is its twin
    calls = sum(len(CALL.findall(c.source)) for c in nb.cells if c.cell_type == "code")
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream" and o.name == "stdout")
    report = json.loads(printed.strip().splitlines()[-1])
    assert len(report["controls"]) == calls, f"{calls} control cells, but the kernel made {report['controls']}"
    assert report["differ"] == [], f"{path.name}: states that do not redraw as drawn: {report['differ']}"
