"""Toy data sets made in code: nothing is downloaded."""

import torch

from helpers.checks import positive_int


def _generator(generator):
    """A ``torch.Generator``, or None for PyTorch's global one (an int seed is refused, not used)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}:"
                         " pass torch.Generator().manual_seed(seed)")
    return generator


def reversal_batch(batch, length, generator, digits=10):
    """A batch of digit strings and their reversals: ``(source, target)``, each ``(batch, length)``.

    The true alignment is known: target position ``t`` copies source position ``length - 1 - t``.
    """
    batch, length, digits = positive_int(batch, "batch"), positive_int(length, "length"), positive_int(digits, "digits")
    generator = _generator(generator)
    if digits < 2:
        raise ValueError(f"need at least two digits, got {digits}")
    source = torch.randint(digits, (batch, length), generator=generator)
    return source, source.flip(1)


def adding_problem_batch(batch, length, generator):
    """The adding problem: ``(x, y)`` with ``x (batch, length, 2)`` and ``y (batch,)``.

    Feature 0 holds values drawn from U(0, 1); feature 1 marks exactly two positions, one in each
    half of the sequence. The target is the sum of the two marked values, so a model that always
    predicts the mean, 1, has a mean squared error of Var(u1 + u2) = 1/6.
    """
    batch, length = positive_int(batch, "batch"), positive_int(length, "length")
    generator = _generator(generator)
    if length < 2 or length % 2:
        raise ValueError(f"length must be a positive even number (one marker per half), got {length}")
    values = torch.rand(batch, length, generator=generator)
    half = length // 2
    first = torch.randint(half, (batch,), generator=generator)
    second = half + torch.randint(half, (batch,), generator=generator)
    markers = torch.zeros(batch, length)
    rows = torch.arange(batch)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    y = values[rows, first] + values[rows, second]
    return torch.stack([values, markers], dim=-1), y
