import math

import pytest
import torch
from torch import nn

from helpers.models import (
    AddingTransformer,
    AdditiveAttention,
    Attention,
    LanguageModel,
    LogitAttention,
    PreNormBlock,
    RecurrentRegressor,
    copy_lm,
    decay_groups,
    init_gpt2,
    keep_copy_lm,
    repeat_batch,
    train_lm,
    warmup_cosine,
)


def size(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_follow_the_formulas():
    f, T, d, h = 2, 100, 64, 64
    embed, readout, pos, norm = f * d + d, d, (T + 1) * d, 2 * d
    attn, mlp, out = 4 * d * d + 4 * d, d * 4 * d + 4 * d + 4 * d * d + d, d + 1
    assert size(AddingTransformer(features=f, length=T, d=d, heads=4)) == embed + readout + pos + 3 * norm + attn + mlp + out
    # A GRU has three gates, a vanilla RNN one; each gate has input and hidden weights and two biases.
    gate = f * h + h * h + 2 * h
    assert size(RecurrentRegressor("gru", features=f, hidden=h)) == 3 * gate + h + 1
    assert size(RecurrentRegressor("rnn", features=f, hidden=h)) == gate + h + 1


def test_adding_transformer_shapes_and_weights():
    torch.manual_seed(0)
    model = AddingTransformer(length=10, d=16, heads=4).eval()
    x = torch.rand(3, 10, 2)
    y, w = model(x, need_weights=True)
    assert y.shape == (3,) and w.shape == (3, 4, 11)
    assert torch.allclose(w.sum(-1), torch.ones(3, 4))
    assert torch.allclose(model(x), y)


def test_adding_transformer_equals_the_full_block_read_at_the_readout_token():
    """Querying with the readout token alone is the full block's output at position 0."""
    torch.manual_seed(0)
    m = AddingTransformer(length=10, d=16, heads=4).eval()
    x = torch.rand(3, 10, 2)
    h = torch.cat([m.readout.expand(3, -1, -1), m.embed(x)], dim=1) + m.pos.weight
    a = m.block.norm1(h)
    h = h + m.block.attn.mha(a, a, a, need_weights=False)[0]
    h = h + m.block.mlp(m.block.norm2(h))
    assert torch.allclose(m(x), m.out(m.norm(h[:, 0])).squeeze(-1), atol=1e-6)


def test_pre_norm_block_is_two_residual_sublayers_and_reads_a_context():
    torch.manual_seed(0)
    block = PreNormBlock(16, Attention(16, 4)).eval()
    x = torch.randn(2, 5, 16)
    h = x + block.attn(block.norm1(x))
    assert torch.allclose(block(x), h + block.mlp(block.norm2(h)), atol=1e-6)
    # With a context, the rows of x alone are computed: the full block's rows where x is part of the context.
    assert torch.allclose(block(x[:, :2], context=x), block(x)[:, :2], atol=1e-6)
    swapped = PreNormBlock(16, Attention(16, 4), mlp=nn.Identity(), norm=nn.RMSNorm)
    assert isinstance(swapped.norm1, nn.RMSNorm) and isinstance(swapped.mlp, nn.Identity)


def test_attention_self_causal_and_cross():
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    attn = Attention(16, 4)
    weights = []
    assert attn(x, memory, record=weights).shape == (2, 5, 16) and weights[0].shape == (2, 4, 5, 7)
    assert attn(x).shape == (2, 5, 16) and not hasattr(attn, "weights")     # nothing kept on the module
    causal = Attention(16, 4, causal=True)
    weights = []
    y = causal(x, record=weights)
    assert torch.allclose(weights[0].sum(-1), torch.ones(2, 4, 5))
    assert (weights[0].triu(1) == 0).all()                     # no weight on the future
    assert torch.allclose(causal(x[:, :3]), y[:, :3], atol=1e-6)   # outputs 0-2 ignore tokens 3-4


def test_causal_attention_with_a_context_is_aligned_bottom_right():
    """The m queries are the last m positions: the last position alone sees every key, as in the full pass."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    block = PreNormBlock(16, Attention(16, 4, causal=True)).eval()
    for m in (1, 2, 6):
        assert torch.allclose(block(x[:, -m:], context=x), block(x)[:, -m:], atol=1e-6)
    weights = []
    block(x[:, -2:], context=x, record=weights)
    assert (weights[0][:, :, 0, 5] == 0).all() and (weights[0][:, :, 1] > 0).all()
    with pytest.raises(ValueError, match="at most as many queries as keys"):
        block.attn(x, x[:, :3])


def test_language_model_is_initialized_as_gpt2_and_tied():
    torch.manual_seed(0)
    L = 3
    lm = LanguageModel(50, 16, 64, heads=4, layers=L)
    assert lm.head.weight is lm.tok.weight
    std = {name: p.std().item() for name, p in lm.named_parameters()}
    assert abs(std["tok.weight"] - 0.02) < 0.003 and abs(std["blocks.0.attn.mha.in_proj_weight"] - 0.02) < 0.002
    for name in ("blocks.1.attn.mha.out_proj.weight", "blocks.2.mlp.2.weight"):
        assert abs(std[name] - 0.02 / math.sqrt(2 * L)) < 0.002, name
    assert all(p.abs().sum() == 0 for name, p in lm.named_parameters() if name.endswith("bias"))
    idx = torch.randint(50, (2, 16))
    loss = nn.functional.cross_entropy(lm(idx)[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    assert abs(loss.item() - math.log(50)) < 0.1               # about a uniform guess at the start
    with pytest.raises(ValueError, match="T <= 16"):
        lm(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_the_cached_language_model_gives_the_logits_of_the_whole_sequence(qk_norm):
    torch.manual_seed(0)
    lm = LanguageModel(20, 12, 32, heads=4, layers=2, attention=lambda: LogitAttention(32, 4, qk_norm)).eval()
    idx = torch.randint(20, (3, 12))
    caches = [{} for _ in lm.blocks]
    with torch.no_grad():                   # a prompt of 5, one token, then a chunk of 6 after the cached 6
        parts = [lm(idx[:, :5], caches), lm(idx[:, 5:6], caches), lm(idx[:, 6:], caches)]
        torch.testing.assert_close(torch.cat(parts, 1), lm(idx), atol=1e-5, rtol=1e-5)
    assert caches[1]["k"].shape == (3, 4, 12, 8)
    with pytest.raises(ValueError, match=r"T <= 0 \(12 tokens cached\)"):
        lm(idx[:, :1], caches)              # no position left after the cached 12
    with pytest.raises(ValueError, match="list of 2 dicts"):
        lm(idx, [{}])
    with pytest.raises(TypeError, match="cache must be a dict"):
        lm(idx, [{}, []])
    with pytest.raises(TypeError, match="need LogitAttention"):
        LanguageModel(20, 12, 32, heads=4, layers=1)(idx, [{}])
    shared = {}
    with pytest.raises(ValueError, match="2 distinct dicts"):
        lm(idx[:, :5], [shared, shared])    # [{}] * 2: both blocks would write their keys into one cache
    caches = [{} for _ in lm.blocks]
    lm(idx[:, :5], caches)
    caches[1].clear()                       # one block's cache emptied: the positions would no longer agree
    with pytest.raises(ValueError, match=r"different numbers of tokens, \[5, 0\]"):
        lm(idx[:, 5:6], caches)
    with pytest.raises(ValueError, match=r"1 <= T <= 12"):
        lm(idx[:, :0])


def test_copy_lm_keeps_the_trained_model_and_trains_again_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr("helpers.models.train_lm", lambda lm, lr: calls.append(lr) or [(0.5, 1.0)] * 3)
    lm, history = copy_lm()                 # nothing kept: trains (here a stand-in) and keeps the result
    assert calls == [1e-2] and history == [(0.5, 1.0)] * 3 and not lm.training
    (kept,) = (tmp_path / "attention-book").glob("copy-lm-*.pt")
    with torch.no_grad():
        lm.tok.weight.add_(1.0)
    keep_copy_lm(lm, [(0.25, None)])        # what section 9.4 does with the model it trained
    again, history = copy_lm()
    assert calls == [1e-2] and history == [(0.25, None)] and torch.equal(again.tok.weight, lm.tok.weight)
    kept.write_bytes(b"not a model")        # unreadable: trained again, and kept again
    copy_lm()
    assert calls == [1e-2, 1e-2] and not list(tmp_path.glob("attention-book/*.tmp"))


def test_keep_copy_lm_leaves_nothing_behind_on_a_refused_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the folder should be")
    keep_copy_lm(LanguageModel(20, 12, 32, heads=4, layers=1), [])     # refused quietly
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_decay_groups_decay_only_the_weight_matrices():
    lm = LanguageModel(50, 16, 64, heads=4, layers=2)
    decay, rest = decay_groups(lm, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    ids = {id(p) for p in decay["params"]}
    assert id(lm.tok.weight) not in ids and id(lm.pos.weight) not in ids and all(p.dim() == 2 for p in decay["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(list(lm.parameters()))
    assert len(decay["params"]) == 2 * 4                       # in_proj, out_proj and the MLP's two per block


def test_train_lm_records_the_largest_logit_and_learns():
    torch.manual_seed(0)
    lm = LanguageModel(32, 32, 32, heads=4, layers=1, attention=lambda: LogitAttention(32, 4, qk_norm=True))
    history = train_lm(lm, lr=1e-2, steps=3)
    assert len(history) == 3 and all(z > 0 for _, z in history)
    x = repeat_batch(torch.Generator().manual_seed(0), batch=2, half=4)
    assert torch.equal(x[:, :4], x[:, 4:])


def test_train_lm_shows_its_progress_and_ends_on_a_quiet_line(monkeypatch, capsys):
    """Issue 31: 9.4's cell of three train_lm runs (about 24 s) showed only [*]. In a notebook each run's bar
    ends on the line it began with; nothing is printed or written to stderr."""
    import IPython.display

    from helpers import progress as progress_module

    shown = []

    class Handle:
        def update(self, obj):
            shown[-1].append(repr(obj))

    def display(obj, display_id=False):
        shown.append([repr(obj)])
        return Handle()

    monkeypatch.setattr(progress_module, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    torch.manual_seed(0)
    lm = LanguageModel(32, 32, 16, heads=2, layers=1, attention=lambda: LogitAttention(16, 2))
    assert len(train_lm(lm, lr=1e-2, steps=3)) == 3
    assert [lines[0] for lines in shown] == [lines[-1] for lines in shown] == ["training: 3 steps"]
    assert capsys.readouterr() == ("", "")


def test_additive_attention_weights_are_a_softmax_over_the_keys():
    torch.manual_seed(0)
    c, a = AdditiveAttention(8, 6, 5)(torch.randn(3, 8), torch.randn(3, 4, 6))
    assert c.shape == (3, 6) and a.shape == (3, 4) and torch.allclose(a.sum(-1), torch.ones(3))


def test_recurrent_regressor_reads_the_last_state():
    torch.manual_seed(0)
    model = RecurrentRegressor("gru", hidden=8)
    x = torch.rand(5, 7, 2)
    out, _ = model.rnn(x)
    assert torch.allclose(model(x), model.out(out[:, -1]).squeeze(-1))
    assert isinstance(RecurrentRegressor("rnn").rnn, nn.RNN)


def test_models_reject_bad_arguments():
    with pytest.raises(ValueError, match="divisible"):
        AddingTransformer(d=10, heads=4)
    with pytest.raises(ValueError, match="batch, 100, 2"):
        AddingTransformer()(torch.rand(2, 50, 2))
    with pytest.raises(ValueError, match=r"cell must be one of \['gru', 'rnn'\], got 'lstm'"):
        RecurrentRegressor("lstm")
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        AddingTransformer(heads=0)
    with pytest.raises(ValueError, match="batch, length, 2"):
        RecurrentRegressor()(torch.rand(2, 5, 3))


def test_warmup_cosine_at_the_edges():
    assert warmup_cosine(0, 20, 200) == 1 / 20 and warmup_cosine(19, 20, 200) == 1.0
    assert warmup_cosine(20, 20, 200) == 1.0 and warmup_cosine(200, 20, 200) == pytest.approx(0.1)
    assert warmup_cosine(20, 20, 20) == pytest.approx(0.1)             # as many steps as warmup: divided by zero before
    torch.manual_seed(0)
    lm = LanguageModel(32, 32, 16, heads=2, layers=1, attention=lambda: LogitAttention(16, 2))
    assert len(train_lm(lm, lr=1e-3, steps=3, warmup=3)) == 3          # LambdaLR asks for the step after the last


def test_the_language_model_helpers_refuse_what_would_fail_later_or_silently():
    torch.manual_seed(0)
    lm = LanguageModel(32, 32, 32, heads=4, layers=1, attention=lambda: LogitAttention(32, 4))
    for kw, name in ((dict(lr=0.0), "lr"), (dict(lr=1e-2, steps=-3), "steps"), (dict(lr=1e-2, warmup=-1), "warmup"),
                     (dict(lr=1e-2, weight_decay=math.nan), "weight_decay"), (dict(lr=1e-2, weight_decay=-1), "weight_decay")):
        with pytest.raises(ValueError, match=name):
            train_lm(lm, **kw)                  # before: a history of NaN, or [] for steps=-3
    with pytest.raises(FloatingPointError, match="the loss is nan at step 0"):
        with torch.no_grad():
            lm.tok.weight[0, 0] = float("nan")
        train_lm(lm, lr=1e-2, steps=2)
    for call, name in ((lambda: init_gpt2(lm, 0), "layers"), (lambda: warmup_cosine(-1, 0, 10), "step"),
                       (lambda: repeat_batch(torch.Generator(), vocab=0), "vocab"),
                       (lambda: AdditiveAttention(8.0, 6, 5), "d_s"), (lambda: AdditiveAttention(8, 6, 0), "d_a"),
                       (lambda: LogitAttention(32, 4)(torch.randn(5, 32)), "x must be"),
                       (lambda: Attention(16, 4, causal=True)(torch.randn(5, 16)), "x must be")):   # read as unbatched
        with pytest.raises(ValueError, match=name):
            call()


def test_warmup_cosine_refuses_a_floor_outside_the_peak():
    """Bad input to the helpers: a floor of -1 gave a negative learning rate, NaN a NaN, 2.0 a factor above 1."""
    from helpers.models import warmup_cosine
    for floor in (-1, float("nan"), 2.0, True, "0.1"):
        with pytest.raises(ValueError, match="floor must be a fraction"):
            warmup_cosine(50, 10, 100, floor)
    with pytest.raises(ValueError, match="total"):
        warmup_cosine(50, 10, None)
    assert warmup_cosine(100, 10, 100, 0) == 0.0 and warmup_cosine(10, 10, 100, 1) == 1.0
