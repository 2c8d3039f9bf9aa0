import pytest
import torch
from torch import nn

from helpers.models import AddingTransformer, RecurrentRegressor


def size(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_follow_the_formulas():
    f, T, d, h = 2, 100, 64, 64
    embed, readout, pos, norm = f * d + d, d, (T + 1) * d, 2 * d
    attn, mlp, out = 4 * d * d + 4 * d, d * 4 * d + 4 * d + 4 * d * d + d, d + 1
    assert size(AddingTransformer(features=f, length=T, d=d, heads=4)) == embed + readout + pos + 3 * norm + attn + mlp + out
    # A GRU has three gates, a vanilla RNN one; each gate has input and hidden weights and two biases.
    gate = f * h + h * h + 2 * h
    assert size(RecurrentRegressor("gru", features=f, hidden=h)) == 3 * gate + h + 1
    assert size(RecurrentRegressor("rnn", features=f, hidden=h)) == gate + h + 1


def test_adding_transformer_shapes_and_weights():
    torch.manual_seed(0)
    model = AddingTransformer(length=10, d=16, heads=4).eval()
    x = torch.rand(3, 10, 2)
    y, w = model(x, need_weights=True)
    assert y.shape == (3,) and w.shape == (3, 4, 11)
    assert torch.allclose(w.sum(-1), torch.ones(3, 4))
    assert torch.allclose(model(x), y)


def test_adding_transformer_equals_the_full_block_read_at_the_readout_token():
    """Querying with the readout token alone is the full block's output at position 0."""
    torch.manual_seed(0)
    m = AddingTransformer(length=10, d=16, heads=4).eval()
    x = torch.rand(3, 10, 2)
    h = torch.cat([m.readout.expand(3, -1, -1), m.embed(x)], dim=1) + m.pos.weight
    a = m.ln1(h)
    h = h + m.attn(a, a, a, need_weights=False)[0]
    h = h + m.mlp(m.ln2(h))
    assert torch.allclose(m(x), m.out(m.ln(h[:, 0])).squeeze(-1), atol=1e-6)


def test_recurrent_regressor_reads_the_last_state():
    torch.manual_seed(0)
    model = RecurrentRegressor("gru", hidden=8)
    x = torch.rand(5, 7, 2)
    out, _ = model.rnn(x)
    assert torch.allclose(model(x), model.out(out[:, -1]).squeeze(-1))
    assert isinstance(RecurrentRegressor("rnn").rnn, nn.RNN)


def test_models_reject_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        AddingTransformer(d=10, heads=4)
    with pytest.raises(ValueError, match="batch, 100, 2"):
        AddingTransformer()(torch.rand(2, 50, 2))
    with pytest.raises(ValueError, match=r"cell must be one of \['gru', 'rnn'\], got 'lstm'"):
        RecurrentRegressor("lstm")
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        AddingTransformer(heads=0)
    with pytest.raises(ValueError, match="batch, length, 2"):
        RecurrentRegressor()(torch.rand(2, 5, 3))
