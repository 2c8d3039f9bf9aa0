"""The notebooks' structure: every MyST source is in sync with its .ipynb, every figure has a caption (in
the markdown cell below it, numbered), alt text and files in figures/, every notebook starts with the same
cell that installs the helpers outside a checkout. (nbval, run by the same pytest, checks their outputs;
tests/test_outside.py runs that cell outside.)"""

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("captions", ROOT / "book" / "captions.py")
captions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(captions)
SOURCES = sorted((ROOT / "notebooks").glob("*.md"))
NAME = re.compile(r"^\d+\.[\dA-Z]+-[a-z0-9-]+\.md$")
SAVES = re.compile(r'save_figure\(\w+, "([a-z0-9-]+)"')


def cells(nb):
    return [(c.cell_type, c.source.strip(), c.metadata.get("tags", []), c.metadata.get("mystnb")) for c in nb.cells]


def test_there_are_notebooks():
    assert SOURCES, "no notebooks/*.md found"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_pair_in_sync(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make execute NB={md.relative_to(ROOT)}`"
    assert cells(jupytext.read(md)) == cells(nbformat.read(ipynb, as_version=4)), (
        f"{md.name} and {ipynb.name} differ: run `make execute NB={md.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_notebook_is_named_by_section(md):
    assert NAME.match(md.name), f"{md.name} should look like 9.1-attention-as-lookup.md"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_every_stored_cell_was_executed_in_order(md):
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), "re-execute the notebook top to bottom (make execute)"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_each_section_opens_with_what_the_reader_will_do_in_two_to_four_points(md):
    """Issue 31: 'Each section opens with what the reader will be able to do, in 2 to 4 points' (9.3 had 5); the
    appendices too, one point each."""
    text = md.read_text()
    opening = "In these appendices you will:" if md.stem.startswith("9.A") else "In this section you will:"
    start = text.find(opening)
    assert start >= 0, f"the section should open with {opening!r} and its points"
    points = re.findall(r"^[-*] ", text[start:text.find("```", start)], re.M)
    assert 2 <= len(points) <= 4, f"{len(points)} points"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_a_cell_hidden_on_the_site_is_collapsed_in_jupyterlab(md):
    """hide-input hides a cell's code on the site only; JupyterLab shows it unless source_hidden collapses it too
    (six of 9.4's figure cells showed their styling in full, lines up to 114 characters, an audit found)."""
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    shown = [cell.source.splitlines()[0] for cell in nb.cells if "hide-input" in cell.metadata.get("tags", [])
             and not cell.metadata.get("jupyter", {}).get("source_hidden")]
    assert not shown, shown


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_every_figure_has_caption_alt_text_and_files(md):
    """Each figure cell has a name and alt text in its metadata, its caption (written once) in the markdown
    cell right below it, numbered 9.N.1, 9.N.2, ... in order, and its files in figures/."""
    nb = jupytext.read(md)
    section = md.name.split("-")[0]
    saving = [i for i, cell in enumerate(nb.cells) if SAVES.search(cell.source)]
    assert saving == [i for i, cell in enumerate(nb.cells) if captions.is_figure(cell)], (
        "figure metadata on a cell that saves no figure, or none on one that does")
    shown = [i for i, cell in enumerate(nb.cells) if captions.caption(cell)]
    assert shown == [i + 1 for i in saving], (
        f"each figure cell should be followed by its caption cell, tagged {captions.TAG!r}, and only they")
    for k, i in enumerate(saving, start=1):
        meta = nb.cells[i].metadata["mystnb"]
        assert meta["figure"].get("name", "").startswith("fig-"), f"cell {i} has no figure name"
        assert "caption" not in meta["figure"], f"cell {i}: the caption belongs in the markdown cell below it, and only there"
        assert meta.get("image", {}).get("alt"), f"cell {i} has no alt text"
        below = captions.caption(nb.cells[i + 1])              # (section, k, text)
        assert below[:2] == (section, k), f"cell {i + 1} is captioned Figure {below[0]}.{below[1]}, not {section}.{k}"
        assert len(below[2]) > 10, f"cell {i + 1}'s caption is empty"
        for name in SAVES.findall(nb.cells[i].source):
            for ext in ("svg", "png"):
                assert (ROOT / "figures" / f"{name}.{ext}").exists(), f"figures/{name}.{ext} is missing"


def first_code_cell(md):
    return next(c for c in jupytext.read(md).cells if c.cell_type == "code")


def test_every_notebook_starts_with_the_same_install_cell():
    """One cell, identical everywhere, hidden on the site and collapsed in JupyterLab; its address is pyproject.toml's."""
    first = {md.name: first_code_cell(md) for md in SOURCES}
    reference = first[SOURCES[0].name].source
    assert "import helpers" in reference and "raise SystemExit(" in reference
    differ = [name for name, cell in first.items() if cell.source != reference]
    assert differ == [], f"the first code cell of {differ} differs from {SOURCES[0].name}'s: copy it"
    hidden = [name for name, cell in first.items() if "remove-cell" not in cell.metadata.get("tags", [])]
    assert hidden == [], f"tag the first code cell of {hidden} remove-cell"
    shown = [name for name, cell in first.items() if cell.metadata.get("jupyter", {}).get("source_hidden") is not True]
    assert shown == [], f"collapse the first code cell of {shown} in JupyterLab too (jupyter: source_hidden: true)"
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("urls", {})
    recorded = re.findall(r'^    REPOSITORY = "([^"]*)"', reference, re.M)
    assert recorded == [urls.get("Repository", "")], "the install cell's REPOSITORY must be pyproject.toml's"


def test_make_check_runs_the_notebook_its_structure_tests_and_its_helpers_tests():
    import check

    args = check.arguments(ROOT / "notebooks" / "9.6-images-and-other-data.md")
    stem = "9.6-images-and-other-data"
    assert args[0] == f"notebooks/{stem}.ipynb"
    structure = [a for a in args if a.startswith("tests/test_notebooks.py::")]
    assert structure and all(a.endswith(f"[{stem}]") and a.split("::")[1].split("[")[0] in globals() for a in structure)
    # 9.6 imports the package's own names, helpers.attention, .controls, .diagrams, .exercises (its own section's
    # checker tests), .mechanisms, .models, .verify and .vision.
    assert [a for a in args[1:] if a.startswith("tests/") and "::" not in a] == [
        "tests/test_attention.py", "tests/test_controls.py", "tests/test_diagrams.py", "tests/test_exercises_9_6.py",
        "tests/test_helpers.py", "tests/test_mechanisms.py", "tests/test_models.py", "tests/test_verify.py",
        "tests/test_vision.py"]
    # None of them uses hypothesis, so its plugin is off (it imports hypothesis in every process).
    assert args[-2:] == ["-p", "no:hypothesispytest"]
    # Of the figure tests, those of the diagrams it draws stay and those of other sections' diagrams are deselected.
    dropped = {a.removeprefix("--deselect=") for a in args if a.startswith("--deselect=")}
    assert "tests/test_mechanisms.py::test_each_figure_is_readable_at_the_sites_width[kv_cache]" in dropped
    assert "tests/test_mechanisms.py::test_kv_cache_" in dropped
    assert not any("[vit_tokens" in a or "[vit_input" in a or "[window_panels" in a or "test_vit_tokens" in a
                   for a in dropped)
    # The reference solutions' own tests are left to nbval, which runs the same cells in this run (and only those).
    exercises = sorted(a for a in dropped if a.startswith("tests/test_exercises_"))
    assert exercises == ["tests/test_exercises_9_6.py::test_9_6_5_reference_solution_passes",
                         "tests/test_exercises_9_6.py::test_reference_solution_passes"]
    # Every figure case is seen by the pattern that reads them (one it missed would silently run, not be lost).
    cases = re.findall(r'^    "([\w-]+)": lambda', (ROOT / "tests" / "test_mechanisms.py").read_text(), re.M)
    assert [c for c, _ in check.CASE.findall((ROOT / "tests" / "test_mechanisms.py").read_text())] == cases



def test_make_checks_plugin_spares_an_unused_import_and_nbformat_still_validates():
    """tests/plugins/quick.py refuses rfc3987_syntax (1.1 s a process, for a string format no notebook uses)."""
    script = ("import sys; sys.path.insert(0, 'tests/plugins'); import quick, glob, nbformat\n"
              "for path in sorted(glob.glob('notebooks/*.ipynb')): nbformat.validate(nbformat.read(path, as_version=4))\n"
              "assert 'rfc3987_syntax' not in sys.modules or sys.modules['rfc3987_syntax'] is None\n"
              "import jsonschema; assert not jsonschema.FormatChecker().conforms('no', 'ipv4')\n"
              "print('validated')")
    ran = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == "validated", ran.stderr
    recipe = subprocess.run(["make", "-n", "-o", ".venv/.installed", "check", "NB=notebooks/9.6-images-and-other-data.md"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "PYTHONPATH=tests/plugins" in recipe and "pytest -q -p quick" in recipe


@pytest.mark.parametrize("name", ["9.1-attention-as-lookup.md", "9.1-attention-as-lookup.ipynb", "9.1-attention-as-lookup"])
def test_a_notebook_is_named_with_or_without_its_suffix(name):
    # make check, make bench and make execute take NB=notebooks/x.md; the stem "9.1-x" must not lose ".1-x".
    import check
    import paths

    md = ROOT / "notebooks" / "9.1-attention-as-lookup.md"
    assert paths.source(ROOT / "notebooks" / name) == md
    assert check.arguments(ROOT / "notebooks" / name)[0] == "notebooks/9.1-attention-as-lookup.ipynb"
    with pytest.raises(SystemExit, match="no notebook .*9.9-nothing.md; name one of: notebooks/9.1-attention-as-lookup.md"):
        paths.source(ROOT / "notebooks" / "9.9-nothing")
    ran = subprocess.run(["make", "-n", "-o", ".venv/.installed", "execute", f"NB=notebooks/{name}"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    assert 'jupytext --sync --execute --quiet "notebooks/9.1-attention-as-lookup.md"' in ran.stdout
