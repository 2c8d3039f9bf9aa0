"""Timings in the stored notebooks keep the measurement protocol (issue 21), so a disturbed run cannot be stored.

Timings vary with the machine, so nbval never compares them (their cells are tagged nbval-ignore-output).
What can be checked on the stored notebooks is that what they show is a sound measurement. Every
timing a notebook shows is printed by `helpers.measure.timings`: either its whole report (`str()`, the
verdict right below the table), or the reader's table (`Timings.table()`) with the verdict printed by the
check cell below it (helpers.verify, whose lines are indented; each verdict there belongs to the first
table still without one). This test reads each table and its verdict back from the stored outputs, from
its printed numbers alone (not from its verdict line), and fails when
- the report's own verdict is not "passed";
- a method's median time does not grow with the size (where the report says it must): it must rise at
  every step and, from the first size to the last, by the factor the report states (to the rounding of the
  printed medians); that the rise at every step is beyond the quartiles is the verdict's to say, since the
  report prints the IQR, not the quartiles;
- a spread (IQR / median) is above the bound the report states;
- a method's counted FLOPs per second exceed the reference's best by more than the stated margin;
- a stored output shows a time outside such a report (the allowed exceptions are listed in ELSEWHERE).
"""

import re
from pathlib import Path

import nbformat
import pytest
import torch
from torch.utils.benchmark import Measurement, TaskSpec

from helpers.measure import SOUND, Timings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
HEADER = re.compile(r"^time per call: median of (\d+) interleaved rounds on 1 thread, ms \(IQR / median\)$")
TABLE = re.compile(r"^time per call on .+, ms: median of (\d+) rounds \(IQR / median\)$")      # Timings.table()
RATES = "counted FLOPs per second, as a fraction of the reference's best"
CELL = re.compile(r"\s+([0-9.e+-]+) \(\s*(\d+)%\)")
RATE_ROW = re.compile(r"^[^%]+?(?:\s+\d+%)+$")                  # a name, then only percentages
# A verdict line: passed (Timings.verdict: SOUND, then the rules kept), or failed.
VERDICT = re.compile(r"^(?:" + re.escape(SOUND) + r"|verdict: FAILED)")
GROWS = re.compile(r"time grows with (\S+) for (.+?) \(at least ([0-9.]+) times from the first \S+ to the last")
MARGIN = re.compile(r"by more than (\d+)%")
BOUND = re.compile(r"repeats agree within (\d+)% \(IQR / median\)")
# A time shown on its own, outside a report: a number with a unit of time.
A_TIME = re.compile(r"\d(?:\.\d+)?\s*(?:ms|µs|us|s|seconds)\b")
# Durations shown that are not measurements of a method's speed, and the reason.
ELSEWHERE = {
    "the race, ": "9.4: how long the background race ran on after its cell began, shown; nothing is claimed from it",
}


def _table_end(lines, start):
    """The index just past the table whose title is ``lines[start]``: its sizes, its rows of medians (and,
    with a reference, a blank line, the rates' title, its sizes and its rows of rates)."""
    i = start + 2                                         # the title, and the line of sizes below it
    while i < len(lines) and CELL.search(lines[i]):
        i += 1
    if i + 2 < len(lines) and lines[i] == "" and lines[i + 1] == RATES:
        i += 3
        while i < len(lines) and RATE_ROW.match(lines[i]):
            i += 1
    return min(i, len(lines))


def reports(text):
    """The protocol's reports in ``text``: lists of lines, a table from its title on, then its verdict (or
    "verdict: missing"). Lines are read without their indentation (a check cell's lines are indented)."""
    lines = [line.strip() for line in text.splitlines()]
    found, waiting, i = [], [], 0
    while i < len(lines):
        if HEADER.match(lines[i]) or TABLE.match(lines[i]):
            end = _table_end(lines, i)
            waiting.append(lines[i:end])
            i = end
            continue
        if VERDICT.match(lines[i]) and waiting:
            found.append([*waiting.pop(0), lines[i]])
        i += 1
    return found + [[*table, "verdict: missing"] for table in waiting]


