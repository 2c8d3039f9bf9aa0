"""The claims ledger: what the chapter states, and the output or the paper that backs each statement.

The ledger is data, `book/claims/<notebook stem>*.toml` (one notebook's entries may be split across
several files: `9.1-attention-as-lookup.toml`, `9.1-attention-as-lookup.exercises.toml`, ...). Each
entry is a `[[claim]]` table:

    text   = "..."          an exact substring of the notebook's .md (prose, caption, alt text, comment,
                            solution), whitespace collapsed
    kind   = "computed"     computed (an output proves it) | figure (what a figure shows; an output proves
                            it) | cited (a paper says so) | setting (how an experiment is set up: the
                            seed, the learning rate, the steps; the code that sets it proves it) |
                            timed (what a timing shows: times vary, so its lines are not compared; the
                            stored report prints them and tests/test_timings.py holds it to the protocol)
    check  = ["..."]        computed and figure: substrings of compared output lines (stdout of cells not
                            tagged nbval-ignore-output), each within one line, whitespace collapsed
                            setting: substrings of the notebook's code, or of the helpers module that
                            `source` names, whitespace collapsed
                            timed: substrings of stored output lines (compared or not)
    source = "..."          cited: the paper and its section, table or theorem; setting, optional: how
                            the code sets it, or the path of the helpers module that holds the code
                            the notebook calls (helpers/...py), where the checks are then found too
    manuscript = "..."      optional: where the text departs from the author's manuscript or corrects it,
                            what the manuscript says and why the book differs; the site lists these
                            entries, with their evidence, on the page "Notes on the manuscript"

`tests/test_reproducible.py` holds the ledger to the notebooks (every text is in its .md, every check
is printed by a compared cell, every cited entry names its source) and to coverage: every caption,
every alt text and every sentence that quotes a measured number (`quoted_measurements`) contains an
entry's text. `book/conf.py` renders the ledger as the site page "What this chapter claims, and where
it checks it" (`page`). Run `python book/ledger.py` to list what a notebook's ledger does not cover yet.
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "book" / "claims"
NOTEBOOKS = ROOT / "notebooks"
IGNORE = "nbval-ignore-output"
KINDS = ("computed", "figure", "cited", "setting", "timed")


def flat(text):
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------- entries

def ledger_files(stem, folder=CLAIMS):
    """The TOML files of one notebook: `<stem>.toml` and `<stem>.<part>.toml`."""
    return sorted(p for p in folder.glob(f"{stem}*.toml") if p.name == f"{stem}.toml" or p.name.startswith(f"{stem}."))


def load(stem, folder=CLAIMS):
    """The entries of one notebook, in file order, each a dict with `text`, `kind`, `check`, `source`, `file`."""
    entries = []
    for path in ledger_files(stem, folder):
        data = tomllib.loads(path.read_text())
        unknown = set(data) - {"claim"}
        if unknown:
            raise ValueError(f"{path.name}: only [[claim]] tables belong in a ledger, found {sorted(unknown)}")
        for claim in data.get("claim", []):
            extra = set(claim) - {"text", "kind", "check", "source", "manuscript"}
            if extra:
                raise ValueError(f"{path.name}: unknown keys {sorted(extra)} in the claim {claim.get('text', '')!r}")
            check = claim.get("check", [])
            entries.append({"text": flat(claim.get("text", "")), "kind": claim.get("kind", ""),
                            "check": [flat(c) for c in ([check] if isinstance(check, str) else check)],
                            "source": claim.get("source", "").strip(), "file": path.name,
                            "manuscript": flat(claim.get("manuscript", ""))})
    return entries


def stems(folder=NOTEBOOKS):
    return [p.stem for p in sorted(folder.glob("*.md"))]


# ---------------------------------------------------------------------------------------------- notebooks

def cells(md):
    """The cells of a notebook's .md (jupytext), as nbformat cells."""
    import jupytext

    return jupytext.read(md).cells


def source(cell):
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def alt_text(cell):
    return cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")


def figure_name(cell):
    return cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("name", "")


def is_caption(cell):
    return cell.get("cell_type") == "markdown" and "caption" in cell.get("metadata", {}).get("tags", [])


def _printed(output):
    """The lines an output prints: a stdout stream's, or a check cell's (helpers.verify: its text form lists
    every check line, indented, under its one-line summary)."""
    if output.get("name") == "stdout":
        return source({"source": output.get("text", "")}).splitlines()
    text = source({"source": output.get("data", {}).get("text/plain", "")})
    if output.get("output_type") == "display_data" and text.startswith(("✓ ", "✗ ")):
        return [line.removeprefix("  FAILED ") for line in text.splitlines()[1:]]
    return []


