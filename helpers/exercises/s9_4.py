"""Section 9.4's checkers, in exercise order: 9.4.1 the residual stream, block by block, 9.4.2 what the z-loss
does to the logits, 9.4.3 label smoothing (9.4.4 is a written answer), 9.4.5 a decoder trained to reverse."""

import math
import numbers

import torch
import torch.nn.functional as F

from helpers.exercises.judge import (
    Watch,
    Wrong,
    _Raised,
    call,
    cases,
    compare,
    compare_number,
    exercise,
    fresh,
    generator,
    parameters_of,
    pick,
    shuffled,
    uses_keyword,
)
from helpers.runtime import threads

# 9.4.1: the residual stream's size, block by block ----------------------------------------------------------

def _stream(blocks, x, inputs=False, reduce="rms", normalized=False, chained=True):
    out, first = ([x] if inputs else []), x
    with torch.no_grad():
        for block in blocks:
            x = block(x if chained else first)          # not chained: each block applied to the input alone
            out.append(block.norm1(x) if normalized else x)
    if reduce == "rms":
        return torch.stack([z.pow(2).mean().sqrt() for z in out])
    if reduce == "norm":
        return torch.stack([z.norm() for z in out])
    if reduce == "token":                               # each token's RMS over its features, averaged
        return torch.stack([z.pow(2).mean(-1).sqrt().mean() for z in out])
    if reduce == "sequence":                            # each sequence's RMS, averaged
        return torch.stack([z.pow(2).mean((-2, -1)).sqrt().mean() for z in out])
    return torch.stack([z.std(unbiased=reduce != "population") for z in out])


@exercise("9.4.1", "Your measurement is the RMS of the residual stream after each block, for stacks of every depth "
                   "tried.")
def _(answer):
    from helpers.models import PreNormBlock
    g = generator()
    for k in range(1, 4):
        L, d, B, T = pick(g, (2, 3, 5)), pick(g, (8, 16)), pick(g, (2, 3)), pick(g, (4, 6))
        case = f"case {k} of 3 ({L} pre-norm blocks of width {d}, x of shape {(B, T, d)})"
        with torch.random.fork_rng():
            torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
            blocks = torch.nn.Sequential(*[PreNormBlock(d, torch.nn.Linear(d, d)) for _ in range(L)])
            with torch.no_grad():
                for p in blocks.parameters():
                    p.mul_(2.0)                             # a stream that visibly grows
        x = 3 * torch.randn(B, T, d, generator=g) + 1      # a mean away from zero, so RMS and std differ
        want = _stream(blocks, x)
        got = call(answer, blocks, x, case=case)
        if isinstance(got, list | tuple) and all(isinstance(v, numbers.Real | torch.Tensor) for v in got):
            raise Wrong(f"{case}: return a tensor of {L} numbers (torch.stack or torch.tensor), got a {type(got).__name__}")
        compare(got, want, case, what="RMS after each block", atol=1e-5, rtol=1e-4, mistakes=[
            (_stream(blocks, x, inputs=True), "One value per block, after it: leave out the input."),
            (_stream(blocks, x, inputs=True)[:-1], "Measure after each block, not before it: the first value is the "
                                                   "RMS of block 1's output, the last that of the final block's."),
            (_stream(blocks, x, reduce="norm"), "This is the stream's norm, not its RMS: the RMS averages the "
                                                "squares over the entries, where the norm sums them."),
            (_stream(blocks, x, reduce="std"), "This is the standard deviation: the RMS does not subtract the mean."),
            (_stream(blocks, x, reduce="population"), "This is the standard deviation: the RMS does not subtract the "
                                                      "mean."),
            (_stream(blocks, x, reduce="token"), "Yours is an average of roots, the RMS of each token averaged: the "
                                                 "RMS is one root of the mean square over all the entries."),
            (_stream(blocks, x, reduce="sequence"), "Yours is an average of roots, the RMS of each sequence averaged: "
                                                    "the RMS is one root of the mean square over all the entries."),
            (_stream(blocks, x, normalized=True), "Measure the stream itself, x after each block, not its normalized copy."),
            (_stream(blocks, x, chained=False), "Each block reads the stream the block before it wrote: feed block 2 "
                                                "block 1's output, not the input x."),
        ], hint="No usual mistake fits: check one block first, where your first value should be the RMS of the "
                "first block's output over all of its entries.")


