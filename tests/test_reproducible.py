"""What makes the stored outputs hold on any reader's machine, and a re-execution leave only real change.

- One convention keeps what legitimately varies (timings, the exact trajectory of a training run) out
  of compared output: a cell tagged `nbval-ignore-output`. Nothing else: no `# NBVAL_...` comments,
  no sanitizer patterns; and such a cell prints no check (`...: True`), so it cannot hide one.
- What the words claim is in a ledger (`book/claims/*.toml`, read by `book/ledger.py`): every caption, alt
  text and sentence that quotes a measured number holds an entry, and each entry computed here or shown in a
  figure names the line a compared cell prints that tests it, so nbval proves it on every run, and the matrix
  of `make guarantees` on every simulated CPU; a cited entry names its paper and section.
- Stored notebooks carry no execution timestamps and no progress-bar frames (book/clean.py), and SVG
  figures no coordinates finer than a hundredth of a point (helpers.plotting.round_coordinates).
"""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from helpers.controls import CONTROL_HTML
from helpers.plotting import round_coordinates

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("*.md"))
TAG = "nbval-ignore-output"

spec = importlib.util.spec_from_file_location("clean", ROOT / "book" / "clean.py")
clean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clean)
spec = importlib.util.spec_from_file_location("ledger", ROOT / "book" / "ledger.py")
ledger = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ledger)



@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_one_convention_for_what_varies(md):
    text = md.read_text()
    assert "NBVAL_" not in text, "tag the cell nbval-ignore-output instead of a # NBVAL_... comment (CONTRIBUTING.md)"
    for cell in nbformat.read(md.with_suffix(".ipynb"), as_version=4).cells:
        tags = cell.metadata.get("tags", [])
        assert not [t for t in tags if t.startswith("nbval") and t != TAG], f"only {TAG} is the book's convention"
        if TAG in tags:
            shown = " ".join(o.get("text", "") for o in cell.outputs)
            assert not re.search(r": (True|False)\b", shown), f"a check hidden from nbval:\n{cell.source}"
    assert not (ROOT / "tests" / "sanitize.cfg").exists()


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_stored_notebook_is_clean(md):
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    assert not [c for c in nb.cells if "execution" in c.metadata], "execution timestamps: run book/clean.py (make execute does)"
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr"], "progress bars in stored outputs"
    assert clean.is_clean(nb)


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_stored_controls_carry_every_state_for_the_site(md):
    """A reader's kernel draws a control's start state alone (helpers.controls.every_state); the stored
    notebooks, which the site is built from, must come from `make execute`, which draws them all."""
    for cell in nbformat.read(md.with_suffix(".ipynb"), as_version=4).cells:
        for out in cell.get("outputs", []):
            still = out.get("data", {}).get("text/html", "")
            if "book-control-still" not in still:
                continue
            states = int(re.search(r"one of (\d+) states", still)[1])
            frames = out.data.get(CONTROL_HTML, "").count('class="book-frame"')
            assert frames == states, (f"a control of {states} states stored with {frames} frames for the site:"
                                      " execute with `make execute` (BOOK_FRAMES=all)")


def test_clean_strips_timestamps_progress_bars_and_the_patch_version_and_joins_streams():
    cell = nbformat.v4.new_code_cell("print(1)", metadata={"execution": {"iopub.status.idle": "2026-11-30T10:00:00Z"}})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="race:  40%|####      | 1/3\r"),
                    nbformat.v4.new_output("stream", name="stdout", text="2\n")]
    nb = nbformat.v4.new_notebook(cells=[cell], metadata={"language_info": {"name": "python", "version": "3.11.7"}})
    assert not clean.is_clean(nb)
    clean.clean(nb)
    assert clean.is_clean(nb)
    assert cell.metadata == {} and [(o.name, o.text) for o in cell.outputs] == [("stdout", "1\n2\n")]
    assert nb.metadata.language_info == {"name": "python"}


def test_round_coordinates_rounds_positions_not_scales_or_labels():
    svg = '<path d="M 72.123456 -0.001 L 10.5 2.005001"/><!-- 0.0001 --><g transform="translate(1.23456 7) scale(0.015625)">'
    rounded = '<path d="M 72.12 0 L 10.5 2.01"/><!-- 0.0001 --><g transform="translate(1.23 7) scale(0.015625)">'
    assert round_coordinates(svg) == rounded
    assert round_coordinates(round_coordinates(svg)) == round_coordinates(svg)


