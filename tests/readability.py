"""How the chapter reads: per notebook, the main text's length and sentences, what its visible cells print,
its long code lines, and any word written for a maintainer rather than a reader.

`python tests/readability.py` prints the report; `tests/test_readability.py` holds every notebook to the
limits below, and `make test` prints the report at its end (conftest.py).

- Main prose: the markdown before "## Exercises", captions included, without headings, math, code, labels
  and directives. A sentence ends at ".", "?" or "!" followed by a space or the end of a paragraph.
- Visible printed lines: what the code cells a reader sees print (stdout and results), the exercises
  included. Check cells (helpers.verify) and hidden cells are not visible: a check cell shows one line.
- A verdict is a printed line ending in True or False.
- The maintainer's vocabulary: words about the manuscript, CPUs and threads, the tests and CI, twins and
  re-runs, anywhere in the reader's text (prose, captions, alt text, solutions, visible code comments).
"""

import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))

# Main-text words: twice the section's manuscript prose plus 300 (issue 31), and the appendices' own limit.
WORDS = {"9.1": 2200, "9.2": 2150, "9.3": 1700, "9.4": 2900, "9.5": 2050, "9.6": 1750, "9.A": 1800}
MEAN_WORDS, LONG, LONG_SHARE = 24, 40, 0.10        # per sentence: mean; share of sentences over LONG words
VERDICT_SHARE, CODE_WIDTH = 0.15, 100
VOCABULARY = re.compile(r"\b(manuscript|CPUs?|threads?|nbval|CI|twins?|re-?runs?|re-?ran|MKL|AVX\w*|ATEN_\w*"
                        r"|instruction sets?)\b|tests/", re.I)
VERDICT = re.compile(r"\b(True|False)\W*$")

MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
FENCE = re.compile(r"^(```|:::).*$", re.M)
NOISE = re.compile(r"^\(\S+\)=\s*$|^:\w+:.*$|<!--.*?-->|\{\w+\}`[^`]*`|`[^`]*`", re.M | re.S)
SENTENCE_END = re.compile(r"(?<=[.?!])[\"')\]*_]*\s+(?=[\"'(*_]*[A-Z0-9$])|\n\s*\n")


def hidden(cell):
    meta = cell.get("metadata", {})
    tags = meta.get("tags", [])
    return (meta.get("jupyter", {}).get("source_hidden") is True or "remove-cell" in tags or "remove-input" in tags
            or "hide-input" in tags or "hide-cell" in tags)


def is_check(cell):
    return cell.get("cell_type") == "code" and re.search(r"^with verify\(", cell.get("source", ""), re.M)


def prose(text):
    """Markdown as plain words: no math, code, labels, directive lines or headings' marks."""
    text = FENCE.sub("", MATH.sub(" x ", text))
    text = NOISE.sub(" x ", text)
    text = re.sub(r"^#+\s.*$", "", text, flags=re.M)                     # headings are not sentences
    text = re.sub(r"^\s*(?:[-*+]|\d+\.)\s+", "\n\n", text, flags=re.M)         # a list item is a paragraph of its own
    return re.sub(r"[*_]{1,2}|\[([^\]]*)\]\([^)]*\)", r"\1", text)


def sentences(text):
    parts = []
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(block.split())
        if not block or re.fullmatch(r"[-*+|]?\s*x?", block):
            continue
        parts += [s for s in SENTENCE_END.split(block) if len(s.split()) > 1]
    return parts


def printed(cell):
    lines = []
    for out in cell.get("outputs", []):
        if out.get("name") == "stdout":
            lines += out.get("text", "").splitlines()
        elif out.get("output_type") == "execute_result":
            lines += out.get("data", {}).get("text/plain", "").splitlines()
    return [line for line in lines if line.strip()]


def alt_texts(cell):
    image = cell.get("metadata", {}).get("mystnb", {}).get("image", {})
    return [image["alt"]] if isinstance(image, dict) and "alt" in image else []


def comments(source):
    return [m.group(1) for line in source.splitlines() if (m := re.search(r"(?:^|\s)#\s?(.*)$", line))]


