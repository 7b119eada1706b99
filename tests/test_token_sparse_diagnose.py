"""experiments/token_sparse/diagnose.py: the ablation masks against a numpy masked
softmax and the method itself, the selection mask against the method's aux, the prompt
regions on a hand-made prompt; the experiment's warm-up stages (lcjax.data.sources.
stage_batches)."""

import numpy as np
import pytest

from experiments.token_sparse import diagnose as dg
from experiments.token_sparse import experiment as exp
from lcjax.attention.token_sparse import token_sparse_attention

OPTS = dict(coverage=0.3, min_tokens=5, window=4, pool=3)


@pytest.fixture(scope="module")
def qkv():
    rng = np.random.default_rng(0)
    b, n, h, hk, d = 2, 24, 4, 2, 8
    q = rng.standard_normal((b, n, h, d)).astype(np.float32)
    k = rng.standard_normal((b, n, hk, d)).astype(np.float32)
    v = rng.standard_normal((b, n, hk, d)).astype(np.float32)
    return q, k, v


@pytest.fixture(scope="module")
def method(qkv):
    """The library's token-sparse output and its selection as bool [B, H, L]."""
    out, aux = token_sparse_attention(*qkv, causal=True, return_aux=True, inner="softmax",
                                      **OPTS)
    b, n, h = qkv[0].shape[:3]
    keep = np.zeros((b, h, n + 1), bool)
    idx = np.asarray(aux["indices"])
    for i in range(b):
        for j in range(h):
            keep[i, j, idx[i, j]] = True
    return np.asarray(out), keep[..., :n]


def _masked_softmax(q, k, v, allow):
    """numpy causal softmax attention with ``allow`` [B, H, T, S]; empty rows give 0."""
    b, n, h, d = q.shape
    g = h // k.shape[2]
    kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, kr) / np.sqrt(d)
    allow = allow & np.tril(np.ones((n, n), bool))
    s = np.where(allow, s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    p = np.where(allow, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-30)
    return np.einsum("bhts,bshd->bthd", p, vr)


def test_keep_mask_is_the_methods_selection(qkv, method):
    _, keep = method
    got = np.asarray(dg.keep_mask(qkv[0], qkv[1], **OPTS))
    np.testing.assert_array_equal(got, keep)
    assert 0 < keep.mean() < 1  # the call really is sparse


@pytest.mark.parametrize("mode", ["paper", "keys", "queries"])
def test_ablation_masks(qkv, method, mode):
    """"paper" equals the method (gather/scatter path) and the numpy reference with query
    and key selected; "keys" computes every query over the selected keys; "queries"
    zeroes the dropped queries and shows every key."""
    out, keep = method
    kq, kk = keep[:, :, :, None], keep[:, :, None, :]
    allow = {"paper": kq & kk, "keys": np.broadcast_to(kk, kq.shape[:3] + kk.shape[-1:]),
             "queries": np.broadcast_to(kq, kq.shape[:3] + kk.shape[-1:])}[mode]
    got = np.asarray(dg.ablation_attention(*qkv, mode=mode, **OPTS))
    np.testing.assert_allclose(got, _masked_softmax(*qkv, allow), atol=2e-5)
    if mode == "paper":
        np.testing.assert_allclose(got, out, atol=2e-5)
    else:
        assert np.abs(got - out).max() > 1e-3  # the ablation changes the output


def test_oracle_forces_positions(qkv, method):
    """``force`` adds the given positions (per batch row) to every head's selection."""
    _, keep = method
    force = ((0, 1, 2), (5,))
    allow = keep.copy()
    for row, pos in enumerate(force):
        allow[row, :, list(pos)] = True
    got = np.asarray(dg.ablation_attention(*qkv, mode="oracle", force=force, **OPTS))
    np.testing.assert_allclose(got, _masked_softmax(*qkv, allow[:, :, :, None]
                                                    & allow[:, :, None, :]), atol=2e-5)


def test_dense_outside_domain(qkv):
    """A decoding step (kv_len != q_len) is plain softmax, as in the method."""
    q, k, v = qkv
    got = np.asarray(dg.ablation_attention(q[:, -1:], k, v, causal=False, mode="keys", **OPTS))
    want = _masked_softmax(np.concatenate([np.zeros_like(q[:, :-1]), q[:, -1:]], 1), k, v,
                           np.ones((1, 1, q.shape[1], q.shape[1]), bool))[:, -1:]
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_regions_on_a_hand_made_prompt():
    """Needle with the question's key (a distractor needle before it is haystack)."""
    prompt = (b"The magic number for aa-b is 1111. xx The magic number for cc-d is 2345. y"
              b"\nThe magic number for cc-d is ")
    r = dg.regions(prompt)
    text = b"^" + prompt
    pick = lambda name: bytes(text[i] for i in r[name])
    assert pick("needle_key") == b"cc-d" and pick("needle_value") == b"2345"
    assert pick("question_key") == b"cc-d" and pick("bos") == b"^"
    assert pick("needle_rest") == b"The magic number for  is ."
    assert pick("question_rest") == b"The magic number for  is "
    assert b"1111" in pick("haystack") and b"aa-b" in pick("haystack")
    assert sum(len(v) for v in r.values()) == len(text)


def test_warmup_stages():
    """The full mode's warm-up: the first steps at the warm-up length, then L, in order."""
    assert exp.training_stages(("a",), 256, 10) == ((256, 10, ("a",)),)
    assert exp.training_stages(("a",), 256, 10, (128, 3)) == ((128, 3, ("a",)),
                                                              (256, 7, ("a",)))
    with pytest.raises(ValueError, match="warm-up"):
        exp.training_stages(("a",), 256, 10, (128, 10))
    ds = exp.training_dataset(("niah_single_1",), 128, 3, 2, warmup=(96, 1))
    widths = [ds[i]["inputs"].shape for i in range(len(ds))]
    assert widths == [(2, 97), (2, 129), (2, 129)]
