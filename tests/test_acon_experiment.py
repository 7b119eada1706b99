"""ACON experiment: the distillation claim needs a distillation that converged (loss down
and flat) and follows the paired interval; the truncation baseline keeps the tail."""

from __future__ import annotations

from experiments.acon import experiment as ex
from lcjax.agents import acon


def _distil(success, **kw):
    base = {"success": sum(success) / len(success), "per_task_success": success,
            "train_steps": 800, "first_loss": 5.0, "last_loss": 0.4,
            "reply_nll_last": 0.100, "reply_nll_prev": 0.102}
    return {**base, **kw}


def test_distil_claim_needs_convergence():
    teacher = [1.0] * 10
    short = _distil([0.0] * 10, train_steps=20, last_loss=4.0, reply_nll_prev=0.3)
    assert ex.distil_claim(short, teacher).verdict == "not tested"  # 20 steps, loss 5 -> 4
    still_falling = _distil([1.0] * 10, reply_nll_last=0.10, reply_nll_prev=0.20)
    assert ex.distil_claim(still_falling, teacher).verdict == "not tested"
    done = _distil([1.0] * 10)
    assert ex.distil_claim(done, teacher).holds is True
    assert ex.distil_claim(_distil([1.0, 0.0] * 5), teacher).holds is False
    assert "converged" in ex.distil_claim(done, teacher).precondition


def test_truncation_keeps_the_tail_of_the_text_to_compress():
    history = "".join(f"Observation {i}:\nline {i} " + "x" * 30 + "\nAction: next\n\n"
                      for i in range(10))
    prompt = acon.COMPRESS_HISTORY_PROMPT.format(guideline="g", history=history)
    out = ex.truncate_compress(prompt, keep=60)
    assert len(out.encode()) <= 60 and history.rstrip().endswith(out)
    assert "Summary:" not in out and "line 9" in out and "line 0" not in out
    obs = acon.COMPRESS_OBS_PROMPT.format(guideline="g", observation="The code is \u00e9" * 20)
    cut = ex.truncate_compress(obs, keep=7)  # never splits a UTF-8 character
    assert cut.endswith("\u00e9") and "Compressed" not in cut


def test_truncation_claim_follows_the_interval():
    c = ex.truncation_claim([1.0] * 20, [0.0] * 20, (450.0, 460.0))
    assert c.holds is True and "95% CI" in c.ours
    assert ex.truncation_claim([1.0, 0.0] * 10, [0.0, 1.0] * 10, (1, 1)).holds is False
    assert ex.truncation_claim([1.0], [0.0], (1, 1)).verdict == "not tested"


def test_call_agreement_compares_replies_with_the_teachers():
    """The scripted compressor replies exactly as the teacher (it is the teacher); the
    truncating one replies to the same prompts with something else."""
    from lcjax.agents import make_tasks
    from lcjax.agents.scripted import ThreadedServer, create_scripted_app

    states = ex.teacher_part("keep every code", make_tasks(2, seed=5, num_steps=8))
    calls = sum(len(s.compressions) for s in states)
    assert calls >= 3
    with ThreadedServer(create_scripted_app()) as same, \
            ThreadedServer(ex.create_truncation_app()) as other:
        ok = ex.call_agreement(ex.chat_endpoint(same.url, "scripted"), states)
        cut = ex.call_agreement(ex.chat_endpoint(other.url, "truncate"), states, limit=2)
    assert ok["calls"] == calls and ok["exact"] == 1.0
    assert cut["calls"] == 2 and cut["exact"] < 1.0