@pytest.mark.parametrize("svg", sorted((ROOT / "figures").glob("*.svg")), ids=lambda p: p.stem)
def test_committed_figures_have_rounded_coordinates(svg):
    text = svg.read_text()
    assert round_coordinates(text) == text, f"{svg.name} was not written by save_figure: re-execute its notebook"


# ------------------------------------------------------------------------------------------- the claims ledger

@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_entries_are_well_formed(md):
    entries = ledger.load(md.stem)
    assert entries, f"{md.stem}: no ledger: write book/claims/{md.stem}.toml (book/ledger.py says how)"
    for e in entries:
        where = f"{e['file']}: {e['text'][:60]!r}"
        assert e["text"], f"{e['file']}: an entry without text"
        assert e["kind"] in ledger.KINDS, f"{where}: kind {e['kind']!r} is not one of {ledger.KINDS}"
        if e["kind"] == "cited":
            assert e["source"], f"{where}: a cited claim names its source (paper, and its section, table or theorem)"
        else:
            assert e["check"] and all(e["check"]), f"{where}: a {e['kind']} claim names the compared output lines that test it"
    texts = [e["text"] for e in entries]
    twice = sorted({t for t in texts if texts.count(t) > 1})
    assert not twice, f"{md.stem}: the same text in two entries: {twice}"


def test_every_ledger_file_belongs_to_a_notebook():
    stems = [md.stem for md in SOURCES]
    for path in sorted((ROOT / "book" / "claims").glob("*.toml")):
        assert path in [p for stem in stems for p in ledger.ledger_files(stem)], f"{path.name} names no notebook"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_texts_are_in_the_notebook(md):
    where = ledger.places(md)
    missing = [e["text"] for e in ledger.load(md.stem) if ledger.locate(e["text"], where) is None]
    assert not missing, f"{md.stem}: the notebook no longer says these; update its ledger:\n" + "\n".join(missing)


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_checks_are_printed_by_compared_cells(md):
    printed = ledger.compared_lines(nbformat.read(md.with_suffix(".ipynb"), as_version=4))
    missing = [(e["text"][:60], c) for e in ledger.load(md.stem) if e["kind"] in ("computed", "figure")
               for c in e["check"] if not any(c in line for line in printed)]
    assert not missing, f"{md.stem}: checks no compared output line prints (claim, check):\n" + "\n".join(map(str, missing))


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_timings_are_in_the_stored_report(md):
    printed = ledger.output_lines(nbformat.read(md.with_suffix(".ipynb"), as_version=4))
    missing = [(e["text"][:60], c) for e in ledger.load(md.stem) if e["kind"] == "timed"
               for c in e["check"] if not any(c in line for line in printed)]
    assert not missing, f"{md.stem}: timing lines not in the stored outputs (claim, line):\n" + "\n".join(map(str, missing))


def module(entry):
    """The code of the helpers module a setting entry names as its source (a path, helpers/...py), whitespace
    collapsed; none where its source is a sentence or empty."""
    if not re.fullmatch(r"helpers/[\w/]+\.py", entry["source"]):
        return []
    path = ROOT / entry["source"]
    assert path.is_file(), f"{entry['text'][:60]}: no module {entry['source']}"
    return [ledger.flat(path.read_text())]


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_settings_are_in_the_code(md):
    code = ledger.code(md)
    missing = [(e["text"][:60], c) for e in ledger.load(md.stem) if e["kind"] == "setting"
               for c in e["check"] if not any(ledger.flat(c) in cell for cell in code + module(e))]
    assert not missing, f"{md.stem}: settings not in the notebook's code (claim, code):\n" + "\n".join(map(str, missing))


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_ledger_covers_every_caption_alt_text_and_measured_number(md):
    gaps = ledger.uncovered(md, ledger.load(md.stem))
    assert not gaps, (f"{md.stem}: no ledger entry lies within these (python book/ledger.py {md.stem} lists them):\n"
                      + "\n".join(f"{what}: {text[:120]}" for what, text in gaps))


