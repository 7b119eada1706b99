r"""α-entmax attention (AdaSplash-2), blockwise: one spec, an XLA path and a Pallas kernel.

Sparse attention with the α-entmax mapping (Peters, Niculae & Martins 2019; Correia,
Niculae & Martins 2019) in place of softmax, computed the way AdaSplash does it
(Gonçalves, Treviso & Martins, "AdaSplash: Adaptive Sparse Flash Attention", 2025, and its
v2, AdaSplash-2, with the histogram-initialised threshold). Per query row i of head h
(q [B, T, H, D], k, v [B, S, Hkv, D], key head h // (H/Hkv)):

    x_ij = scale · q_i·k_j  (masked keys excluded),   z_ij = (α_h - 1)(x_ij - max_j x_ij),
    p_ij = [z_ij - τ_i]₊^{1/(α_h-1)},  τ_i such that Σ_j p_ij = 1,   out_i = Σ_j p_ij v_j.

The XLA path (:mod:`lcjax.attention.entmax.xla`) never builds the [T, S] scores;
``docs/entmax.md`` has the derivation. The pieces of the method live beside this file:
``mapping`` (the α-entmax mapping and its threshold rules), ``config`` (:class:`EntmaxConfig`),
``reference`` (the dense reference), ``xla``, ``length_scaling`` (ASEntmax, SSMax).

Specs declared here (registered by ``lcjax.attention.builtin_specs``): ``"entmax"`` and
``"sparsemax"`` (α = 2), implementations ``"pallas"``
(``pallas_kernels.entmax_attention``; it raises ``NotImplementedError`` with the reason
where it cannot serve a call: no GPU/TPU unless ``interpret=True``, a mask or
segment ids, ALiBi slopes, float64) and ``"xla"`` (everything, including the ALiBi bias
``alibi_slopes`` [H] / ``alibi_offset`` of the shared tile-score function). Both take the
one :class:`EntmaxConfig`, whole (solver settings shared through
:class:`lcjax.attention.entmax.mapping.SolverConfig`, block sizes) and return
the same ``aux``: ``tau`` [B, T, H] float32 (entmax convention p = [(α-1)x - τ]₊^{1/(α-1)},
+inf for an empty row, no gradient), ``iterations`` [B, T, H] int32 (solver steps after the
initialisation) and ``block_sparsity`` (float32: the fraction of (batch, head, query block,
key block) tiles at or below the causal diagonal — all tiles if not causal — in which no
visible pair has weight).

α is a Python number > 1 or a float array [H] (per head, differentiable: see
``lcjax.attention.entmax.mapping.alpha_from_param``). A row with no visible key gives zeros.
"""

from __future__ import annotations

import functools
import inspect

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from lcjax.attention.base import (
    AttentionSpec,
    Features,
    Implementation,
    LearnedParams,
    pallas_skip_on_cpu,
    resolve_kernel,
)
from lcjax.attention.core import stat_dtype
from lcjax.attention.entmax.config import AUX, DEFAULT_CONFIG, EntmaxConfig, prepare_call
from lcjax.attention.entmax.mapping import ALPHA_ARRAY_FLOOR
from lcjax.attention.entmax.reference import entmax_attention_reference
from lcjax.attention.entmax.xla import entmax_attention_xla

__all__ = ["ENTMAX", "SPARSEMAX", "entmax_attention", "sparsemax_attention"]

_KERNEL_MODULE = "pallas_kernels.entmax_attention"


