"""The student edition (``make student``, ``book/student.py``): the book without its solutions, which still runs.

The first tests read the editions as written; the last one, marked ``chapter`` (``make guarantees``), executes
every student notebook with Run All, where each check must say "not attempted yet" and each experiment "complete
the function above first", and then, in the same kernel, pastes each reference solution into its starter: each
check must then say "correct", and each experiment run, with the student's function.
"""

import ast
import importlib.util
import json
import re

import nbformat
import pytest
from chapter import execute
from exercises_common import CHECK, ROOT
from IPython.core.inputtransformer2 import TransformerManager

spec = importlib.util.spec_from_file_location("student", ROOT / "book" / "student.py")
student = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student)

STORED = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = [p.stem.split("-")[0] for p in STORED]
GUARD = re.compile(r'solved\("(\d+\.[\dA-Z]+\.\d+)", (\w+)(?:, quiet=True)?\)', re.M)
MAGIC = "%%solution"


def book(path):
    return nbformat.read(path, as_version=4)


def checks(nb):
    """(index, number, name, cell) for every code cell that checks an exercise."""
    return [(i, *CHECK.search(c.source).groups(), c) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and CHECK.search(c.source)]


def pasted(starter, solution):
    """The starter with the reference solution pasted in place of its body: the solution cell's code below its
    ``%%solution`` line, which ends, like the starter, with the check line."""
    first, code = solution.source.split("\n", 1)
    assert first == MAGIC, f"a solution cell begins with {MAGIC}, so that it never replaces the reader's function"
    assert starter.source.rstrip().splitlines()[-1] == code.rstrip().splitlines()[-1], (
        "the solution cell does not end with its starter's check line")
    return code


@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_student_edition_has_no_solution(path):
    full, edition = book(path), student.student(book(path))
    assert not [c for c in edition.cells if student.is_solution(c)]
    text = "\n".join(c.source for c in edition.cells)
    assert "{dropdown} Solution" not in text
    # Nor does its text speak of solutions a student does not have (say it in a markdown cell tagged solution).
    prose = "\n".join(c.source for c in edition.cells[student.exercises_start(edition):] if c.cell_type == "markdown")
    assert not re.findall(r"[^.\n]*\bsolutions?\b[^.\n]*", prose, re.I), "the student edition speaks of solutions"
    solutions = [c.source for c in full.cells if student.is_solution(c)]
    assert not [s for s in solutions if s in text], "a solution's code is left in the student edition"
    # Every check left is a starter's, stored without output (the student runs it), and every exercise has one.
    left = checks(edition)
    assert sorted(n for _, n, _, _ in left) == sorted({n for _, n, _, _ in checks(full)})
    for _, number, _, cell in left:
        assert "# your code here" in cell.source or "# your answer here" in cell.source, f"{number}: not a starter"
        assert not cell.outputs


@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_student_edition_keeps_the_main_text_and_the_starters(path):
    full, edition = book(path), student.student(book(path))
    start = student.exercises_start(full)
    assert edition.cells[:start] == full.cells[:start], "the main text changed"
    kept = [c for c in full.cells[start:] if not student.is_solution(c) and c.cell_type == "code"]
    assert [c.source for c in edition.cells[start:] if c.cell_type == "code"] == [c.source for c in kept]


@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_student_edition_keeps_every_exercise_and_its_statement(path):
    """A markdown cell tagged solution held the heading and statement of Exercise 9.A.1 below the solutions' note,
    so the student edition lost the exercise (and the ledger's links to it broke the student site)."""
    full, edition = book(path), student.student(book(path))
    for cell in full.cells:
        if student.is_solution(cell) and cell.cell_type == "markdown":
            assert not re.search(r"^#+ ", cell.source, re.M), f"a heading in a solution cell: {cell.source[:200]}"
    headings = [line for c in full.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("#")]
    kept = [line for c in edition.cells if c.cell_type == "markdown" for line in c.source.splitlines()
            if line.startswith("#")]
    assert kept == headings


@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_solution_cells_hold_only_what_pasting_would_put_in_the_starter(path):
    """A solution cell is its starter's twin: imports, the reference function, the same check line; nothing that
    would run an experiment or redefine anything else when pasted."""
    full = book(path)
    found = checks(full)
    for (i, number, name, starter), (j, number_, name_, solution) in zip(found[0::2], found[1::2], strict=True):
        assert (number, name) == (number_, name_) and j == i + 1, f"{number}: starter then its solution"
        assert not student.is_solution(starter) and student.is_solution(solution), number
        body = ast.parse(pasted(starter, solution)).body
        kinds = [type(node).__name__ for node in body]
        assert set(kinds[:-1]) <= {"Import", "ImportFrom", "FunctionDef"} and kinds[-1] == "Expr", (number, kinds)
        assert [n.name for n in body if isinstance(n, ast.FunctionDef)][-1] == name
        pasted(starter, solution)


