"""Reusable models. Each one a notebook writes out as a listing is its twin here, for another notebook or
the race's worker processes, and the listing's notebook checks that the two compute the same."""

import contextlib
import hashlib
import math
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from helpers.attention import causal_mask
from helpers.checks import finite_float, flag, non_negative_int, one_of, positive_float, positive_int, tensor
from helpers.progress import progress


class AdditiveAttention(nn.Module):
    """Bahdanau's score with a bias, ``e_ti = w^T tanh(W s + U h_i + b)`` (his equation has no ``b``): section
    9.1's listing, which checks they are equal.

    ``forward(s (B, d_s), h (B, n, d_h)) -> (context (B, d_h), weights (B, n))``.
    """

    def __init__(self, d_s, d_h, d_a):
        super().__init__()
        d_s, d_h, d_a = positive_int(d_s, "d_s"), positive_int(d_h, "d_h"), positive_int(d_a, "d_a")
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

    ``forward(x (B, m, d), context (B, n, d) = x, record=None) -> (B, m, d)``: self-attention
    without ``context``, cross-attention with it. ``causal`` hides the future: the ``m`` queries are
    the last ``m`` of the ``n`` positions (bottom-right alignment), so query ``i`` sees keys
    ``0 .. n - m + i``; with ``context = x`` that is the usual causal mask, and the last position alone,
    ``x[:, -1:]`` against the whole sequence, sees every key. ``record``, a list the caller owns, receives
    the weights per head, ``(B, heads, m, n)``; without it none are computed (PyTorch's fast path).
    """

    def __init__(self, d, heads, causal=False):
        super().__init__()
        d, heads = positive_int(d, "d"), positive_int(heads, "heads")
        if d % heads:
            raise ValueError(f"width d={d} must be divisible by heads={heads}")
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.causal = flag(causal, "causal")

    def forward(self, x, context=None, record=None):
        c = x if context is None else context
        for name, t in (("x", x), ("context", c)):
            if tensor(t, name).dim() != 3 or t.shape[1] == 0:
                # nn.MultiheadAttention would read a 2-D x as unbatched (tokens, d), and build the mask wrong
                raise ValueError(f"{name} must be (batch, tokens, d) with at least one token, got shape {tuple(t.shape)}")
        m, n = x.shape[1], c.shape[1]
        if self.causal and m > n:
            raise ValueError(f"causal attention needs at most as many queries as keys, got {m} queries and {n} keys")
        mask = causal_mask(n, device=x.device)[n - m:] if self.causal else None     # the last m rows
        y, w = self.mha(x, c, c, attn_mask=mask, need_weights=record is not None, average_attn_weights=False)
        if record is not None:
            record.append(w)
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
        flag(need_weights, "need_weights")
        if x.dim() != 3 or x.shape[1] != self.length or x.shape[2] != self.embed.in_features:
            raise ValueError(f"x must be (batch, {self.length}, {self.embed.in_features}), got {tuple(x.shape)}")
        h = torch.cat([self.readout.expand(len(x), -1, -1), self.embed(x)], dim=1) + self.pos.weight  # (B, T+1, d)
        # Only the readout token's final state is read: it alone queries the sequence (keys and values
        # are still projected at every position), and the MLP runs on it alone: the same function as the
        # full block at that position, with several times fewer operations (section 9.4 counts them).
        record = [] if need_weights else None
        r = self.block(h[:, :1], context=h, record=record)[:, 0]                                      # (B, d)
        y = self.out(self.norm(r)).squeeze(-1)
        return (y, record[0][:, :, 0]) if need_weights else y


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


class LogitAttention(nn.Module):
    """Causal self-attention with its logits written out, optional QK-norm (section 9.4's listing).

    ``forward(x (B, T, d), record=None, cache=None) -> (B, T, d)``; ``record``, a list the caller owns,
    receives the largest absolute attention logit (a float), over every query-key pair of every head, the
    pairs the causal mask hides included (their logits come from the same queries and keys). With
    ``qk_norm`` each head's queries and keys pass a LayerNorm before their dot product. ``cache`` is
    section 9.5's addition, not in 9.4's listing: a dict the caller owns, empty at the start, that keeps
    the keys and values of the tokens seen so far; the new tokens come after them and attend to them as
    well as to each other, causally.
    """

    def __init__(self, d, heads, qk_norm=False):
        super().__init__()
        d, heads = positive_int(d, "d"), positive_int(heads, "heads")
        if d % heads:
            raise ValueError(f"width d={d} must be divisible by heads={heads}")
        self.heads, d_k = heads, d // heads
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.q_norm = nn.LayerNorm(d_k) if flag(qk_norm, "qk_norm") else nn.Identity()
        self.k_norm = nn.LayerNorm(d_k) if qk_norm else nn.Identity()

    def forward(self, x, record=None, cache=None):
        if tensor(x, "x").dim() != 3 or x.shape[1] == 0:
            raise ValueError(f"x must be (batch, T, d) with T >= 1, got shape {tuple(x.shape)}")
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)   # (B, H, T, d_k)
        q, k = self.q_norm(q), self.k_norm(k)
        if cache is not None and not isinstance(cache, dict):
            raise TypeError(f"cache must be a dict (empty at the start), got {type(cache).__name__}")
        if cache:
            k, v = torch.cat([cache["k"], k], dim=-2), torch.cat([cache["v"], v], dim=-2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        n = k.shape[-2]                                                                           # past + T keys
        s = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)                                  # (B, H, T, n)
        if record is not None:
            record.append(s.detach().abs().max().item())
        w = s.masked_fill(causal_mask(n, device=x.device)[n - T:], float("-inf")).softmax(-1)   # the last T rows
        return self.out((w @ v).transpose(1, 2).reshape(B, T, d))


def init_gpt2(model, layers):
    """GPT-2's initialization (section 9.4's listing): every weight matrix and embedding normal with mean 0 and
    standard deviation 0.02, biases 0, and the projections that write into the residual stream (parameters named
    ``out.weight``, ``out_proj.weight`` or ``mlp.2.weight``) with standard deviation 0.02 / sqrt(2 layers); norms
    keep their gains of 1."""
    layers = positive_int(layers, "layers")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                residual = name.endswith(("out.weight", "out_proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if residual else 0.02)


class LanguageModel(nn.Module):
    """A decoder-only language model initialized as GPT-2 and nanoGPT are (section 9.4's listing).

    ``forward(idx (B, T) token ids, caches=None, **kw) -> (B, T, vocab)`` next-token logits; ``kw`` (e.g.
    ``record``) reaches every block's attention. ``caches`` (section 9.5's addition, with ``LogitAttention``
    only) is one dict per block, empty at the start: ``idx`` then continues the tokens already cached, at the
    positions after them. Token and learned position embeddings, ``layers`` ``PreNormBlock``s
    with ``attention()`` (default: causal ``Attention(d, heads)``), a final LayerNorm, and an output layer
    tied to the token embedding. Every weight matrix and embedding starts normal with standard deviation 0.02,
    biases at 0, and the two projections that write into the residual stream in each block (the attention's output
    layer, named ``out`` or ``out_proj``, and the MLP's second layer) with standard deviation 0.02 / sqrt(2 layers).
    """

    def __init__(self, vocab, T, d, heads, layers, attention=None):
        super().__init__()
        vocab, T, layers = positive_int(vocab, "vocab"), positive_int(T, "T"), positive_int(layers, "layers")
        attention = attention or (lambda: Attention(d, heads, causal=True))
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(PreNormBlock(d, attention()) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight                        # weight tying
        init_gpt2(self, layers)

    def forward(self, idx, caches=None, **kw):
        past = 0
        if caches is not None:
            if not isinstance(caches, (list, tuple)) or len(caches) != len(self.blocks):
                raise ValueError(f"caches must be a list of {len(self.blocks)} dicts, one per block")
            if not all(isinstance(b.attn, LogitAttention) for b in self.blocks):
                raise TypeError("caches need LogitAttention in every block (it keeps a key-value cache)")
            if not all(isinstance(c, dict) for c in caches):
                raise TypeError(f"each cache must be a dict (empty at the start), got {[type(c).__name__ for c in caches]}")
            if len({id(c) for c in caches}) < len(caches):
                # [{}] * layers is one dict: every block would append its keys to the same cache.
                raise ValueError(f"caches must be {len(self.blocks)} distinct dicts, one per block "
                                 f"([{{}} for _ in model.blocks]), not one dict repeated")
            held = [c["k"].shape[-2] if c else 0 for c in caches]
            if len(set(held)) > 1:
                raise ValueError(f"the caches hold different numbers of tokens, {held}: start again from empty dicts")
            past = held[0]                                                       # tokens already cached
        if tensor(idx, "idx").dim() != 2 or idx.shape[1] == 0 or past + idx.shape[1] > self.pos.num_embeddings:
            raise ValueError(f"idx must be (batch, T) with 1 <= T <= {self.pos.num_embeddings - past} "
                             f"({past} tokens cached), got {tuple(idx.shape)}")
        x = self.tok(idx) + self.pos.weight[past: past + idx.shape[1]]
        for i, block in enumerate(self.blocks):
            x = block(x, **kw) if caches is None else block(x, cache=caches[i], **kw)
        return self.head(self.norm(x))


def decay_groups(model, weight_decay=0.1):
    """AdamW's two parameter groups: weight decay on the weight matrices; none on biases, norms, embeddings."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def warmup_cosine(step, warmup, total, floor=0.1):
    """Learning-rate factor: linear warmup to 1, then cosine decay to ``floor`` (a fraction of the peak, 0 to 1)
    at ``total`` steps."""
    step, warmup = non_negative_int(step, "step"), non_negative_int(warmup, "warmup")
    total = non_negative_int(total, "total")
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 <= floor <= 1:
        raise ValueError(f"floor must be a fraction of the peak learning rate, 0 to 1, got {floor!r}")
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup)) if total > warmup else 1.0   # no room to decay: the floor
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def repeat_batch(g, batch=32, half=16, vocab=32):
    """``(batch, 2 half)`` token ids: ``half`` random tokens, then the same tokens again."""
    batch, half, vocab = positive_int(batch, "batch"), positive_int(half, "half"), positive_int(vocab, "vocab")
    first = torch.randint(vocab, (batch, half), generator=g)
    return torch.cat([first, first], dim=1)


