"""Sphinx configuration of the chapter's static site (`make site`).

The site is built from the notebooks' stored outputs, never by executing them: nbval has already
proved those outputs. `make site` stages `book/index.md`, `README.md` and `notebooks/*.ipynb` under
`_build/site/src` (so Sphinx sees one source per page, not the jupytext `.md` twins) and runs
`sphinx-build -n -W -c book _build/site/src _build/site/html`, with this folder as its configuration.
Nothing a page loads comes from another host: the theme ships its assets and fonts, and MathJax is
copied from `node_modules/` (the npm package pinned in package.json) into `_static/mathjax/`.
Each figure's caption comes from the markdown cell below it in the notebook (`captions.py`). The page
"What this chapter claims, and where it checks it" is generated from the claims ledger (`ledger.py`).
"""

import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

from sphinx.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MATHJAX = ROOT / "node_modules" / "mathjax" / "es5"

# The repository the launch buttons open (Binder builds environment.yml; Colab opens the notebook from
# GitHub): pyproject.toml's [project.urls] Repository, the one place the address is recorded (the
# notebooks' first cell installs the helpers from it). Without one the site has no launch buttons.
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REPOSITORY = PROJECT.get("urls", {}).get("Repository", "").rstrip("/")
BRANCH = os.environ.get("BOOK_BRANCH", "main")

project = "Attention and Transformers"
html_title = "9. Attention and Transformers"

extensions = ["myst_nb", "sphinx_copybutton", "sphinx_design"]   # sphinx_design: the solutions' {dropdown}
root_doc = "index"
exclude_patterns = ["README.md", "**/.ipynb_checkpoints"]  # README.md is staged for index.md to include

# Notebooks: show what is stored, never execute. Progress bars and warnings on stderr stay in Jupyter.
nb_execution_mode = "off"
nb_output_stderr = "remove"
# Controls (helpers.controls) store, beside their live widget, an html rendering with every state
# precomputed (under CONTROL_HTML) and their start state alone (text/html, what JupyterLab shows unrun): the
# site shows the first, swapped into text/html as Sphinx reads each notebook (`control_frames` below). No
# widget view is rendered, and no widget manager is loaded (myst-nb would take it from two CDNs), so a
# control on a page works without kernel or network.
CONTROL_HTML = "application/vnd.book.control+html"
nb_mime_priority_overrides = [("*", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

# Figures and equations are numbered by their section, as in the notebooks' captions: Figure 9.1.1.
numfig = True
numfig_format = {"figure": "Figure %s", "table": "Table %s", "code-block": "Listing %s"}
SECTION = re.compile(r"(?:^|/)(\d+)\.([0-9A-Z]+)-[^/]*$")

# MathJax from the site itself (relative to _static), not from a CDN.
mathjax_path = "mathjax/tex-chtml.js"

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_favicon = "_static/favicon.svg"
html_sourcelink_suffix = ""  # download links give the notebook itself: 9.1-....ipynb
html_show_sphinx = False
html_show_copyright = False
# Light or dark as the reader's system prefers; the theme logs an error when this is left unset.
html_context = {"default_mode": "auto"}
html_theme_options = {
    "home_page_in_toc": False,  # the title above the contents already leads home
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "use_repository_button": bool(REPOSITORY),
    "use_issues_button": False,
    "use_edit_page_button": False,
    "footer_content_items": ["extra-footer"],
    "extra_footer": "<p>Chapter 9 of the book, built from the notebooks and the outputs they stored when they last ran.</p>",
}
if REPOSITORY:
    html_theme_options |= {
        "repository_url": REPOSITORY,
        "repository_branch": BRANCH,
        "path_to_docs": "",  # pages are staged at their repository paths: notebooks/9.1-....ipynb
        "launch_buttons": {
            "binderhub_url": "https://mybinder.org",
            "colab_url": "https://colab.research.google.com",
            "notebook_interface": "jupyterlab",
        },
    }


def number_figures_by_section(app, env):
    """Renumber each notebook's figures (and numbered equations) 9.N.1, 9.N.2, ... after Sphinx's pass.

    The section headings already carry their numbers (`# 9.1 ...`), so the toctree is not numbered
    and Sphinx would count figures through the whole book; the section comes from the file name.
    """
    changed = []
    for docname, types in env.toc_fignumbers.items():
        found = SECTION.search(docname)
        if not found:
            continue
        for numbers in types.values():
            for k, figure in enumerate(sorted(numbers, key=numbers.get), start=1):
                numbers[figure] = (int(found[1]), found[2], k)
        changed.append(docname)
    return changed


def control_frames(app, docname, content):
    """``source-read``: each control's every-state html becomes its text/html, which the page shows.

    Only what Sphinx parses changes; the notebook a reader downloads keeps both renderings.
    """
    if not str(app.env.doc2path(docname)).endswith(".ipynb") or CONTROL_HTML not in content[0]:
        return
    nb = json.loads(content[0])
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if CONTROL_HTML in data:
                data["text/html"] = data.pop(CONTROL_HTML)
    content[0] = json.dumps(nb, ensure_ascii=False)


def copy_mathjax(app, exception):
    """Copy MathJax's CHTML build and what it loads on demand (TeX extensions, fonts, menu, speech)."""
    if exception or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "mathjax"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy2(MATHJAX / "tex-chtml.js", target / "tex-chtml.js")
    for part in ("input", "output/chtml", "ui", "a11y", "sre", "adaptors"):
        shutil.copytree(MATHJAX / part, target / part, dirs_exist_ok=True)


def write_claims_page(app):
    """Generate "What this chapter claims, and where it checks it" and "Notes on the manuscript" from the
    ledger (`book/claims/*.toml`, read by `ledger.py`) into the source folder, as `claims.md` and
    `manuscript.md`, before Sphinx looks for sources. Each is rewritten only when it changes, so that a
    rebuild does not reread it for nothing."""
    from ledger import manuscript_page, page

    for name, text in (("claims.md", page(ROOT)), ("manuscript.md", manuscript_page(ROOT))):
        target = Path(app.srcdir) / name
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def setup(app):
    if not (MATHJAX / "tex-chtml.js").exists():
        raise ConfigError(f"MathJax is missing from {MATHJAX}: run `npm ci` (make site does)")
    # Captions are written once, in the markdown cell below each figure (what Jupyter shows): captions.py
    # copies them into the figures' metadata as Sphinx reads each notebook, and hides those cells.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from captions import source_read

    app.connect("source-read", source_read)
    app.connect("builder-inited", write_claims_page)
    app.connect("source-read", control_frames)
    app.connect("env-get-updated", number_figures_by_section, priority=900)
    app.connect("build-finished", copy_mathjax)
