"""experiments/token_sparse: the sparse-prefill / dense-decoding generator against
lcjax.nn.generate and nn's own cache writes, its kept fractions against the method's aux,
and the claims on hand-made numbers. The pipeline end to end is the experiment's quick run
(``python experiments/reproduce.py --quick --only token_sparse``): too slow for this file's
15 s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.token_sparse import experiment as exp
from lcjax.attention.token_sparse import layer_attention, token_sparse_attention
from lcjax.data import VOCAB_SIZE
from lcjax.data import tokenizer as tok
from lcjax.nn import DecoderConfig, DecoderLM, capture_attention, generate

TINY = dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_hidden=64)
OPTS = dict(coverage=0.5, min_tokens=6, window=4, pool=3, inner="softmax")


@pytest.fixture(scope="module")
def models():
    """A random dense model and the same weights with token-sparse attention in layer 0."""
    cfg = DecoderConfig(vocab_size=VOCAB_SIZE, max_len=128, **TINY)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(3)  # numpy weights: no compile per parameter shape

    def draw(x):
        if len(x.shape) == 1:  # norm scales
            return (1 + 0.1 * rng.standard_normal(x.shape)).astype(np.float32)
        return (rng.standard_normal(x.shape) / np.sqrt(x.shape[0])).astype(np.float32)

    dense = nnx.merge(graphdef, jax.tree.map(draw, state))
    names, options = layer_attention(2, (0,), sparse_options=OPTS)
    return dense, exp.with_layer_attention(dense, names, options)


def _rows(n, b, seed):
    return np.random.default_rng(seed).integers(0, 256, (b, n)).astype(np.int32)


def _references(dense, sparse, rows):
    """Independent of the generator, in one compile: the dense model's own prefill cache
    writes, and the queries its layer 0 received (the sparse model's layer 0 sees the same
    embeddings); dense block 1's cache write of the hidden state after the sparse block 0
    (through the blocks); the token-sparse aux of layer 0 on its inputs."""
    b, n = rows.shape
    (_, dense_caches), inputs = capture_attention(
        dense, rows, cache=dense.init_cache(b, n + 2), tap="inputs")
    pos = jnp.broadcast_to(jnp.arange(n), (b, n))
    h1, _ = sparse.blocks[0](jnp.take(sparse.embed[...], rows, axis=0), pos)
    _, c1 = dense.blocks[1](h1, pos, cache=dense.blocks[1].attn.init_cache(b, n + 2))
    x = {"q": inputs[0]["q"], "k": dense_caches[0].k[:, :n], "v": dense_caches[0].v[:, :n]}
    _, aux = token_sparse_attention(x["q"], x["k"], x["v"], causal=True, return_aux=True,
                                    **OPTS)
    return dense_caches, c1, x, aux


@pytest.fixture(scope="module")
def prefilled(models):
    """The generator's sparse prefill of three 40-token prompts (two random, one constant)
    and the references."""
    dense, sparse = models
    rows = np.concatenate([_rows(40, 2, 2), np.full((1, 40), 7, np.int32)])
    gen = exp.SparsePrefillGenerator(sparse, dense, max_new_tokens=3, batch_size=3)
    return gen.prefill(rows), nnx.jit(_references)(dense, sparse, jnp.asarray(rows))


def test_dense_generator_is_lcjax_generate(models):
    """With dense attention the generator is greedy decoding: its answers to three prompts
    are those of lcjax.nn.generate (cached prefill) cut at EOS, specials dropped."""
    dense, _ = models
    rng = np.random.default_rng(1)
    prompts = ["".join(chr(c) for c in rng.integers(97, 123, 30)) for _ in range(3)]
    rows = np.stack([tok.encode(p, bos=True) for p in prompts])
    out = generate(dense, rows, 5, stop_tokens=(tok.EOS,), pad_id=tok.PAD)
    tokens, ends = np.asarray(out.tokens), np.asarray(out.lengths)
    want = [tok.decode(t[31:e][t[31:e] < 256]) for t, e in zip(tokens, ends)]
    gen = exp.SparsePrefillGenerator(dense, max_new_tokens=5, batch_size=3)
    assert gen(prompts) == want
    assert gen.kept == [{}] * 3  # no token-sparse layer


def test_generator_groups_prompts_by_length(models):
    """Prompts of several lengths are answered in their order, in rows of one length and
    ``batch_size`` (a short group repeats its last row), each answer cut at its first EOS
    with the specials dropped; kept fractions and budgets are filed per prompt."""
    _, sparse = models
    gen = exp.SparsePrefillGenerator(sparse, max_new_tokens=4, batch_size=2)
    seen = []

    def fake(rows):  # answer: the row's last prompt byte, BOS (dropped), EOS, then junk
        seen.append(rows.copy())
        last = rows[:, -1]
        out = np.stack([last, np.full_like(last, tok.BOS), np.full_like(last, tok.EOS),
                        last], axis=1)
        return out, [(rows[:, 1] / 1000.0, rows.shape[1] - last)]

    gen.generate_tokens = fake
    prompts = ["abc", "wxyz", "de", "fgh", "klm"]
    assert gen(prompts) == ["c", "z", "e", "h", "m"]
    assert [r.shape for r in seen] == [(2, 3), (2, 4), (2, 4), (2, 5)]
    for r in (seen[0], seen[2], seen[3]):  # "de", "klm", "wxyz" alone: repeated
        np.testing.assert_array_equal(r[0], r[1])
    assert [k[0] for k in gen.kept] == [ord(p[0]) / 1000.0 for p in prompts]
    assert [b[0] for b in gen.budgets] == [len(p) + 1 - ord(p[-1]) for p in prompts]


def test_sparse_prefill_caches_what_each_layer_receives(prefilled):
    """Layer 0 (token-sparse) sees the embeddings, so its cached K/V equal the dense
    model's own cache writes; layer 1's equal nn's cache write of the hidden state after
    the sparse block 0, and differ from the dense ones (the sparse prefill changed them)."""
    (_, caches, _), (dense_caches, c1, _, _) = prefilled
    assert [int(c.index) for c in caches] == [40, 40] and caches[0].k.shape[1] == 42
    for name in ("k", "v"):
        np.testing.assert_allclose(getattr(caches[0], name)[:, :40],
                                   getattr(dense_caches[0], name)[:, :40], atol=1e-5)
        np.testing.assert_allclose(getattr(caches[1], name)[:, :40],
                                   getattr(c1, name)[:, :40], atol=1e-5)
    assert float(jnp.max(jnp.abs(caches[1].v[:, :40] - dense_caches[1].v[:, :40]))) > 1e-3


def test_kept_fraction_and_budget_are_the_methods(prefilled):
    """Per example, the generator's kept fraction and budget of the token-sparse layer equal
    the aux of token_sparse_attention on the inputs that layer received (three prompts,
    different budgets); a prompt too short to be sparse keeps everything."""
    (_, _, [(kept, budget)]), (_, _, x, aux) = prefilled
    np.testing.assert_allclose(kept, aux["kept_fraction"], rtol=1e-6)
    np.testing.assert_array_equal(budget, aux["budget"])
    assert np.all(np.asarray(kept) < 1) and len(set(np.asarray(budget).tolist())) > 1
    short = exp.kept_fraction(x["q"][:, :9], x["k"][:, :9], OPTS)  # 9 <= min_tokens + window: dense
    np.testing.assert_array_equal(short[0], 1.0)
    np.testing.assert_array_equal(short[1], 9 - OPTS["window"])


def _pt(speedup, acc, kept, c=0.1):
    return {"speedup": speedup, "accuracy": acc, "kept": kept, "coverage": c,
            "label": f"coverage {c}"}


def test_claims_on_hand_made_numbers():
    """The paper's claim holds only for a coverage that is both >= 3.23x and within 1
    point; the kept-fraction claim only for a point <= 0.5 kept within 1 point; neither
    when the dense model is below 50% (nothing to lose)."""
    pts = [_pt(0.5, 100.0, 0.8), _pt(1.5, 100.0, 0.45), _pt(3.5, 98.5, 0.3)]
    paper, kept = exp.claims_from(100.0, pts)
    assert not paper.holds and "3.50x" in paper.ours and "1.5 points lost" in paper.ours
    assert kept.holds and "kept 0.45" in kept.ours
    paper, _ = exp.claims_from(100.0, pts[:2] + [_pt(3.3, 99.2, 0.3)])
    assert paper.holds and "3.30x" in paper.ours
    paper, kept = exp.claims_from(97.5, [_pt(0.4, 97.5, 0.6), _pt(0.2, 90.0, 0.55)],
                                  seq_len=125)
    assert not paper.holds and "no coverage reaches 3.23x" in paper.ours
    assert "best speed-up 0.40x" in paper.ours and "at T = 125 the attention step" in paper.ours
    assert not kept.holds and "least kept 0.55" in kept.ours
    _, kept = exp.claims_from(97.5, [_pt(0.4, 95.0, 0.5)])
    assert not kept.holds and "95.0%" in kept.ours
    for claim in exp.claims_from(30.0, [_pt(3.5, 30.0, 0.3)]):  # dense not learned
        assert not claim.holds and claim.ours.startswith("not checkable: dense 30.0% < 50%")
