"""Section 9.1's checkers, in exercise order: 9.1.1 attention for many queries at once, 9.1.2 the bandwidth
implied by a query's norm, 9.1.3 which copy of the digit the decoder reads."""

import math

import torch

from helpers.exercises.judge import (
    Watch,
    Wrong,
    as_number,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    on_batches,
    pair,
    pick,
)

# 9.1.1: attention for many queries at once ------------------------------------------------------------------

def _sdpa(Q, K, V, scale, dim=-1):
    w = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)
    return w @ V, w


@exercise("9.1.1", "Your weights sum to one over the keys and your outputs are softmax(QK^T / sqrt(d_k)) V, "
                   "with and without leading batch dimensions.")
def _(answer):
    r = fresh()

    def describe(m, n, d, d_v, lead):
        batch = f"a batch of {' x '.join(map(str, lead))}, " if lead else ""
        return f"{batch}{m} quer{'y' if m == 1 else 'ies'}, {n} keys, d_k = {d}, d_v = {d_v}"
    # Leading batch dimensions in every check: one of them (case 3), and two in the first hidden case, so that an
    # answer that handles one batch dimension and not two (torch.bmm) fails every check, not one in three.
    hidden = [(r.integer(2, 6), r.integer(2, 9), r.choice([8, 12, 20, 24, 48]), r.integer(1, 6),
               r.choice([(2, 2), (3, 2), (2, 3)] if k == 0 else [(), (3,), (2, 2)])) for k in range(3)]
    name = getattr(answer, "__name__", "your function")
    for case, (m, n, d, d_v, lead) in cases([(3, 5, 16, 2, ()), (1, 7, 64, 3, ()), (4, 6, 32, 5, (2,))], hidden, describe):
        def run(Q, K, V, case=case, d=d, d_v=d_v):
            want_out, want_w = _sdpa(Q, K, V, d ** -0.5)
            mistakes = [
                (_sdpa(Q, K, V, 1.0)[1], "Your weights are softmax(QK^T) without the scale: divide the scores by sqrt(d_k)."),
                (_sdpa(Q, K, V, 1 / d)[1], "You divided the scores by d_k: the scale is 1/sqrt(d_k)."),
                (_sdpa(Q, K, V, d_v ** -0.5)[1], "Scale by sqrt(d_k), the width of the queries and keys, not of the values."),
                (_sdpa(Q, K, V, d ** -0.5, dim=-2)[1],
                 "Your weights sum to one over the queries: take the softmax over the keys (dim=-1)."),
                (want_w.transpose(-2, -1), "Your weights are transposed: row i should hold query i's weights over the keys."),
            ]
            out, w = pair(call(answer, Q, K, V, case=case), case, ("outputs", "weights"))
            if isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor) and out.shape == want_w.shape \
                    and w.shape == want_out.shape and want_w.shape != want_out.shape:
                raise Wrong(f"{case}: your first result has the weights' shape and the second the outputs': "
                            "return (outputs, weights), in that order.")
            compare(w, want_w, case, what="weights", mistakes=mistakes,
                    hint="Scores are Q K^T / sqrt(d_k), one row per query.")
            compare(out, want_out, case, what="outputs", hint="Your weights are right: the outputs are weights @ V.")
        # An answer that fails on a batch but is right on its first matrix works on 2-D inputs only: say so.
        on_batches(run, r.randn(*lead, m, d), r.randn(*lead, n, d), r.randn(*lead, n, d_v), case=case, name=name)


# 9.1.2: the bandwidth implied by a query's norm -------------------------------------------------------------

def _kernel_weights(u, k, rho, h):
    """Nadaraya-Watson weights at the point rho u (u (d,) of norm 1) over keys k (n, d), Gaussian kernel of bandwidth h.

    exp(-|rho u - k_i|^2 / 2h^2), normalized: a softmax of its logarithm, since the kernel itself underflows to 0
    for every key once |rho u - k|^2 / 2h^2 passes about 745.
    """
    return torch.softmax(-((rho * u - k) ** 2).sum(-1) / (2 * h ** 2), dim=0)


@exercise("9.1.2", "Your bandwidth makes the Nadaraya-Watson weights equal to softmax(q . k) for every query norm "
                   "and key norm tried: h = sqrt(rho / r).")