def _pallas(q: Float[Array, "B T H D"], k: Float[Array, "B S Hkv D"],
            v: Float[Array, "B S Hkv Dv"], *, causal=False, mask=None, scale=None,
            q_segment_ids=None, kv_segment_ids=None, return_aux=False, alpha=1.5,
            config: EntmaxConfig = DEFAULT_CONFIG, block_sizes=None, interpret=None,
            alibi_slopes=None, alibi_offset=0):
    """The Pallas kernel (``pallas_kernels.entmax_attention``), given the one
    :class:`EntmaxConfig` ``config``; ``NotImplementedError`` (before any computation)
    where it cannot serve the call. ``block_sizes``: the kernel's ``BlockSizes`` (backward
    tiles too), instead of ``block_q``/``block_kv``; ``interpret``: None = on CPU."""
    shapes, a_static, a_arr = prepare_call(q, k, v, alpha)
    kernel, interpret = resolve_kernel(_KERNEL_MODULE, interpret)
    gaps = [what for what, bad in (
        ("mask", mask is not None),
        ("q_segment_ids/kv_segment_ids", q_segment_ids is not None),
        ("alibi_slopes (the XLA path adds ALiBi)", alibi_slopes is not None),
        ("float64 (the kernel computes in float32)", stat_dtype(q, k, v) == jnp.float64),
    ) if bad]
    if gaps:
        raise NotImplementedError("does not support " + ", ".join(gaps))
    sizes = block_sizes or kernel.BlockSizes(block_q=config.block_q, block_k=config.block_kv)
    reason = kernel.unsupported_block_sizes(sizes, interpret=interpret)
    if reason:
        if block_sizes is None:  # name the options the user gave, not the kernel's fields
            reason = (reason.replace("block_sizes.block_q ", "block_q ")
                      .replace("block_sizes.block_k ", "block_kv "))
        raise NotImplementedError(reason)
    sol = config.solver_config.resolve(a_static, jnp.float32)
    # an array α [H]: traced, differentiable through the kernel (its backward returns dα),
    # clamped as in the XLA path
    kernel_alpha = a_static if a_arr is None else jnp.maximum(a_arr.astype(jnp.float32),
                                                              ALPHA_ARRAY_FLOOR)
    res = kernel.entmax_attention_pallas(
        q, k, v, alpha=kernel_alpha, causal=causal, scale=scale, solver=config.solver,
        n_iter=sol.n_iter, bins=sol.bins, tol=sol.tol, block_sizes=sizes,
        interpret=interpret, return_aux=return_aux)
    if not return_aux:
        return res
    out, aux = res
    return out, {key: aux[key] for key in AUX}


# ----------------------------------------------------------------------------
# Public functions, specs
# ----------------------------------------------------------------------------
def entmax_attention(
    q: Float[Array, "B T H D"],
    k: Float[Array, "B S Hkv D"],
    v: Float[Array, "B S Hkv Dv"],
    *,
    alpha=1.5,
    causal: bool = False,
    mask: Bool[Array, "..."] | None = None,
    scale: float | None = None,
    q_segment_ids: Int[Array, "B T"] | None = None,
    kv_segment_ids: Int[Array, "B S"] | None = None,
    solver: str = EntmaxConfig.solver,
    n_iter: int | None = EntmaxConfig.n_iter,
    bins: int = EntmaxConfig.bins,
    tol: float | None = EntmaxConfig.tol,
    block_q: int = EntmaxConfig.block_q,
    block_kv: int = EntmaxConfig.block_kv,
    implementation: str | None = None,
    return_aux: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    **implementation_options,
):
    """α-entmax attention, blockwise: out_i = Σ_j p_ij v_j, p_i = entmax_α(scale·q_i·K^T).

    Args:
      q: [B, T, H, D]; k: [B, S, Hkv, D]; v: [B, S, Hkv, Dv]; H % Hkv == 0.
      alpha: a Python number > 1 (1.5: entmax-1.5; 2: sparsemax), or a float array of
        shape [H] or [] (per head, differentiable, clamped to ≥ 1.001 where its gradient
        is zero; e.g. ``lcjax.attention.entmax.mapping.alpha_from_param(raw)``).
      causal: query i sees keys j <= i; key blocks above the diagonal are skipped.
      mask: bool broadcastable to [B, H, T, S], True = may attend.
      scale: score scale, default 1/sqrt(D).
      q_segment_ids, kv_segment_ids: int [B, T], [B, S]; attend within a segment,
        negative ids are padding.
      solver, n_iter, bins, tol, block_q, block_kv: the one :class:`EntmaxConfig` of both
        implementations (defaults and rules: :class:`lcjax.attention.entmax.mapping.SolverConfig`).
      implementation: None (the Pallas kernel where it can serve the call — a GPU/TPU, no
        mask or segment ids, not float64; a number α or an array α, whose dα the kernel's
        backward returns — else XLA), ``"xla"`` or
        ``"pallas"`` (on CPU it runs in the Pallas interpreter; ``NotImplementedError``
        with the reason where it cannot serve the call).
      return_aux: also return ``aux`` (module docstring: tau, iterations, block_sparsity).
      local_window_size: int w or (left, right): query i sees keys j with
        i - left <= j <= i + right (``jax.nn.dot_product_attention``'s sliding window; key
        blocks outside it are skipped; the XLA path serves it).
      implementation_options: options of one implementation (the kernel's
        ``block_sizes``, ``interpret``); another implementation raises on them.

    Returns: [B, T, H, Dv] in q's dtype, and the aux dict when ``return_aux``.
    """
    return ENTMAX(q, k, v, causal=causal, mask=mask, scale=scale,
                  q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                  implementation=implementation, return_aux=return_aux, alpha=alpha,
                  local_window_size=local_window_size,
                  solver=solver, n_iter=n_iter, bins=bins, tol=tol, block_q=block_q,
                  block_kv=block_kv, **implementation_options)


