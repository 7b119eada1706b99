"""Token Sparse Attention (lcjax.attention.token_sparse) against independent numpy
references: scores (softmax of the window rows, avg_pool1d with zero padding counted), the
coverage budget on hand-made scores, the restricted attention for kept tokens and zeros for
skipped ones, dense fall-backs, batch > 1 with per-example and per-head selections,
kv-group sharing, jit / vmap / grad, inner="entmax", layer choice by drift and per-layer
attention in DecoderConfig. Shapes are tiny; calls are jitted (one compile each)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import dot_product_attention, get
from lcjax.attention.entmax import entmax_attention_reference
from lcjax.attention.token_sparse import (
    drift_per_layer,
    layer_attention,
    select_tokens,
    sparse_layers,
    token_scores,
    token_sparse_attention,
)

B, L, H, HKV, D = 3, 40, 4, 2, 16
W, POOL, MIN = 6, 3, 8
SPARSE = dict(window=W, pool=POOL, min_tokens=MIN, coverage=0.3, capacity=24, block_kv=16)


def _inputs(seed=0, b=B, length=L, h=H, hkv=HKV, d=D, temp=1.5):
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, length, h, d)) * temp
    k = jax.random.normal(ks[1], (b, length, hkv, d)) * temp
    v = jax.random.normal(ks[2], (b, length, hkv, d))
    return q, k, v


@functools.cache
def _jitted(causal=True, **options):
    fn = functools.partial(token_sparse_attention, causal=causal, return_aux=True, **options)
    return jax.jit(fn)


def _call(q, k, v, **options):
    opts = {key: (tuple(sorted(val.items())) if isinstance(val, dict) else val)
            for key, val in options.items()}
    return _jitted(**opts)(q, k, v)


# ----------------------------------------------------------------------------
# numpy references
# ----------------------------------------------------------------------------
def np_scores(q, k, window, pool, scale=None):
    """Dense: mean over the window rows of the causal softmax, prefix columns, avg_pool1d
    (kernel pool, padding pool//2, zeros counted), by explicit loops."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    b, length, h, d = q.shape
    g = h // k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    p_len = length - window
    out = np.zeros((b, h, p_len))
    for bi in range(b):
        for hi in range(h):
            acc = np.zeros(length)
            for i in range(p_len, length):
                s = scale * k[bi, : i + 1, hi // g] @ q[bi, i, hi]
                e = np.exp(s - s.max())
                acc[: i + 1] += e / e.sum()
            a = acc[:p_len] / window
            r = pool // 2
            for j in range(p_len):
                out[bi, hi, j] = sum(a[j + t] for t in range(-r, r + 1)
                                     if 0 <= j + t < p_len) / pool
    return out


def np_restricted(q, k, v, indices, valid, scale=None, causal=True):
    """Softmax attention of each head over its own selected tokens (causal or not), zeros
    for the tokens it skipped."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, length, h, d = q.shape
    g = h // k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros((b, length, h, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            sel = np.asarray(indices[bi, hi])[np.asarray(valid[bi, hi])]
            for i in sel:
                keys = sel[sel <= i] if causal else sel
                s = scale * k[bi, keys, hi // g] @ q[bi, i, hi]
                e = np.exp(s - s.max())
                out[bi, i, hi] = (e / e.sum()) @ v[bi, keys, hi // g]
    return out


# ----------------------------------------------------------------------------
# scores and budget
# ----------------------------------------------------------------------------
def test_token_scores_equal_naive_dense_with_zero_padded_pool():
    q, k, _ = _inputs(1, b=2, length=29)
    got = jax.jit(functools.partial(token_scores, window=5, pool=5, block_kv=8))(q, k)
    assert got.shape == (2, H, 24)
    np.testing.assert_allclose(got, np_scores(q, k, 5, 5), rtol=1e-5, atol=1e-7)
    # the pool counts the zero padding: the edge is the sum of 3 terms over 5, not over 3
    raw = np_scores(q, k, 5, 1)
    np.testing.assert_allclose(got[..., 0], raw[..., :3].sum(-1) / 5, rtol=1e-5)


def test_budget_formula_on_hand_made_scores():
    # one example, two heads, P = 10; head mean g normalised = [.01 .01 .02 .02 .04 .1 .1 .2
    # .2 .3]; ascending cumsum .01 .02 .04 .06 .10 .2 ...: coverage .05 -> n = 3 (< .05),
    # n_drop = 4, K = max(min_tokens, 10 - 4) = 6
    g = np.array([0.01, 0.01, 0.02, 0.02, 0.04, 0.1, 0.1, 0.2, 0.2, 0.3])
    rng = np.random.default_rng(0)
    perm = rng.permutation(10)
    head0 = g[perm] * (1 + 0.05 * rng.uniform(-1, 1, 10))  # no ties inside a head
    head1 = 2.5 * g[perm] - head0  # head mean = 1.25 g[perm]: normalised, g[perm]
    scores = jnp.asarray(np.stack([head0, head1])[None])
    for coverage, min_tokens, want in ((0.05, 2, 6), (0.05, 8, 8), (0.095, 2, 5),
                                       (0.011, 2, 8), (0.005, 2, None)):
        sel = select_tokens(scores, coverage=coverage, min_tokens=min_tokens, window=3)
        if want is None:  # cumsum[0] = .01 >= .005: nothing dropped -> dense
            assert bool(sel.dense[0]) and int(sel.budget[0]) == 10
            continue
        assert not bool(sel.dense[0])
        assert int(sel.budget[0]) == want, (coverage, min_tokens)
        kept = np.asarray(sel.indices[0, 0])[np.asarray(sel.valid[0, 0])]
        top = np.sort(np.argsort(-head0, kind="stable")[:want])
        np.testing.assert_array_equal(kept, np.concatenate([top, np.arange(10, 13)]))


def test_capacity_pads_or_clips_the_selection():
    q, k, _ = _inputs(2)
    scores = jax.jit(functools.partial(token_scores, window=W, pool=POOL))(q, k)
    free = select_tokens(scores, coverage=0.3, min_tokens=MIN, window=W)
    budgets = np.asarray(free.budget)
    assert free.indices.shape[-1] == budgets.max() + W  # eager: the largest K of the batch
    sel = jax.jit(lambda s: [select_tokens(s, coverage=0.3, min_tokens=MIN, window=W,
                                           capacity=c) for c in (30, MIN)])(scores)
    big, small = sel
    np.testing.assert_array_equal(np.asarray(big.valid).sum(-1),
                                  (budgets + W)[:, None].repeat(H, 1))
    assert bool(np.all(np.asarray(small.valid)))  # K >= min_tokens fills every slot
    idx = np.asarray(big.indices)
    assert np.all(np.diff(idx, axis=-1) >= 0) and np.all(idx[~np.asarray(big.valid)] == L)
    np.testing.assert_array_equal(np.asarray(free.indices), idx[..., :idx.shape[-1] - (
        30 - budgets.max())])


# ----------------------------------------------------------------------------
# the attention
# ----------------------------------------------------------------------------
def test_coverage_zero_and_short_sequences_are_exactly_dense():
    """Dense = the default inner variant ("blockwise") on the whole sequence, bit for bit;
    and that is softmax attention (to rounding)."""
    q, k, v = _inputs(3)
    dense = jax.jit(functools.partial(get("blockwise"), causal=True))(q, k, v)
    exact = jax.jit(functools.partial(dot_product_attention, causal=True))(q, k, v)
    np.testing.assert_allclose(dense, exact, rtol=1e-5, atol=1e-5)
    out, aux = _call(q, k, v, **{**SPARSE, "coverage": 0.0})
    np.testing.assert_array_equal(out, dense)
    assert bool(np.all(aux["dense"])) and bool(np.all(aux["kept_fraction"] == 1))
    out, _ = _call(q, k, v, **{**SPARSE, "min_tokens": L - W})  # L <= min_tokens + W
    np.testing.assert_array_equal(out, dense)


def test_kept_tokens_match_numpy_restricted_attention_and_skipped_are_zero():
    q, k, v = _inputs(4)
    out, aux = _call(q, k, v, **SPARSE)
    idx, valid = np.asarray(aux["indices"]), np.asarray(aux["valid"])
    budget = np.asarray(aux["budget"])
    assert not np.any(aux["dense"]) and np.all(budget < L - W)
    # batch > 1: different budgets per example and different tokens per head
    assert len(set(budget.tolist())) > 1, budget
    for b in range(B):
        sets = {tuple(idx[b, h][valid[b, h]]) for h in range(H)}
        assert len(sets) == H
    assert tuple(idx[0, 0][valid[0, 0]]) != tuple(idx[1, 0][valid[1, 0]])
    want = np_restricted(q, k, v, idx, valid)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5)
    kept = np.zeros((B, L, H), bool)
    for b in range(B):
        for h in range(H):
            kept[b, idx[b, h][valid[b, h]], h] = True
    assert np.all(np.asarray(out)[~kept] == 0.0) and np.all(np.abs(want[kept]).sum(-1) > 0)
    np.testing.assert_allclose(aux["kept_fraction"], kept.mean(axis=(1, 2)), rtol=1e-6)
    # not causal: unused slots are hidden by segment ids instead of by causality
    out_nc, aux_nc = _call(q, k, v, causal=False, **SPARSE)
    idx_nc, valid_nc = np.asarray(aux_nc["indices"]), np.asarray(aux_nc["valid"])
    assert not np.all(valid_nc)
    np.testing.assert_allclose(out_nc, np_restricted(q, k, v, idx_nc, valid_nc, causal=False),
                               atol=2e-5, rtol=1e-5)
    # the selection follows the numpy scores: per head, the top-K prefix tokens
    sc = np_scores(q, k, W, POOL)
    for b in range(B):
        top = np.sort(np.argsort(-sc[b, 1], kind="stable")[: budget[b]])
        np.testing.assert_array_equal(idx[b, 1][valid[b, 1]][: budget[b]], top)


def test_kv_group_sharing_equals_per_head_when_the_group_agrees():
    q, k, v = _inputs(5)
    q = jnp.repeat(q[:, :, ::2], 2, axis=2)  # heads 2g and 2g+1 equal: same scores
    head, aux_h = _call(q, k, v, **SPARSE)
    group, aux_g = _call(q, k, v, **{**SPARSE, "share": "kv_group"})
    np.testing.assert_array_equal(aux_h["indices"], aux_g["indices"])
    np.testing.assert_allclose(group, head, atol=1e-6)
    q2, _, _ = _inputs(6)  # heads disagree: one shared selection per group
    _, aux = _call(q2, k, v, **{**SPARSE, "share": "kv_group"})
    np.testing.assert_array_equal(aux["indices"][:, 0], aux["indices"][:, 1])


def test_jit_vmap_grad():
    q, k, v = _inputs(7, b=2)
    opts = dict(SPARSE)
    jitted, aux = _call(q, k, v, **opts)
    idx, valid = np.asarray(aux["indices"]), np.asarray(aux["valid"])
    np.testing.assert_allclose(jitted, np_restricted(q, k, v, idx, valid), atol=2e-5)
    fn = functools.partial(token_sparse_attention, causal=True, **opts)  # as _call
    scales = jnp.array([1.0, 0.5])[:, None, None, None, None]
    stacked = jax.jit(jax.vmap(fn))(q[None] * scales, k[None].repeat(2, 0),
                                    v[None].repeat(2, 0))
    np.testing.assert_allclose(stacked[0], jitted, atol=1e-6)
    np.testing.assert_allclose(stacked[1], _call(q * 0.5, k, v, **opts)[0], atol=1e-6)
    # grad: equals central finite differences of the float64 numpy restricted attention
    # (the selection is fixed: it carries no gradient) along random directions
    c = np.asarray(jax.random.normal(jax.random.key(9), (2, L, H, D)))
    grad_q, grad_v = jax.jit(jax.grad(lambda q_, v_: jnp.sum(fn(q_, k, v_) * c),
                                      argnums=(0, 1)))(q, v)
    qn, vn = np.asarray(q, np.float64), np.asarray(v, np.float64)
    eps = 1e-4
    for seed, grad, which in ((10, grad_q, "q"), (11, grad_v, "v")):
        direction = np.asarray(jax.random.normal(jax.random.key(seed), grad.shape))

        def loss(e, which=which, direction=direction):
            qq = qn + e * direction if which == "q" else qn
            vv = vn + e * direction if which == "v" else vn
            return np.sum(np_restricted(qq, k, vv, idx, valid) * c)

        np.testing.assert_allclose(np.sum(np.asarray(grad) * direction),
                                   (loss(eps) - loss(-eps)) / (2 * eps), rtol=1e-3)


def test_inner_entmax_equals_entmax_over_the_selected_tokens():
    q, k, v = _inputs(8, b=1)
    inner = dict(alpha=1.5, block_q=16, block_kv=16)
    out, aux = _call(q, k, v, **SPARSE, inner="entmax", inner_options=inner)
    idx, valid = np.asarray(aux["indices"]), np.asarray(aux["valid"])
    for b in range(1):
        for h in range(H):
            sel = idx[b, h][valid[b, h]]
            qs = q[b:b + 1, sel, h:h + 1]
            ks, vs = k[b:b + 1, sel, h // 2:h // 2 + 1], v[b:b + 1, sel, h // 2:h // 2 + 1]
            want = entmax_attention_reference(qs, ks, vs, alpha=1.5, causal=True)
            np.testing.assert_allclose(out[b, sel, h], want[0, :, 0], atol=2e-5)
            skipped = np.setdiff1d(np.arange(L), sel)
            assert np.all(np.asarray(out[b, skipped, h]) == 0.0)


def test_bad_options_raise_value_error():
    q, k, v = _inputs(0, b=1)
    for bad, match in ((dict(coverage=1.0), "coverage"), (dict(pool=4), "pool"),
                       (dict(window=0), "window"), (dict(capacity=0), "capacity"),
                       (dict(share="all"), "share"), (dict(inner=3), "inner"),
                       (dict(min_tokens=-1), "min_tokens")):
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(functools.partial(token_sparse_attention, **{**SPARSE, **bad}),
                           q, k, v)
    with pytest.raises(ValueError, match="window"):
        token_scores(q, k, window=L)


# ----------------------------------------------------------------------------
# layer choice and the model
# ----------------------------------------------------------------------------
def test_sparse_layers_rule():
    assert sparse_layers([0.3, 0.1, 0.5, 0.2]) == (1, 3)  # median 0.25
    assert sparse_layers([0.3, 0.1, 0.5, 0.2, 0.4]) == (0, 1, 3)  # at the median 0.3 too
    assert sparse_layers([0.3, 0.1, 0.5, 0.2], rule=0.0) == (1,)
    with pytest.raises(ValueError, match="rule"):
        sparse_layers([0.1], rule="mean")
    names, opts = layer_attention(3, (1,), sparse_options={"coverage": 0.1})
    assert names == ("softmax", "token_sparse", "softmax") and opts[1] == {"coverage": 0.1}


def test_drift_and_per_layer_attention_in_the_decoder():
    from lcjax.nn import DecoderConfig, DecoderLM

    base = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=8, mlp_hidden=64)
    tokens = jax.random.randint(jax.random.key(0), (2, 24), 0, 64)
    dense = DecoderLM(DecoderConfig(**base), rngs=nnx.Rngs(0))
    drift = drift_per_layer(dense, tokens)
    assert drift.shape == (2,) and np.all(drift > 0)
    # a block whose attention output and MLP output are zero does not move the stream
    dense.blocks[1].attn.o_proj[...] = jnp.zeros_like(dense.blocks[1].attn.o_proj[...])
    dense.blocks[1].mlp.w_down[...] = jnp.zeros_like(dense.blocks[1].mlp.w_down[...])
    drift = drift_per_layer(dense, tokens)
    assert drift[0] > 0 and drift[1] == 0.0
    assert sparse_layers(drift) == (1,)
    opts = {"window": 4, "min_tokens": 6, "coverage": 0.9, "pool": 3, "capacity": 10}
    names, options = layer_attention(2, (1,), sparse_options=opts)
    mixed = DecoderLM(DecoderConfig(**base, attention=names, attention_options=options),
                      rngs=nnx.Rngs(0))
    ref = DecoderLM(DecoderConfig(**base), rngs=nnx.Rngs(0))
    forward = nnx.jit(lambda m, t: m(t))
    short = tokens[:, :8]  # L <= min_tokens + window: dense
    want, want_short = forward(ref, tokens), forward(ref, short)
    # the same parameters; layer 1 sparse on 24 tokens, dense on 8
    assert float(jnp.max(jnp.abs(forward(mixed, tokens) - want))) > 1e-4
    np.testing.assert_allclose(forward(mixed, short), want_short, atol=1e-5)
    with pytest.raises(ValueError, match="attention"):
        DecoderConfig(**base, attention=("softmax",))


def test_bench_token_sparse_writes_its_report(tmp_path):
    from experiments.token_sparse.bench import TokenSparseBenchConfig, run_token_sparse_benchmark

    cfg = TokenSparseBenchConfig(seq_lens=(96,), coverages=(0.5,), heads=2, head_dim=16,
                                 window=8, min_tokens=16, pool=3, block=32, repeats=1,
                                 warmup=0, out_dir=str(tmp_path))
    result = run_token_sparse_benchmark(cfg, verbose=False)
    dense, sparse = result["rows"]
    assert dense["variant"] == "blockwise (dense)" and sparse["coverage"] == 0.5
    assert 0 < sparse["kept_fraction"] < 1 and sparse["budget"] < 96 - 8
    assert sparse["speedup"] == dense["median_s"] / sparse["median_s"]
    for name in ("token_sparse.json", "token_sparse.md", "token_sparse.png"):
        assert (tmp_path / name).stat().st_size > 0
