"""Token-sparse attention through the user paths (issue 36, items 1-3): ragged rows are
sparse per row, ``generate`` prefills with the method, and ``load_hf`` puts every variant
with parameters of its own on pretrained weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lcjax.attention import registry
from lcjax.attention.token_sparse import token_sparse_attention
from lcjax.interop.hf import load_hf, save_hf
from lcjax.nn import DecoderConfig, DecoderLM, generate
from lcjax.nn.pretrained import variant_param_paths

SPARSE = {"coverage": 0.3, "min_tokens": 6, "window": 4, "pool": 3, "block_kv": 8}
BASE = dict(vocab_size=40, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
            mlp_hidden=48, max_len=64)


def _qkv(b, length, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (b, length, 4, 8))
    k = jax.random.normal(ks[1], (b, length, 2, 8))
    v = jax.random.normal(ks[2], (b, length, 2, 8))
    return q, k, v


@pytest.mark.parametrize(("share", "how"), [("head", "segments"), ("kv_group", "mask")])
def test_padded_batch_is_sparse_per_row(share, how):
    """A right-padded batch equals each row computed alone (its own length, no padding),
    the rows are sparse (not dense), and padding positions get 0."""
    q, k, v = _qkv(3, 40)
    lens = np.array([40, 31, 22])
    seg = jnp.where(jnp.arange(40)[None] < lens[:, None], 0, -1)
    kw = (dict(q_segment_ids=seg, kv_segment_ids=seg) if how == "segments"
          else dict(mask=(seg >= 0)[:, None, None, :]))
    call = jax.jit(lambda q, k, v, kw: token_sparse_attention(
        q, k, v, causal=True, share=share, return_aux=True, **kw, **SPARSE))
    out, aux = call(q, k, v, kw)
    assert not np.any(aux["dense"])
    dense = token_sparse_attention(q, k, v, causal=True, coverage=0.0, **kw)
    for i, n in enumerate(lens):
        alone, a = token_sparse_attention(q[i:i + 1, :n], k[i:i + 1, :n], v[i:i + 1, :n],
                                          causal=True, share=share, return_aux=True, **SPARSE)
        np.testing.assert_allclose(out[i, :n], alone[0], atol=2e-6)
        assert int(aux["budget"][i]) == int(a["budget"][0])
        assert np.max(np.abs(out[i, :n] - dense[i, :n])) > 1e-2  # really sparse
        if how == "segments":
            np.testing.assert_array_equal(out[i, n:], 0.0)


def test_short_and_decode_calls_warn_and_record_dense():
    from lcjax.attention import token_sparse as ts

    ts._WARNED.clear()
    q, k, v = _qkv(1, 12)
    with pytest.warns(UserWarning, match="min_tokens"):
        _, aux = token_sparse_attention(q, k, v, return_aux=True, min_tokens=1024)
    assert bool(aux["dense"][0])
    with pytest.warns(UserWarning, match="decoding"):
        _, aux = token_sparse_attention(q[:, :1], k, v, causal=False, return_aux=True,
                                        **SPARSE)
    assert bool(aux["dense"][0])


def _models():
    dense = DecoderLM(DecoderConfig(**BASE), rngs=nnx.Rngs(0))
    cfg = DecoderConfig(**{**BASE, "attention": "token_sparse", "attention_options": SPARSE})
    sparse = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0)))),
                       nnx.state(dense))
    return dense, sparse


def test_generate_prefills_sparse_and_rows_are_independent():
    dense, sparse = _models()
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, 40, (3, 30)).astype(np.int32)
    lens = np.array([30, 24, 17], np.int32)
    kw = dict(prompt_lengths=lens, return_logprobs=True)
    d = generate(dense, prompts, 5, **kw)
    s = generate(sparse, prompts, 5, **kw)
    assert np.max(np.abs(np.asarray(s.logprobs) - np.asarray(d.logprobs))) > 1e-3
    # a padded row: its first token's log-prob is the sparse model's own full forward
    # over the row alone, and all its log-probs are those of generate on the row alone
    i, n = 2, int(lens[2])
    logits = nnx.jit(lambda m, x: m(x))(sparse, jnp.asarray(prompts[i:i + 1, :n]))
    want = jax.nn.log_softmax(logits[0, -1])[int(s.tokens[i, n])]
    np.testing.assert_allclose(s.logprobs[i, 0], want, atol=1e-4)
    alone = generate(sparse, prompts[i:i + 1, :n], 5, return_logprobs=True)
    np.testing.assert_allclose(s.logprobs[i], alone.logprobs[0], atol=1e-4)


def _hf_folder(path):
    save_hf(DecoderLM(DecoderConfig(**BASE), rngs=nnx.Rngs(1)), path)
    return path


def test_load_hf_every_variant_with_parameters(tmp_path):
    path = _hf_folder(str(tmp_path / "hf"))
    base, _ = load_hf(path)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 16)), jnp.int32)
    with_params = [s.name for s in registry.specs() if s.params is not None]
    assert {"plash", "ssmax", "asentmax", "entmax"} <= set(with_params)
    for name in with_params:
        over = {"attention_learn": ("alpha",)} if name == "entmax" else {}
        model, cfg, init = load_hf(path, attention=name, return_initialised=True, **over)
        assert cfg.attention == name
        assert sorted(init) == sorted(variant_param_paths(model)) and init, name
        logits = model(tokens)
        assert np.all(np.isfinite(np.asarray(logits))), name
        # the checkpoint's tensors are loaded unchanged
        np.testing.assert_array_equal(model.blocks[0].attn.q_proj[...],
                                      base.blocks[0].attn.q_proj[...])
    model, _, init = load_hf(path, attention="asentmax", return_initialised=True)
    assert float(jnp.max(jnp.abs(model.blocks[0].attn.variant_params.beta[...]))) == 0.0


def test_plash_prototypes_come_from_the_checkpoints_keys(tmp_path):
    """The prototypes are k-means centroids of the keys: each lies in the keys' range and
    is closer to its nearest key than random N(0, 1) prototypes are."""
    from lcjax.nn.attention import capture_attention

    path = _hf_folder(str(tmp_path / "hf"))
    calib = np.random.default_rng(3).integers(0, 40, (2, 32))
    model, _, init = load_hf(path, attention="plash", attention_options={"num_prototypes": 4},
                             calibration=calib, return_initialised=True)
    assert "k-means" in init["blocks.0.attn.variant_params.prototypes"]
    base, _ = load_hf(path)
    _, inputs = capture_attention(base, jnp.asarray(calib, jnp.int32), tap="inputs")
    keys = np.asarray(inputs[0]["k"]).reshape(-1, 2, 8)
    proto = np.asarray(model.blocks[0].attn.variant_params.prototypes[...])  # [2, 4, 8]
    for h in range(2):
        d = np.linalg.norm(keys[:, h][:, None] - proto[h][None], axis=-1)  # [N, 4]
        # Lloyd's fixed point: each centroid is the mean of its cluster
        assign = np.argmin(d, axis=1)
        for m in range(4):
            if np.any(assign == m):
                np.testing.assert_allclose(proto[h, m], keys[assign == m, h].mean(0),
                                           atol=1e-1)


def _write_run_dir(model, path):
    """A run folder as `lcjax train --out` leaves it (config.json + checkpoints/)."""
    import json
    import os

    from lcjax.train import checkpoint
    from lcjax.train.loop import config_dict

    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model": config_dict(model.config), "train": {}}, f)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    manager = checkpoint.checkpoint_manager(os.path.join(path, "checkpoints"))
    checkpoint.save_checkpoint(manager, 1, params=params, rest=rest,
                               opt_state={"count": np.zeros((), np.int32)}, data_state={})
    manager.close()


def test_load_model_with_a_variant_that_has_parameters(tmp_path):
    from lcjax.train.checkpoint import load_model

    trained = DecoderLM(DecoderConfig(**BASE), rngs=nnx.Rngs(2))
    run = str(tmp_path / "run")
    _write_run_dir(trained, run)
    for name in ("ssmax", "plash", "asentmax"):
        model = load_model(run, attention=name)
        assert model.config.attention == name and model.blocks[0].attn.variant_params
        np.testing.assert_array_equal(model.blocks[1].mlp.w_down[...],
                                      trained.blocks[1].mlp.w_down[...])
        assert np.all(np.isfinite(np.asarray(model(jnp.ones((1, 8), jnp.int32)))))
    # asentmax per head starts neutral; with alpha -> softmax-like only via alpha, so
    # compare the length scaling alone: beta = 0 leaves q unchanged
    model = load_model(run, attention="asentmax")
    assert float(jnp.max(jnp.abs(model.blocks[0].attn.variant_params.beta[...]))) == 0.0


def test_short_finetune_moves_only_the_variant_parameters(tmp_path):
    """A few Adam steps on the variant's own parameters (the checkpoint's frozen, as
    `lcjax train --init HF_DIR --attention plash` with frozen base weights) change the
    prototypes (their gradient is not zero) and nothing else."""
    import optax

    path = _hf_folder(str(tmp_path / "hf"))
    # chunks of 8: queries past the first chunk attend to the past through the prototypes
    model, _, init = load_hf(path, attention="plash",
                             attention_options={"num_prototypes": 4, "chunk": 8},
                             return_initialised=True)
    before = nnx.to_pure_dict(nnx.state(model))
    is_variant = nnx.All(nnx.Param, nnx.PathContains("variant_params"))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=is_variant)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (4, 24)), jnp.int32)

    def loss_fn(m):
        logits = m(tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None],
                                             axis=-1))

    @nnx.jit
    def step(model, opt):
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, is_variant))(model)
        opt.update(model, grads)
        return loss

    losses = [float(step(model, opt)) for _ in range(3)]
    assert np.all(np.isfinite(losses))
    after = nnx.to_pure_dict(nnx.state(model))
    flat_b = dict(jax.tree_util.tree_flatten_with_path(before)[0])
    for p, x in jax.tree_util.tree_flatten_with_path(after)[0]:
        changed = not np.array_equal(np.asarray(x), np.asarray(flat_b[p]))
        assert changed == ("variant_params" in jax.tree_util.keystr(p)), p
