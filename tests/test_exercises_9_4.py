"""Section 9.4's exercises: 9.4.1 the residual stream, block by block, 9.4.2 what the z-loss does to the
logits, 9.4.3 label smoothing, 9.4.5 a decoder that reverses (9.4.4 is a written answer).

Each checker accepts the notebook's reference solution and rejects the usual mistakes, each with its own
hint (exercises_common.py says how; the shared layout is tested in test_exercises_layout.py).
"""

import re

import torch
from exercises_common import (
    NOTEBOOKS,
    fails_on_every_seed,
    section_tests,
)

from helpers.exercises import EXERCISES, s9_4, verdict
from helpers.models import Attention, PreNormBlock

# Wrong answers and right ones unlike the reference ---------------------------------------------------------------

def _smoothed(z, t, eps, others=False, target_one=False, probs=False):
    V = z.shape[-1]
    one_hot = torch.nn.functional.one_hot(t, V).double()
    if others:
        smooth = (1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)
    else:
        smooth = (1 if target_one else 1 - eps) * one_hot + eps / V
    log_p = torch.softmax(z, -1) if probs else torch.log_softmax(z, -1)
    return -(smooth * log_p).sum(-1).mean()


def _rms(blocks, x, inputs=False, norm=False, std=False, normalized=False, as_list=False, in_place=False):
    out = [x.pow(2).mean().sqrt()] if inputs else []
    for block in blocks:
        if in_place:
            x += block(x) - x
        else:
            x = block(x)
        z = block.norm1(x) if normalized else x
        out.append(z.norm() if norm else z.std() if std else z.pow(2).mean().sqrt())
    return [v.item() for v in out] if as_list else torch.stack(out)


def _rms_float64(blocks, x):
    """Correct, another way: in double precision, from the stream's squared norm."""
    blocks = __import__("copy").deepcopy(blocks).double()
    x, out = x.double(), []
    for block in blocks:
        x = block(x)
        out.append((x.square().sum() / x.numel()).sqrt())
    return torch.stack(out).float()


def _reverser(steps=200, positions=True, causal=True, shift=True, returns="model", d=32, whole_table=False):
    """9.4.5's answers: the reference's decoder (one block of width 32, Adam at 1e-2), or one of its mistakes
    (``whole_table``: T - 1 position embeddings added whole, so that it takes T - 1 tokens and no other length)."""
    def train_reverser(batch, vocab, T):
        parts = torch.nn.ModuleDict(dict(tok=torch.nn.Embedding(vocab, d), pos=torch.nn.Embedding(T - whole_table, d),
                                         block=PreNormBlock(d, Attention(d, heads=2, causal=causal)),
                                         norm=torch.nn.LayerNorm(d), out=torch.nn.Linear(d, vocab)))

        def decoder(idx):
            table = parts["pos"].weight if whole_table else parts["pos"].weight[: idx.shape[1]]
            x = parts["tok"](idx) + (table if positions else 0)
            return parts["out"](parts["norm"](parts["block"](x)))

        opt = torch.optim.Adam(parts.parameters(), lr=1e-2)
        losses = []
        for _ in range(steps):
            x = batch()
            target = x[:, 1:] if shift else x[:, :-1]
            loss = torch.nn.functional.cross_entropy(decoder(x[:, :-1]).flatten(0, 1), target.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"model": decoder, "losses": losses, "pair": lambda idx: (decoder(idx), None),
                "no_grad": torch.no_grad()(decoder)}[returns]
    return train_reverser


def _lookup(batch, vocab, T):
    """Wrong: no model and no training, the reversal hard-coded, causally (position j reads token 2 n - 1 - j)."""
    n = (T - 1) // 2

    def model(idx):
        B, t = idx.shape
        logits = torch.zeros(B, t, vocab)
        for j in range(n, t):
            logits[torch.arange(B), j, idx[:, 2 * n - 1 - j]] = 50.0
        return logits
    return model


def _one_hot_unsized(z, t, eps):
    """Wrong: F.one_hot without num_classes, as wide as the largest target + 1 (right when a target is class V - 1)."""
    q = (1 - eps) * torch.nn.functional.one_hot(t) + eps / z.shape[-1]
    return -(q * torch.log_softmax(z, dim=-1)).sum(-1).mean()


def _kl_plus_entropy(z, t, eps):
    """Correct, another way: KL(q || p) + H(q), with 0 log 0 = 0 (xlogy)."""
    q = (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]).to(z.dtype) + eps / z.shape[-1]
    return (torch.nn.functional.kl_div(z.log_softmax(-1), q, reduction="batchmean")
            - torch.special.xlogy(q, q).sum(-1).mean())


