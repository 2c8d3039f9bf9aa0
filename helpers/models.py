"""Reusable models. The attention mechanisms they use are written out in the notebooks."""

import torch
from torch import nn

from helpers.checks import one_of, positive_int, tensor


class AttentionSeq2Seq(nn.Module):
    """A GRU encoder-decoder in which every decoder step queries the encoder states (Bahdanau et al.).

    ``attention(s, h) -> (context (B, d), weights (B, n))`` scores the decoder state ``s (B, d)``
    against the encoder states ``h (B, n, d)``. Token ``vocab`` is the start symbol.
    """

    def __init__(self, vocab, d, attention):
        super().__init__()
        vocab, d = positive_int(vocab, "vocab"), positive_int(d, "d")
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
        its own greedy prediction, for ``steps`` steps (default: the source's length).
        """
        if tensor(source, "source").dim() != 2:
            raise ValueError(f"source must be (batch, length), got shape {tuple(source.shape)}")
        if target is not None:
            if tensor(target, "target").dim() != 2 or steps not in (None, target.shape[1]):
                raise ValueError(f"target must be (batch, steps), got shape {tuple(target.shape)} and steps={steps!r}")
            steps = target.shape[1]
        steps = source.shape[1] if steps is None else positive_int(steps, "steps")
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


class AddingTransformer(nn.Module):
    """One pre-normalization transformer block that reads a sequence through a learned readout token.

    ``x (B, T, features) -> (B,)``: the features are mapped to width ``d``, a learned readout token
    is prepended, learned position embeddings are added (``T + 1`` positions), one block of
    ``heads``-head self-attention and a ``4d`` GELU MLP runs, and the readout token's final state,
    normalized, is mapped to one number. ``forward(x, need_weights=True)`` also returns the readout
    token's attention weights per head, ``(B, heads, T + 1)`` (position 0 is the readout token).
    """

    def __init__(self, features=2, length=100, d=64, heads=4):
        super().__init__()
        features, length = positive_int(features, "features"), positive_int(length, "length")
        d, heads = positive_int(d, "d"), positive_int(heads, "heads")
        if d % heads:
            raise ValueError(f"width d={d} must be divisible by heads={heads}")
        self.length = length
        self.embed = nn.Linear(features, d)
        self.readout = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Embedding(length + 1, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, 1)
        # Small learned embeddings, as in GPT-2 and ViT: nn.Embedding's default N(0, 1) positions
        # would swamp the embedded values and markers, and slow the search for the markers.
        nn.init.normal_(self.readout, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, x, need_weights=False):
        if x.dim() != 3 or x.shape[1] != self.length or x.shape[2] != self.embed.in_features:
            raise ValueError(f"x must be (batch, {self.length}, {self.embed.in_features}), got {tuple(x.shape)}")
        h = torch.cat([self.readout.expand(len(x), -1, -1), self.embed(x)], dim=1)   # (B, T+1, d)
        h = h + self.pos.weight
        a = self.ln1(h)
        # Only the readout token's final state is read, and the block is position-wise after the
        # attention, so the readout token alone queries (keys and values come from every position)
        # and the MLP runs on it alone: the same function, a hundred times less work.
        r, w = self.attn(a[:, :1], a, a, need_weights=need_weights, average_attn_weights=False)
        r = h[:, 0] + r[:, 0]                                                          # (B, d)
        r = r + self.mlp(self.ln2(r))
        y = self.out(self.ln(r)).squeeze(-1)                                           # (B,)
        return (y, w[:, :, 0]) if need_weights else y


class RecurrentRegressor(nn.Module):
    """A GRU or vanilla (tanh) RNN whose last hidden state is mapped linearly to one number.

    ``x (B, T, features) -> (B,)``. ``cell`` is ``"gru"`` or ``"rnn"``.
    """

    def __init__(self, cell="gru", features=2, hidden=64):
        super().__init__()
        kinds = {"gru": nn.GRU, "rnn": nn.RNN}
        one_of(cell, "cell", sorted(kinds))
        self.rnn = kinds[cell](positive_int(features, "features"), positive_int(hidden, "hidden"), batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        if x.dim() != 3 or x.shape[2] != self.rnn.input_size:
            raise ValueError(f"x must be (batch, length, {self.rnn.input_size}), got {tuple(x.shape)}")
        _, h = self.rnn(x)                                        # h: (1, B, hidden), the last state
        return self.out(h[-1]).squeeze(-1)