def report(md):
    """The readability figures of notebook ``md`` (its MyST source; outputs from its .ipynb)."""
    nb = jupytext.read(md)
    stored = nbformat.read(md.with_suffix(".ipynb"), as_version=4)
    cells = nb.cells
    heading = re.compile(r"^## Exercises\s*$", re.M)
    end = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and heading.search(c.source)), len(cells))
    before = [c.source for c in cells[:end] if c.cell_type == "markdown"]
    if end < len(cells):                                  # the heading's own cell may begin with main text
        before.append(cells[end].source[:heading.search(cells[end].source).start()])
    main = prose("\n\n".join(before))
    said = sentences(main)
    lengths = [len(s.split()) for s in said]
    visible = [c for c in stored.cells if c.cell_type == "code" and not hidden(c) and not is_check(c)]
    lines = [line for c in visible for line in printed(c)]
    verdicts = [line for line in lines if VERDICT.search(line)]
    wide = [line for c in visible for line in c.source.splitlines() if len(line) > CODE_WIDTH]
    reader_text = [(f"cell {i}", c.source) for i, c in enumerate(cells) if c.cell_type == "markdown"]
    reader_text += [(f"cell {i} alt text", a) for i, c in enumerate(cells) for a in alt_texts(c)]
    reader_text += [(f"cell {i} comment", t) for i, c in enumerate(cells)
                    if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])
                    and not is_check(c) for t in comments(c.source)]
    vocabulary = [(where, m.group(0), " ".join(text[max(0, m.start() - 40):m.end() + 40].split()))
                  for where, text in reader_text for m in VOCABULARY.finditer(text)]
    return {
        "section": md.stem.split("-")[0], "words": len(main.split()), "sentences": len(said),
        "mean": sum(lengths) / max(len(lengths), 1), "long": sum(n > LONG for n in lengths) / max(len(lengths), 1),
        "lines": len(lines), "verdicts": len(verdicts), "checks": sum(bool(is_check(c)) for c in stored.cells),
        "wide": wide, "vocabulary": vocabulary,
    }


def problems(r):
    """What in report ``r`` is over the limits, as sentences (empty when none is)."""
    found = []
    if r["words"] > WORDS[r["section"]]:
        found.append(f"main prose {r['words']} words, above {WORDS[r['section']]}")
    if r["mean"] > MEAN_WORDS:
        found.append(f"sentences average {r['mean']:.1f} words, above {MEAN_WORDS}")
    if r["long"] > LONG_SHARE:
        found.append(f"{r['long']:.0%} of sentences run over {LONG} words, above {LONG_SHARE:.0%}")
    if r["verdicts"] > VERDICT_SHARE * r["lines"]:
        found.append(f"{r['verdicts']} of {r['lines']} visible printed lines are verdicts, above {VERDICT_SHARE:.0%}")
    found += [f"visible code line of {len(line)} characters: {line.strip()[:70]}" for line in r["wide"]]
    found += [f"maintainer's word {word!r} ({where}): ...{context}..." for where, word, context in r["vocabulary"]]
    return found


def table(rows, write=print):
    write(f"{'notebook':9} {'words':>11} {'sentences':>9} {'mean':>5} {'>40':>5} {'printed':>7} {'verdicts':>9}"
          f" {'checks':>6} {'>100 col':>8} {'vocab':>5}")
    for r in rows:
        write(f"{r['section']:9} {r['words']:>5}/{WORDS[r['section']]:<5} {r['sentences']:>9} {r['mean']:>5.1f}"
              f" {r['long']:>5.0%} {r['lines']:>7} {r['verdicts']:>4} {r['verdicts'] / max(r['lines'], 1):>4.0%}"
              f" {r['checks']:>6} {_count(r['wide']):>8} {_count(r['vocabulary']):>5}")


def _count(found):
    return found if isinstance(found, int) else len(found)


if __name__ == "__main__":
    chosen = [Path(a).resolve().with_suffix(".md") for a in sys.argv[1:]] or NOTEBOOKS
    rows = [report(md) for md in chosen]
    table(rows)
    for r in rows:
        for p in problems(r):
            print(f"{r['section']}: {p}")
