"""ACON experiment: the distillation claim needs a distillation that converged."""

from __future__ import annotations

from experiments.acon import experiment as ex


def test_distil_claim_needs_convergence():
    short = {"success": 0.0, "train_steps": 20, "first_loss": 5.0, "last_loss": 4.0}
    assert ex.distil_claim(short, 1.0).verdict == "not tested"  # 20 steps, loss 5 -> 4
    done = {"success": 1.0, "train_steps": 400, "first_loss": 5.0, "last_loss": 0.4}
    assert ex.distil_claim(done, 1.0).holds is True
    assert ex.distil_claim({**done, "success": 0.5}, 1.0).holds is False
    assert "converged" in ex.distil_claim(done, 1.0).precondition
