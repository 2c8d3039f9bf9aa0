"""The layout every section's exercises share: 4 to 6 numbered exercises at the end of each section, each checked
one a starter followed by its hidden solution, stored outputs showing "not attempted yet" and "correct", and the
check imported in the setup cell. (The appendices' layout is tested in test_exercises_9_a.py.)"""

import importlib
import re

import jupytext
import nbformat
import pytest
import torch
from exercises_common import (
    CHECK,
    HEADING,
    NOTEBOOKS,
    SECTIONS,
    checked_cells,
    compile_cell,
    exercise_cells,
    hidden,
    setup_cell,
)

from helpers.exercises import EXERCISES


def test_every_checker_has_wrong_answers_and_a_notebook():
    in_notebooks = {number for s in SECTIONS for number, _, _ in checked_cells(s)}
    registered = {n for n in EXERCISES if n.rsplit(".", 1)[0] in SECTIONS}
    assert registered == in_notebooks
    # Each section's test file lists its wrong answers: WRONG, and NEW_WRONG for the exercises added later.
    wrong = set()
    for s in SECTIONS:
        tests = importlib.import_module(f"test_exercises_{s.replace('.', '_')}")
        wrong |= set(tests.WRONG) | set(getattr(tests, "NEW_WRONG", {}))
    assert registered <= wrong, f"checkers without wrong answers: {sorted(registered - wrong)}"


@pytest.mark.parametrize("section", SECTIONS)
def test_section_ends_with_four_to_six_exercises(section):
    """Numbered headings in order, at least three checked, each checked one followed by its hidden solution."""
    nb = jupytext.read(NOTEBOOKS[section])
    cells = exercise_cells(nb)
    numbers = HEADING.findall("\n".join(c.source for c in cells if c.cell_type == "markdown"))
    assert numbers == [f"{section}.{k}" for k in range(1, len(numbers) + 1)], numbers
    assert 4 <= len(numbers) <= 6, numbers
    checked = checked_cells(section)
    assert len({n for n, _, _ in checked}) >= 3
    pairs = [(number, hidden(cell)) for number, _, cell in checked]
    assert pairs[0::2] == [(n, False) for n, _ in pairs[0::2]] and pairs[1::2] == [(n, True) for n, _ in pairs[0::2]]
    # A written answer sits in a MyST dropdown, closed until clicked: a directive, so that its math is typeset
    # in JupyterLab too (jupyterlab-myst leaves the TeX inside raw html such as <details> as text).
    for c in cells:
        if c.cell_type == "markdown" and "Solution" in c.source:
            assert "<details>" not in c.source and ":::{dropdown} Solution\n" in c.source, c.source[:200]
            assert c.source.count(":::{dropdown}") == len(re.findall(r"^:::$", c.source, flags=re.M)), c.source[:200]
            assert c.source.rstrip().endswith("\n:::") or re.search(r"\n:::\n\n### Exercise ", c.source), c.source[-200:]


@pytest.mark.parametrize("section", SECTIONS)
def test_stored_outputs_show_starters_untouched_and_solutions_passing(section):
    stored = nbformat.read(NOTEBOOKS[section].with_suffix(".ipynb"), as_version=4)
    for cell in exercise_cells(stored):
        found = cell.cell_type == "code" and CHECK.search(cell.source)
        if not found:
            continue
        text = "".join(o.get("text", "") for o in cell.outputs)
        verdict_ = "the reference solution is correct." if hidden(cell) else "not attempted yet."
        assert text.startswith(f"Exercise {found[1]}: {verdict_}"), text
        # `make check` leaves the reference solutions' own tests to nbval, which must compare this verdict.
        assert not {"nbval-ignore-output", "nbval-skip", "raises-exception"} & set(cell.metadata.get("tags", [])), text


@pytest.mark.parametrize("section", (*SECTIONS, "9.A"))
def test_check_is_imported_in_the_setup_cell(section):
    """Issue 19: check was imported only in the first exercise cell: after a restart a later one failed."""
    nb = jupytext.read(NOTEBOOKS[section])
    assert re.search(r"^from helpers\.exercises import check(, solved)?$", setup_cell(nb).source, re.M)
    # After a restart: the setup cell, then the last starter alone.
    namespace, default = {}, torch.get_default_dtype()
    exec(setup_cell(nb).source, namespace)
    number, name, cell = [s for s in checked_cells(section) if not hidden(s[2])][-1]
    import contextlib
    import io
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile_cell(cell.source, f"restart-{number}"), namespace)
    torch.set_default_dtype(default)
    assert printed.getvalue().startswith(f"Exercise {number}: not attempted yet."), printed.getvalue()
