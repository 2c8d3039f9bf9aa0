"""Reusable models. The attention mechanisms they use are written out in the notebooks."""

import torch
from torch import nn


class AttentionSeq2Seq(nn.Module):
    """A GRU encoder-decoder in which every decoder step queries the encoder states (Bahdanau et al.).

    ``attention(s, h) -> (context (B, d), weights (B, n))`` scores the decoder state ``s (B, d)``
    against the encoder states ``h (B, n, d)``. Token ``vocab`` is the start symbol.
    """

    def __init__(self, vocab, d, attention):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab + 1, d)
        self.encoder = nn.GRU(d, d, batch_first=True)
        self.init = nn.Linear(d, d)
        self.attention = attention
        self.cell = nn.GRUCell(d + d, d)                 # input: previous token and context
        self.out = nn.Linear(d + d, vocab)

    def forward(self, source, target=None, steps=None):
        """Logits ``(B, steps, vocab)`` and attention weights ``(B, steps, n)``.

        With ``target`` the decoder is fed the true previous token (teacher forcing); without it,
        its own greedy prediction.
        """
        if source.dim() != 2:
            raise ValueError(f"source must be (batch, length), got shape {tuple(source.shape)}")
        steps = target.shape[1] if target is not None else (steps or source.shape[1])
        h, _ = self.encoder(self.embed(source))                # (B, n, d)
        s = torch.tanh(self.init(h.mean(1)))                   # (B, d)
        prev = torch.full_like(source[:, 0], self.vocab)       # start symbol
        logits, weights = [], []
        for t in range(steps):
            c, a = self.attention(s, h)
            s = self.cell(torch.cat([self.embed(prev), c], -1), s)
            logit = self.out(torch.cat([s, c], -1))
            logits.append(logit)
            weights.append(a)
            prev = target[:, t] if target is not None else logit.argmax(-1)
        return torch.stack(logits, 1), torch.stack(weights, 1)
