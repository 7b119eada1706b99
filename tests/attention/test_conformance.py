"""Runs the conformance suite (``conformance.py``) for every registered attention spec
and every one of its implementations."""

from conformance import ConformanceSuite, cases

from lcjax import attention


class TestConformance(ConformanceSuite):
    """All registered (spec, implementation) pairs, collected from the registry."""


def test_every_registered_implementation_is_collected():
    pairs = cases()
    assert {(s.name, i.name) for s in attention.specs() for i in s.implementations} == set(pairs)
    assert {"softmax", "blockwise", "jax"} <= {name for name, _ in pairs}