def _finite_differences(z, w):
    """Right, though not derived by hand: central differences in float64."""
    f = lambda z: w * torch.logsumexp(z, -1).pow(2).mean()
    z, h = z.double(), 1e-6
    g = torch.zeros_like(z)
    for i in range(z.numel()):
        e = torch.zeros(z.numel(), dtype=z.dtype)
        e[i] = h
        g.view(-1)[i] = (f(z + e.view_as(z)) - f(z - e.view_as(z))) / (2 * h)
    return g


def _wider(batch, vocab, T, d=64):
    """Correct, another way: two heads of width 32, AdamW with weight decay on the matrices, a generator loop."""
    parts = torch.nn.ModuleDict(dict(tok=torch.nn.Embedding(vocab, d), pos=torch.nn.Embedding(T, d),
                                     block=PreNormBlock(d, Attention(d, heads=2, causal=True)),
                                     norm=torch.nn.LayerNorm(d), out=torch.nn.Linear(d, vocab)))

    def decoder(idx):
        return parts["out"](parts["norm"](parts["block"](parts["tok"](idx) + parts["pos"](torch.arange(idx.shape[1])))))

    matrices = [p for p in parts.parameters() if p.dim() == 2]
    rest = [p for p in parts.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=5e-3)
    for x in (batch() for _ in range(250)):
        loss = torch.nn.functional.cross_entropy(decoder(x[:, :-1]).transpose(1, 2), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return decoder


def _torch_layer(batch, vocab, T, d=32):
    """Correct, another way: PyTorch's own pre-norm layer with a causal mask, positions as one parameter, AdamW."""
    layer = torch.nn.TransformerEncoderLayer(d, 2, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    embed, head, pos = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab), torch.nn.Parameter(torch.randn(T, d))

    def model(idx):
        t = idx.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
        return head(layer(embed(idx) + pos[:t], src_mask=mask, is_causal=True))

    opt = torch.optim.AdamW([*layer.parameters(), *embed.parameters(), *head.parameters(), pos], lr=1e-2)
    for _ in range(300):
        x = batch()
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, vocab), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


# A students' review (9.4.1, 9.4.3): mistakes that got no hint of their own, and right answers unlike the reference.
def _rms_averaged(blocks, x, dims):
    """Wrong: the RMS over ``dims`` (the features of each token, or each sequence's entries), then averaged."""
    out = []
    for block in blocks:
        x = block(x)
        out.append(x.pow(2).mean(dim=dims).sqrt().mean())
    return torch.stack(out)


def _rms_population_std(blocks, x):
    """Wrong: the standard deviation with unbiased=False, not the RMS."""
    out = []
    for block in blocks:
        x = block(x)
        out.append(x.std(unbiased=False))
    return torch.stack(out)


def _rms_linalg(blocks, x):
    """Right: the vector norm over sqrt(numel), in float64, the blocks by index."""
    import math
    out = torch.empty(len(blocks), dtype=torch.float64)
    with torch.no_grad():
        for i in range(len(blocks)):
            x = blocks[i](x)
            out[i] = torch.linalg.vector_norm(x.double()) / math.sqrt(x.numel())
    return out


def _rms_einsum(blocks, x):
    """Right: einsum of the stream with itself, float() of a tensor that requires grad, torch.tensor of floats."""
    values = []
    for block in blocks:
        x = block(x)
        values.append(float(torch.einsum("btd,btd->", x, x) / x.numel()) ** 0.5)
    return torch.tensor(values)


def _rms_hooks(blocks, x):
    """Right: forward hooks on each block record the stream while the whole stack runs."""
    seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o.detach().square().mean().sqrt())) for b in blocks]
    try:
        blocks(x)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(seen)


def _smoothed_mean_all(z, t, eps):
    """Wrong: the mean over all N * V entries, not a sum over the classes and a mean over the rows."""
    q = (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]) + eps / z.shape[-1]
    return -(q * torch.log_softmax(z, -1)).mean()


def _smoothed_logsumexp(z, t, eps):
    """Right: log Z minus the smoothed mean logit."""
    true = z.gather(1, t[:, None]).squeeze(1)
    return (torch.logsumexp(z, -1) - (1 - eps) * true - eps * z.mean(-1)).mean()


def _smoothed_python(z, t, eps):
    """Right: Python loops and math."""
    import math
    N, V = z.shape
    total = 0.0
    for n in range(N):
        row = z[n].tolist()
        top = max(row)
        lse = top + math.log(sum(math.exp(v - top) for v in row))
        for j in range(V):
            total -= ((1 - eps) * (j == int(t[n])) + eps / V) * (row[j] - lse)
    return total / N