def train_lm(lm, lr, steps=200, vocab=32, weight_decay=0.1, warmup=20):
    """Section 9.4's recipe on the repeat task: AdamW with decay groups, warmup then cosine, clipping at 1.

    Returns per step ``(loss on the predictable second half, largest attention logit or None)``: the
    logit is recorded only by ``LogitAttention`` (``Attention`` records weights, and then it is None). A
    loss that is not finite stops training (``FloatingPointError``) before it reaches the weights.
    """
    lr, steps, warmup = positive_float(lr, "lr"), positive_int(steps, "steps"), non_negative_int(warmup, "warmup")
    vocab, weight_decay = positive_int(vocab, "vocab"), finite_float(weight_decay, "weight_decay")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(decay_groups(lm, weight_decay), lr=lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warmup, steps))
    history = []
    for _ in progress(range(steps), desc="training"):            # a bar while it runs (helpers.progress)
        x = repeat_batch(g, vocab=vocab)
        largest = []
        logits = lm(x[:, :-1], record=largest)                    # (B, 31, vocab): predicts tokens 1 .. 31
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"the loss is {loss.item()} at step {len(history)}; the weights are those before it")
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        schedule.step()
        second = F.cross_entropy(logits[:, 15:].flatten(0, 1), x[:, 16:].flatten()).item()
        logits_seen = [v for v in largest if isinstance(v, float)]   # LogitAttention's floats, not weights
        history.append((second, max(logits_seen, default=None)))
    return history