def problems(report):
    """The rules a printed report breaks, read from its numbers."""
    found = []
    verdict = report[-1]
    if not verdict.startswith(SOUND):
        found.append(f"the verdict is not passed: {verdict}")
    grows, margin, bound = GROWS.search(verdict), MARGIN.search(verdict), BOUND.search(verdict)
    if not (grows and bound):
        return [*found, f"the verdict does not state its rules: {verdict}"]
    everyone = grows.group(2) == "every method"
    bound = int(bound.group(1))
    rates = report.index(RATES) if RATES in report else len(report) - 1
    for line in report[2:rates]:
        cells = CELL.findall(line)
        if not cells:
            continue
        name = line[:len(line) - len("".join(m.group(0) for m in CELL.finditer(line)))].strip()
        medians = [float(t) for t, _ in cells]
        if everyone or name in grows.group(2).split(", "):
            if any(b <= a for a, b in zip(medians, medians[1:], strict=False)):
                found.append(f"{name}: the median does not grow: {medians}")
            # printed to 3 significant digits: each median may be off by half a unit in its third digit
            if medians[-1] * (1 + 5e-3) < float(grows.group(3)) * medians[0] * (1 - 5e-3):
                found.append(f"{name}: the median grows less than {grows.group(3)} times: {medians}")
        if max(int(s) for _, s in cells) > bound:
            found.append(f"{name}: a spread above {bound}%: {[int(s) for _, s in cells]}")
    if RATES in report:
        if not margin:
            return [*found, f"the verdict does not state its margin: {verdict}"]
        for line in report[rates + 2:-1]:
            percents = [int(p) for p in re.findall(r"(\d+)%", line)]
            if percents and max(percents) > 100 + int(margin.group(1)):
                found.append(f"{line.split('  ')[0]}: above the reference by more than {margin.group(1)}%: {percents}")
    return found


def shown(path):
    """``[(cell number, text)]`` of every code cell's text output in a stored notebook."""
    nb = nbformat.read(path, as_version=4)
    out = []
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        text = ""
        for o in cell.outputs:
            if o.output_type == "stream":
                text += o.text
            elif "data" in o:                      # a display is a line of its own
                text += o.data.get("text/plain", "").rstrip("\n") + "\n"
        out.append((i, text))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_timings_keep_the_protocol(path):
    cells = shown(path)
    text = "".join(t for _, t in cells)                   # a table's verdict is in the check cell below it
    inside = set()
    for report in reports(text):
        assert not problems(report), f"{path.name}: a timing that breaks the protocol:\n" + "\n".join(
            problems(report)) + "\n\n" + "\n".join(report)
        inside |= set(report)
    for i, cell_text in cells:
        for line in cell_text.splitlines():
            if A_TIME.search(line) and line.strip() not in inside and not any(line.startswith(s) for s in ELSEWHERE):
                pytest.fail(f"{path.name}, code cell {i}: a time shown outside helpers.measure.timings: {line!r}")


def test_the_section_that_measures_shows_a_report():
    texts = ["".join(t for _, t in shown(path)) for path in NOTEBOOKS if path.stem.startswith("9.5")]
    assert sum(len(reports(t)) for t in texts) >= 2, "9.5 times attention and the key-value cache with the protocol"


def test_a_table_takes_its_verdict_from_the_check_cell_below():
    """The reader's tables (Timings.table) and their verdicts, printed by the check cell that follows them
    (helpers.verify, indented), paired in order; a table left without a verdict is refused."""
    cpu = made_up({"a": [1e-3, 4e-3, 16e-3]}, reference="ref", rate_of=[0.5e-3, 2e-3, 8e-3])
    gpu = made_up({"a": [1e-3, 4e-3, 16e-3]})
    check = f"✓ the timings above: 2 checks hold\n  {cpu.verdict()}\n  {gpu.verdict()}\n"
    text = f"{cpu.table()}\ngrowth exponent: a 2.0\n{gpu.table()}\n" + check
    found = reports(text)
    assert [r[-1] for r in found] == [cpu.verdict(), gpu.verdict()]
    assert found[0][:-1] == cpu.table().splitlines() and found[1][:-1] == gpu.table().splitlines()
    assert all(problems(r) == [] for r in found)
    [alone] = reports(cpu.table())
    assert problems(alone) == ["the verdict is not passed: verdict: missing",
                               "the verdict does not state its rules: verdict: missing"]