def _smoothed_scatter(z, t, eps):
    """Right: the targets scattered, in float32, returned as a NumPy number."""
    z = z.float()
    q = torch.full_like(z, eps / z.shape[-1]).scatter_add(1, t[:, None], torch.full((len(t), 1), 1 - eps))
    return (-(q * z.log_softmax(-1)).sum(-1).mean()).numpy()


# A students' review (9.4.5): a block of nn.MultiheadAttention, trained with its mistakes, and hand-written lookups.
class _Tiny(torch.nn.Module):
    """Token and learned position embeddings, one pre-norm block of nn.MultiheadAttention given ``mask(t)``."""

    def __init__(self, vocab, T, mask, d=32, dropout=0.0):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(T, d)
        self.ln1, self.ln2, self.ln = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.mha = torch.nn.MultiheadAttention(d, 2, batch_first=True, dropout=dropout)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.out = torch.nn.Linear(d, vocab)
        self.mask = mask

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        a = self.ln1(x)
        x = x + self.mha(a, a, a, attn_mask=self.mask(t), need_weights=False)[0]
        x = x + self.mlp(self.ln2(x))
        return self.out(self.ln(x))


def _hidden_after(t):
    """nn.MultiheadAttention's causal mask: True where a key is hidden, the later positions."""
    return torch.ones(t, t, dtype=torch.bool).triu(1)


def _fit_tiny(model, batch, steps=300, shift=1):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        x = batch()
        logits = model(x[:, :-shift])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, shift:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _mask_inverted(batch, vocab, T):
    """Wrong: SDPA's mask, True where a key may be seen, given to nn.MultiheadAttention, where True hides: the last
    position then sees no key and gives NaN (in eval mode), the others read ahead."""
    return _fit_tiny(_Tiny(vocab, T, lambda t: ~_hidden_after(t)), batch)


def _dropout_closure(batch, vocab, T):
    """Wrong: causal and trained with dropout, returned as a function around the module left in train mode."""
    model = _fit_tiny(_Tiny(vocab, T, _hidden_after, dropout=0.1), batch)
    return lambda idx: model(idx)


def _dropout_module(batch, vocab, T):
    """Right: the same, the module itself returned (the check puts it in eval mode)."""
    return _fit_tiny(_Tiny(vocab, T, _hidden_after, dropout=0.1), batch)


def _two_ahead(batch, vocab, T):
    """Wrong: trained against the token two ahead, not the next one."""
    return _fit_tiny(_Tiny(vocab, T, _hidden_after), batch, shift=2)


def _own_decoder(batch, vocab, T):
    """Right: a block of its own with is_causal SDPA, sinusoidal positions (a buffer), AdamW, the loss on the reversed
    half only."""
    d, H, n = 48, 4, (T - 1) // 2

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = torch.nn.Embedding(vocab, d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.n1, self.n2, self.n3 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.ReLU(), torch.nn.Linear(2 * d, d))
            self.head = torch.nn.Linear(d, vocab)
            pos = torch.arange(64)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
            self.register_buffer("pe", torch.stack([pos.sin(), pos.cos()], -1).flatten(1))

        def forward(self, idx):
            B, t = idx.shape
            x = self.tok(idx) + self.pe[:t]
            q, k, v = self.qkv(self.n1(x)).view(B, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, t, d))
            x = x + self.mlp(self.n2(x))
            return self.head(self.n3(x))

    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    for _ in range(300):
        x = batch()
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1])[:, n:].transpose(1, 2), x[:, n + 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _lookup_scaled(batch, vocab, T):
    """Wrong: the reversal hard-coded, its logits multiplied by an nn.Parameter, so that they require a gradient."""
    n = (T - 1) // 2
    scale = torch.nn.Parameter(torch.tensor(30.0))

    def model(idx):
        B, t = idx.shape
        logits = torch.zeros(B, t, vocab)
        for j in range(n, t):
            logits[torch.arange(B), j, idx[:, 2 * n - 1 - j]] = 1.0
        return logits * scale
    return model


def _lookup_scaled_per_token(batch, vocab, T):
    """Wrong: the same with a scale per token, an nn.Module whose parameters are those scales."""
    n = (T - 1) // 2

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.full((vocab,), 30.0) + torch.rand(vocab))

        def forward(self, idx):
            B, t = idx.shape
            logits = torch.zeros(B, t, vocab)
            for j in range(n, t):
                logits[torch.arange(B), j, idx[:, 2 * n - 1 - j]] = 1.0
            return logits * self.scale
    return Lookup()


def _lookup_after_backward(batch, vocab, T):
    """Wrong: the reversal hard-coded, after one meaningless backward() to look trained."""
    w = torch.zeros(1, requires_grad=True)
    (w * 1.0).sum().backward()
    return _lookup(batch, vocab, T)


