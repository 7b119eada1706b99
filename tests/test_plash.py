"""PLASH (lcjax/attention/plash.py, docs/plash.md): exactness without compression, error
trends, the sketch's unbiasedness, the certificate against the true deviation on
adversarial inputs, causality, float64 finite-difference gradients, the mask fallback,
bad options, and the model route."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from lcjax.attention import plash as P
from lcjax.attention.core import dot_product_attention


def _qkv(seed, b=2, t=21, s=27, h=4, hk=2, d=16, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (b, t, h, d), dtype), jax.random.normal(kk, (b, s, hk, d), dtype),
            jax.random.normal(kv, (b, s, hk, d), dtype))


def _clustered(seed, b, t, s, h, hk, d, centers, noise, qscale=1.0):
    """Keys near ``centers`` random centres (spread ``noise``); returns q, k, v and the
    centres [B, Hkv, centers, d] (used as prototypes)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(b, hk, centers, d)) * 1.5
    lab = rng.integers(0, centers, size=(b, s, hk))
    k = c[np.arange(b)[:, None, None], np.arange(hk)[None, None, :], lab]  # [B, S, Hkv, d]
    k = k + noise * rng.normal(size=k.shape)
    q = qscale * rng.normal(size=(b, t, h, d))
    v = rng.normal(size=(b, s, hk, d))
    return q, k, v, c


def test_no_compression_is_softmax():
    """M = N, prototypes = keys (also with duplicated keys): softmax attention to 1e-5."""
    for causal, (t, s) in ((False, (21, 27)), (True, (20, 27))):
        q, k, v = _qkv(1, t=t, s=s)
        k = k.at[:, 5].set(k[:, 3])  # duplicated keys
        protos = jnp.moveaxis(k, 1, 2)
        out, aux = jax.jit(functools.partial(P.plash_attention, causal=causal, chunk=8,
                                             return_aux=True))(q, k, v, protos)
        ref = jax.jit(functools.partial(dot_product_attention, causal=causal))(q, k, v)
        assert float(jnp.max(jnp.abs(out - ref))) < 1e-5, (causal, t, s)
        assert float(jnp.max(aux["certificate"])) < 1e-5


@functools.partial(jax.jit, static_argnames=("degree", "sketch_dim"))
def _mean_dev(q, k, v, protos, key, degree, sketch_dim):
    out = P.plash_attention(q, k, v, protos, key=key, degree=degree, sketch_dim=sketch_dim)
    return jnp.mean(jnp.linalg.norm(out - dot_product_attention(q, k, v), axis=-1))


def _err(q, k, v, protos, *, key=0, degree=2, sketch_dim=64):
    """Mean over rows of ‖PLASH − softmax‖₂ (non-causal; one compile per option set)."""
    return float(_mean_dev(q, k, v, protos, jax.random.key(key), degree, sketch_dim))


def test_error_falls_with_prototypes_degree_and_sketch_dim():
    with jax.enable_x64(True):
        # M: nested prototype sets drawn from the keys (M = N is exact)
        q, k, v = _qkv(2, b=2, t=16, s=64, h=2, hk=1, d=8, dtype=jnp.float64)
        perm = np.random.default_rng(0).permutation(64)
        protos_all = jnp.moveaxis(k[:, perm], 1, 2)
        errs_m = [_err(q, k, v, protos_all[:, :, :m], sketch_dim=64) for m in (4, 16, 64)]
        print("error vs M (4, 16, 64):", errs_m)
        assert all(a > b for a, b in zip(errs_m, errs_m[1:])), errs_m
        assert errs_m[-1] < 1e-10
        # degree and sketch_dim: tight clusters (a ~ 1), error averaged over sketch seeds
        q, k, v, c = _clustered(3, 2, 16, 96, 2, 1, 8, centers=4, noise=0.35)
        q, k, v, c = (jnp.asarray(x) for x in (q, k, v, c))
        protos = c[:, :, :, :]

        def mean_err(**kw):
            return np.mean([_err(q, k, v, protos, key=seed, **kw) for seed in range(4)])

        errs_p = [mean_err(degree=p, sketch_dim=1024) for p in (1, 2, 3)]
        print("error vs degree (1, 2, 3):", errs_p)
        assert errs_p[0] > errs_p[1] > errs_p[2], errs_p
        errs_d = [mean_err(degree=2, sketch_dim=dd) for dd in (2, 32)] + [errs_p[1]]
        print("error vs sketch_dim (2, 32, 1024):", errs_d)
        assert errs_d[0] > errs_d[1] > errs_d[2], errs_d


