"""The manuscript's own printed lines (the `# ...` output lines that close its listings) are printed by the
notebooks to the character, in cells a reader sees: a stronger check may sit beside one, never in its place."""

from pathlib import Path

import nbformat
import pytest
from readability import hidden, is_check

ROOT = Path(__file__).resolve().parents[1]
MANUSCRIPT = ROOT.parent / "shared" / "manuscript" / "chapter-09-attention-and-transformers.txt"

# Copied from the manuscript (the test below compares them with it wherever a checkout has it beside).
LINES = {
    "9.1": ["unscaled -> scaled by 1/sqrt(d_k), for 100 keys per query",
            "d_k =   16: variance of scores   16.0 -> 1.00; largest weight 0.56 -> 0.08; Jacobian norm 0.28 -> 0.15",
            "d_k =   64: variance of scores   65.1 -> 1.02; largest weight 0.76 -> 0.08; Jacobian norm 0.23 -> 0.15",
            "d_k =  256: variance of scores  257.0 -> 1.00; largest weight 0.89 -> 0.08; Jacobian norm 0.14 -> 0.15",
            "d_k = 1024: variance of scores 1019.6 -> 1.00; largest weight 0.95 -> 0.08; Jacobian norm 0.06 -> 0.15"],
    "9.2": ["matches nn.MultiheadAttention: True", "permuting the tokens permutes the outputs: True",
            "with a causal mask, outputs 0-2 ignore tokens 3-4: True", "parameters: 1088 = 4 d^2 + 4 d"],
    "9.3": ["score depends only on the offset n - m: True", "rotation leaves norms unchanged: True",
            "at offset 0 the score is the unrotated q . k: True"],
    "9.4": ["parameters: 124,439,808", "formula L(12 d^2 + 13 d) + (V + C + 2) d: 124,439,808",
            "in the blocks: 68% ; logits shape: (1, 8, 50257)"],
    "9.5": ["tiled attention equals full attention: True", "scores held at once: 16384 instead of 65536",
            "linear attention, recurrence equals parallel form: True"],
    "9.6": ["strided convolution = linear map of flattened patches: True",
            "tokens: (1, 196, 192) ; parameters of the patch embedding: 147648"],
}


def printed_lines(text):
    """The output lines of the manuscript's listings: a run of `# ` lines that ends its listing (a blank line follows)."""
    lines, found, run = text.splitlines() + [""], [], []
    for line, after in zip(lines, lines[1:], strict=False):
        if line.startswith("# "):
            run.append(line[2:])
            if not after.strip():
                found += run
        else:
            run = []
    return found


def test_the_lines_are_the_manuscripts():
    if not MANUSCRIPT.exists():
        pytest.skip(f"no manuscript beside this checkout ({MANUSCRIPT})")
    assert printed_lines(MANUSCRIPT.read_text()) == [line for lines in LINES.values() for line in lines]


@pytest.mark.parametrize("section", LINES)
def test_the_notebook_prints_the_manuscripts_lines_where_a_reader_sees_them(section):
    path = next((ROOT / "notebooks").glob(f"{section}-*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    shown = [line.rstrip() for c in nb.cells if c.cell_type == "code" and not hidden(c) and not is_check(c)
             for o in c.outputs if o.get("name") == "stdout" for line in o.text.splitlines()]
    missing = [line for line in LINES[section] if line not in shown]
    assert not missing, f"{path.name} no longer prints, in a visible cell, the manuscript's lines: {missing}"
    order = [shown.index(line) for line in LINES[section]]
    assert order == sorted(order), f"{path.name} prints the manuscript's lines out of order"


def test_a_changed_line_is_found():
    assert printed_lines("x = 1\nprint(x)\n# 1\n# 2\n\nprose\n# a comment\ny = 2\n") == ["1", "2"]