def output_lines(nb):
    """Every printed line of every code cell, compared or not, whitespace collapsed: what a `timed` entry's
    checks are found in."""
    return [flat(line) for cell in nb["cells"] if cell.get("cell_type") == "code" for output in cell.get("outputs", [])
            for line in _printed(output) if line.strip()]


def compared_lines(nb):
    """Every printed line (stdout, and the lines of check cells) of the code cells nbval compares (not tagged
    nbval-ignore-output), whitespace collapsed."""
    lines = []
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code" or IGNORE in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            lines += [flat(line) for line in _printed(output) if line.strip()]
    return lines


def code(md):
    """The notebook's code, every code cell's source whitespace collapsed, one string per cell: what a
    `setting` entry's checks are found in."""
    return [flat(source(cell)) for cell in cells(md) if cell.get("cell_type") == "code"]


def slug(heading):
    """The anchor myst-parser gives a heading (myst_heading_anchors): GitHub's slug."""
    try:
        from myst_parser.slugs import github_slugify
    except ImportError:                                      # the same rule, for a checkout without the site's packages
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    return github_slugify(heading)


def places(md):
    """Where each piece of the notebook's text is: a list of (text, place), place a dict with `what`
    (prose, caption, alt text, code, solution), `figure` (the `fig-...` name of a caption or alt text),
    `section` and `anchor` (the heading above it)."""
    found, section, anchor, figure = [], "", "", ""
    for cell in cells(md):
        text = source(cell)
        if cell.get("cell_type") == "markdown":
            for heading in re.findall(r"^#{1,3} (.+)$", text, flags=re.M):
                section, anchor = flat(heading), slug(heading)
            if is_caption(cell):
                found.append((flat(text), dict(what="caption", figure=figure, section=section, anchor=anchor)))
                continue
            for part in re.split(r"(^:::\{dropdown\}.*?^:::$)", text, flags=re.S | re.M):
                what = "solution" if part.startswith(":::{dropdown}") else "prose"
                found.append((flat(part), dict(what=what, figure="", section=section, anchor=anchor)))
        else:
            figure = figure_name(cell)
            hidden = cell.get("metadata", {}).get("jupyter", {}).get("source_hidden", False)
            found.append((flat(text), dict(what="solution" if hidden else "code", figure="", section=section, anchor=anchor)))
            if alt_text(cell):
                found.append((flat(alt_text(cell)), dict(what="alt text", figure=figure, section=section, anchor=anchor)))
    return found


def locate(text, where):
    """The first place whose text contains ``text``, or None."""
    for whole, place in where:
        if text in whole:
            return place
    return None


# ---------------------------------------------------------------------------------------------- coverage

# A number as prose writes it: 0.15, 1,000, 99.7, 1e-4; and 10^{-4} in math.
NUMBER = r"(?<![\w.,^{-])-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])"
# Measurement units and ratios: an integer followed by one of these is a measured quantity (135 MB, 7 times).
UNITS = (r"%|percent|per cent|[kKMGT]i?B\b|bytes?\b|(?:kilo|mega|giga|tera)bytes\b|[mµu]?s\b|ms\b|seconds?\b|"
         r"minutes?\b|hours?\b|[kMGTP]?FLOPs?\b|[kMGTP]?FLOP\b|flops\b|nats?\b|bits?\b|rad\b|radians?\b|degrees?\b|"
         r"times\b|×|x\b|parameters\b|multiply-adds\b|tokens/s\b")
# What names a part of this or another work, never a measurement: Figure 9.2.1, Exercise 9.3.2, section 9.4,
# Table 1, Theorem 1, Section 3.2 of a paper, equation (3), chapter 8, Python 3.11, PyTorch 2.13.0.
REFERENCE = re.compile(
    r"\b(?:Figures?|Fig\.|Exercises?|Tables?|Listings?|Sections?|sections?|Chapters?|chapters?|Appendix|Appendices|"
    r"[Ee]quations?|Eqs?\.|Theorems?|Lemmas?|Propositions?|Corollary|Algorithms?|§|Python|PyTorch|torch|CUDA|"
    r"MathJax|version|v)\s*\(?\d+(?:\.[0-9A-Z]+)*\)?(?:\s*(?:,|and|to|–|-)\s*\(?\d+(?:\.[0-9A-Z]+)*\)?)*")
