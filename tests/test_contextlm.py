"""ContextLM (lcjax.nn.contextlm): strict causality at and inside chunk boundaries, cached
decoding = the full pass, the base LM exactly when the branch is off, the context loss
against a slow per-chunk reference, training with resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax import data
from lcjax.nn import ContextLMConfig, DecoderConfig, DecoderLM, generate
from lcjax.nn.contextlm import chunk_embeddings, context_pair_loss, feedback_index
from lcjax.train import TrainConfig, context_lm_loss, nll_loss, train

C = 4
BASE = DecoderConfig(vocab_size=data.VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=16, mlp_hidden=64, max_len=32)
CTX = dataclasses.replace(BASE, context_lm=ContextLMConfig(chunk=C, weight=0.5))
T = 18  # chunks 0..3 complete, chunk 4 partial; one length: the tests share one compile
_fwd = nnx.jit(lambda m, x: m(x))


def _model(cfg=CTX, seed=0, feedback=True):
    """A ContextLM with a random (nonzero) feedback W_f, so that the branch matters."""
    m = DecoderLM(cfg, rngs=nnx.Rngs(seed))
    if feedback and m.context_lm is not None:
        d = cfg.d_model
        m.context_lm.w_feedback[...] = jax.random.normal(jax.random.key(seed + 7), (d, d)) * 0.5
    return m


def _tokens(b, t, seed=1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, data.VOCAB_SIZE, jnp.int32)


def test_strictly_causal_at_and_inside_chunk_boundaries():
    model = _model()
    t_len = T
    tok = _tokens(2, t_len)
    fwd = _fwd
    full = np.asarray(fwd(model, tok))
    # t = 3, 7 (a chunk's last token: sees its own chunk's prediction), 4, 8 (a chunk's first
    # token), 5, 10 (inside a chunk), 15 (last complete chunk), 16 (partial chunk)
    for t in (3, 4, 5, 7, 8, 10, 15, 16):
        other = tok.at[:, t + 1:].set(_tokens(2, t_len - t - 1, seed=100 + t))
        changed = np.asarray(fwd(model, other))
        np.testing.assert_array_equal(changed[:, :t + 1], full[:, :t + 1], err_msg=f"t={t}")
        assert np.abs(changed[:, t + 1:] - full[:, t + 1:]).max() > 1e-3, t
    # the branch matters: the same model without feedback gives other logits from chunk 0's
    # last token on, and the same before it (m(t) < 0 for t < C - 1)
    off = _model(feedback=False)  # W_f = 0: the base LM (test below), same compiled program
    plain = np.asarray(fwd(off, tok))
    np.testing.assert_allclose(full[:, :C - 1], plain[:, :C - 1], rtol=0, atol=1e-5)
    assert np.abs(full[:, C - 1:] - plain[:, C - 1:]).max() > 1e-2


def test_feedback_index_and_chunk_means_match_a_loop():
    m = np.asarray(feedback_index(13, C))
    ref = [(t + 1) // C - 1 for t in range(13)]  # the last token of chunk j gets ĉ_j
    np.testing.assert_array_equal(m, ref)
    u = jax.random.normal(jax.random.key(3), (2, 10, 5))
    valid = jnp.asarray(np.random.default_rng(0).random((2, 10)) > 0.3)
    c, count = chunk_embeddings(u, C, valid)
    un, vn = np.asarray(u, np.float64), np.asarray(valid)
    for b in range(2):
        for j in range(3):
            sel = vn[b, j * C:(j + 1) * C]
            rows = un[b, j * C:(j + 1) * C][sel]
            assert count[b, j] == sel.sum()
            want = rows.mean(0) if len(rows) else np.zeros(5)
            np.testing.assert_allclose(c[b, j], want, rtol=1e-5, atol=1e-6)


def test_cached_decoding_token_by_token_equals_full_pass_and_generate():
    model = _model()
    t_len = T
    tok = _tokens(2, t_len, seed=5)
    fwd = _fwd
    full = np.asarray(fwd(model, tok))
    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    # prefill 6 tokens (crosses the chunk boundary at 4), then one token at a time
    cache = model.init_cache(2, T)
    logits, cache = step(model, tok[:, :6], cache)
    outs = [logits]
    for i in range(6, t_len):
        logits, cache = step(model, tok[:, i:i + 1], cache)
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-5, atol=2e-5)
    state = cache[-1]
    assert int(state.index) == t_len and int(state.pred_cache[0].index) == t_len // C
    # generate (prefill + while loop through the cache): its log-probs are the full pass's
    out = generate(model, tok[:, :5], t_len - 4, return_logprobs=True)
    seq = out.tokens  # [2, t_len + 1]
    logp = jax.nn.log_softmax(fwd(model, seq[:, :-1]), axis=-1)
    want = jnp.take_along_axis(logp[:, 4:], seq[:, 5:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(out.logprobs, want, rtol=1e-4, atol=1e-4)


def test_off_and_zero_weight_is_the_base_lm_exactly():
    tok = _tokens(2, T + 1, seed=9)
    base = DecoderLM(BASE, rngs=nnx.Rngs(0))
    fresh = DecoderLM(CTX, rngs=nnx.Rngs(0))  # W_f = 0 at initialisation
    # the base parameters are the same (the branch's are created last) ...
    base_state = nnx.state(base, nnx.Param).flat_state()
    ctx_state = dict(nnx.state(fresh, nnx.Param).flat_state())
    assert all(k in ctx_state for k, _ in base_state)
    for k, v in base_state:
        np.testing.assert_array_equal(np.asarray(v.get_value()),
                                      np.asarray(ctx_state[k].get_value()))
    assert any(k[0] == "context_lm" for k in ctx_state)
    # ... and with the feedback at zero the logits are bit for bit the base LM's
    np.testing.assert_array_equal(np.asarray(_fwd(fresh, tok[:, :-1])),
                                  np.asarray(_fwd(base, tok[:, :-1])))
    # λ = 0: the loss hook is exactly nll_loss and so are its gradients; a base model
    # (branch removed) gets nll_loss too
    batch = {"inputs": tok[:, :-1], "targets": tok[:, 1:]}
    zero = DecoderLM(dataclasses.replace(CTX, context_lm=dataclasses.replace(
        CTX.context_lm, weight=0.0)), rngs=nnx.Rngs(0))

    @nnx.jit
    def both(m):
        vg = lambda fn: nnx.value_and_grad(lambda m: fn(m, batch, None)[0])(m)
        return vg(context_lm_loss), vg(nll_loss)

    (l0, g0), (lb, gb) = both(zero)
    assert float(l0) == float(lb)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(gb)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    lc, ln = nnx.jit(lambda m: (context_lm_loss(m, batch)[0], nll_loss(m, batch)[0]))(base)
    assert float(lc) == float(ln)


def test_pair_losses_match_their_formulas():
    p, c = (np.random.default_rng(s).normal(size=(3, 7)) for s in (0, 1))
    np.testing.assert_allclose(context_pair_loss(p, c, "mse"), ((p - c) ** 2).mean(-1),
                               rtol=1e-5)
    cos = (p * c).sum(-1) / np.linalg.norm(p, axis=-1) / np.linalg.norm(c, axis=-1)
    np.testing.assert_allclose(context_pair_loss(p, c, "cosine"), 1 - cos, rtol=1e-5)
    np.testing.assert_allclose(context_pair_loss(2.5 * c, c, "cosine"), 0.0, atol=1e-6)


def test_context_loss_matches_a_reference_and_stops_the_target_gradient():
    model = _model()
    t_len = 15  # 3 complete chunks -> 2 pairs per row
    tok = _tokens(2, t_len, seed=11)
    seg = jnp.ones((2, t_len), jnp.int32).at[1, 9:].set(-1)  # row 1: chunk 2 partly padding
    batch = {"inputs": tok, "targets": jnp.roll(tok, -1, 1), "segment_ids": seg}
    valid = np.asarray(seg >= 0, np.float32)
    pos = jnp.broadcast_to(jnp.arange(t_len), (2, t_len))

    def chunks(m):  # reference pooling, chunk by chunk: h after block 0 (k = 1)
        h, _ = m.blocks[0](jnp.take(m.embed[...], tok, axis=0), pos, segment_ids=seg)
        u = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + BASE.norm_eps)
        return jnp.stack([(u[:, j * C:(j + 1) * C] * valid[:, j * C:(j + 1) * C, None]).sum(1)
                          / valid[:, j * C:(j + 1) * C].sum(1)[:, None] for j in range(3)], 1)

    def reference(m, target):  # mean over the 4 pairs of mean_d (ĉ_j - c_{j+1})²
        pred = m.context_lm.predict(chunks(m), jnp.broadcast_to(jnp.arange(3), (2, 3)))[0]
        return jnp.mean((pred[:, :2] - target[:, 1:]) ** 2)

    @nnx.jit
    def run(m):
        loss, mets = context_lm_loss(m, batch)
        ours = lambda m: m(tok, segment_ids=seg, return_aux=True)[1]["context_loss"][0]
        const = jax.lax.stop_gradient(chunks(m))
        return (loss, mets, reference(m, const), nnx.grad(ours)(m),
                nnx.grad(lambda m: reference(m, const))(m),  # target a constant
                nnx.grad(lambda m: reference(m, chunks(m)))(m))  # target not stopped

    loss, mets, ref, g, g_const, g_live = run(model)
    ctx, pairs = (float(x) for x in mets["context_loss"])
    assert pairs == 4
    np.testing.assert_allclose(ctx, float(ref), rtol=1e-5)
    assert float(loss) == pytest.approx(float(mets["nll"][0]) + 0.5 * ctx, rel=1e-6)
    # no gradient through the target: ours = the gradient with the target as a constant
    # (block 0 still gets gradient through the predictor's inputs), unlike the live target
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_const)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    w_g, w_live = (np.asarray(x["blocks"][0]["mlp"]["w_up"][...]) for x in (g, g_live))
    assert np.abs(w_g).max() > 0 and np.abs(w_g - w_live).max() > 1e-3 * np.abs(w_g).max()


def test_trains_through_the_loop_with_exact_resume(tmp_path):
    docs = [bytes(np.random.default_rng(i).integers(97, 123, 300).astype(np.uint8)).decode()
            for i in range(4)]
    cfg = TrainConfig(steps=4, batch_size=2, seq_len=16, lr=1e-2, warmup_steps=1,
                      log_every=1, eval_batches=0, progress=False)
    kw = dict(train_docs=docs[:3], eval_docs=docs[3:], loss_fn=context_lm_loss)
    full = train(CTX, dataclasses.replace(cfg, out_dir=str(tmp_path / "a")), **kw)
    first = train(CTX, dataclasses.replace(cfg, out_dir=str(tmp_path / "b")), stop_at=2, **kw)
    rest = train(CTX, dataclasses.replace(cfg, out_dir=str(tmp_path / "b"), resume=True), **kw)
    strip = lambda h: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in h]
    assert strip(first.history + rest.history) == strip(full.history)
    assert {"nll", "context_loss"} <= set(full.history[0])
    assert all(r["context_loss"] > 0 for r in full.history)
    for r in full.history:  # the logged loss is CE + λ L_ctx
        assert r["loss"] == pytest.approx(r["nll"] + 0.5 * r["context_loss"], rel=1e-5)
    assert full.history[-1]["loss"] < full.history[0]["loss"]


def test_value_errors():
    for bad, match in [(dict(chunk=0), "chunk"), (dict(weight=-1.0), "weight"),
                       (dict(loss="l1"), "loss"), (dict(predictor_layers=0), "predictor")]:
        with pytest.raises(ValueError, match=match):
            ContextLMConfig(**bad)
    with pytest.raises(ValueError, match="layer"):
        dataclasses.replace(BASE, context_lm=ContextLMConfig(chunk=4, layer=2))
    with pytest.raises(ValueError, match="layer"):
        dataclasses.replace(BASE, num_layers=1, context_lm=ContextLMConfig(chunk=4))
    with pytest.raises(ValueError, match="ContextLMConfig"):
        dataclasses.replace(BASE, context_lm={"chunk": 4})
    model = _model(feedback=False)
    with pytest.raises(ValueError, match="ContextLM state"):
        model(_tokens(1, 2), cache=model.init_cache(1, 8)[:-1])
