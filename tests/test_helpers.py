import pytest
import torch
from torch import nn

import helpers
from helpers import plotting
from helpers.data import reversal_batch
from helpers.models import AttentionSeq2Seq
from helpers.train import train, train_and_evaluate


def test_seed_reproduces():
    helpers.seed(3)
    a = torch.randn(4)
    g = helpers.seed(3)
    assert torch.equal(a, torch.randn(4))
    assert torch.equal(torch.randn(2, generator=g), torch.randn(2, generator=torch.Generator().manual_seed(3)))


def test_seed_rejects_bad_values():
    with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.2\*\*32 - 1 \(the range NumPy takes\), got -1"):
        helpers.seed(-1)
    with pytest.raises(ValueError, match="seed must be an int in .*, got True"):
        helpers.seed(True)


def test_device_is_cuda_exactly_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert helpers.device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert helpers.device() == torch.device("cuda")


def test_save_figure_writes_svg_and_png(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plotting, "figures_dir", lambda: tmp_path)
    helpers.use_style()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = helpers.save_figure(fig, "a-test")
    plt.close(fig)
    assert path == tmp_path / "a-test.svg" and path.stat().st_size > 0
    assert (tmp_path / "a-test.png").read_bytes()[:4] == b"\x89PNG"
    assert "<dc:date>" not in path.read_text()          # reproducible: no timestamp


def test_save_figure_is_reproducible(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plotting, "figures_dir", lambda: tmp_path)
    helpers.use_style()
    texts = []
    for _ in range(2):
        fig, ax = plt.subplots()
        ax.plot([0, 1, 2], [1, 0, 1], label="x")
        ax.legend()
        texts.append(helpers.save_figure(fig, "same").read_text())
        plt.close(fig)
    assert texts[0] == texts[1]


def test_a_readers_run_writes_no_figure_even_in_the_checkout(monkeypatch):
    """Only the book's build writes figures/ (make execute sets BOOK_FIGURES): a reader's run in the
    checkout must not rewrite the committed figures, nor spend half a second a figure on files it does not show."""
    import matplotlib.pyplot as plt

    root = plotting.Path(helpers.__file__).resolve().parents[1]
    before = {p.name: p.stat().st_mtime_ns for p in (root / "figures").iterdir()}
    for unset in (monkeypatch.delenv, lambda name, raising: monkeypatch.setenv(name, "")):
        unset("BOOK_FIGURES", raising=False)
        monkeypatch.chdir(root / "notebooks")             # where a notebook's kernel starts
        assert plotting.figures_dir() is None
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        assert helpers.save_figure(fig, "attention-weights") is None
        plt.close(fig)
    assert {p.name: p.stat().st_mtime_ns for p in (root / "figures").iterdir()} == before



def test_outside_a_checkout_figures_are_shown_not_written(tmp_path, monkeypatch):
    """An installed copy must not write into the checkout it came from when the notebook runs elsewhere."""
    import matplotlib.pyplot as plt

    monkeypatch.delenv("BOOK_FIGURES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert plotting.figures_dir() is None
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    assert helpers.save_figure(fig, "outside") is None
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []


def test_figures_dir_can_be_redirected(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path))
    assert plotting.figures_dir() == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("BOOK_FIGURES", "~/figs")
    assert plotting.figures_dir() == tmp_path / "figs"


def line_figure():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    return fig


def test_save_figure_creates_missing_folders_and_takes_a_name_with_svg(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path / "a" / "b"))
    fig = line_figure()
    path = helpers.save_figure(fig, "x.svg")
    plt.close(fig)
    assert path == tmp_path / "a" / "b" / "x.svg"
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.png", "x.svg"]      # no temporaries left


def test_a_failed_save_leaves_the_old_pair_and_names_the_folder(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path))
    fig = line_figure()
    helpers.save_figure(fig, "pair")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(self, fname, **kwargs):               # the PNG cannot be written (disk full, say)
        if kwargs.get("format") == "png":
            raise PermissionError(13, "Permission denied")
        return savefig(self, fname, **kwargs)

    savefig = type(fig).savefig
    monkeypatch.setattr(type(fig), "savefig", broken)
    fig.axes[0].plot([0, 1], [0, 1])
    with pytest.raises(OSError, match=f"cannot write figure 'pair' to {tmp_path} \\(from BOOK_FIGURES\\)"):
        helpers.save_figure(fig, "pair")
    plt.close(fig)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before        # the old pair, whole


