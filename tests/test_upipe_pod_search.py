"""experiments/upipe/tpu.py's search and verdict logic on synthetic compile points (no
compiler): the line estimate, the host-memory cap, bisection and the three verdicts."""

from experiments.upipe import tpu

GiB = 1 << 30
HBM = 95 * GiB
STEP = tpu.STEP


def _pt(strategy, steps, total_gib=None, fits=True, target="step-offload", host_gib=None,
        error=None, context=8, model="llama3-8b"):
    return {"model": model, "topology": "v5p:2x2x2", "target": target, "strategy": strategy,
            "seq_len": steps * STEP, "fits": fits, "hbm_bytes": HBM, "error": error,
            "total_bytes": None if total_gib is None else int(total_gib * GiB),
            "host_bytes": None if host_gib is None else int(host_gib * GiB),
            "mesh": {"data": 1, "context": context}}


def test_line_estimate_is_where_the_line_meets_hbm():
    pts = [_pt("ulysses", 1, 10), _pt("ulysses", 2, 15), _pt("ulysses", 10, 55)]
    # the two longest sized points: 15 GiB at 2 steps, 55 at 10 -> 5 GiB/step -> 95 at 18
    assert abs(tpu.line_estimate(pts) - 18 * STEP) < 1e-6 * STEP


def test_host_cap_from_the_compilers_host_error_bounds_every_strategy_of_a_target():
    err = ("RESOURCE_EXHAUSTED: Allocation (size=171798691840) would exceed memory (size="
           f"{64 * GiB}) :: %s0 = inlined_call_operand.host [shape: bf16[32,1,655360,4096]]")
    pts = [_pt("upipe", 1, 20, host_gib=1.0), _pt("upipe", 2, 21, host_gib=2.0),
           _pt("upipe", 100, fits=False, error=err),
           _pt("ulysses", 1, 20, host_gib=1.0), _pt("ulysses", 2, 21, host_gib=2.0)]
    rows = {r["strategy"]: r for r in tpu.summarise(pts)}
    for row in rows.values():  # 64 GiB of host at 1 GiB per 128K tokens: 64 steps
        assert abs(row["host_cap"] - 64 * STEP) < 1e-6 * STEP
        assert abs(row["line"] - 64 * STEP) < 1e-6 * STEP < row["hbm_line"]
    (claim,) = [c for c in tpu.claims(list(rows.values())) if "UPipe largest T" in c.claim]
    assert claim.holds is None and "host memory caps both" in claim.ours


def test_bisection_halves_the_bracket_and_doubles_without_an_upper_bound():
    pts = [_pt("ulysses", 1, 10), _pt("ulysses", 2, 15), _pt("ulysses", 8, fits=False)]
    (job,) = tpu.bisect_jobs(tpu.summarise(pts))
    assert job[-1] == 5 * STEP
    (job,) = tpu.bisect_jobs(tpu.summarise(pts[:2]))
    assert job[-1] == 4 * STEP
    assert tpu.bisect_jobs(tpu.summarise(pts[:2] + [_pt("ulysses", 3, fits=False)])) == []


def test_ratio_verdicts_follow_the_lines_and_need_two_upipe_stages():
    def rows(u_slope, p_slope, context=8, model="llama3-8b"):
        pts = [_pt(s, n, 5 + slope * n, target="layer", context=context, model=model)
               for s, slope in (("ulysses", u_slope), ("upipe", p_slope)) for n in (1, 2)]
        return tpu.summarise(pts)

    (c,) = [c for c in tpu.claims(rows(3.0, 2.0)) if "UPipe largest T" in c.claim]
    assert c.holds is True  # 30 vs 45 steps: 1.5x
    (c,) = [c for c in tpu.claims(rows(3.0, 2.8)) if "UPipe largest T" in c.claim]
    assert c.holds is False  # 1.07x
    (c,) = [c for c in tpu.claims(rows(3.0, 2.0, context=64, model="llama3-70b"))
            if "UPipe largest T" in c.claim]
    assert c.holds is None and "1 stage" in c.ours  # 64 heads over 64 chips