def _(answer):
    r_ = fresh()
    hidden = [(r_.log_uniform(0.1, 100.0), r_.log_uniform(0.1, 100.0)) for _ in range(4)]
    for case, (r, rho) in cases([(9.0, 4.0), (0.25, 3.0), (100.0, 0.5), (2.0, 8.0)], hidden,
                                lambda r, rho: f"query norm r = {r:.4g}, key norm rho = {rho:.4g}"):
        h = call(answer, r, rho, case=case, watch=Watch())
        compare_number(h, math.sqrt(rho / r), case, what="bandwidth", rtol=1e-5, mistakes=[
            (1 / math.sqrt(r), "The keys' norm matters too: the query point is rho u, and |rho u - k|^2 = 2 rho^2 - 2 rho u.k."),
            (rho / r, "That is h^2: take the square root."),
            (math.sqrt(r / rho), "Upside down: a longer query makes the weights sharper, so the bandwidth shrinks as r grows."),
            (rho / math.sqrt(r), "The term in u.k is rho u.k / h^2 (|k|^2 = rho^2 is the same for every key and cancels): "
                                 "h^2 = rho / r, not rho^2 / r."),
        ], hint="Expand |rho u - k|^2 / (2 h^2) and match the term in u.k with r u.k.")
        # What the message says: the kernel weights built with the answer's h are attention's weights, on keys
        # of norm rho in a few dimensions.
        n, d = r_.integer(10, 30), r_.choice([2, 3, 5, 8])
        u = r_.randn(d)
        u = u / u.norm()
        k = r_.randn(n, d)
        k = rho * k / k.norm(dim=1, keepdim=True)
        compare(_kernel_weights(u, k, rho, float(as_number(h, case, "bandwidth"))), torch.softmax(k @ (r * u), 0),
                f"{case}, the Nadaraya-Watson weights at rho u with your h against softmax(q . k), over {n} keys in "
                f"{d} dimensions", what="Nadaraya-Watson weights",
                hint="With this h the kernel weights are not attention's: check h for this r and rho.")


# 9.1.3: decoding the reversal model with some source positions hidden ---------------------------------------

def _decode_hiding(model, source, offsets, relative=1, copied=True, renormalize=True, context=True, wrap=False,
                   teacher=False, tanh=True, start=False):
    """Greedy decoding with source positions n - 1 - t + o, o in offsets, hidden at output step t (``teacher``:
    the mistake of feeding the true reversed digit instead of the model's own prediction; ``start``: of feeding
    the start symbol at every step)."""
    n = source.shape[1]
    with torch.no_grad():
        h, _ = model.encoder(model.embed(source))
        s = torch.tanh(model.init(h.mean(1))) if tanh else model.init(h.mean(1))
        prev = torch.full_like(source[:, 0], model.vocab)
        logits, weights = [], []
        for t in range(n):
            c, a = model.attention(s, h)
            hide = torch.zeros(n, dtype=torch.bool)
            for o in offsets:
                i = (n - 1 - t if copied else t) + relative * o
                if 0 <= i < n or (wrap and -n <= i < 0):
                    hide[i] = True
            a = a.masked_fill(hide, 0.0)
            if renormalize:
                a = a / a.sum(-1, keepdim=True)
            if context:
                c = (a[:, :, None] * h).sum(1)
            s = model.cell(torch.cat([model.embed(prev), c], -1), s)
            logit = model.out(torch.cat([s, c], -1))
            logits.append(logit)
            weights.append(a)
            prev = source[:, n - 1 - t] if teacher else prev if start else logit.argmax(-1)
    return torch.stack(logits, 1), torch.stack(weights, 1)


_OWN_PREDICTION = ("Feed the model's own previous prediction, the argmax of its last logits, as AttentionSeq2Seq.forward "
                   "does without a target: the true digit source[:, n - 1 - t] is teacher forcing.")


@exercise("9.1.3", "With the positions you hid, your decoder's weights and logits are those of the model's own "
                   "decoding loop with the hidden weights removed and the rest renormalized, also where an offset "
                   "points before the start of the string.")