def test_save_figure_into_a_read_only_folder_names_it(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    fig = line_figure()
    with pytest.raises(OSError, match="cannot write figure 'x' to .*file \\(from BOOK_FIGURES\\)"):
        helpers.save_figure(fig, "x")
    plt.close(fig)


@pytest.mark.parametrize("name", ["", "Bad Name", "-x", "a/b"])
def test_save_figure_rejects_bad_names(name):
    with pytest.raises(ValueError, match="figure name"):
        helpers.save_figure(object(), name)


def test_save_figure_rejects_non_figures():
    with pytest.raises(ValueError, match="matplotlib figure"):
        helpers.save_figure(object(), "fine")


def test_reversal_batch():
    source, target = reversal_batch(5, 6, torch.Generator().manual_seed(0))
    assert source.shape == target.shape == (5, 6)
    assert torch.equal(target, source.flip(1))
    with pytest.raises(ValueError, match="batch must be a positive int, got 0"):
        reversal_batch(0, 6, torch.Generator())


class Uniform(nn.Module):
    """The simplest attention a decoder could use: equal weight on every encoder state."""

    def forward(self, s, h):
        a = torch.full(h.shape[:2], 1 / h.shape[1])
        return h.mean(1), a


def test_seq2seq_shapes_and_greedy_decoding():
    model = AttentionSeq2Seq(10, 8, Uniform())
    source, target = reversal_batch(3, 5, torch.Generator().manual_seed(0))
    logits, weights = model(source, target)
    assert logits.shape == (3, 5, 10) and weights.shape == (3, 5, 5)
    assert model(source)[0].shape == (3, 5, 10)
    with pytest.raises(ValueError, match="batch, length"):
        model(source[0])
    assert model(source, steps=2)[0].shape == (3, 2, 10)
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        model(source, steps=0)
    with pytest.raises(ValueError, match="source must be a torch.Tensor"):
        model(source.tolist())


def test_train_reduces_the_loss():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    losses = train(model, lambda step: (x, y), loss_fn, steps=200, lr=0.05)
    assert len(losses) == 200 and losses[-1] < 0.01 * losses[0]
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        train(model, lambda step: (x, y), loss_fn, steps=0)
    with pytest.raises(ValueError, match="clip must be a positive finite number, got nan"):
        train(model, lambda step: (x, y), loss_fn, steps=1, clip=float("nan"))


def test_train_stops_at_the_first_non_finite_loss():
    model = nn.Linear(1, 1)
    losses = iter([1.0, float("nan"), 1.0])
    weights = []

    def loss_fn(m, batch):
        weights.append(m.weight.detach().clone())
        return m(torch.ones(1, 1)).sum() * 0 + next(losses)

    with pytest.raises(FloatingPointError, match="the loss is nan at step 1"):
        train(model, lambda step: None, loss_fn, steps=3)
    assert torch.equal(model.weight.detach(), weights[1])      # the NaN step changed nothing


def test_train_leaves_eval_mode_even_when_the_loss_raises():
    model = nn.Linear(1, 1)

    def loss_fn(m, batch):
        assert m.training
        raise KeyError("bad batch")

    with pytest.raises(KeyError, match="bad batch"):
        train(model, lambda step: None, loss_fn, steps=2)
    assert not model.training
    with pytest.raises(KeyError, match="bad batch"):
        train_and_evaluate(model, lambda step: None, loss_fn, steps=2, evaluate=lambda m: 0.0)
    assert not model.training


def test_train_runs_on_one_thread_and_restores_the_count():
    model = nn.Linear(1, 1)
    seen = []

    def loss_fn(m, batch):
        seen.append(torch.get_num_threads())
        if len(seen) == 3:
            raise KeyError("bad batch")
        return m(torch.ones(1, 1)).sum()

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(model, lambda step: None, loss_fn, steps=2)
        assert seen == [1, 1] and torch.get_num_threads() == 2
        with pytest.raises(KeyError, match="bad batch"):            # restored when a step fails too
            train(model, lambda step: None, loss_fn, steps=2)
        assert torch.get_num_threads() == 2
        seen.clear()
        train(model, lambda step: None, loss_fn, steps=2, threads=None)   # None: the count as it is
        assert seen == [2, 2]
        with pytest.raises(ValueError, match="threads must be a positive int, got 0"):
            train(model, lambda step: None, loss_fn, steps=1, threads=0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", [2**32, 2**64, -1])
def test_a_refused_seed_changes_no_generator(value):
    import random

    import numpy as np

    helpers.seed(5)
    state = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.2\*\*32 - 1"):
        helpers.seed(value)                    # 2**32 seeded Python's random, then NumPy refused it
    assert random.getstate() == state[0]
    assert (np.random.get_state()[1] == state[1]).all() and torch.equal(torch.get_rng_state(), state[2])
    helpers.seed(2**32 - 1)                    # the largest seed every generator takes


def test_a_directory_in_the_way_leaves_the_old_pair_whole(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path))
    fig = line_figure()
    helpers.save_figure(fig, "pair", png=False)
    old = (tmp_path / "pair.svg").read_bytes()
    (tmp_path / "pair.png").mkdir()                       # figures/NAME.png is a directory
    fig.axes[0].plot([0, 1], [0, 1])
    with pytest.raises(OSError, match=r"cannot write figure 'pair'.*pair\.png is a directory"):
        helpers.save_figure(fig, "pair")
    plt.close(fig)
    assert (tmp_path / "pair.svg").read_bytes() == old    # the SVG was replaced before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair.png", "pair.svg"]    # no temporaries


@pytest.mark.parametrize("name", ["x.png", "a.b", "x.svg.svg", "é", "x_y"])
def test_save_figure_refuses_dotted_and_other_names(name):
    with pytest.raises(ValueError, match="figure name must be lower-case ASCII letters, digits and hyphens"):
        helpers.save_figure(object(), name)                # "x.png" wrote x.png.svg


def test_save_figure_refuses_a_png_flag_that_is_not_a_bool():
    with pytest.raises(ValueError, match="png must be True or False"):
        helpers.save_figure(line_figure(), "fine", png="no")


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_figures_get_the_mode_the_umask_gives(tmp_path, monkeypatch, umask):
    import os

    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path))
    fig = line_figure()
    old = os.umask(umask)
    try:
        helpers.save_figure(fig, "mode")
    finally:
        os.umask(old)
    plt.close(fig)
    for suffix in ("svg", "png"):                          # mkstemp's 0600 whatever the umask, before
        assert (tmp_path / f"mode.{suffix}").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_second_rename_puts_the_first_file_back(tmp_path, monkeypatch):
    import os

    import matplotlib.pyplot as plt

    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path))
    fig = line_figure()
    helpers.save_figure(fig, "pair")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    replace = os.replace

    def flaky(src, dst):                                  # the PNG's rename fails (a disk error, say)
        if str(dst).endswith("pair.png"):
            raise OSError(5, "Input/output error")
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    fig.axes[0].plot([0, 1], [0, 1])
    with pytest.raises(OSError, match="Input/output error"):
        helpers.save_figure(fig, "pair")
    plt.close(fig)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before        # the old pair, whole
    monkeypatch.undo()
    fig = line_figure()
    monkeypatch.setenv("BOOK_FIGURES", str(tmp_path / "new"))
    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(OSError):
        helpers.save_figure(fig, "pair")                   # no old pair: neither file is left
    plt.close(fig)
    assert list((tmp_path / "new").iterdir()) == []


