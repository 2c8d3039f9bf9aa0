"""One figure style for the whole book, and ``save_figure`` that writes it to ``figures/`` when the book is built."""

import functools
import io
import os
import re
import secrets
from pathlib import Path

import matplotlib as mpl
from matplotlib.backends import backend_agg
from matplotlib.mathtext import MathTextParser

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
    """Apply the book's matplotlib style (palette, fonts, reproducible SVG), and share one mathtext cache."""
    mpl.rcParams.update(STYLE)
    share_mathtext()


MATHTEXT = MathTextParser("path")     # what each Agg renderer makes for itself (matplotlib 3.11)


def share_mathtext() -> None:
    """Give every Agg renderer the same mathtext parser, so that what it has parsed outlives each figure.

    matplotlib caches parsed mathtext per parser, and every new figure's renderer makes its own: each
    figure parses its labels again (a log axis's $10^{-4}$, a title's $d_k$), about 10 ms a label here,
    and a control's frames parse the same labels frame after frame (a quarter of a frame's time). The
    parser keeps no other state, so the pixels are the same (tests/test_helpers.py). One caveat, which
    the book never meets: the cache's key holds the font properties and dpi but not the ``mathtext.*``
    settings other than the font set, so changing ``mathtext.default`` (say) mid-session would leave
    labels already parsed as they were. Only Agg (PNG) renderers are concerned; SVG output parses
    through matplotlib's module-wide ``TextToPath``, already shared.
    """
    init = backend_agg.RendererAgg.__init__
    if getattr(init, "shares_mathtext", False):
        return

    @functools.wraps(init)
    def shared(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.mathtext_parser = MATHTEXT

    shared.shares_mathtext = True
    backend_agg.RendererAgg.__init__ = shared


def log_labels(axis, subs=(1, 2, 5)):
    """Label a log-scaled ``axis`` (``ax.yaxis``) at ``subs`` times each power of ten, written plainly
    (0.05, 0.1, 0.2), and drop its minor ticks: over two or three decades matplotlib labels only the powers
    of ten, too few to read a value off."""
    if axis.get_scale() != "log":
        raise ValueError(f"log_labels needs a log-scaled axis, got scale {axis.get_scale()!r}")
    axis.set_major_locator(mpl.ticker.LogLocator(subs=subs))
    axis.set_major_formatter(mpl.ticker.FormatStrFormatter("%g"))
    axis.set_minor_locator(mpl.ticker.NullLocator())


def figures_dir() -> Path | None:
    """Where ``save_figure`` writes: the folder ``BOOK_FIGURES`` names, or None, and the figure is only
    shown.

    The book's build sets it (`make execute`: the checkout's ``figures/``; the tests: a scratch folder).
    A reader's run writes nothing, in a checkout or elsewhere: the committed figures change only when
    the book is rebuilt, not when a reader tries another seed, and a Run All does not spend half a
    second a figure on an SVG and a PNG it does not show (issue 21: 15 s over the chapter).
    """
    folder = os.environ.get("BOOK_FIGURES", "")
    return Path(folder).expanduser() if folder else None


NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def save_figure(fig, name: str, png: bool = True) -> Path | None:
    """Write ``fig`` to ``figures_dir()/NAME.svg`` (and ``.png``); return the SVG's path (None: not written).

    ``name`` is a stable, lower-case, hyphenated name such as ``"unit-circle-lookup"`` (a trailing
    ``.svg`` is dropped; any other dot is refused). Both files are written to temporary names in the
    folder first and then renamed over the old ones, so a failed write leaves the previous pair whole:
    what is in the way (a directory named ``NAME.png``) is found before anything is written, and if
    the second rename fails all the same, the first file's old version is put back. Missing folders
    are created; the files get the mode the umask gives, as any file the user writes. A failure
    raises ``OSError`` naming the folder and where it came from.
    """
    given = name
    if isinstance(name, str) and name.endswith(".svg"):
        name = name[: -len(".svg")]
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError("figure name must be lower-case ASCII letters, digits and hyphens"
                         f" (.svg and .png are added), got {given!r}")
    if not isinstance(png, bool):
        raise ValueError(f"png must be True or False, got {png!r}")
    if not hasattr(fig, "savefig"):
        raise ValueError(f"expected a matplotlib figure, got {type(fig).__name__}")
    folder = figures_dir()
    if folder is None:  # a reader's run: the notebook shows the figure, nothing is written
        return None
    files = {"svg": {"Date": None}, **({"png": {"Software": None}} if png else {})}    # format: metadata
    targets = {fmt: folder / f"{name}.{fmt}" for fmt in files}
    temps, backups = {}, {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for target in targets.values():                   # before anything is written
            if target.exists() and not target.is_file():
                raise OSError(f"{target} is {'a directory' if target.is_dir() else 'not a regular file'}")
        for fmt, metadata in files.items():
            temps[fmt] = _new_file(folder / f".{name}.{secrets.token_hex(6)}.{fmt}")
            if fmt == "svg":
                buffer = io.BytesIO()
                fig.savefig(buffer, format=fmt, metadata=metadata)
                temps[fmt].write_text(round_coordinates(buffer.getvalue().decode()))
            else:
                fig.savefig(temps[fmt], format=fmt, metadata=metadata)
        existed = {fmt for fmt, target in targets.items() if target.exists()}
        for fmt, target in targets.items():               # keep the old files under a second name
            if fmt in existed:
                backup = folder / f".{name}.{secrets.token_hex(6)}.old.{fmt}"
                try:
                    os.link(target, backup)
                    backups[fmt] = backup
                except OSError:                           # no hard links on this file system
                    pass
        done = []
        try:
            for fmt, temp in temps.items():
                os.replace(temp, targets[fmt])            # both files exist: rename them in turn
                done.append(fmt)
        except OSError:
            for fmt in done:                              # put the old version back (or remove the new one)
                if fmt in backups:
                    os.replace(backups[fmt], targets[fmt])
                elif fmt not in existed:
                    targets[fmt].unlink()
            raise
        temps.clear()
    except OSError as error:
        raise OSError(f"cannot write figure {name!r} to {folder} (from BOOK_FIGURES): {error}") from error
    finally:
        for temp in (*temps.values(), *backups.values()):
            temp.unlink(missing_ok=True)
    return folder / f"{name}.svg"


def _new_file(path):
    """Create the empty file ``path`` (never an existing one) with the mode the umask gives; return it."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return path


# matplotlib writes SVG coordinates with 6 decimals, so a figure computed on another CPU, whose floats
# differ in the last bits, would churn figures/. A hundredth of a point is far below what shows.
# Comments (the text of labels) and scale factors (glyphs are drawn at scale(0.015625)) keep theirs.
DECIMALS = re.compile(r"-?\d+\.\d{3,}")
KEPT = re.compile(r"(<!--.*?-->|(?:scale|matrix|rotate)\([^)]*\))", re.S)


def round_coordinates(svg: str) -> str:
    """Round every coordinate with three or more decimals in ``svg`` (the text of an SVG file) to two."""
    if not isinstance(svg, str):
        raise ValueError(f"svg must be the SVG's text, a str, got {type(svg).__name__}")
    def short(match):
        value = round(float(match[0]), 2)
        return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"

    return "".join(p if KEPT.fullmatch(p) else DECIMALS.sub(short, p) for p in KEPT.split(svg))