# Wrong answers: for each exercise, (the mistake, a piece of the hint that must name it).
WRONG = {
    "9.4.2": [
        (lambda z, w: w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0], "factor 2"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1), "divide by N"),
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) / z.numel() + 0 * z, "not 1 / V"),
        (lambda z, w: 2 * w * z * torch.softmax(z, -1) / z.shape[0], "not the logits themselves"),
        (lambda z, w: 2 * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0], "w is missing"),
    ],
    "9.4.3": [
        (lambda z, t, eps: _smoothed(z, t, eps, others=True), "not over the other V - 1"),
        (lambda z, t, eps: _smoothed(z, t, eps, target_one=True), "not 1"),
        (lambda z, t, eps: -_smoothed(z, t, eps), "The sign is flipped"),
        (lambda z, t, eps: _smoothed(z, t, eps, probs=True), "the probabilities themselves"),
        (lambda z, t, eps: _smoothed(z, t, eps) * z.shape[0], "a mean, not a sum"),
        (lambda z, t, eps: torch.nn.functional.cross_entropy(z, t), "the targets are not smoothed"),
    ],
}


# Students at the exercises (REVIEW.md, brief 2): wrong attempts not in WRONG, and right answers unlike the
# reference. Each attempt is (answer, a piece of the message it must get); None marks a right answer.
STUDENTS = {
    "9.4.2": [
        (lambda z, w: (lambda z: torch.autograd.grad(w * torch.logsumexp(z, -1).pow(2).mean(), z)[0])(
            z.detach().requires_grad_()), "with autograd"),                                 # autograd: refused now
        (lambda z, w: (lambda e: 2 * w * e.sum(-1, keepdim=True).log() * e / e.sum(-1, keepdim=True) / len(z))(
            (z - z.amax(-1, keepdim=True)).exp()) + 2 * w * z.amax(-1, keepdim=True) * torch.softmax(z, -1) / len(z), None),
        (lambda z, w: torch.einsum("n,nv->nv", 2 * w * torch.logsumexp(z.float(), -1) / len(z),
                                   z.float().exp() / z.float().exp().sum(-1, keepdim=True)), None),   # einsum, float32
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, 0) / z.shape[0],
         "Your softmax runs over the rows (dim 0)"),                                       # its hint since 2026-12-04
        (lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.numel(),
         "differentiate step by step"),
        (lambda z, w: (2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / z.shape[0]).tolist(),
         "should be a torch.Tensor, got list"),
    ],
    "9.4.3": [
        (lambda z, t, eps: torch.nn.functional.cross_entropy(
            z, (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]).to(z.dtype) + eps / z.shape[-1]), None),  # soft targets
        (lambda z, t, eps: ((1 - eps) * torch.nn.functional.nll_loss(z.float().log_softmax(-1), t)
                            - eps * z.float().log_softmax(-1).mean(-1).mean()).item(), None),        # float32 decomposition
        (lambda z, t, eps: torch.nn.functional.cross_entropy(z, (t + 1) % z.shape[-1], label_smoothing=0.0),
         "eps = 0 first"),                                                          # the wrong classes, unsmoothed
        (lambda z, t, eps: (-(1 - eps) * z.log_softmax(-1).gather(1, t[:, None]).squeeze(1)
                            - eps / z.shape[-1] * z.log_softmax(-1).sum(-1)).sum().item(), "a mean, not a sum"),
        (lambda z, t, eps: f"{torch.nn.functional.cross_entropy(z, t):.4f}", "should be a number, got str"),
        (_one_hot_unsized, "give it num_classes"),
        (_kl_plus_entropy, None),
        (_smoothed_mean_all, "Average over examples, not over every class entry"),
        (_smoothed_logsumexp, None),
        (_smoothed_python, None),
        (_smoothed_scatter, None),
    ],
}