def test_round_coordinates_takes_text_only():
    assert plotting.round_coordinates('<path d="M 1.23456 -0.0001"/>') == '<path d="M 1.23 0"/>'
    with pytest.raises(ValueError, match="svg must be the SVG's text, a str, got bytes"):
        plotting.round_coordinates(b"<svg/>")


def test_the_shared_mathtext_parser_draws_the_same_pixels():
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.backends import backend_agg
    from matplotlib.mathtext import MathTextParser

    plotting.use_style()
    plotting.use_style()                                 # twice: the renderer is wrapped once
    assert backend_agg.RendererAgg.__init__.shares_mathtext
    assert not hasattr(backend_agg.RendererAgg.__init__.__wrapped__, "shares_mathtext")     # matplotlib's own

    def pixels(own_parser):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([1, 10, 100], [1e-4, 1e-2, 1])
        ax.set(yscale="log", xscale="log", title=r"$\|q\|$ and $d_k$ = 64")
        renderer = fig.canvas.get_renderer()
        shared = renderer.mathtext_parser is plotting.MATHTEXT
        if own_parser:
            renderer.mathtext_parser = MathTextParser("path")        # as matplotlib makes it for each renderer
        fig.canvas.draw()
        drawn = np.asarray(fig.canvas.buffer_rgba()).copy()
        plt.close(fig)
        return shared, drawn

    pixels(False)                                        # fills the shared cache with every label of the figure
    (shared, with_shared), (_, with_own) = pixels(False), pixels(True)     # drawn from the cache / parsed afresh
    assert shared and np.array_equal(with_shared, with_own)


def test_log_labels_writes_plain_labels_at_one_two_and_five():
    import matplotlib.pyplot as plt

    from helpers.plotting import log_labels

    fig, ax = plt.subplots()
    ax.plot([0.03, 6.5], [0.03, 6.5])
    ax.set(yscale="log")
    log_labels(ax.yaxis)
    fig.canvas.draw()
    shown = [t.get_text() for t in ax.get_yticklabels() if 0.03 <= t.get_position()[1] <= 6.5]
    assert shown == ["0.05", "0.1", "0.2", "0.5", "1", "2", "5"] and not ax.yaxis.get_minor_locator()()
    with pytest.raises(ValueError, match="log-scaled"):
        log_labels(ax.xaxis)
    plt.close(fig)


def test_threads_sets_the_count_inside_and_restores_it_after_an_error():
    from helpers.runtime import threads
    outside = torch.get_num_threads()
    torch.set_num_threads(2)               # not 1, which `make check` runs with: the count inside must differ
    try:
        with pytest.raises(KeyError), threads(1):
            assert torch.get_num_threads() == 1
            raise KeyError
        assert torch.get_num_threads() == 2
        with threads(None):
            assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="threads"), threads(0):
            pass
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(outside)