# 9.4.2: what the z-loss does to the logits ------------------------------------------------------------------

_AUTOGRAD = ("computes the gradient with autograd (backward, torch.autograd.grad or torch.func), which the exercise "
             "asks you to do without: differentiate by hand, then write the result with torch operations.")


def _autograd(func, args, kwargs):
    """Whether a torch call is autograd computing a gradient (torch.func's transforms call torch.autograd.grad)."""
    return func is torch.autograd.grad or func is torch.autograd.backward or func is torch.Tensor.backward


@exercise("9.4.2", "Your gradient, computed without autograd, matches autograd's on every case.")
def _(answer):
    r = fresh()
    hidden = [(r.integer(1, 8), r.integer(2, 60), r.uniform(-10.0, 25.0), r.log_uniform(1e-4, 2.0)) for _ in range(2)]
    for case, (N, V, shift, w) in cases([(4, 10, 5.0, 1e-4), (3, 7, -3.0, 0.01), (6, 50, 20.0, 1.0)], hidden,
                                        lambda N, V, shift, w: f"{N} row{'s' * (N > 1)} of {V} logits around {shift:.3g}, "
                                                               f"weight {w:.3g}"):
        z = r.randn(N, V) + shift
        log_z = torch.logsumexp(z, -1, keepdim=True)
        p = torch.softmax(z, -1)
        want = 2 * w * log_z * p / N
        mistakes = [
            (w * log_z * p / N, "A factor 2 is missing, the one from differentiating the square."),
            (2 * w * log_z * p, "The loss is a mean over the N rows: divide by N."),
            (2 * w * log_z / V / N + 0 * p, "Your gradient is the same for every logit of a row: how much log Z changes "
                                            "with a logit depends on how large that logit is, not 1 / V for each."),
            (2 * log_z * p / N, "The weight w is missing."),
            (2 * w * z * p / N, "The factor from the square is the row's log Z, not the logits themselves."),
            (-want, "The sign is flipped: yours is the negative of the gradient."),
            (2 * w * torch.logsumexp(z, 0, keepdim=True) * torch.softmax(z, 0) / N,
             "Your softmax and log Z run over the rows (dim 0): each row's log Z is over that row's V logits."),
            (2 * w * log_z * torch.softmax(z, 0) / N,
             "Your softmax runs over the rows (dim 0): each row's log Z depends on that row's V logits only."),
            (2 * w * log_z / N + 0 * p, "Your gradient leaves out how log Z changes with each logit: the chain rule "
                                        "gives one more factor, which differs from logit to logit."),
        ]
        compare(call(answer, z, w, case=case, watch=Watch(_autograd, _AUTOGRAD)), want, case, what="gradient",
                mistakes=mistakes, hint="No usual mistake fits: differentiate step by step (the mean over rows, the "
                                        "square, log Z, each logit) and try your result on one row of two logits by hand.")


# 9.4.3: label smoothing -------------------------------------------------------------------------------------

_SMOOTHING = ("uses label_smoothing, which the exercise asks you to do without (in F.cross_entropy or "
              "nn.CrossEntropyLoss, however it is passed): build the smoothed targets yourself (F.cross_entropy with "
              "the targets as probabilities is fine).")


def _label_smoothing(func, args, kwargs):
    """Whether a torch call is a cross-entropy with label smoothing, passed by keyword or by position."""
    if func is F.cross_entropy or func is _CROSS_ENTROPY:
        position = 7                   # (input, target, weight, size_average, ignore_index, reduce, reduction, eps)
    elif func is torch._C._nn.cross_entropy_loss:
        position = 5                   # (input, target, weight, reduction, ignore_index, label_smoothing)
    else:
        return False
    value = kwargs.get("label_smoothing", args[position] if len(args) > position else 0.0)
    try:
        return float(value) != 0.0
    except (TypeError, ValueError, RuntimeError):
        return True