def test_sketch_is_unbiased_over_seeds():
    """Mean over 1,200 sketch draws of φⱼ(q)·mean φⱼ(r) (j = 1, 2, 3) and of the value
    term φ₁(q)·mean vᵢφ₁(rᵢ) within 3 standard errors of the exact (q·r)ʲ moments."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(4)
        d, n, dsk, seeds = 6, 5, 4, 1200
        qv = rng.normal(size=d) * 0.8
        r = rng.normal(size=(n, d)) * 0.7
        val = rng.normal(size=(n, 3))
        exact = [np.mean((r @ qv) ** j) for j in (1, 2, 3)]
        exact_v = (val * (r @ qv)[:, None]).mean(0)

        def one(seed):
            w = P.plash_sketch(jax.random.key(seed), 3, dsk, d, jnp.float64)
            fq = P.polynomial_features(jnp.asarray(qv), w, 3)
            fr = P.polynomial_features(jnp.asarray(r), w, 3)
            moments = jnp.stack([fq[j] @ fr[j].mean(0) for j in range(3)])
            value = jnp.einsum("D,nv,nD->v", fq[0], jnp.asarray(val), fr[0]) / n
            return moments, value

        est, est_v = jax.jit(jax.vmap(one))(jnp.arange(seeds))
        est, est_v = np.asarray(est), np.asarray(est_v)
        for j in range(3):
            se = est[:, j].std(ddof=1) / math.sqrt(seeds)
            assert abs(est[:, j].mean() - exact[j]) < 3 * se, (j, est[:, j].mean(), exact[j], se)
            assert est[:, j].std() > 0  # really random
        se_v = est_v.std(0, ddof=1) / math.sqrt(seeds)
        assert np.all(np.abs(est_v.mean(0) - exact_v) < 3 * se_v), (est_v.mean(0), exact_v)


def _cases():
    """Adversarial inputs (float64 numpy), 16 batch elements each, stacked on the batch
    axis: q, k, v, prototypes [B, Hkv, 4, d] and a key mask [B, 1, 1, S]."""
    rng = np.random.default_rng(5)
    b, t, s, h, hk, d = 24, 12, 24, 2, 1, 8
    fams = []
    default = lambda k: np.asarray(P.default_prototypes(jnp.asarray(k), 4, causal=False, chunk=s))
    first = lambda k: np.asarray(P.default_prototypes(jnp.asarray(k), 4, causal=True, chunk=5))
    ones = np.ones((b, 1, 1, s), bool)
    for scale in (0.1, 1.0, 3.0, 10.0):
        q, k, v = (rng.normal(size=sh) for sh in ((b, t, h, d), (b, s, hk, d), (b, s, hk, d)))
        fams.append((q * scale, k * scale, v, default(k * scale), first(k * scale), ones))
    q, k, v, c = _clustered(6, b, t, s, h, hk, d, centers=4, noise=0.2)
    fams.append((q, k, v, c, c, ones))                               # clustered
    fams.append((q * 8, k, v, c, c, ones))                           # clustered, large q
    qp = np.repeat(k[:, :1, :1], h, axis=2) * 20 + 0.01 * rng.normal(size=(b, 1, h, d))
    fams.append((np.repeat(qp, t, 1), k, v, c, c, ones))             # peaked queries
    ko, vo = k.copy(), v.copy()
    ko[:, 7] *= 50.0
    vo[:, 7] *= 30.0
    fams.append((q, ko, vo, c, c, ones))                             # outlier key and value
    kd = np.repeat(k[:, :3], s // 3, axis=1)
    fams.append((q, kd, v, default(kd), first(kd), ones))            # duplicated keys
    ql, kl, vl = q * 30, k * 30, v * 1e3
    fams.append((ql, kl, vl, default(kl), first(kl), ones))          # large norms
    few = np.zeros((b, 1, 1, s), bool)
    few[np.arange(b), 0, 0, rng.integers(0, s, size=b)] = True       # one or two keys visible
    few[np.arange(b // 2), 0, 0, rng.integers(0, s, size=b // 2)] = True
    fams.append((q, k, v, default(k), first(k), few))                # near-empty key mask
    return [np.concatenate(x) for x in zip(*fams)]


def test_certificate_bounds_true_deviation_on_adversarial_inputs():
    """≥ 2,000 inputs (24 batch elements of each of 11 adversarial families — random at four scales,
    clustered, large queries, peaked queries, outlier keys/values, duplicated keys, large
    norms, near-empty key masks — each with 12 query rows × 2 heads, causal and not, two
    (degree, sketch_dim) settings and two sketch seeds): the certificate is ≥
    ‖PLASH − softmax‖₂ on every row (float64; 1e-9 relative rounding slack)."""
    n_inputs, ratios = 0, []
    with jax.enable_x64(True):
        q, k, v, protos, protos_causal, mask = (jnp.asarray(x) for x in _cases())
        slack = 1e-9 * (1 + float(jnp.max(jnp.abs(v))))
        for causal in (False, True):
            ref = dot_product_attention(q, k, v, causal=causal, mask=mask)
            for degree, dsk in ((1, 4), (3, 16)):
                for seed in range(2):
                    out, aux = P.plash_attention(q, k, v, protos_causal if causal else protos,
                                                 causal=causal, chunk=5, degree=degree,
                                                 sketch_dim=dsk, mask=mask, key=seed,
                                                 return_aux=True)
                    dev = np.asarray(jnp.linalg.norm(out - ref, axis=-1))
                    cert = np.asarray(aux["certificate"], np.float64)
                    bad = dev > cert + slack
                    assert not bad.any(), (causal, degree, np.argwhere(bad)[:5], dev[bad][:5],
                                           cert[bad][:5])
                    live = dev > 1e-8
                    ratios.extend((cert[live] / dev[live]).tolist())
                    n_inputs += q.shape[0]
    assert n_inputs >= 2000
    print(f"certificate: {n_inputs} inputs, {len(ratios)} rows with deviation > 1e-8; "
          f"tightness (certificate / deviation) median {np.median(ratios):.2f}, "
          f"quartiles {np.percentile(ratios, 25):.2f} / {np.percentile(ratios, 75):.2f}")
    assert np.median(ratios) < 50  # a bound that says something


def test_causality():
    """Changing k, v after position t changes no output (nor certificate) at or before t,
    for default (first-chunk) and explicit prototypes."""
    q, k, v = _qkv(7, b=1, t=26, s=26)
    protos = jax.random.normal(jax.random.key(9), (1, 2, 4, 16))
    for t in (2, 7, 8, 13, 19):
        k2 = k.at[:, t + 1:].set(jax.random.normal(jax.random.key(t), k[:, t + 1:].shape) * 3)
        v2 = v.at[:, t + 1:].set(-v[:, t + 1:] + 1.0)
        for kw in ({"num_prototypes": 4}, {"prototypes": protos}):
            a, aa = P.plash_attention(q, k, v, causal=True, chunk=6, return_aux=True, **kw)
            b, ba = P.plash_attention(q, k2, v2, causal=True, chunk=6, return_aux=True, **kw)
            assert np.array_equal(np.asarray(a[:, : t + 1]), np.asarray(b[:, : t + 1])), t
            assert np.array_equal(np.asarray(aa["certificate"][:, : t + 1]),
                                  np.asarray(ba["certificate"][:, : t + 1])), t
            assert not np.allclose(np.asarray(a[:, t + 2:]), np.asarray(b[:, t + 2:]))


def test_gradients_match_finite_differences_float64():
    with jax.enable_x64(True):
        q, k, v = _qkv(8, b=1, t=10, s=13, h=2, hk=1, d=4, dtype=jnp.float64)
        protos = jax.random.normal(jax.random.key(3), (1, 3, 4), jnp.float64)
        w = jax.random.normal(jax.random.key(4), (1, 10, 2, 4), jnp.float64)
        for causal in (False, True):
            def f(q, k, v, p, causal=causal):
                out = P.plash_attention(q, k, v, p, causal=causal, chunk=4, sketch_dim=6,
                                        degree=2)
                return jnp.sum(out * w)
            # jitted: two compiles (primal, VJP) instead of op-by-op dispatch of every call
            check_grads(jax.jit(f), (q, k, v, protos), order=1, modes=("rev",),
                                      eps=1e-6, atol=1e-6, rtol=1e-6)


def test_per_query_mask_falls_back_to_exact_with_zero_certificate():
    q, k, v = _qkv(10)
    mask = jax.random.bernoulli(jax.random.key(1), 0.6, (2, 4, 21, 27))
    out, aux = P.plash_attention(q, k, v, num_prototypes=4, mask=mask, return_aux=True)
    ref = dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    assert float(jnp.max(aux["certificate"])) == 0.0
    # a key-only mask is native: different from the exact result, and masked keys unused
    keymask = jnp.arange(27) < 20
    out2 = P.plash_attention(q, k, v, num_prototypes=4, mask=keymask[None, None, None])
    k_changed = k.at[:, 20:].set(100.0)
    out4 = P.plash_attention(q, k_changed, v.at[:, 20:].set(5.0), num_prototypes=4,
                             mask=keymask[None, None, None],
                             prototypes=P.default_prototypes(k, 4, causal=False, chunk=27))
    out5 = P.plash_attention(q, k, v, num_prototypes=4, mask=keymask[None, None, None],
                             prototypes=P.default_prototypes(k, 4, causal=False, chunk=27))
    np.testing.assert_allclose(out4, out5, atol=1e-6)
    assert float(jnp.max(jnp.abs(out2 - dot_product_attention(q, k, v, mask=keymask)))) > 1e-3


def test_degree_zero_is_plain_prototype_attention():
    """degree=0 (no enrichment): every query attends by softmax over clusters with logits
    log n_m + s q·p_m to the clusters' value means (computed here from the nearest-prototype
    assignment); causal, the XLA path equals the slow reference; the certificate bounds the
    true deviation from softmax on every row."""
    q, k, v, c = _clustered(3, b=2, t=9, s=23, h=4, hk=2, d=8, centers=5, noise=0.4)
    q, k, v, c = (jnp.asarray(x, jnp.float32) for x in (q, k, v, c))
    out, aux = P.plash_attention(q, k, v, c, degree=0, return_aux=True)
    qn, kn, vn, cn = (np.asarray(x, np.float64) for x in (q, k, v, c))
    ref = np.zeros_like(qn)
    for b in range(2):
        for h in range(4):
            g = h // 2  # GQA: heads 0, 1 -> KV head 0
            lab = np.argmin(((kn[b, :, g, None] - cn[b, g][None]) ** 2).sum(-1), -1)
            n = np.bincount(lab, minlength=5)
            u = np.stack([vn[b, lab == m, g].mean(0) if n[m] else np.zeros(8)
                          for m in range(5)])
            logit = np.where(n > 0, np.log(np.maximum(n, 1)) + qn[b, :, h] @ cn[b, g].T
                             / math.sqrt(8), -np.inf)
            p = np.exp(logit - logit.max(-1, keepdims=True))
            ref[b, :, h] = (p / p.sum(-1, keepdims=True)) @ u
    np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5)
    exact = np.asarray(dot_product_attention(q, k, v))
    dev = np.linalg.norm(np.asarray(out) - exact, axis=-1)
    assert (dev <= np.asarray(aux["certificate"]) + 1e-5).all()
    assert float(np.max(dev)) > 1e-3  # a real approximation, not softmax
    qc, kc, vc = _qkv(4, t=20, s=20)
    protos = P.default_prototypes(kc, 4, causal=True, chunk=8)
    fast, fa = P.plash_attention(qc, kc, vc, protos, degree=0, causal=True, chunk=8,
                                 return_aux=True)
    slow, sa = P.plash_reference(qc, kc, vc, prototypes=protos, degree=0, causal=True,
                                 chunk=8, return_certificate=True)
    np.testing.assert_allclose(fast, slow, atol=1e-5)
    np.testing.assert_allclose(fa["certificate"], sa["certificate"], atol=1e-4)
    dev = np.linalg.norm(np.asarray(fast - dot_product_attention(qc, kc, vc, causal=True)), axis=-1)
    assert (dev <= np.asarray(fa["certificate"]) + 1e-5).all()


@pytest.mark.parametrize("bad, match", [
    ({"prototypes": jnp.zeros((3, 4, 16))}, "prototypes"),
    ({"prototypes": jnp.zeros((2, 4, 8))}, "prototypes"),
    ({"num_prototypes": 4, "degree": -1}, "degree"),
    ({"num_prototypes": 4, "degree": 9}, "degree"),
    ({"num_prototypes": 4, "sketch_dim": 0}, "sketch_dim"),
    ({"num_prototypes": 4, "chunk": 0}, "chunk"),
    ({}, "num_prototypes"),
    ({"num_prototypes": 5, "prototypes": jnp.zeros((2, 4, 16))}, "num_prototypes"),
])
def test_bad_options_raise_value_error_before_compiling(bad, match):
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(lambda q, k, v: P.plash_attention(q, k, v, **bad), q, k, v)


def test_decoder_with_learned_prototypes_trains():
    from lcjax.nn import DecoderConfig, DecoderLM
    cfg = DecoderConfig(vocab_size=32, d_model=32, num_heads=4, num_kv_heads=2, num_layers=1,
                        head_dim=8,
                        attention="plash",
                        attention_options={"num_prototypes": 4, "chunk": 8, "sketch_dim": 8})
    model = DecoderLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, 20), 0, 32)

    def loss(model):
        logits = model(tokens[:, :-1])
        return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    grads = nnx.jit(nnx.grad(loss))(model)  # one compile, not op-by-op dispatch
    g = grads.blocks[0].attn.variant_params.prototypes[...]
    p = model.blocks[0].attn.variant_params.prototypes[...]
    assert g.shape == p.shape == (2, 4, 8)
    assert float(jnp.abs(g).max()) > 0  # the prototypes are trained