# The exercises added later: each wrong answer is tried on several fresh checks, and RIGHT holds right answers
# written differently from the reference.
NEW_WRONG = {
    "9.4.1": [
        (lambda blocks, x: _rms(blocks, x, inputs=True), "leave out the input"),
        (lambda blocks, x: _rms(blocks, x, norm=True), "not its RMS"),
        (lambda blocks, x: _rms(blocks, x, std=True), "does not subtract the mean"),
        (lambda blocks, x: _rms(blocks, x, normalized=True), "not its normalized copy"),
        (lambda blocks, x: _rms(blocks, x, as_list=True), "return a tensor"),
        (lambda blocks, x: _rms(blocks, x, in_place=True), "changed its input x"),
        (lambda blocks, x: _rms(blocks, x, inputs=True)[:-1], "not before it"),
        (lambda blocks, x: _rms_averaged(blocks, x, -1), "an average of roots"),             # per token
        (lambda blocks, x: _rms_averaged(blocks, x, (1, 2)), "an average of roots"),         # per sequence
        (_rms_population_std, "does not subtract the mean"),
        # a students' review: every block applied to the input, not to the block before it's output
        (lambda blocks, x: torch.stack([b(x).pow(2).mean().sqrt() for b in blocks]), "feed block 2 block 1's output"),
    ],
    "9.4.5": [
        (_reverser(steps=0), "has not learned. Does it train (a loss, backward, an optimizer step, in a loop) for "
                             "enough steps"),                                           # no training
        (_reverser(causal=False), "it reads ahead"),                                    # peeks at the next token
        (_reverser(shift=False), "predicts the token it reads"),                        # targets not shifted
        (_reverser(positions=False), "must know where each token is"),                  # positions left out
        (_reverser(steps=3, returns="losses"), "return the trained model"),             # returns its losses
        (_reverser(steps=3, returns="pair"), "the logits alone"),                       # returns (logits, weights)
        (_reverser(whole_table=True), "must take any length t < T"),                    # T - 1 tokens only
        (_lookup, "Train a model"),                                                     # hard-coded, untrained
        # a students' review: a vocabulary one too small got the raw IndexError alone
        (lambda batch, vocab, T: _reverser(steps=0)(batch, vocab - 1, T), "is the model's vocabulary that large"),
    ],
}


RIGHT = {
    "9.4.1": [_rms_float64, lambda blocks, x: torch.tensor([v for v in _rms(blocks, x, as_list=True)]), _rms_linalg,
              _rms_einsum, _rms_hooks],
    "9.4.5": [_torch_layer, _wider, _reverser(returns="no_grad"), _dropout_module, _own_decoder],
}


# The tests every section runs (exercises_common.py) ---------------------------------------------------------------

globals().update(section_tests("9.4", wrong=WRONG, students=STUDENTS, new_wrong=NEW_WRONG, right=RIGHT))


# This section's own tests -----------------------------------------------------------------------------------------

def test_forbidden_label_smoothing_is_detected():
    """Issue 19: F.cross_entropy(..., label_smoothing=eps) passed 9.4.3, whose statement forbids it."""
    import torch.nn.functional as F
    from torch.nn.functional import cross_entropy as ce

    def functional(z, targets, eps):
        return F.cross_entropy(z, targets, label_smoothing=eps)

    def module(z, targets, eps):
        return torch.nn.CrossEntropyLoss(**{"label_smoothing": eps})(z, targets)   # hidden from a source scan

    def imported(z, targets, eps):
        return ce(z, targets, label_smoothing=eps)

    # Fresh review of the checkers: hidden from the source scan, these reached the function unseen.
    def positional(z, targets, eps):
        return F.cross_entropy(z, targets, None, None, -100, None, "mean", eps)

    def imported_unpacked(z, targets, eps):
        return ce(z, targets, **{"label_smoothing": eps})

    def module_positional(z, targets, eps):
        return torch.nn.CrossEntropyLoss(None, None, -100, None, "mean", eps)(z, targets)

    def builtin(z, targets, eps):
        return torch._C._nn.cross_entropy_loss(z, targets, None, 1, -100, eps)

    def swallowed(z, targets, eps):                      # catches the refusal and answers another way
        try:
            return ce(z, targets, **{"label_smoothing": eps})
        except Exception:
            return ce(z, targets)
    for answer in (functional, module, imported, positional, imported_unpacked, module_positional, builtin, swallowed):
        for seed in range(3):
            ok, message = verdict("9.4.3", answer, seed=seed)
            assert ok is False and "label_smoothing, which the exercise asks you to do without" in message, message

    def soft_targets(z, targets, eps):                   # allowed: F.cross_entropy without its label_smoothing
        q = (1 - eps) * F.one_hot(targets, z.shape[-1]).to(z.dtype) + eps / z.shape[-1]
        return ce(z, q, None, None, -100, None, "mean", 0.0)
    assert all(verdict("9.4.3", soft_targets, seed=seed)[0] for seed in range(5))


def test_9_4_3_half_precision_is_told_it_is_the_dtype():
    """A right formula in float16 or bfloat16 was told its formula was wrong."""
    def smoothed(z, t, eps, dtype):
        q = (1 - eps) * torch.nn.functional.one_hot(t, z.shape[-1]) + eps / z.shape[-1]
        return -(q.to(dtype) * torch.log_softmax(z.to(dtype), -1)).sum(-1).mean()
    for dtype in (torch.float16, torch.bfloat16):
        for answer in (lambda z, t, eps, dtype=dtype: smoothed(z, t, eps, dtype),
                       lambda z, t, eps, dtype=dtype: smoothed(z, t, eps, dtype).item()):
            for seed in range(4):
                ok, message = verdict("9.4.3", answer, seed=seed)
                assert ok is False and str(dtype) in message and "float32 or float64" in message, message
                assert "Targets" not in message, message


