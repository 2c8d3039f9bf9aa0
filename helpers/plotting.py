"""One figure style for the whole book, and ``save_figure`` that writes it to ``figures/``."""

import io
import os
import re
import tempfile
from pathlib import Path

import matplotlib as mpl

# Okabe and Ito's palette: distinguishable with every common form of colour blindness.
PALETTE = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
CYCLE = [PALETTE[c] for c in ("blue", "orange", "green", "vermillion", "purple", "sky", "yellow", "black")]

STYLE = {
    "axes.prop_cycle": mpl.cycler(color=CYCLE),
    "figure.figsize": (8.0, 3.2),
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    # An opaque background keeps figures legible on the site's dark theme too.
    "savefig.facecolor": "white",
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "image.cmap": "viridis",
    "lines.linewidth": 1.6,
    # Reproducible SVG: fixed ids, no date, so re-executing does not churn figures/.
    "svg.hashsalt": "attention-chapter",
    "svg.fonttype": "path",
}


def use_style() -> None:
    """Apply the book's matplotlib style (palette, fonts, reproducible SVG)."""
    mpl.rcParams.update(STYLE)


def figures_dir() -> Path | None:
    """The ``figures/`` folder of the checkout the notebook runs in, or None outside a checkout.

    The checkout is the first folder holding ``notebooks/`` and ``helpers/`` at or above the working
    directory (a kernel starts in its notebook's folder). Only the working directory counts, not this
    package's location: a copy installed from one checkout must not write into it from a notebook run
    elsewhere (Colab, a download), where the figure is only shown. The environment variable
    ``BOOK_FIGURES`` overrides it: the tests set it so that re-executing the notebooks does not rewrite
    the committed figures.
    """
    if os.environ.get("BOOK_FIGURES"):
        return Path(os.environ["BOOK_FIGURES"]).expanduser()
    cwd = Path.cwd().resolve()
    for root in (cwd, *cwd.parents):
        if (root / "notebooks").is_dir() and (root / "helpers").is_dir():
            return root / "figures"
    return None


def save_figure(fig, name: str, png: bool = True) -> Path | None:
    """Write ``fig`` to ``figures/NAME.svg`` (and ``.png``); return the SVG's path (None outside a checkout).

    ``name`` is a stable, lower-case, hyphenated name such as ``"unit-circle-lookup"`` (a trailing
    ``.svg`` is dropped). Both files are written to temporary names in the folder first and then
    renamed over the old ones, so a failed write leaves the previous pair whole; missing folders are
    created. A failure raises ``OSError`` naming the folder and where it came from.
    """
    if isinstance(name, str) and name.endswith(".svg"):
        name = name[: -len(".svg")]
    if not isinstance(name, str) or not name or name[0] in "-." or not all(c.islower() or c.isdigit() or c in "-." for c in name):
        raise ValueError(f"figure name must be lower-case letters, digits and hyphens, got {name!r}")
    if not hasattr(fig, "savefig"):
        raise ValueError(f"expected a matplotlib figure, got {type(fig).__name__}")
    folder = figures_dir()
    if folder is None:  # outside a checkout: the notebook shows the figure, nothing is written
        return None
    files = {"svg": {"Date": None}, **({"png": {"Software": None}} if png else {})}    # format: metadata
    temps = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for fmt, metadata in files.items():
            handle, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=f".{fmt}", dir=folder)
            os.close(handle)
            temps[fmt] = Path(temp)
            if fmt == "svg":
                buffer = io.BytesIO()
                fig.savefig(buffer, format=fmt, metadata=metadata)
                temps[fmt].write_text(round_coordinates(buffer.getvalue().decode()))
            else:
                fig.savefig(temp, format=fmt, metadata=metadata)
        for fmt, temp in temps.items():
            os.replace(temp, folder / f"{name}.{fmt}")       # both files exist: rename them in turn
        temps.clear()
    except OSError as error:
        where = ("BOOK_FIGURES" if os.environ.get("BOOK_FIGURES") else "the repository's figures/ (BOOK_FIGURES overrides it)")
        raise OSError(f"cannot write figure {name!r} to {folder} (from {where}): {error}") from error
    finally:
        for temp in temps.values():
            temp.unlink(missing_ok=True)
    return folder / f"{name}.svg"


# matplotlib writes SVG coordinates with 6 decimals, so a figure computed on another CPU, whose floats
# differ in the last bits, would churn figures/. A hundredth of a point is far below what shows.
# Comments (the text of labels) and scale factors (glyphs are drawn at scale(0.015625)) keep theirs.
DECIMALS = re.compile(r"-?\d+\.\d{3,}")
KEPT = re.compile(r"(<!--.*?-->|(?:scale|matrix|rotate)\([^)]*\))", re.S)


def round_coordinates(svg: str) -> str:
    """Round every coordinate with three or more decimals in ``svg`` to two."""
    def short(match):
        value = round(float(match[0]), 2)
        return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"

    return "".join(p if KEPT.fullmatch(p) else DECIMALS.sub(short, p) for p in KEPT.split(svg))