def sparsemax_attention(q, k, v, *, causal=False, mask=None, scale=None, q_segment_ids=None,
                        kv_segment_ids=None, **options):
    """Sparsemax attention: :func:`entmax_attention` with α = 2 (same options)."""
    return entmax_attention(q, k, v, alpha=2.0, causal=causal, mask=mask, scale=scale,
                            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                            **options)


def _with_alpha(fn, alpha: float):
    """``fn`` with α fixed (the "sparsemax" spec): its signature without ``alpha``, so the
    dispatcher rejects an ``alpha`` option."""

    @functools.wraps(fn)
    def fixed(q, k, v, **kw):
        return fn(q, k, v, alpha=alpha, **kw)

    sig = inspect.signature(fn)
    fixed.__signature__ = sig.replace(
        parameters=[p for p in sig.parameters.values() if p.name != "alpha"])
    del fixed.__wrapped__
    return fixed


_FEATURES = Features(window=True, dtypes=("float32", "bfloat16", "float16", "float64"))
# the kernel takes no mask, segment ids or sliding window (window=False): such calls go to XLA
_PALLAS_FEATURES = Features(mask=False, segment_ids=False, window=False,
                            dtypes=("float32", "bfloat16", "float16"))
_TEST_OPTIONS = {"block_q": 16, "block_kv": 16}  # tiny conformance shapes span several blocks


def _spec(name, alpha, description):
    fix = functools.partial(_with_alpha, alpha=alpha) if alpha else (lambda fn: fn)
    impls = (Implementation("pallas", fix(_pallas), features=_PALLAS_FEATURES,
                            config=EntmaxConfig, skip_unless_named=pallas_skip_on_cpu),
             Implementation("xla", fix(entmax_attention_xla), config=EntmaxConfig))
    ref = fix(entmax_attention_reference)
    # with a free alpha, a learnable per-head α (Attention(learn=("alpha",))), built by
    # lcjax.nn (variant_params.learnable_alpha)
    params = None if alpha else LearnedParams("learnable_alpha")
    return AttentionSpec(name, reference=ref, implementations=impls, features=_FEATURES,
                         aux=AUX, params=params, test_options=_TEST_OPTIONS,
                         description=description)


ENTMAX = _spec("entmax", None, "alpha-entmax sparse attention (AdaSplash-2)")
SPARSEMAX = _spec("sparsemax", 2.0, "alpha = 2 entmax (sparsemax) attention")
