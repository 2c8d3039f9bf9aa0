import pytest
import torch

from helpers.data import adding_problem_batch


def test_adding_problem_batch_shapes_and_target():
    x, y = adding_problem_batch(32, 100, torch.Generator().manual_seed(0))
    assert x.shape == (32, 100, 2) and y.shape == (32,)
    markers = x[..., 1]
    assert torch.equal(markers.sum(1), torch.full((32,), 2.0))
    assert (markers[:, :50].sum(1) == 1).all() and (markers[:, 50:].sum(1) == 1).all()   # one per half
    assert torch.allclose((x[..., 0] * markers).sum(1), y)
    assert ((x[..., 0] >= 0) & (x[..., 0] < 1)).all()


def test_adding_problem_batch_is_reproducible_and_has_the_plateau_at_one_sixth():
    a = adding_problem_batch(4, 10, torch.Generator().manual_seed(1))
    b = adding_problem_batch(4, 10, torch.Generator().manual_seed(1))
    assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    _, y = adding_problem_batch(20000, 10, torch.Generator().manual_seed(2))
    assert abs(((y - 1) ** 2).mean().item() - 1 / 6) < 0.01      # predicting the mean costs 1/6


@pytest.mark.parametrize(
    ("batch", "length", "message"),
    [(0, 10, "batch must be a positive int"), (4, 1, "even"), (4, 7, "even"), (4, 10.0, "length must be a positive int")],
)
def test_adding_problem_batch_rejects_bad_sizes(batch, length, message):
    with pytest.raises(ValueError, match=message):
        adding_problem_batch(batch, length, torch.Generator())


def test_generators_must_be_torch_generators():
    from helpers.data import reversal_batch

    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        adding_problem_batch(4, 10, 0)                 # an obscure "rand() received an invalid combination"
    with pytest.raises(ValueError, match="generator must be a torch.Generator or None, got int"):
        reversal_batch(4, 10, 0)
    assert adding_problem_batch(4, 10, None)[0].shape == (4, 10, 2)    # None: the global generator