def test_new_hints_name_their_mistake():
    """Reviewers' mistakes that got a generic hint: RMS before each block, a flipped sign (and an int32 product: 9.5's
    file)."""
    for seed in range(6):
        ok, message = verdict("9.4.1", lambda blocks, x: _rms(blocks, x, inputs=True)[:-1], seed=seed)
        assert ok is False and "not before it" in message, message
        ok, message = verdict("9.4.2", lambda z, w: -2 * w * torch.logsumexp(z, -1, keepdim=True)
                              * torch.softmax(z, -1) / z.shape[0], seed=seed)
        assert ok is False and "The sign is flipped" in message, message


def test_9_4_2_refuses_autograd_however_it_is_called():
    """Issue 32: 9.4.2 asks for a derivation by hand and accepted z.grad; its message printed the formula."""
    from torch.func import grad as func_grad

    def loss(z, w):
        return w * torch.logsumexp(z, -1).pow(2).mean()

    def backward(z, w):
        z = z.clone().requires_grad_(True)
        loss(z, w).backward()
        return z.grad

    def functional(z, w):
        return func_grad(lambda z: loss(z, w))(z)

    def jacobian(z, w):
        return torch.autograd.functional.jacobian(lambda z: loss(z, w), z)

    def engine(z, w):
        z = torch.nn.Parameter(z.clone())
        torch.autograd.backward(loss(z, w))
        return z.grad

    def swallowed(z, w):                                 # catches the refusal and answers another way
        try:
            return backward(z, w)
        except Exception:
            return 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / len(z)
    for answer in (backward, functional, jacobian, engine, swallowed):
        for seed in range(3):
            ok, message = verdict("9.4.2", answer, seed=seed)
            assert ok is False and "with autograd" in message and "softmax" not in message, message
    ok, message = verdict("9.4.2", lambda z, w: 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, -1) / len(z))
    assert ok and "softmax" not in message and "log Z" not in message, message


def test_hints_and_messages_name_the_mistake_not_the_formula():
    """Issue 32: a hint says what went wrong; it never prints the answer's formula or code."""
    formulas = re.compile(r"softmax\(z\)|log_softmax\(|sqrt\(mean|mean\(x|x = block\(x\)|\(1 - eps\) one-hot|"
                          r"-sum\(target|eps / V for every|2 w log Z")
    wrong = [(n, a) for n in ("9.4.1", "9.4.2", "9.4.3") for a, _ in WRONG.get(n, []) + NEW_WRONG.get(n, [])]
    wrong += [(n, a) for n in ("9.4.2", "9.4.3") for a, hint in STUDENTS[n] if hint]
    for number, answer in wrong:
        ok, message = verdict(number, answer, seed=0)
        assert ok is False and not formulas.search(message), message
    for number in ("9.4.1", "9.4.2", "9.4.3", "9.4.5"):
        assert not formulas.search(EXERCISES[number].done), EXERCISES[number].done


def test_9_4_5_states_the_checks_level_and_its_reference_clears_it_on_every_draw():
    """The open exercise: its text states the level and time limit the check holds; the reference's loss on the
    reversed half stays far below the level on every draw (about 0.003 against 0.1), a broken answer's far above."""
    from helpers.exercises import judge

    text = NOTEBOOKS["9.4"].read_text()
    assert f"must fall below {s9_4.LEVEL} nats per token" in text and s9_4.LEVEL == 0.1
    assert f"({EXERCISES['9.4.5'].time_limit:g} s at most)" in text
    losses = {}
    for name, answer in (("reference", _reverser()), ("positions left out", _reverser(positions=False))):
        losses[name] = []
        for seed in range(4):
            draw = judge.Draw(seed)                                     # the check's own draw, replayed
            n, digits = draw.choice([4, 5, 6]), draw.integer(8, 11)
            vocab, T = digits + 1, 2 * n + 1
            data = torch.Generator().manual_seed(draw.integer(0, 2**31 - 1))
            with torch.random.fork_rng():
                torch.manual_seed(draw.integer(0, 2**31 - 1))
                model = answer(lambda n=n, vocab=vocab, data=data: s9_4.reversal_sequences(32, n, vocab, data), vocab, T)
            x = s9_4.reversal_sequences(256, n, vocab, torch.Generator().manual_seed(draw.integer(0, 2**31 - 1)))
            with torch.no_grad():
                logits = model(x[:, :-1])
            losses[name].append(torch.nn.functional.cross_entropy(logits[:, n:].flatten(0, 1), x[:, n + 1:].flatten()).item())
    assert max(losses["reference"]) < s9_4.LEVEL / 5, losses
    assert min(losses["positions left out"]) > 5 * s9_4.LEVEL, losses


