"""Strip what a re-execution churns from stored notebooks, so that `git diff` shows only real change.

`make execute` runs this after executing each notebook. It removes
- each cell's execution timestamps (`metadata.execution`, written by nbclient),
- stderr streams: progress-bar frames and warnings, never compared by nbval (see conftest.py) and
  noise in the stored file (tqdm still draws its bars while a notebook runs),
- the Python patch version in the notebook's metadata, which differs from one reader to the next,
- live widgets (helpers.controls): their views and saved state name model ids that change on every run
  and mean nothing without the kernel that made them; the control's two html renderings, stored beside
  them in the same output, are what the site (every state) and a reader opening the stored notebook
  (the start state, with a line saying how to make it live) see;
and it joins consecutive pieces of one stream, which the kernel splits wherever its buffer was flushed.

Usage: python book/clean.py NOTEBOOK.ipynb [...]
"""

import sys

import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def clean(nb):
    """Clean notebook ``nb`` in place; return it."""
    nb.metadata.get("language_info", {}).pop("version", None)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            outputs = []
            for o in cell.outputs:
                if o.output_type == "stream" and o.name == "stderr":
                    continue
                if o.output_type == "stream" and outputs and outputs[-1].output_type == "stream" and outputs[-1].name == o.name:
                    outputs[-1].text += o.text
                else:
                    outputs.append(o)
            cell.outputs = outputs
            for o in cell.outputs:
                if "data" in o and WIDGET_VIEW in o.data and len(o.data) > 1:
                    del o.data[WIDGET_VIEW]
    return nb


def is_clean(nb):
    """True when ``clean`` would change nothing."""
    return nb == clean(nbformat.from_dict(nb))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        nbformat.write(clean(nbformat.read(path, as_version=4)), path)
