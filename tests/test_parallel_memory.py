"""The context-parallel memory model, the largest-T search, and UPipe's compiled per-device
memory against Ulysses' (compile only, H = 32, C = 8; the T = 128K figure is the bench's
and experiments/upipe's)."""

import jax
import pytest

from lcjax.bench.context_parallel import (
    compiled_temp_bytes,
    max_length_under,
    memory_model,
    model_head_part,
    split_per_token,
)
from lcjax.parallel import make_mesh


def _model(strategy, kv_heads, t=1 << 17):
    return memory_model(strategy, seq_len=t, batch=1, heads=32, kv_heads=kv_heads,
                        head_dim=64, d_model=2048, context=8)


def test_memory_model_attention_ratio_is_c_over_h_for_mha():
    ratio = _model("upipe", 32)["attention"] / _model("ulysses", 32)["attention"]
    assert ratio == pytest.approx(8 / 32)
    gqa = _model("upipe", 8)["attention"] / _model("ulysses", 8)["attention"]
    assert gqa == pytest.approx(4 / (2 * 32 / 8 + 2 * 8 / 8))  # = 40%
    # Ulysses' attention bytes: q, k, v, o and cotangents, H/C and Hv/C heads over T
    assert _model("ulysses", 32)["attention"] == 2 * 4 * (1 << 17) * 64 * (8 + 8)


def test_model_attention_intermediates_include_the_projections():
    """Head-layout tensors plus the sequence-layout projections (all ∝ T D): for MHA the
    UPipe / Ulysses ratio is still C/H; Ulysses' projections are q, k, v, o of all heads
    over T/C tokens with cotangents, UPipe's those of one stage (C heads)."""
    t = 1 << 17
    uly, up = _model("ulysses", 32, t), _model("upipe", 32, t)
    assert uly["projections"] == 4 * (t / 8) * 2 * (32 + 64) * 64
    assert up["projections"] == 4 * (t / 8) * 2 * (8 + 16) * 64
    assert model_head_part(up) / model_head_part(uly) == pytest.approx(8 / 32)
    assert uly["total"] == model_head_part(uly) + uly["sequence"]


def test_split_per_token_recovers_a_known_split_and_flags_a_non_physical_one():
    """temp(T, d) = c(d) + T (a + b d) at two lengths and two d_models: the split gives a
    (the attention part) and b d exactly; a fit that makes a part negative is flagged."""
    a, b, d, d2, t1, t2 = 3000.0, 0.7, 2048, 1024, 8192, 32768

    def temp(t, dm):
        return 5e6 + 900.0 * dm + t * (a + b * dm)

    slope = (temp(t2, d) - temp(t1, d)) / (t2 - t1)
    other = (temp(t2, d2) - temp(t1, d2)) / (t2 - t1)
    got = split_per_token(slope, other, d_model=d, other_d_model=d2, x_buffer_bytes=1024)
    assert got["attention"] == pytest.approx(a) and got["x_part"] == pytest.approx(b * d)
    assert got["x_buffers"] == pytest.approx(b * d / 1024) and got["physical"]
    # the slope grows by more than its whole when d_model doubles: a < 0, not physical
    bad = split_per_token(3000.0, 1000.0, d_model=d, other_d_model=d2, x_buffer_bytes=1024)
    assert bad["attention"] < 0 and not bad["physical"]
    # the slope shrinks when d_model grows: b < 0, not physical
    assert not split_per_token(3000.0, 3500.0, d_model=d, other_d_model=d2,
                               x_buffer_bytes=1024)["physical"]


@pytest.mark.parametrize("budget", [1000, 4096, 77777])
def test_max_length_search_finds_the_exact_largest_multiple(budget):
    measure = lambda t: 3 * t + 100  # largest T with 3T + 100 <= budget, T % 64 == 0
    want = (budget - 100) // 3 // 64 * 64
    got = max_length_under("x", budget, step=64, guess=64, measure=measure, max_compiles=40)
    assert got["exact"] and got["max_len"] == want
    assert measure(got["max_len"]) <= budget < measure(got["max_len"] + 64)


def test_upipe_compiled_temp_is_at_most_40_percent_of_ulysses_mha():
    """H = 32, C = 8, MHA, blockwise attention inside, T = 4096: compile only."""
    mesh = make_mesh(data=1, context=8, devices=jax.devices()[:8])
    shape = dict(mesh=mesh, heads=32, kv_heads=32, head_dim=8, block=256)
    ulysses, _ = compiled_temp_bytes("ulysses", 4096, **shape)
    upipe, _ = compiled_temp_bytes("upipe", 4096, **shape)
    assert upipe <= 0.40 * ulysses, (upipe, ulysses)