# The checker itself, on reports printed by helpers.measure.Timings from made-up measurements.

def made_up(medians, spread=0.05, reference=None, rate_of=None):
    """A Timings over sizes (1, 2, 4) with the given median seconds per method (and the reference's), each
    with an IQR of ``spread`` times its median, and 1e6 T^2 FLOPs per call for every method."""
    sizes = [1, 2, 4]
    names = list(medians) + ([reference] if reference else [])
    table = dict(medians, **({reference: rate_of} if reference else {}))
    measurements = {}
    for name in names:
        measurements[name] = [Measurement(1, [t * (1 - spread), t * (1 - spread / 2), t, t * (1 + spread / 2), t * (1 + spread)],
                                          TaskSpec(stmt=name, setup="")) for t in table[name]]
    flops = {name: [1e6 * s * s for s in sizes] for name in names}
    rules = {"margin": 0.2, "spread": 0.25, "rounds": 5, "growth": 1.5}
    return Timings(sizes, names, measurements, flops, reference, rules, 1, 3, "T", names)


def test_a_sound_report_passes():
    t = made_up({"a": [1e-3, 4e-3, 16e-3]}, reference="ref", rate_of=[0.5e-3, 2e-3, 8e-3])
    [report] = reports(str(t))
    assert t.broken() == [] and problems(report) == []


def test_a_flat_series_is_refused_from_its_numbers():
    """Issue 34: a time that does not depend on the size, its medians rising by chance at every step."""
    flat = made_up({"a": [1.00e-3, 1.05e-3, 1.10e-3]})
    [report] = reports(str(flat))
    assert flat.broken() and report[-1].startswith("verdict: FAILED")
    passed = [*report[:-1], report[-1].replace("verdict: FAILED after 1 measurement: ", SOUND)]
    assert any("grows less than 1.5 times" in p for p in problems(passed)), problems(passed)


def test_the_disturbed_runs_of_issue_21_are_refused():
    # The tiled loop's spike (379.8 ms at 2,048, 48.5 at 4,096), and SDPA above the reference.
    spike = made_up({"tiled": [3.1e-3, 379.8e-3, 48.5e-3]}, reference="ref", rate_of=[1e-3, 4e-3, 16e-3])
    fast = made_up({"sdpa": [0.5e-3, 2e-3, 8e-3]}, reference="ref", rate_of=[1e-3, 4e-3, 16e-3])   # twice its FLOP rate
    noisy = made_up({"a": [1e-3, 4e-3, 16e-3]}, spread=0.6)
    for t, words in ((spike, "does not grow"), (fast, "above the reference"), (noisy, "spread above")):
        [report] = reports(str(t))
        assert t.broken(), str(t)
        assert report[-1].startswith("verdict: FAILED")
        assert any(words in p for p in problems(report)), problems(report)
        passed = [*report[:-1], report[-1].replace("verdict: FAILED after 1 measurement: ", SOUND)]
        assert any(words in p for p in problems(passed)), "the numbers are checked, not only the verdict"


def test_a_time_outside_a_report_is_refused(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="150 tokens: 2.61 s with the cache, 3.06 s without\n")])])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(pytest.fail.Exception, match="outside helpers.measure.timings"):
        test_stored_timings_keep_the_protocol(path)


def test_made_up_measurements_have_the_stated_spread():
    t = made_up({"a": [1.0, 2.0, 4.0]}, spread=0.1)
    assert t.spread("a") == pytest.approx([0.1] * 3) and torch.tensor(t.median("a")).tolist() == [1.0, 2.0, 4.0]
