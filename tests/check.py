"""What `make check NB=notebooks/x.md` runs for one notebook: print the pytest arguments.

Its stored .ipynb (nbval re-executes and compares it), its own structure tests (pair in sync, captions),
its claims ledger, the styling of its visible cells, and the unit tests of each helpers module the notebook imports;
of the exercises' checkers, only its own section's tests (test_exercises_9_6.py) and its section's layout.
"""

import re
import sys
from pathlib import Path

from paths import source

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# `from helpers import seed, vision` or `from helpers.vision import patches` or `import helpers.vision`
IMPORT = re.compile(r"^\s*(?:from\s+helpers(?:\.(\w+))?\s+import\s+([\w, ()]+)|import\s+helpers(?:\.(\w+))?)", re.M)
STRUCTURE = ("test_pair_in_sync", "test_notebook_is_named_by_section", "test_every_stored_cell_was_executed_in_order",
             "test_every_figure_has_caption_alt_text_and_files")
# Every test of test_reproducible.py parametrized by notebook (its stored outputs and controls, its claims ledger,
# book/claims/<stem>*.toml), and how much styling its visible cells carry.
LEDGER = ("test_reproducible.py::test_one_convention_for_what_varies",
          "test_reproducible.py::test_stored_notebook_is_clean",
          "test_reproducible.py::test_stored_controls_carry_every_state_for_the_site",
          "test_reproducible.py::test_ledger_entries_are_well_formed",
          "test_reproducible.py::test_ledger_texts_are_in_the_notebook",
          "test_reproducible.py::test_ledger_checks_are_printed_by_compared_cells",
          "test_reproducible.py::test_ledger_timings_are_in_the_stored_report",
          "test_reproducible.py::test_ledger_settings_are_in_the_code",
          "test_reproducible.py::test_ledger_covers_every_caption_alt_text_and_measured_number",
          "test_styling.py::test_visible_cells_carry_at_most_a_few_lines_of_styling")
# The exercises' layout tests, parametrized by section ("9.6"); the appendices (9.A) have only the last, their
# layout being tested in their own file.
LAYOUT = ("test_section_ends_with_four_to_six_exercises", "test_stored_outputs_show_starters_untouched_and_solutions_passing",
          "test_check_is_imported_in_the_setup_cell")


def modules(source):
    """The helpers modules that ``source`` imports; "helpers" stands for the package's own names."""
    found = set()
    helpers = ROOT / "helpers"
    submodules = {p.stem for p in helpers.glob("*.py")} | {p.parent.name for p in helpers.glob("*/__init__.py")}
    for sub, names, plain in IMPORT.findall(source):
        named = {n.strip() for n in names.strip("()").split(",")} if names else set()
        found |= {sub or plain} if sub or plain else named & submodules
        if not (sub or plain) and (named - submodules or not names):  # the package's own names
            found.add("helpers")
    return found


# The figure tests parametrized by case (test_mechanisms.py's CASES, each drawing one function of helpers.mechanisms or
# helpers.diagrams): a notebook's check keeps the cases of the functions it imports and deselects the rest, which draw
# other sections' figures (about 20 s of the 9.6 check's 40 before).
CASE = re.compile(r'^\s+"([\w-]+)": lambda: (?:mechanisms|diagrams)\.(\w+)\(', re.M)
BY_CASE = ("test_each_figure_is_readable_at_the_sites_width", "test_each_figures_coloured_lines_are_legible_on_white",
           "test_each_figure_renders_to_the_same_svg_bytes")


def imported(source):
    """The names ``source`` imports from helpers modules (``from helpers.mechanisms import vit_tokens``)."""
    return {n.strip() for _, names, _ in IMPORT.findall(source) for n in names.strip("()").split(",") if n.strip()}


def other_figures(md):
    """--deselect arguments for the figure cases that draw with functions notebook ``md`` does not import."""
    names = imported(md.read_text())
    cases = CASE.findall((TESTS / "test_mechanisms.py").read_text())
    cases = [f"--deselect=tests/test_mechanisms.py::{test}[{case}]"
             for case, function in cases if function not in names for test in BY_CASE]
    # ... and the tests named after a diagram of helpers.mechanisms it does not draw (each draws one figure alone;
    # a node id given to --deselect is a prefix: test_kv_cache deselects test_kv_cache_totals_add_up_...).
    drawn = re.findall(r"^def ([a-z]\w*)\(", (ROOT / "helpers" / "mechanisms.py").read_text(), re.M)
    return cases + [f"--deselect=tests/test_mechanisms.py::test_{function}_" for function in drawn if function not in names]


def same_as_nbval(files):
    """--deselect arguments for the tests that run a reference solution and expect it correct: nbval runs the same
    solution cells in the notebook, in this run, and compares each verdict with the stored one, which says correct
    (test_stored_outputs_show_starters_untouched_and_solutions_passing). `make test` runs them all."""
    found = []
    for test in sorted(t for t in files if t.name.startswith("test_exercises_")):
        names = ["test_reference_solution_passes", *re.findall(r"^def (test_\w+_reference_solution_passes)\(",
                                                                 test.read_text(), re.M)]
        found += [f"--deselect=tests/{test.name}::{name}" for name in names]
    return found


def arguments(md):
    """pytest's arguments for notebook ``md`` (a path to its MyST source)."""
    md = source(md).resolve()                   # notebooks/x.md, notebooks/x.ipynb or notebooks/x
    units = sorted(set(TESTS.glob("test_*.py")) - {TESTS / "test_notebooks.py", TESTS / "test_outside.py"})
    related, exercises = set(), []
    for module in modules(md.read_text()):
        if module == "exercises":               # the section's checkers only, not all the chapter's
            section = md.stem.split("-")[0]     # "9.6", "9.A"
            related.add(TESTS / f"test_exercises_{section.replace('.', '_').lower()}.py")
            exercises = [f"tests/test_exercises_layout.py::{name}[{section}]"
                         for name in (LAYOUT if section != "9.A" else LAYOUT[-1:])]
            continue
        # A module's own test file (helpers.vision: test_vision.py); without one, the files that import it.
        named = TESTS / f"test_{module}.py"
        related |= {named} if named.exists() else {t for t in units if module in modules(t.read_text())}
    structure = [f"tests/test_notebooks.py::{name}[{md.stem}]" for name in STRUCTURE]
    structure += [f"tests/{name}[{md.stem}]" for name in LEDGER] + exercises
    own = sorted(str(t.relative_to(ROOT)) for t in related)
    deselected = other_figures(md) if TESTS / "test_mechanisms.py" in related else []
    deselected += same_as_nbval(related) if exercises else []
    # hypothesis's plugin imports hypothesis in every process, about half a second each: off where no test uses it.
    unused = [] if any("hypothesis" in t.read_text() for t in related) else ["-p", "no:hypothesispytest"]
    return [str(md.with_suffix(".ipynb").relative_to(ROOT)), *structure, *own, *deselected, *unused]


if __name__ == "__main__":
    print(" ".join(a for md in sys.argv[1:] for a in arguments(md)))