@pytest.mark.parametrize("sentence, numbers", [
    ("At $\\sigma=1$ the mean norm is 0.15, the value section 9.1 found.", ["0.15"]),
    ("4,096 features still leave an error of 85%.", ["85%"]),
    ("It runs 5.7 times faster and needs 7 times less work.", ["5.7", "7"]),
    ("its peak memory grows to about 135 megabytes", ["135"]),
    ("its test error fluctuates around $10^{-4}$", ["10^{-4}"]),
    ("At a learning rate of 1e-2 it stays below 100", ["1e-2"]),
    ("The 147,648 parameters are the inputs of each patch", ["147,648"]),
    ("The lines cross at $T=6d=384$ and at 0.5.", ["0.5"]),
])
def test_measured_numbers_are_found(sentence, numbers):
    assert ledger.measured_numbers(sentence) == numbers


@pytest.mark.parametrize("sentence", [
    "Section 9.4 trains the model below again, as in sections 9.1 and 9.3.",
    "Figure 9.2.1 shows it; Exercise 9.3.2 asks for it; see 9.A and (9.5).",
    "The three ways trade off differently (Vaswani et al., 2017, Table 1).",
    "Vaswani et al. (2017) used fixed encodings; Bahdanau, Cho, and Bengio (2015) did not.",
    "As in Section 3.2 of the paper, Theorem 1 and equation (3); chapter 8 and chapter 11.",
    "Six tokens of width $d=8$, a sequence of 64 tokens, 1,000 random pairs and 200 queries.",
    "Pinned to PyTorch 2.13.0 and Python 3.11, with MathJax 3.2.2.",
    "The check is `torch.allclose(a, b, atol=1e-6)`, with $\\omega_j=10000^{-2j/d}$.",
    "Xiong et al. 2020, Theorem 1, and [the docs](https://pytorch.org/docs/2.1/index.html).",
])
def test_references_years_sizes_and_code_are_not_measurements(sentence):
    assert ledger.measured_numbers(sentence) == []


def test_sentences_split_at_full_stops_not_at_abbreviations_math_or_numbers():
    text = "Vaswani et al. (2017) scale by 0.5. Then $a.b$ is e.g. small. Section 9.4 follows.\n\n- A list item"
    assert ledger.sentences(text) == ["Vaswani et al. (2017) scale by 0.5.", "Then $a.b$ is e.g. small.",
                                      "Section 9.4 follows.", "- A list item"]


def test_coverage_needs_an_entry_within_each_caption_alt_text_and_measured_sentence(tmp_path):
    md = tmp_path / "9.9-toy.md"
    md.write_text("""---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3 (ipykernel)
  language: python
  name: python3
---

# 9.9 Toy

The norm is 0.15 at width 16. Nothing here is measured in section 9.4.

```{code-cell} ipython3
---
mystnb:
  figure:
    name: fig-toy
  image:
    alt: A line rising to 0.3.
---
print(1)
```

+++ {"tags": ["caption"]}

*Figure 9.9.1. A line.*
""")
    assert [w for w, _ in ledger.uncovered(md, [])] == ["sentence", "alt text", "caption"]
    entries = [{"text": "The norm is 0.15"}, {"text": "rising to 0.3"}, {"text": "A line."}]
    assert ledger.uncovered(md, entries) == []
    assert [w for w, _ in ledger.uncovered(md, entries[1:])] == ["sentence"]


def test_ledger_reads_every_file_of_a_notebook(tmp_path):
    (tmp_path / "9.9-toy.toml").write_text('[[claim]]\ntext = "a"\nkind = "cited"\nsource = "X 2020, Table 1"\n')
    (tmp_path / "9.9-toy.exercises.toml").write_text('[[claim]]\ntext = "b"\nkind = "computed"\ncheck = "b: True"\n')
    (tmp_path / "9.9-toy-other.toml").write_text('[[claim]]\ntext = "c"\nkind = "cited"\nsource = "Y"\n')
    assert [(e["text"], e["check"]) for e in ledger.load("9.9-toy", tmp_path)] == [("b", ["b: True"]), ("a", [])]
    (tmp_path / "9.9-toy.bad.toml").write_text('[[claim]]\ntext = "d"\nchecks = ["typo"]\n')
    with pytest.raises(ValueError, match="unknown keys"):
        ledger.load("9.9-toy", tmp_path)