def copy_lm():
    """Section 9.4's language model, built and trained as there: ``(model in eval mode, history)``.

    Two blocks of width 64 with 4 heads (``LogitAttention`` without QK-norm), vocabulary 32, context 32,
    trained by ``train_lm`` for 200 steps at a peak learning rate of 1e-2 on ``repeat_batch`` sequences:
    given 16 tokens, it continues by repeating them. Training takes a few seconds, so the weights that 9.4
    trained, or an earlier call, are kept by ``keep_copy_lm`` in the user's cache folder and loaded from
    there; a kept file made by other code (another version of this module or of torch) is not used.
    """
    torch.manual_seed(0)
    lm = LanguageModel(32, 32, 64, heads=4, layers=2, attention=lambda: LogitAttention(64, 4))
    try:
        kept = torch.load(_kept_path(), weights_only=True)
        lm.load_state_dict(kept["model"])
        history = [tuple(h) for h in kept["history"]]
    except Exception:                      # absent, unreadable or from other code: train it again and keep it
        history = train_lm(lm, lr=1e-2)
        keep_copy_lm(lm, history)
    return lm.eval(), history


def keep_copy_lm(lm, history):
    """Keep section 9.4's trained model for ``copy_lm``: written whole, or (when the disk refuses) not at all."""
    path = _kept_path()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": lm.state_dict(), "history": [list(h) for h in history]}, tmp)
        os.replace(tmp, path)
    except OSError:                       # a read-only or full disk: copy_lm trains again next time, no more
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _kept_path():
    """The kept model's file, named by a digest of this module's source and torch's version."""
    key = hashlib.sha256(Path(__file__).read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(home) / "attention-book" / f"copy-lm-{key}.pt"