def _(answer):
    from helpers.models import AdditiveAttention, AttentionSeq2Seq
    g = generator()
    # One case hides the copied position or its neighbours, one reaches past the start of the string (-1).
    offset_sets = (([0], [1], [0, 1]), ([-1, 0], [-1, 2]), ([0], [1], [-1, 0], [0, 1], [-1, 2]))
    for k in range(1, 4):
        n, d, B = pick(g, (4, 5, 6, 7)), pick(g, (8, 12, 16)), pick(g, (3, 5, 8))
        offsets = list(pick(g, offset_sets[k - 1]))
        case = f"case {k} of 3 (strings of {n} digits, width {d}, offsets {offsets})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            model = AttentionSeq2Seq(10, d, AdditiveAttention(d, d, d)).eval()
            with torch.no_grad():
                model.out.weight.mul_(8.0)          # clear winners: greedy decoding does not hinge on rounding
                # An initial state tanh(init(mean h)) well inside tanh's bend, so that forgetting the tanh moves the
                # first weights by many times the tolerance, not by about as much (3e-5 against 1e-5 at scale 1).
                model.init.weight.mul_(8.0)
        source = torch.randint(10, (B, n), generator=g)
        want_logits, want_w = _decode_hiding(model, source, offsets)
        teacher_logits, teacher_w = _decode_hiding(model, source, offsets, teacher=True)
        # (call hands the answer a copy of the model and of the source, and tells an answer that changed them so.)
        got = pair(call(answer, model, source, offsets, case=case), case, ("logits", "weights"))
        start_w = _decode_hiding(model, source, offsets, start=True)[1]
        compare(got[1], want_w, case, what="weights", atol=1e-5, rtol=1e-4, mistakes=[
            (teacher_w, _OWN_PREDICTION),
            (start_w, "Every step is fed the start symbol: after each step, feed the model's own prediction, "
                      "prev = the argmax of its logits, as AttentionSeq2Seq.forward does."),
            (_decode_hiding(model, source, offsets, tanh=False)[1],
             "The decoder starts from s = tanh(init(mean of h)), as AttentionSeq2Seq.forward does: the tanh is missing."),
            (_decode_hiding(model, source, offsets, relative=-1)[1],
             "Offset +1 is the position after the one being copied: n - 1 - t + 1, not n - 1 - t - 1."),
            (_decode_hiding(model, source, offsets, copied=False)[1],
             "At output step t the decoder copies source position n - 1 - t, not position t."),
            (_decode_hiding(model, source, offsets, renormalize=False)[1],
             "The weights left should sum to one again: divide by their sum (or set the hidden scores to -inf)."),
            (_decode_hiding(model, source, offsets, wrap=True)[1],
             "A position outside 0 .. n - 1 does not exist: skip it (a negative index wraps around to the end)."),
            (_decode_hiding(model, source, offsets, context=False)[1],
             "Your first step's weights are right, but the context still comes from the old ones: "
             "c = sum_i a_i h_i with the new a."),
        ], hint="At step t hide positions n - 1 - t + o for each offset o, then renormalize the other weights.")
        # A hidden position is hidden exactly: a weight of 1e-6 passes the tolerance above, and still reads it.
        steps = torch.arange(n)[:, None]
        hidden = torch.zeros(n, n, dtype=torch.bool)                   # (step t, source position)
        for o in offsets:
            i = n - 1 - steps + o
            hidden |= (torch.arange(n)[None, :] == i) & (i >= 0) & (i < n)
        left = got[1].detach()[:, hidden]
        if (left != 0).any():
            b, j = (int(x) for x in (left != 0).nonzero()[0])
            t_, i_ = (int(x) for x in hidden.nonzero()[j])
            raise Wrong(f"{case}: the weights: a hidden position should get weight exactly 0, got {left[b, j].item():.2g} "
                        f"at step {t_}, position {i_} (index {(b, t_, i_)}). Hide it: set its weight to 0 before "
                        "renormalizing, or its score to -inf, not to a small number.")
        compare(got[0], want_logits, case, what="logits", atol=1e-4, rtol=1e-4, mistakes=[
            (teacher_logits, _OWN_PREDICTION),
            (_decode_hiding(model, source, offsets, context=False)[0],
             "Your weights are right, but the context still comes from the old ones: c = sum_i a_i h_i with the new a."),
        ], hint="Your weights are right: feed the context sum_i a_i h_i and your own previous prediction, as "
                "AttentionSeq2Seq.forward does.")