SECTION_NUMBER = re.compile(r"(?<![\w.])9\.[1-6A](?:\.\d+)?(?![\d])")  # this chapter's sections, figures, exercises
VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$]+\$", re.S)
CODE = re.compile(r"`[^`]*`")
LINK = re.compile(r"\]\([^)]*\)|<https?://[^>]*>|https?://\S+")
MARKUP = re.compile(r"<[^>]+>|^\(.*?\)=\s*$", re.M)
ABBREVIATIONS = r"(?<!\bet al\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bcf\.)(?<!\bvs\.)(?<!\bFig\.)(?<!\bEq\.)(?<!\bNo\.)"
SENTENCE_END = re.compile(ABBREVIATIONS + r"(?<=[.!?])[*_)\"”]*\s+(?=[*_(\"“$\\]*[A-Z0-9$\\])")


def sentences(text):
    """Sentences of a markdown text, whitespace collapsed; headings and list items end one."""
    parts = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)|\n(?=#)", text):
        block = flat(block)
        if block:
            # a full stop inside math or code does not end a sentence: split around them only
            pieces, last = [], 0
            protected = [m.span() for m in re.finditer(r"\$\$.*?\$\$|\$[^$]+\$|`[^`]*`", block)]
            for m in SENTENCE_END.finditer(block):
                if any(a < m.start() < b for a, b in protected):
                    continue
                pieces.append(block[last:m.start() + 1].strip())
                last = m.end()
            pieces.append(block[last:].strip())
            parts += [p for p in pieces if p]
    return parts


def measured_numbers(sentence):
    """The numbers in ``sentence`` that quote a measurement: a decimal fraction (0.15), a percentage, a
    number in scientific notation (1e-4, $10^{-4}$), or an integer with a unit or ratio (135 MB,
    7 times, 19,914 parameters). Not numbers that name a part of a work (section 9.4, Figure 9.2.1,
    Exercise 9.3.2, Table 1, equation (3), chapter 8), years and other integers (citations such as
    "Vaswani et al. (2017)", sizes such as "64 tokens"), versions, numbers in code or links, or
    numbers in math other than decimals and powers of ten."""
    found = []
    math = [m.group() for m in MATH.finditer(sentence)]
    for formula in math:
        found += re.findall(r"10\^\{?-?\d+\}?|(?<![\w.])\d+\.\d+", formula)
    text = MATH.sub(" ", sentence)
    for pattern in (CODE, LINK, MARKUP, REFERENCE, SECTION_NUMBER, VERSION):
        text = pattern.sub(" ", text)
    for m in re.finditer(NUMBER, text):
        number, after = m.group(), text[m.end():]
        if re.search(r"[.e]", number.lstrip("-")) or re.match(r"\s*(?:" + UNITS + ")", after):
            found.append(number + (after.lstrip()[:1] if after.lstrip()[:1] in "%×" else ""))
    return found


def must_cover(md):
    """What a notebook's ledger must cover: (what, text) for every caption, every alt text, and every
    prose or solution sentence that quotes a measured number."""
    items = []
    for cell in cells(md):
        text = source(cell)
        if cell.get("cell_type") == "markdown":
            if is_caption(cell):
                items.append(("caption", flat(text)))
                continue
            text = re.sub(r"^\s*#.*$", "", text, flags=re.M)               # headings quote no measurement
            items += [("sentence", s) for s in sentences(text) if measured_numbers(s)]
        elif alt_text(cell):
            items.append(("alt text", flat(alt_text(cell))))
    return items


def uncovered(md, entries):
    """What ``must_cover`` lists that no entry's text lies within (or that lies within no entry's text)."""
    texts = [e["text"] for e in entries if e["text"]]
    return [(what, text) for what, text in must_cover(md) if not any(t in text or text in t for t in texts)]


# ---------------------------------------------------------------------------------------------- the page

def status(entry, printed, where):
    """How the entry stands against the stored notebook: a short word for the page."""
    if locate(entry["text"], where) is None:
        return "text not found"
    if entry["kind"] == "cited":
        return "cited" if entry["source"] else "no source"
    if not entry["check"]:
        return "no check"
    if entry["kind"] == "setting":
        return "set in code"
    if entry["kind"] == "timed":
        return "timed"
    missing = [c for c in entry["check"] if not any(c in line for line in printed)]
    return "checked" if not missing else "check missing from the outputs"


def _evidence(entry):
    """What backs an entry, as the pages show it: the paper, or the lines or code that check it."""
    quoted = "; ".join(f"`{c.replace('`', '')}`" for c in entry["check"])
    if entry["kind"] == "cited":
        return entry["source"]
    if entry["kind"] == "timed":
        return "the stored timing report: " + quoted
    if entry["kind"] == "setting":
        return "the code: " + quoted
    return quoted


def manuscript_page(root=ROOT):
    """The site's page "Notes on the manuscript", in MyST: every ledger entry with a `manuscript` note, by
    notebook, with what the book says, what the manuscript said and why they differ, and the evidence."""
    lines = ["# Notes on the manuscript", "",
             "This chapter was written from its author's manuscript. Where the book's text departs from it, to "
             "correct a statement or to make it precise, the change is listed here: what the book says, what the "
             "manuscript said and why, and the evidence (the output line a compared cell prints, the code that "
             "sets it, or the paper).", ""]
    total = 0
    for stem in stems(root / "notebooks"):
        entries = [e for e in load(stem, root / "book" / "claims") if e["manuscript"]]
        if not entries:
            continue
        md = root / "notebooks" / f"{stem}.md"
        where = places(md)
        heading = next((flat(h) for h in re.findall(r"^# (.+)$", md.read_text(), flags=re.M)), stem)
        lines += [f"## {heading}", "", "```{list-table}", ":header-rows: 1", ":widths: 30 36 34", ":class: manuscript",
                  f":name: manuscript-{slug(stem)}", "", "* - The book says", "  - The manuscript, and why the book differs",
                  "  - Evidence"]
        for entry in entries:
            place = locate(entry["text"], where) or {}
            link = f"notebooks/{stem}.ipynb" + (f"#{place['anchor']}" if place.get("anchor") else "")
            said = f"{_cell(entry['text'])} ([{place.get('section') or heading}]({link}))"
            lines += [f"* - {said}", f"  - {_cell(entry['manuscript'])}", f"  - {_cell(_evidence(entry))}"]
            total += 1
        lines += ["```", ""]
    lines[1:1] = ["", f"{total} notes."]
    return "\n".join(lines) + "\n"


def _cell(text):
    return text.replace("\n", " ").strip() or "—"


def page(root=ROOT, title="What this chapter claims, and where it checks it"):
    """The ledger as a MyST page: one list-table row per claim."""
    import nbformat

    lines = [f"# {title}", "",
             "Every statement of the chapter that quotes a number, says what a figure shows or reports what a "
             "paper found is an entry in a ledger kept in the repository (`book/claims/*.toml`). An entry computed "
             "here or shown in a figure names the line a compared cell prints that tests it as worded: every run "
             "of the notebooks' tests (nbval) reproduces that line, on any machine. A cited entry names the paper and "
             "the section, table or theorem that says so. The status, read from the stored notebooks when this site "
             "was built: checked (every check line is printed by a compared cell) or cited (the source is named).", ""]
    total = 0
    for stem in stems(root / "notebooks"):
        entries = load(stem, root / "book" / "claims")
        if not entries:
            continue
        md = root / "notebooks" / f"{stem}.md"
        where = places(md)
        printed = compared_lines(nbformat.read(md.with_suffix(".ipynb"), as_version=4))
        heading = next((flat(h) for h in re.findall(r"^# (.+)$", md.read_text(), flags=re.M)), stem)
        count = f"{len(entries)} claim{'' if len(entries) == 1 else 's'}"
        lines += [f"## {heading}", "", f"{count} in `book/claims/{stem}*.toml`.", "",
                  "```{list-table}", ":header-rows: 1", ":widths: 38 16 8 30 8", ":class: claims",
                  f":name: claims-{slug(stem)}", "",
                  "* - Statement", "  - Where", "  - Kind", "  - Evidence", "  - Status"]
        for entry in entries:
            place = locate(entry["text"], where) or {}
            link = f"notebooks/{stem}.ipynb" + (f"#{place['anchor']}" if place.get("anchor") else "")
            if place.get("figure"):
                where_text = f"{place['what']} of {{numref}}`{place['figure']}`"
            else:
                where_text = f"[{place.get('section') or heading}]({link}), {place.get('what', '?')}"
            evidence = _evidence(entry)
            lines += [f"* - {_cell(entry['text'])}", f"  - {_cell(where_text)}", f"  - {entry['kind']}",
                      f"  - {_cell(evidence)}", f"  - {status(entry, printed, where)}"]
            total += 1
        lines += ["```", ""]
    lines[1:1] = ["", f"{total} claims."]
    return "\n".join(lines) + "\n"


def main(argv):
    """List, per notebook, what its ledger does not cover yet (the test fails on each)."""
    chosen = argv or stems()
    gaps = 0
    for stem in chosen:
        stem = Path(stem).name.removesuffix(".md").removesuffix(".ipynb")
        missing = uncovered(NOTEBOOKS / f"{stem}.md", load(stem))
        gaps += len(missing)
        print(f"{stem}: {len(load(stem))} claims, {len(missing)} not covered")
        for what, text in missing:
            print(f"  {what}: {text[:160]}")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
