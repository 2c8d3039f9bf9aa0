"""The chapter reads like a chapter (issue 31): each notebook within the limits of tests/readability.py,
whose report `make test` prints at its end (conftest.py)."""

import pytest
import readability


@pytest.mark.parametrize("md", readability.NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_reads_within_the_limits(md, record_property):
    r = readability.report(md)
    record_property("readability", r | {"wide": len(r["wide"]), "vocabulary": len(r["vocabulary"])})
    found = readability.problems(r)
    assert not found, f"{md.stem}:\n" + "\n".join(found)


def test_the_report_finds_what_it_counts(tmp_path):
    """A notebook with a verdict, a long line, a maintainer's word and a check cell, counted as a reader meets them."""
    import jupytext
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 9.1 A title\n\nThe manuscript says so. A second sentence here."),
        nbformat.v4.new_code_cell("print(1)\n" + "x = 1  # " + "y" * 100, outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="shape: (2, 3)\nequal: True\n")]),
        nbformat.v4.new_code_cell('with verify("Figure 1"):\n    print("a: True")', outputs=[
            nbformat.v4.new_output("display_data", data={"text/plain": "✓ Figure 1: 1 check holds\n  a: True"})]),
        nbformat.v4.new_markdown_cell("## Summary\n\nA summary counts.\n\n## Exercises\n\nNot main text, but read: CPU."),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "9.1-x.ipynb")
    jupytext.write(nb, tmp_path / "9.1-x.md", fmt="md:myst")
    r = readability.report(tmp_path / "9.1-x.md")
    # the summary before the heading, in the heading's own cell, is main text: 8 + 3 words
    assert (r["words"], r["sentences"], r["lines"], r["verdicts"], r["checks"]) == (11, 3, 2, 1, 1)
    assert len(r["wide"]) == 1 and [w for _, w, _ in r["vocabulary"]] == ["manuscript", "CPU"]
    assert any("verdicts" in p for p in readability.problems(r))