# Students' review 14: answers whose verdict depended on the draw, or that the checks could not tell ----------------

def test_9_4_3_one_hot_without_num_classes_fails_every_check():
    """F.one_hot(targets) without num_classes is right when some target is the last class: it passed about one
    check in seven, and otherwise raised a shape error that named nothing. Case 2's targets now never include the
    last class, and the hint names num_classes, after a wrong value or the error it raised."""
    fails_on_every_seed("9.4.3", _one_hot_unsized, "give it num_classes", seeds=range(40))
    for seed in range(40):
        ok, message = verdict("9.4.3", _kl_plus_entropy, seed=seed)
        assert ok, (seed, message)


def test_9_4_5_a_model_for_one_length_only_fails_every_check():
    """A decoder that adds its whole position table takes T - 1 tokens only: the check ran it at that length alone,
    and the notebook's next cell, which generates from the first n + 1 tokens, then crashed."""
    fails_on_every_seed("9.4.5", _reverser(whole_table=True), "must take any length t < T", seeds=range(5))


def test_9_4_5_a_hard_coded_reversal_fails_every_check_and_trained_models_pass():
    """A lookup that reads each answer from the earlier tokens, with no model and no training, passed every check.
    A model trained and returned under torch.no_grad (its logits need no gradient) still passes."""
    fails_on_every_seed("9.4.5", _lookup, "depend on no parameters", seeds=range(5))
    for seed in range(5):
        ok, message = verdict("9.4.5", _reverser(returns="no_grad"), seed=seed)
        assert ok, (seed, message)


# A students' review: a guard a lookup got past, and messages that blamed the wrong thing ---------------------------

def test_9_4_5_a_lookup_dressed_as_trained_fails_every_check():
    """D4: the hard-coded reversal passed the guard when its logits were multiplied by an nn.Parameter (they then
    require a gradient), or after one meaningless backward(). What a model does must now come from its parameters:
    shuffling the entries of each of them must undo the reversal."""
    for answer in (_lookup_scaled, _lookup_scaled_per_token, _lookup_after_backward):
        fails_on_every_seed("9.4.5", answer, "Train a model", seeds=range(20))


def test_9_4_5_a_mask_that_hides_every_key_of_a_position_is_told_so():
    """D6: SDPA's mask (True where a key may be seen) given to nn.MultiheadAttention (True where hidden) leaves the
    last position no key: NaN there alone, which was blamed on a diverging training."""
    fails_on_every_seed("9.4.5", _mask_inverted, "every key is hidden", seeds=range(5))
    for seed in range(2):
        ok, message = verdict("9.4.5", _mask_inverted, seed=seed)
        assert "diverge" not in message, message


def _mask_inverted_nan_weights(batch, vocab, T):
    """Wrong: the inverted mask trained with a loss over every position: the last one's NaN reached the loss at the first
    step, and every weight is NaN after it (a students' review, 2026-12-04)."""
    model = _mask_inverted(batch, vocab, T)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    return model


def test_9_4_5_a_mask_whose_nan_spread_to_every_weight_is_told_it_may_be_the_mask():
    """NaN logits at every position were blamed on a learning rate alone; the hint now names the hidden row too."""
    fails_on_every_seed("9.4.5", _mask_inverted_nan_weights, "every key is hidden", seeds=range(3))


def test_9_4_5_dropout_left_active_is_told_so():
    """D7: a causal model returned inside a function, its dropout active, was told that it reads ahead."""
    fails_on_every_seed("9.4.5", _dropout_closure, "dropout or another random layer is active", seeds=range(5))
    for seed in range(2):
        ok, message = verdict("9.4.5", _dropout_closure, seed=seed)
        assert "reads ahead" not in message, message


def test_9_4_5_targets_two_ahead_are_told_so():
    """D8: trained against the token two ahead, a model's loss is far above a uniform guess's; it was told that it
    had not learned."""
    fails_on_every_seed("9.4.5", _two_ahead, "shifted by one", seeds=range(5))
    for seed in range(2):
        ok, message = verdict("9.4.5", _two_ahead, seed=seed)
        assert "has not learned" not in message, message


def test_9_4_2_says_what_it_checked_not_how_the_gradient_was_found():
    """Finite differences in float64 are right, and the check cannot tell them from a derivation: the message said
    "derived by hand"."""
    for seed in range(3):
        ok, message = verdict("9.4.2", _finite_differences, seed=seed)
        assert ok and "by hand" not in message and "without autograd" in message, message


