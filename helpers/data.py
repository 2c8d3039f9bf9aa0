"""Toy data sets made in code: nothing is downloaded."""

import torch


def reversal_batch(batch, length, generator, digits=10):
    """A batch of digit strings and their reversals: ``(source, target)``, each ``(batch, length)``.

    The true alignment is known: target position ``t`` copies source position ``length - 1 - t``.
    """
    if batch < 1 or length < 1:
        raise ValueError(f"batch and length must be positive, got {batch} and {length}")
    if not 2 <= digits:
        raise ValueError(f"need at least two digits, got {digits}")
    source = torch.randint(digits, (batch, length), generator=generator)
    return source, source.flip(1)