@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_every_use_of_a_students_function_waits_for_its_check(path):
    """After a starter, the student's function appears only as the argument of ``solved(number, name)``, whose
    result the experiment runs: nothing calls the starter, so Run All stays clean while the exercise is not
    done, and in the book's own edition the experiment runs the reference solution without replacing theirs."""
    for edition in (student.student(book(path)), book(path)):
        defined = {}                                  # a starter's function name -> its exercise
        for cell in edition.cells:
            if cell.cell_type != "code" or cell.source.startswith(MAGIC):
                continue
            found = CHECK.search(cell.source)
            if found:
                defined[found[2]] = found[1]
                continue
            tree = ast.parse(TransformerManager().transform_cell(cell.source))      # magics become Python
            allowed = {id(node.args[1]) for node in ast.walk(tree) if waits(node)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and node.id in defined and id(node) not in allowed:
                    pytest.fail(f"a cell uses {node.id} (exercise {defined[node.id]}) other than through "
                                f"solved(...):\n{cell.source[:300]}")


def waits(node):
    """Whether ``node`` is the call ``solved("9.N.k", name)`` (or with ``quiet=True``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "solved"
            and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[1], ast.Name))


def test_make_student_writes_both_editions(tmp_path):
    folders = student.build(tmp_path, notebooks=STORED[-1:])
    for edition, folder in folders.items():
        for name in ("README.md", "pyproject.toml", "environment.yml", "helpers/exercises/judge.py", "figures"):
            assert (folder / name).exists(), f"{edition}: {name} missing"
        md, ipynb = folder / "notebooks" / f"{STORED[-1].stem}.md", folder / "notebooks" / STORED[-1].name
        assert md.exists() and ipynb.exists()
    assert (folders["instructor"] / "notebooks" / STORED[-1].name).read_bytes() == STORED[-1].read_bytes()
    assert not list((folders["student"] / "helpers").rglob("__pycache__"))


PASTE = """
import json as _json
from IPython.utils.capture import capture_output as _capture
_pasted = []
for _number, _kind, _source in {snippets!r}:
    with _capture() as _out:
        _result = get_ipython().run_cell(_source)
    _pasted.append([_number, _kind, _out.stdout, repr(_result.error_in_exec) if _result.error_in_exec else None])
print(_json.dumps(_pasted))
"""


@pytest.mark.chapter
@pytest.mark.xdist_group("student")
@pytest.mark.parametrize("path", STORED, ids=NAMES)
def test_student_edition_runs_and_takes_the_reference_solutions(path, tmp_path):
    full = book(path)
    edition = student.student(full)
    copy = tmp_path / path.name
    nbformat.write(edition, copy)
    found = checks(full)
    snippets = []
    for (_, number, _, starter), (_, _, _, solution) in zip(found[0::2], found[1::2], strict=True):
        snippets.append([number, "pasted", pasted(starter, solution)])
        # then the experiments that waited for it, as the student would run them next
        snippets += [[number, "experiment", c.source] for c in edition.cells
                     if c.cell_type == "code" and any(m[1] == number for m in GUARD.finditer(c.source))]
    run = execute(copy, timeout=900, variables={"BOOK_TIMING_ATTEMPTS": "1"}, after=PASTE.format(snippets=snippets))
    for _, number, _, cell in checks(run.nb):
        text = "".join(o.get("text", "") for o in cell.outputs)
        assert text.startswith(f"Exercise {number}: not attempted yet."), text
    for cell in run.nb.cells:
        for m in GUARD.finditer(cell.source):
            text = "".join(o.get("text", "") for o in cell.outputs)
            assert text.startswith(f"Exercise {m[1]}: complete the function above first"), text
    results = json.loads(run.after.strip().splitlines()[-1])
    assert len(results) == len(snippets)
    for number, kind, printed, error in results:
        assert error is None, f"exercise {number}, {kind}: {error}\n{printed}"
        if kind == "pasted":
            assert printed.startswith(f"Exercise {number}: correct."), printed
        else:
            assert "complete the function above first" not in printed and "Exercise" not in printed[:9], printed