def test_9_4_1_solution_says_how_the_part_the_blocks_add_grows():
    """Review fix94b: the solution said the stream grew more slowly than sqrt(L), as the input's RMS of 1 hid the growth,
    and so marked wrong a student who predicted sqrt(L) for the part the blocks add. That part grows about like sqrt(L),
    a little faster deeper: 0.38, 0.77, 1.79, 4.25 after 2, 8, 32, 128 blocks (the notebook's fresh_stack, whose blocks
    the notebook checks are helpers.models'), ratios 2.06, 2.32, 2.37 per fourfold depth, where sqrt(4) = 2."""
    from helpers import seed

    def added(L, d=32):
        g = seed(0)
        blocks = torch.nn.Sequential(*(PreNormBlock(d, Attention(d, heads=4)) for _ in range(L)))
        x = torch.randn(16, 8, d, generator=g)
        with torch.no_grad():
            return (blocks(x) - x).pow(2).mean().sqrt().item()

    rms = [added(L) for L in (2, 8, 32, 128)]
    ratios = [b / a for a, b in zip(rms, rms[1:], strict=False)]
    assert all(1.8 < r < 2.6 for r in ratios), ratios            # about sqrt(4) = 2 per fourfold depth, far from 4
    assert ratios[-1] > ratios[0] and 2.3 < ratios[-1] < 2.45, ratios      # "a little more ... (2.4 times ...)"
    text = " ".join(NOTEBOOKS["9.4"].read_text().split())
    assert "about twice as large for each fourfold depth, as growth like $\\sqrt L$ would make it" in text
    assert "stream grows with the depth, about like $\\sqrt L$, as Exercise 9.4.1 measured" in text     # 9.4.4 agrees


def _language_model(lr, steps):
    """9.4.5 answered with the section's LanguageModel (nanoGPT's initialization, a tied output layer) and Adam."""
    from helpers.models import LanguageModel

    def train_reverser(batch, vocab, T):
        lm = LanguageModel(vocab, T, 32, heads=2, layers=1)
        opt = torch.optim.Adam(lm.parameters(), lr=lr)
        for _ in range(steps):
            x = batch()
            loss = torch.nn.functional.cross_entropy(lm(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return lm
    return train_reverser


def test_9_4_5_language_model_reaches_the_level_at_the_stated_rate_not_at_the_references():
    """Review fix94b: the solution blamed LanguageModel's initialization and tying for missing the level, untested (the
    model differs from the reference in its initialization, tying and output bias at once). What the exercise and
    solution now say is what this measures: with Adam at 3e-3 for 400 steps it passes the check on every draw tried
    (observed on 24 draws, one thread: 0.006 to 0.013 against the level 0.1); at the reference's 1e-2 it misses the
    level on some draws, at 200 steps (5 of 24; draw 0: 1.41) and at 400 (3 of 24: draws 0, 19, 20)."""
    text = " ".join(NOTEBOOKS["9.4"].read_text().split())
    assert ("The section's `LanguageModel` can serve, trained with Adam at a learning rate of $3\\times10^{-3}$ for 400 "
            "steps; at $10^{-2}$ it misses the level on some draws.") in text
    assert "at this solution's $10^{-2}$ it misses the level on some of the check's draws, even with twice the steps" in text
    for seed in range(8):
        ok, message = verdict("9.4.5", _language_model(3e-3, 400), seed=seed)
        assert ok, message
    for steps, seeds in ((200, range(6)), (400, (0, 19, 20))):
        results = [verdict("9.4.5", _language_model(1e-2, steps), seed=seed) for seed in seeds]
        assert any(ok is False and "above the level" in message for ok, message in results), (steps, results)


def test_softmax_over_the_rows_and_a_missing_factor_are_told_so():
    """A students' review (2026-12-04): the softmax over dim 0 (9.4.2 and 9.4.3) and 9.4.2's gradient without the
    softmax factor got 'No usual mistake fits'."""
    def rows(z, w):
        return 2 * w * torch.logsumexp(z, -1, keepdim=True) * torch.softmax(z, 0) / z.shape[0]

    def flat(z, w):
        return (2 * w * torch.logsumexp(z, -1, keepdim=True) / z.shape[0]).expand_as(z).clone()

    def smoothed_rows(z, t, eps):
        V = z.shape[-1]
        target = (1 - eps) * torch.nn.functional.one_hot(t, V).to(z.dtype) + eps / V
        return (-target * torch.log_softmax(z, 0)).sum(-1).mean()
    fails_on_every_seed("9.4.2", rows, "Your softmax runs over the rows (dim 0)", seeds=range(10))
    fails_on_every_seed("9.4.2", flat, "leaves out how log Z changes with each logit", seeds=range(10))
    fails_on_every_seed("9.4.3", smoothed_rows, "Your softmax runs over the rows (dim 0)", seeds=range(10))
