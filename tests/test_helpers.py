import pytest
import torch
from torch import nn

import helpers
from helpers import plotting
from helpers.data import reversal_batch
from helpers.models import AttentionSeq2Seq
from helpers.train import train


def test_seed_reproduces():
    helpers.seed(3)
    a = torch.randn(4)
    g = helpers.seed(3)
    assert torch.equal(a, torch.randn(4))
    assert torch.equal(torch.randn(2, generator=g), torch.randn(2, generator=torch.Generator().manual_seed(3)))


def test_seed_rejects_bad_values():
    with pytest.raises(ValueError, match="non-negative"):
        helpers.seed(-1)


def test_device_is_usable():
    assert torch.zeros(1, device=helpers.device()).device.type in ("cpu", "cuda")


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


def test_figures_dir_is_the_checkout_folder(monkeypatch):
    root = plotting.Path(helpers.__file__).resolve().parents[1]
    monkeypatch.delenv("BOOK_FIGURES", raising=False)
    monkeypatch.chdir(root / "notebooks")                 # where a notebook's kernel starts
    assert plotting.figures_dir() == root / "figures"


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
    with pytest.raises(ValueError, match="positive"):
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


def test_train_reduces_the_loss():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1])

    losses = train(model, lambda step: (x, y), loss_fn, steps=200, lr=0.05)
    assert len(losses) == 200 and losses[-1] < 0.01 * losses[0]
    with pytest.raises(ValueError, match="steps"):
        train(model, lambda step: (x, y), loss_fn, steps=0)
