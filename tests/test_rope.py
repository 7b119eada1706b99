"""RoPE: relative-position property, layouts, closed form, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lcjax.rope import apply_rope, inv_freq


def _x(seed, shape=(2, 10, 3, 16)):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scores_depend_only_on_relative_position(layout):
    q, k = _x(0), _x(1)
    pos = jnp.arange(10)
    scores = lambda p: jnp.einsum("bthd,bshd->bhts", apply_rope(q, p, layout=layout),
                                  apply_rope(k, p, layout=layout))
    base = scores(pos)
    for shift in (1, 17, 1000):
        np.testing.assert_allclose(scores(pos + shift), base, atol=2e-4)
    # but the scores do change with the relative offsets themselves
    assert not np.allclose(scores(pos * 2), base, atol=1e-2)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotation_preserves_norm_and_zero_position_is_identity(layout):
    x = _x(2)
    np.testing.assert_allclose(apply_rope(x, jnp.zeros(10), layout=layout), x, atol=1e-6)
    y = apply_rope(x, jnp.arange(10) * 3, layout=layout)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1),
                               rtol=1e-5)


def test_closed_form_half_and_interleaved():
    d, base, n = 8, 10000.0, 5
    x = np.asarray(_x(3, (1, 1, 1, d)))[0, 0, 0]
    theta = base ** (-np.arange(0, d, 2) / d)
    np.testing.assert_allclose(inv_freq(d, base), theta, rtol=1e-6)
    c, s = np.cos(n * theta), np.sin(n * theta)
    half = np.concatenate([x[:4] * c - x[4:] * s, x[:4] * s + x[4:] * c])
    inter = np.stack([x[0::2] * c - x[1::2] * s, x[0::2] * s + x[1::2] * c], -1).reshape(-1)
    pos = jnp.array([n])
    got_half = apply_rope(jnp.asarray(x)[None, None, None], pos, layout="half")
    got_inter = apply_rope(jnp.asarray(x)[None, None, None], pos, layout="interleaved")
    np.testing.assert_allclose(got_half[0, 0, 0], half, atol=1e-5)
    np.testing.assert_allclose(got_inter[0, 0, 0], inter, atol=1e-5)


def test_layouts_related_by_permutation():
    x = _x(4)
    d = x.shape[-1]
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])  # interleaved -> half
    pos = jnp.arange(10) + 3
    inter = apply_rope(x, pos, layout="interleaved")
    half = apply_rope(x[..., perm], pos, layout="half")
    np.testing.assert_allclose(inter[..., perm], half, atol=1e-5)


def test_batched_positions_and_dtype():
    x = _x(5).astype(jnp.bfloat16)
    pos = jnp.stack([jnp.arange(10), jnp.arange(10) + 7])
    y = apply_rope(x, pos)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y[1], np.float32),
                               np.asarray(apply_rope(x[1:], jnp.arange(10) + 7)[0], np.float32))


def test_custom_frequencies():
    x = _x(6)
    freqs = inv_freq(16, 500000.0)
    np.testing.assert_allclose(apply_rope(x, jnp.arange(10), frequencies=freqs),
                               apply_rope(x, jnp.arange(10), base=500000.0), atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"layout": "bogus"}, "layout"),
    ({"positions": jnp.arange(9)}, "positions"),
    ({"frequencies": jnp.ones(3)}, "frequencies"),
])
def test_errors(kwargs, match):
    x = _x(7)
    kwargs.setdefault("positions", jnp.arange(10))
    with pytest.raises(ValueError, match=match):
        apply_rope(x, **kwargs)
    with pytest.raises(ValueError, match="even"):
        inv_freq(7)
