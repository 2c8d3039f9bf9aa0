"""The two editions of the book: ``python book/student.py [OUT]`` writes ``OUT/student`` and ``OUT/instructor``.

The instructor edition is the book as it is. The student edition is the same book without its solutions: every
cell tagged ``solution`` (the exercises' reference code, and any text that only makes sense beside it) and every
``:::{dropdown} Solution`` block is deleted, and the exercises' code cells lose their stored outputs, so a student
meets each exercise as a starter. The main text keeps its outputs and figures. Each edition holds what a class
needs to run it: ``notebooks/`` (each ``.ipynb`` with its MyST ``.md``), ``helpers/``, ``figures/``, the README,
``pyproject.toml`` and ``environment.yml``.

The checkers, in ``helpers/exercises``, compute their expected answers from reference code a student could read;
the student edition hides the solutions, it does not lock them away.
"""

import argparse
import re
import shutil
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
EDITIONS = ("student", "instructor")
SHARED = ("helpers", "figures", "README.md", "pyproject.toml", "environment.yml")
DROPDOWN = re.compile(r"^:::\{dropdown\} Solution[^\n]*\n.*?^:::[ \t]*$\n?", re.M | re.S)
EXERCISES = re.compile(r"^## Exercises$", re.M)


def is_solution(cell):
    return "solution" in cell.metadata.get("tags", [])


def exercises_start(nb):
    """The index of the cell that opens the exercises (len(cells) when there are none)."""
    return next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and EXERCISES.search(c.source)),
                len(nb.cells))


def student(nb):
    """A copy of notebook ``nb`` without its solutions (see the module's docstring)."""
    nb = nbformat.from_dict(nb)            # a deep copy
    start = exercises_start(nb)
    cells = []
    for i, cell in enumerate(nb.cells):
        if is_solution(cell):
            continue
        if cell.cell_type == "markdown":
            source = DROPDOWN.sub("", cell.source)
            if re.search(r"^:::\{dropdown\} Solution", source, re.M):
                raise ValueError(f"a solution dropdown is not closed by a line ':::' in:\n{cell.source[:300]}")
            if source != cell.source:
                cell.source = re.sub(r"\n{3,}", "\n\n", source).strip("\n")
                if not cell.source.strip():
                    continue
        elif cell.cell_type == "code" and i >= start:
            cell.outputs, cell.execution_count = [], None
        cells.append(cell)
    nb.cells = cells
    return nb


def write(nb, folder, name):
    """``name``.ipynb and its paired ``name``.md in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{name}.ipynb")
    jupytext.write(nb, folder / f"{name}.md", fmt="md:myst")


def build(out, notebooks=None):
    """Write both editions under ``out``; return their folders."""
    notebooks = sorted(notebooks or (ROOT / "notebooks").glob("*.ipynb"))
    folders = {}
    for edition in EDITIONS:
        folder = Path(out) / edition
        shutil.rmtree(folder, ignore_errors=True)
        for name in SHARED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif source.exists():
                folder.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, folder / name)
        for path in notebooks:
            path = Path(path)
            if edition == "student":
                write(student(nbformat.read(path, as_version=4)), folder / "notebooks", path.stem)
            else:                          # the book as it is, both files of each pair
                (folder / "notebooks").mkdir(parents=True, exist_ok=True)
                for twin in (path, path.with_suffix(".md")):
                    shutil.copy2(twin, folder / "notebooks" / twin.name)
        folders[edition] = folder
    return folders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=ROOT / "_build", type=Path,
                        help="where to write student/ and instructor/ (default: _build)")
    args = parser.parse_args(argv)
    for edition, folder in build(args.out).items():
        print(f"{edition} edition: {folder}")


if __name__ == "__main__":
    sys.exit(main())
