"""lcjax.analysis.probes: ridge probe vs lstsq and R² limits; head ablation vs a hand-written
forward pass with that head's output zeroed (MHA and GQA); attention mass vs hand weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.analysis.probes import (
    ablate_heads,
    attention_layers,
    attention_mass,
    hidden_features,
    linear_probe,
    r2_score,
    ridge_fit,
)
from lcjax.nn import DecoderConfig, DecoderLM
from lcjax.nn.layers import rms_norm
from lcjax.rope import apply_rope

# --- probes ----------------------------------------------------------------------------------


def test_ridge_at_zero_equals_lstsq():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 5))
    y = rng.normal(size=(60, 2))
    design = np.concatenate([x, np.ones((60, 1))], 1)
    ref = np.linalg.lstsq(design, y, rcond=None)[0]
    for ridge in (0.0, 1e-10):
        w, b = ridge_fit(x, y, ridge=ridge)
        np.testing.assert_allclose(w, ref[:5], atol=1e-7)
        np.testing.assert_allclose(b, ref[5], atol=1e-7)
    # a positive ridge: the normal equations of the penalised objective hold
    w, b = ridge_fit(x, y, ridge=3.0)
    resid = y - x @ w - b
    np.testing.assert_allclose(x.T @ resid, 3.0 * w, atol=1e-8)
    np.testing.assert_allclose(resid.sum(0), 0.0, atol=1e-8)


def test_r2_linear_target_and_shuffled():
    rng = np.random.default_rng(1)
    n, d = 2000, 8
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=d) + 0.5 + 0.01 * rng.normal(size=n)
    good = linear_probe(x, y, ridge=1e-6)
    assert good.r2 > 0.999 and good.n_test == 500 and good.n_train == 1500
    shuffled = linear_probe(x, rng.permutation(y), ridge=1e-6)
    # E[R²] ≈ -(d + 1) / n_train for independent targets; allow a few standard errors
    assert abs(shuffled.r2) < 10 * (d + 1) / 1500, shuffled.r2
    assert shuffled.train_r2 > shuffled.r2  # in-sample fit is optimistic
    folds = linear_probe(x, rng.permutation(y), ridge=1e-6, folds=5)
    assert abs(folds.r2) < 10 * (d + 1) / 1600 and folds.n_test == n


def test_group_split_and_r2_by_hand():
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(20), 5)
    x = rng.normal(size=(100, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=100)
    res = linear_probe(x, y, groups=groups, test_fraction=0.25)
    assert res.n_test == 25 and res.r2 > 0.95
    from lcjax.analysis.probes import _splits
    (tr, te), = _splits(100, groups, 0.25, None, 0)
    assert not set(groups[tr]) & set(groups[te])
    t, p = np.array([1.0, 2.0, 3.0]), np.array([1.5, 2.0, 2.0])
    assert r2_score(t, p) == pytest.approx(1 - (0.25 + 1.0) / 2.0)


def test_probe_value_errors():
    x = np.zeros((10, 2))
    with pytest.raises(ValueError, match="targets"):
        linear_probe(x, np.zeros(9))
    with pytest.raises(ValueError, match="features"):
        linear_probe(np.zeros(10), np.zeros(10))
    with pytest.raises(ValueError, match="ridge"):
        ridge_fit(x, np.zeros(10), ridge=-1.0)
    with pytest.raises(ValueError, match="folds"):
        linear_probe(x, np.zeros(10), folds=11)
    with pytest.raises(ValueError, match="test_fraction"):
        linear_probe(x, np.zeros(10), test_fraction=1.5)


# --- heads: a hand-written forward pass --------------------------------------------------------


def _config(kv_heads):
    return DecoderConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=4,
                         num_kv_heads=kv_heads, head_dim=8, mlp_hidden=24)


@pytest.fixture(scope="module", params=[4, 2], ids=["mha", "gqa"])
def model(request):
    return DecoderLM(_config(request.param), rngs=nnx.Rngs(7))


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(np.random.default_rng(3).integers(0, 32, (2, 9)), jnp.int32)


def _by_hand(model, tokens, zero=()):
    """Logits and per-layer softmax weights, computed from the parameters, with the output
    o_h of each (layer, head) in ``zero`` set to 0 before the output projection."""
    c = model.config
    b, t = tokens.shape
    pos = jnp.arange(t)
    x = model.embed[...][tokens]
    causal = jnp.tril(jnp.ones((t, t), bool))
    all_w = []
    for li, blk in enumerate(model.blocks):
        a = blk.attn
        h = rms_norm(x, blk.attn_norm.scale[...], eps=c.norm_eps)
        q = jnp.einsum("btd,dnh->btnh", h, a.q_proj[...])
        k = jnp.einsum("btd,dkh->btkh", h, a.k_proj[...])
        v = jnp.einsum("btd,dkh->btkh", h, a.v_proj[...])
        q, k = apply_rope(q, pos, base=c.rope_base), apply_rope(k, pos, base=c.rope_base)
        group = c.num_heads // c.num_kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)  # head n <- n // g
        s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(c.head_dim)
        w = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
        all_w.append(w)
        o = jnp.einsum("bnts,bsnh->btnh", w, v)
        for lz, hz in zero:
            if lz == li:
                o = o.at[:, :, hz].set(0.0)
        x = x + jnp.einsum("btnh,nhd->btd", o, a.o_proj[...])
        x = x + blk.mlp(blk.mlp_norm(x))
    return model.logits(model.final_norm(x)), all_w


def test_hand_forward_matches_model(model, tokens):
    logits, _ = _by_hand(model, tokens)
    np.testing.assert_allclose(logits, model(tokens), atol=1e-5)


@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 3), (0, 2)]])
def test_ablation_equals_zeroed_head(model, tokens, heads):
    before = np.asarray(model(tokens))
    ablated = ablate_heads(model, heads)
    ref, _ = _by_hand(model, tokens, zero=heads)
    got = np.asarray(ablated(tokens))
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert np.abs(got - before).max() > 1e-3  # the ablation changed something
    np.testing.assert_array_equal(np.asarray(model(tokens)), before)  # original untouched


def test_attention_mass_and_features(model, tokens):
    _, w = _by_hand(model, tokens)
    w = np.stack([np.asarray(x) for x in w], axis=1)  # [B, L, H, T, T]
    rng = np.random.default_rng(4)
    qm = rng.random(tokens.shape) < 0.5
    qm[:, -1] = True
    km = rng.random(tokens.shape) < 0.5
    got = attention_mass(model, tokens, qm, km)
    for b in range(tokens.shape[0]):
        ref = w[b][:, :, qm[b]][..., km[b]].sum(-1).mean(-1)
        np.testing.assert_allclose(got[b], ref, atol=1e-5)
    feats = hidden_features(model, tokens, [[1, 4], [8, 0]], layer=2)
    hs = model.hidden_states(tokens)[2]
    # two separately compiled paths: equal up to float32 rounding (1.3e-6 seen on CI)
    np.testing.assert_allclose(feats[1, 0], hs[1, 8], atol=1e-5)
    np.testing.assert_allclose(feats[0, 1], hs[0, 4], atol=1e-5)
    assert len(attention_layers(model)) == 2


def test_head_value_errors(model, tokens):
    with pytest.raises(ValueError, match="outside"):
        ablate_heads(model, [(2, 0)])
    with pytest.raises(ValueError, match="outside"):
        ablate_heads(model, [(0, 4)])
    with pytest.raises(ValueError, match="layer"):
        hidden_features(model, tokens, [0], layer=3)
    with pytest.raises(ValueError, match="positions"):
        hidden_features(model, tokens, [9], layer=0)
    with pytest.raises(ValueError, match="query"):
        attention_mass(model, tokens, np.zeros(tokens.shape, bool), np.ones(tokens.shape, bool))
