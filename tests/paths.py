"""Where the chapter's notebooks are, and a notebook named on the command line: without nbformat, whose import
(jsonschema's format checkers) takes most of a second, so that `make check` starts at once."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def source(name):
    """The MyST source of the notebook ``name`` (notebooks/x.md, notebooks/x.ipynb or notebooks/x), or
    SystemExit naming the notebooks. ``Path.with_suffix`` would read the stem's ".1-..." as a suffix."""
    path = Path(name)
    md = path.with_suffix(".md") if path.suffix in (".md", ".ipynb") else path.with_name(path.name + ".md")
    if not md.is_file():
        names = ", ".join(str(n.relative_to(ROOT).with_suffix(".md")) for n in NOTEBOOKS)
        raise SystemExit(f"no notebook {md}; name one of: {names}")
    return md