_CROSS_ENTROPY = F.cross_entropy

_ONE_HOT = ("F.one_hot(targets) without num_classes is only as wide as the largest target + 1, not V classes, when "
            "no target is the last class (as here): give it num_classes.")


def _one_hot_unsized(func, args, kwargs):
    """Whether a torch call is F.one_hot with no num_classes (or -1: the width then comes from the largest target)."""
    if func is not F.one_hot:
        return False
    size = kwargs.get("num_classes", args[1] if len(args) > 1 else -1)
    return isinstance(size, int) and size == -1


@exercise("9.4.3", "Your loss matches the cross-entropy against the smoothed targets on every case.")
def _(answer):
    r = fresh()
    if uses_keyword(answer, "label_smoothing"):
        raise Wrong(f"{getattr(answer, '__name__', 'your answer')} {_SMOOTHING}")
    hidden = [(r.integer(2, 9), r.integer(2, 12), r.uniform(0.05, 0.4)) for _ in range(2)]
    name = getattr(answer, "__name__", "your function")
    for case, (N, V, eps) in cases([(5, 4, 0.1), (8, 10, 0.2), (3, 3, 0.0)], hidden,
                                   lambda N, V, eps: f"{N} rows, {V} classes, eps = {eps:.3g}"):
        z = r.randn(N, V) * 2
        # Case 2's targets never include the last class, so that F.one_hot(targets) without num_classes, as wide as
        # the largest target + 1, fails every check (with targets drawn from every class it passed one in seven).
        t = torch.randint(V - 1 if case.startswith("case 2 ") else V, (N,), generator=r.torch)
        log_p = torch.log_softmax(z, -1)
        one_hot = F.one_hot(t, V).double()
        want = -((1 - eps) * one_hot + eps / V) * log_p
        others = -((1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)) * log_p
        no_shrink = -(one_hot + eps / V) * log_p
        not_target = -((1 - eps) * one_hot + eps / V * (1 - one_hot)) * log_p
        mistakes = [
            (others.sum(-1).mean().item(), "You spread eps over the other V - 1 classes: the exercise spreads it over "
                                           "all V, the true class included, as the original transformer and "
                                           "F.cross_entropy do, not over the other V - 1."),
            (no_shrink.sum(-1).mean().item(), "The true class still gets 1 from the one-hot target, not 1 - eps: the "
                                              "smoothed target must sum to 1."),
            (not_target.sum(-1).mean().item(), "The true class gets no share of eps: every class gets its share, the true "
                                               "one too."),
            ((-one_hot * log_p).sum(-1).mean().item(), "This is the plain cross-entropy: the targets are not smoothed."),
            (-(want.sum(-1)).mean().item(), "The sign is flipped: a cross-entropy is positive."),
            (want.sum().item(), "Average over the rows, as F.cross_entropy does: a mean, not a sum."),
            (want.mean().item(), "Average over examples, not over every class entry: sum over the V classes of a row, "
                                 "then take the mean over the N rows."),
            ((-((1 - eps) * one_hot + eps / V) * torch.softmax(z, -1)).sum(-1).mean().item(),
             "The cross-entropy takes the log of the probabilities: yours uses the probabilities themselves."),
            ((-((1 - eps) * one_hot + eps / V) * torch.log_softmax(z, 0)).sum(-1).mean().item(),
             "Your softmax runs over the rows (dim 0): each row's probabilities are over its V classes, the last dim."),
        ]
        unsized = []                   # F.one_hot called without num_classes, noted (not refused: it may be padded)

        def refuse(func, args, kwargs, unsized=unsized):
            if _one_hot_unsized(func, args, kwargs):
                unsized.append(func)
            return _label_smoothing(func, args, kwargs)
        try:
            got = call(answer, z, t, eps, case=case, watch=Watch(refuse, _SMOOTHING))
        except _Raised as raised:
            if not unsized:
                raise
            raise Wrong(f"{case}: {name} raised {type(raised.error).__name__} "
                        f"({str(raised.error).strip().splitlines()[0] if str(raised.error).strip() else ''}). "
                        + _ONE_HOT) from None
        compare_number(got, want.sum(-1).mean().item(), case, what="loss", rtol=1e-5, mistakes=mistakes,
                       hint=_ONE_HOT if unsized else "No usual mistake fits: try eps = 0 first, where your loss must "
                                                     "be the plain cross-entropy, then one row of two classes by hand.")


