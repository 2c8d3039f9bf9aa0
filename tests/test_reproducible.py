"""What makes the stored outputs hold on any reader's machine, and a re-execution leave only real change.

- One convention keeps what legitimately varies (timings, the exact trajectory of a training run) out
  of compared output: a cell tagged `nbval-ignore-output`. Nothing else: no `# NBVAL_...` comments,
  no sanitizer patterns; and such a cell prints no check (`...: True`), so it cannot hide one.
- Every measured number the prose, a caption or alt text quotes is printed by a compared cell (CLAIMS):
  nbval then proves it on every run, and the matrix of `make guarantees` on every simulated CPU.
- Stored notebooks carry no execution timestamps and no progress-bar frames (book/clean.py), and SVG
  figures no coordinates finer than a hundredth of a point (helpers.plotting.round_coordinates).
"""

import importlib.util
import re
from pathlib import Path

import jupytext
import nbformat
import pytest

from helpers.plotting import round_coordinates

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("*.md"))
TAG = "nbval-ignore-output"

spec = importlib.util.spec_from_file_location("clean", ROOT / "book" / "clean.py")
clean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clean)

# notebook: [(phrase in the prose, a caption or alt text, [what compared cells print that proves it])]
CLAIMS = {
    "9.1-attention-as-lookup": [
        ("they form a bump about 0.3 radians wide", ["width of the bump (standard deviation of the angle) 0.33 rad"]),
    ],
    "9.3-positional-information": [
        ("every offset beyond about 91 falls into the last bucket", ["bidirectional: offsets from 91 on share the last bucket"]),
        ("the last begins near 113", ["causal: offsets from 113 on share the last bucket"]),
        ("falls from about 0.41 at position 0 to about 0.07 at 63",
         ["random tokens, causal: output RMS at positions 0, 7, 63: 0.408, 0.165, 0.068"]),
    ],
    "9.4-the-transformer": [
        # The whole ledger of 9.4 is book/claims/9.4-the-transformer.toml; these are its measured numbers.
        ("At a peak learning rate of 1e-2 it stays\nbelow 100", ["lr 1e-2           largest attention logit above 100: False"]),
        ("at 3e-2 it grows past 100", ["lr 3e-2           largest attention logit above 100: True"]),
        ("with QK-norm at 3e-2 it stays below 100", ["lr 3e-2, QK-norm  largest attention logit above 100: False"]),
        ("the two stable runs fall from about 3.5 nats", [
            "lr 1e-2           largest attention logit above 100: False; loss on the second half below 0.1 within "
            "100 steps: True, below 0.05 at step 200: True",
            "lr 3e-2, QK-norm  largest attention logit above 100: False; loss on the second half below 0.1 within "
            "100 steps: True, below 0.05 at step 200: True"]),
        ("the unstable run stays above 3 nats", ["lr 3e-2           largest attention logit above 100: True; loss on "
                                                 "the second half below 0.1 within 100 steps: False, below 0.05 at step "
                                                 "200: False, above 3 nats at every step: True"]),
        ("reaches an error of 0.001 within 200 steps", ["transformer below 0.001 within 200 steps: True"]),
        ("is below 0.001 within 200 steps", ["transformer below 0.001 within 200 steps: True"]),
        ("falls below it within 100 steps", ["below 0.1 within 100 steps: True"]),
        ("fluctuates around 1e-4 afterwards", ["median around 1e-4 (between 1e-5 and 1e-3): True"]),
        ("its test error fluctuates around $10^{-4}$", ["median around 1e-4 (between 1e-5 and 1e-3): True"]),
        ("stays on the plateau through step 1,000", ["GRU still on the plateau (above 0.1) through step 1,000: True"]),
        ("ends below 0.02", ["below 0.02 at step 1,500: True"]),
        ("the RNN never leaves it", ["RNN never below 0.15: True"]),
        ("always predicting 1 has an error of 0.18", ["error of always predicting 1 on the test set: 0.18"]),
        ("a gray line at the plateau, about 0.18", ["error of always predicting 1 on the test set: 0.18"]),
        ("At least two heads put about half their weight on each marked position",
         ["(within 0.1 of 0.5, over the test set): at least two of 4: True"]),
        ("with about seven times fewer operations", ["MFLOP, 7.1 times fewer"]),
        ("on average above 0.9, and below 0.05 on the cell",
         ["transformer above 0.9: True", "transformer below 0.05: True"]),
        ("puts nearly all its weight on the copied position", ["transformer above 0.9: True"]),
        ("nearly all of it lies on the source position being copied, and none on the position after it",
         ["transformer above 0.9: True", "transformer below 0.05: True"]),
        ("splits its weight between the copied position", ["GRU between 0.2 and 0.5: True", "GRU above 0.3: True"]),
        ("Both reverse the held-out strings", [
            "GRU with additive attention (9.1): 19,914 parameters; strings reversed exactly, above 99%: True",
            "transformer encoder–decoder: 30,762 parameters; strings reversed exactly, above 99%: True"]),
    ],
    "9.5-efficient-attention": [
        ("4,096 features still leave an error of 85%", ["0.85 with 4,096"]),
        ("to about 135 megabytes", ["peak memory at T = 4,096: naive 135 MB"]),
    ],
    "9.A-appendices": [
        ("At $\\sigma=1$ the mean norm is 0.15", ["sigma =  1: mean largest weight 0.08, mean ||J||_F 0.15"]),
    ],
}


def flat(text):
    return " ".join(text.split())


def prose(md):
    """Markdown cells (the captions among them: each is the markdown cell below its figure) and alt text
    of a notebook source, whitespace collapsed."""
    parts = []
    for cell in jupytext.read(md).cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source)
        parts.append(cell.metadata.get("mystnb", {}).get("image", {}).get("alt", ""))
    return flat(" ".join(parts))


def compared_stdout(nb):
    return flat(" ".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" and TAG not in c.metadata.get("tags", [])
                         for o in c.outputs if o.get("name") == "stdout"))


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_one_convention_for_what_varies(md):
    text = md.read_text()
    assert "NBVAL_" not in text, "tag the cell nbval-ignore-output instead of a # NBVAL_... comment (README)"
    for cell in nbformat.read(md.with_suffix(".ipynb"), as_version=4).cells:
        tags = cell.metadata.get("tags", [])
        assert not [t for t in tags if t.startswith("nbval") and t != TAG], f"only {TAG} is the book's convention"
        if TAG in tags:
            shown = " ".join(o.get("text", "") for o in cell.outputs)
            assert not re.search(r": (True|False)\b", shown), f"a check hidden from nbval:\n{cell.source}"
    assert not (ROOT / "tests" / "sanitize.cfg").exists()


@pytest.mark.parametrize("stem", CLAIMS)
def test_measured_numbers_in_the_prose_are_printed_and_compared(stem):
    md = ROOT / "notebooks" / f"{stem}.md"
    text, printed = prose(md), compared_stdout(nbformat.read(md.with_suffix(".ipynb"), as_version=4))
    for phrase, proofs in CLAIMS[stem]:
        assert flat(phrase) in text, f"{stem}: the prose no longer says {phrase!r}: update CLAIMS"
        for proof in proofs:
            assert flat(proof) in printed, f"{stem}: {phrase!r} is not backed by a compared output {proof!r}"


@pytest.mark.parametrize("md", SOURCES, ids=lambda p: p.stem)
def test_stored_notebook_is_clean(md):
    nb = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    assert not [c for c in nb.cells if "execution" in c.metadata], "execution timestamps: run book/clean.py (make execute does)"
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stderr"], "progress bars in stored outputs"
    assert clean.is_clean(nb)


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
