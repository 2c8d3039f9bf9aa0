"""Reusable models. Each one a notebook writes out as a listing is its twin here, for another notebook or
the race's worker processes, and the listing's notebook checks that the two compute the same."""

import torch
from torch import nn

from helpers.attention import causal_mask
from helpers.checks import one_of, positive_int, tensor


class AdditiveAttention(nn.Module):
    """Bahdanau's score ``e_ti = w^T tanh(W s + U h_i)``: section 9.1's listing, which checks they are equal.

    ``forward(s (B, d_s), h (B, n, d_h)) -> (context (B, d_h), weights (B, n))``.
    """

    def __init__(self, d_s, d_h, d_a):
        super().__init__()
        self.W, self.U = nn.Linear(d_s, d_a, bias=False), nn.Linear(d_h, d_a)
        self.w = nn.Linear(d_a, 1, bias=False)

    def forward(self, s, h):
        e = self.w(torch.tanh(self.W(s)[:, None] + self.U(h))).squeeze(-1)   # (B, n) scores
        alpha = torch.softmax(e, dim=-1)
        return (alpha[:, :, None] * h).sum(1), alpha


class AttentionSeq2Seq(nn.Module):
    """A GRU encoder-decoder in which every decoder step queries the encoder states (Bahdanau et al.).

    Section 9.1's listing, which checks they are equal (``steps`` and the argument checks are additions).

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


class PreNormBlock(nn.Module):
    """A pre-normalization transformer block with the attention passed in (section 9.4's listing).

    ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; ``mlp`` defaults to GPT-2's ``d -> 4d -> d``
    GELU MLP, ``norm`` to LayerNorm. ``forward(x, context=None, **kw)``: with ``context`` the attention is called as
    ``attn(norm1(x), norm1(context), **kw)``, so the positions of ``x`` query those of ``context`` and
    the block's output is computed at the positions of ``x`` only; without it, ``attn(norm1(x), **kw)``.
    """

    def __init__(self, d, attn, mlp=None, norm=nn.LayerNorm):
        super().__init__()
        d = positive_int(d, "d")
        self.norm1, self.attn, self.norm2 = norm(d), attn, norm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) if mlp is None else mlp

    def forward(self, x, context=None, **kw):
        a = self.norm1(x)
        x = x + (self.attn(a, **kw) if context is None else self.attn(a, self.norm1(context), **kw))
        return x + self.mlp(self.norm2(x))


class Attention(nn.Module):
    """Multi-head attention from the positions of ``x`` to those of ``context`` (section 9.4's listing).

    ``forward(x (B, m, d), context (B, n, d) = x, need_weights=False) -> (B, m, d)``: self-attention
    without ``context``, cross-attention with it; ``causal`` hides position ``j > i`` from query ``i``.
    With ``need_weights`` the weights per head, ``(B, heads, m, n)``, are kept in ``self.weights``.
    """

    def __init__(self, d, heads, causal=False):
        super().__init__()
        d, heads = positive_int(d, "d"), positive_int(heads, "heads")
        if d % heads:
            raise ValueError(f"width d={d} must be divisible by heads={heads}")
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.causal, self.weights = causal, None

    def forward(self, x, context=None, need_weights=False):
        c = x if context is None else context
        mask = causal_mask(x.shape[1], device=x.device) if self.causal else None   # self-attention only
        y, self.weights = self.mha(x, c, c, attn_mask=mask, need_weights=need_weights, average_attn_weights=False)
        return y


class AddingTransformer(nn.Module):
    """One transformer block that reads a sequence through a learned readout token (section 9.4's listing).

    ``x (B, T, features) -> (B,)``: the features are mapped to width ``d``, a learned readout token
    is prepended, learned position embeddings are added (``T + 1`` positions), one block of
    ``heads``-head self-attention and a ``4d`` GELU MLP runs, and the readout token's final state,
    normalized, is mapped to one number. ``forward(x, need_weights=True)`` also returns the readout
    token's attention weights per head, ``(B, heads, T + 1)`` (position 0 is the readout token).
    """

    def __init__(self, features=2, length=100, d=64, heads=4):
        super().__init__()
        features, length = positive_int(features, "features"), positive_int(length, "length")
        self.length = length
        self.embed = nn.Linear(features, d)
        self.readout = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Embedding(length + 1, d)
        self.block = PreNormBlock(d, Attention(d, heads))
        self.norm, self.out = nn.LayerNorm(d), nn.Linear(d, 1)
        # Small learned embeddings, as in GPT-2 and ViT: nn.Embedding's default N(0, 1) positions
        # would swamp the embedded values and markers, and slow the search for the markers.
        nn.init.normal_(self.readout, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, x, need_weights=False):
        if x.dim() != 3 or x.shape[1] != self.length or x.shape[2] != self.embed.in_features:
            raise ValueError(f"x must be (batch, {self.length}, {self.embed.in_features}), got {tuple(x.shape)}")
        h = torch.cat([self.readout.expand(len(x), -1, -1), self.embed(x)], dim=1) + self.pos.weight  # (B, T+1, d)
        # Only the readout token's final state is read: it alone queries the sequence (keys and values
        # come from every position), and the MLP runs on it alone. The same function, a hundred times less work.
        r = self.block(h[:, :1], context=h, need_weights=need_weights)[:, 0]                         # (B, d)
        y = self.out(self.norm(r)).squeeze(-1)
        return (y, self.block.attn.weights[:, :, 0]) if need_weights else y


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