# 9.4.5: a decoder that reverses (open: the outcome is measured) ---------------------------------------------------

LEVEL = 0.1             # nats per token on the reversed half: the reference reaches about 0.003, a guess about 2.3


def reversal_sequences(batch, n, vocab, generator):
    """``(batch, 2 n + 1)`` token ids: ``n`` digits (ids ``0 .. vocab - 2``), the separator ``vocab - 1``, the digits
    reversed. The reversed half can be predicted only by reading the first half backwards."""
    digits = torch.randint(vocab - 1, (batch, n), generator=generator)
    return torch.cat([digits, torch.full((batch, 1), vocab - 1), digits.flip(1)], dim=1)


def _logits(model, x, case, what, hint="", vocab=None):
    """The model's logits for ``x``, checked: a float tensor (B, t, vocab), finite. ``hint`` follows the error the
    model raised, if it raised one; with ``vocab``, an IndexError (an embedding too small) is told so."""
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as error:  # noqa: BLE001 (told to the reader as the error it is)
        if vocab is not None and isinstance(error, IndexError):   # a students' review: the raw message alone
            hint = f"the token ids run from 0 to vocab - 1 = {vocab - 1}: is the model's vocabulary that large?"
        raise Wrong(f"{case}: the model you returned raised {type(error).__name__} on {what} of shape "
                    f"{tuple(x.shape)}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
                    + (f" ({hint})" if hint else "")) from None
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        raise Wrong(f"{case}: the model should return the logits alone, a tensor, got a {type(out).__name__}")
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        kind = f"a {out.dtype} tensor" if isinstance(out, torch.Tensor) else type(out).__name__
        raise Wrong(f"{case}: the model should return float logits, got {kind}")
    return out


_ANY_LENGTH = "your model must take any length t < T: (B, t) -> (B, t, vocab), as generating from a prompt does"

_TRAIN = ("Train a model: the function must return the model it trained, its logits computed from the parameters it "
          "learned, not logits written by hand.")


def _agree(a, b):
    """Whether two calls' logits agree, within the tolerance of the checks below (NaN where NaN)."""
    if a.shape != b.shape:
        return False
    scale = a.detach().nan_to_num(0.0, 0.0, 0.0).abs().max().item()
    return torch.allclose(a, b, rtol=1e-4, atol=1e-4 * max(scale, 1e-30), equal_nan=True)


def _reversed_loss(logits, x, n, ahead=1):
    """The cross-entropy of the logits at the reversed half's positions against the token ``ahead`` positions on."""
    T = x.shape[1]
    return F.cross_entropy(logits[:, n:T - ahead].flatten(0, 1).double(), x[:, n + ahead:].flatten()).item()


@exercise("9.4.5", "Your decoder reverses held-out sequences: its loss on the reversed half is below the level, and "
                   "no prediction reads a later token.", time_limit=60)
def _(answer):
    r = fresh()
    n, digits = r.choice([4, 5, 6]), r.integer(8, 11)
    vocab, T = digits + 1, 2 * n + 1
    case = (f"the check (drawn at random: {n} digits of {digits}, then the separator {vocab - 1}, then the digits "
            f"reversed; vocab = {vocab}, T = {T})")
    data = torch.Generator().manual_seed(r.integer(0, 2**31 - 1))

    def batch():
        """32 fresh training sequences, (32, T)."""
        return reversal_sequences(32, n, vocab, data)

    # One thread: a model this small trains fastest on one, and its training is then the same whatever the machine's
    # thread count (and a busy machine's threads do not wait on each other).
    with torch.random.fork_rng(), threads(1):
        torch.manual_seed(r.integer(0, 2**31 - 1))          # the answer's own draws (its initialization)
        model = call(answer, batch, vocab, T, case=case)
    if not callable(model):
        raise Wrong(f"{case}: return the trained model (a module that maps token ids to logits), got "
                    f"{type(model).__name__}")
    if isinstance(model, torch.nn.Module):
        model.eval()
    x = reversal_sequences(256, n, vocab, torch.Generator().manual_seed(r.integer(0, 2**31 - 1)))   # held out
    inputs = x[:, :-1]
    logits = _logits(model, inputs, case, "token ids", vocab=vocab)
    if logits.shape != (256, T - 1, vocab):
        raise Wrong(f"{case}: for token ids of shape {tuple(inputs.shape)} the logits should have shape "
                    f"{(256, T - 1, vocab)}, one row of {vocab} per position, got {tuple(logits.shape)}")
    # The same token ids twice: a layer that draws at random (dropout left in training mode, in a model returned
    # inside a function, which the check cannot put in eval mode) changes every prediction, not only those after a cut.
    if not _agree(_logits(model, inputs, case, "token ids"), logits):
        raise Wrong(f"{case}: the model's logits for the same token ids differ from one call to the next: dropout or "
                    "another random layer is active: put the model in eval mode (model.eval()) before returning it, or "
                    "return the module itself, which the check puts in eval mode.")
    if not logits.isfinite().all():
        bad = ~logits.isfinite().all(-1)                 # (B, t): the positions with a logit that is NaN or infinite
        everywhere = bad.all(0)
        if torch.equal(bad.any(0), everywhere) and not everywhere.all():
            # NaN at the same positions of every sequence, and only there: softmax over keys that are all hidden.
            where = everywhere.nonzero().flatten().tolist()
            raise Wrong(f"{case}: the model's logits are not finite at position{'s' * (len(where) > 1)} "
                        f"{', '.join(map(str, where))} of every sequence, and finite elsewhere: a position whose every "
                        "key is hidden gives NaN, a softmax over no key. Is the mask inverted (nn.MultiheadAttention "
                        "hides where its mask is True, scaled_dot_product_attention where it is False), or does it "
                        "hide a whole row?")
        # NaN everywhere: a diverging run, or a NaN that training spread to every weight (a loss over a position whose
        # keys are all hidden is NaN from the first step, and so is every weight after it).
        raise Wrong(f"{case}: the model's logits are not all finite: did training diverge (a learning rate too high), "
                    "or was its loss NaN from the start? A position whose every key is hidden gives NaN, a softmax over "
                    "no key, and one NaN step makes every weight NaN: is the mask inverted?")
    # A prediction may read its own token and the earlier ones only: change every token after a cut and compare.
    for cut in (n - 1, n, T - 3):
        changed = inputs.clone()
        changed[:, cut + 1:] = torch.randint(vocab, changed[:, cut + 1:].shape, generator=r.torch)
        before = _logits(model, changed, case, "token ids")[:, : cut + 1]
        if not torch.allclose(before, logits[:, : cut + 1], rtol=1e-4, atol=1e-4 * logits.abs().max().item()):
            raise Wrong(f"{case}: the prediction at position {cut} changed when only later tokens changed: it reads ahead, "
                        "so it can copy the answer instead of predicting it. The attention must be causal (a mask that "
                        "hides the later positions), and nothing else may mix positions.")
    # Any length t < T, as the exercise says and generation needs: the first n + 1 tokens (the digits and the
    # separator, a prompt to generate from) alone give the logits they get at the start of the full sequence. A
    # decoder that adds the whole position table, T - 1 rows, takes T - 1 tokens only.
    prefix = inputs[:, : n + 1]
    short = _logits(model, prefix, case, f"the first n + 1 = {n + 1} token ids", hint=_ANY_LENGTH)
    if short.shape != (256, n + 1, vocab):
        raise Wrong(f"{case}: for the first n + 1 = {n + 1} token ids, of shape {tuple(prefix.shape)}, the logits "
                    f"should have shape {(256, n + 1, vocab)}, got {tuple(short.shape)}: {_ANY_LENGTH}.")
    if not torch.allclose(short, logits[:, : n + 1], rtol=1e-4, atol=1e-4 * logits.abs().max().item()):
        raise Wrong(f"{case}: for the first n + 1 = {n + 1} token ids alone, the logits differ from those at the same "
                    "positions of the full sequence: a prediction must depend on its own token, the earlier ones and "
                    "its position counted from the start, and on nothing after it.")
    loss = _reversed_loss(logits, x, n)
    if loss < LEVEL:
        # Hard-coding the reversal (logits set by hand from the earlier tokens) passes everything above, and so does
        # such a lookup whose logits are multiplied by a parameter, or returned after a backward() that trains
        # nothing. What a trained model does lives in its parameters: with the entries of each shuffled, it is noise
        # of the same size, and its loss is far above the level, where a lookup's is unchanged.
        name = getattr(answer, "__name__", "your function")
        weights = parameters_of(model, prefix)
        if not weights:
            raise Wrong(f"{case}: the logits of the model {name} returned depend on no parameters. {_TRAIN}")
        with shuffled(weights, torch.Generator().manual_seed(r.integer(0, 2**31 - 1))):
            try:
                still = _reversed_loss(_logits(model, inputs, case, "token ids"), x, n)
            except Wrong:                                 # it no longer runs: its parameters were what it used
                still = math.inf
        if still < LEVEL:
            raise Wrong(f"{case}: the model {name} returned still reverses with the entries of each of its parameters "
                        f"shuffled: what it does is written in its code, not learned in its parameters. {_TRAIN}")
        return
    read = F.cross_entropy(logits.flatten(0, 1).double(), inputs.flatten()).item()
    guess = torch.log(torch.tensor(float(digits))).item()
    shown = f"loss on the reversed half {loss:.2f} nats per token, above the level {LEVEL}"
    if read < 0.5:
        raise Wrong(f"{case}: {shown}. Your model predicts the token it reads, not the next one: was it trained "
                    "against the tokens it reads? The target at each position is the token after it. (An untrained "
                    "model whose output layer shares the token embedding's weights also predicts the token it reads.)")
    # Trained against a token further ahead than the next, a model predicts that token (a loss of about 0.01
    # against it), and its loss against the next one is far above a uniform guess's. (A model without positions
    # predicts every later digit about alike, at 1.1 to 1.8 nats: not this.)
    for ahead in range(2, n + 1):
        if _reversed_loss(logits, x, n, ahead) < min(0.5, loss - 1):
            raise Wrong(f"{case}: {shown}. Your model predicts the token {ahead} positions ahead, not the next one: "
                        "the targets are the inputs shifted by one (x[:, 1:] for the inputs x[:, :-1]).")
    if loss > guess + 1:
        raise Wrong(f"{case}: {shown}, far above a uniform guess over the {digits} digits ({guess:.2f}): the model "
                    "is confidently wrong, as a model trained against other targets is. Are its targets the next "
                    "tokens, the inputs shifted by one (x[:, 1:] for the inputs x[:, :-1]), at every position, those "
                    "of the reversed half included?")
    # An untrained model's loss is at least 0.17 above the guess (200 draws); one trained without positions, which
    # learns something and cannot reverse, came within 0.28 below it (1 draw in some hundreds), across the 0.3 this
    # margin once was.
    if loss > guess - 0.1:
        raise Wrong(f"{case}: {shown}, about a uniform guess over the {digits} digits ({guess:.2f}): the model has not "
                    "learned. Does it train (a loss, backward, an optimizer step, in a loop) for enough steps, and is it the "
                    "trained model you return?")
    raise Wrong(f"{case}: {shown}, below a uniform guess ({guess:.2f}) but not reversing. To copy the right digit the "
                "model must know where each token is (position embeddings), and it may need more steps or another "
                "learning rate.")
