"""Runs the conformance suite (``conformance.py``) for every registered attention spec
and every one of its implementations."""

from conformance import ConformanceSuite, cases

from lcjax import attention


class TestConformance(ConformanceSuite):
    """All registered (spec, implementation) pairs, collected from the registry."""


def test_every_registered_implementation_is_collected():
    pairs = cases()
    assert {(s.name, i.name) for s in attention.specs() if s.alias_of is None
            for i in s.implementations} == set(pairs)
    # the softmax family: one method, three implementations; the old names are aliases
    assert {("softmax", "xla"), ("softmax", "blockwise"), ("softmax", "jax")} <= set(pairs)
    for alias in ("blockwise", "jax"):
        method, impl = attention.spec(alias).alias_of
        assert (method, impl) in pairs
        assert (attention.spec(alias).implementation("xla").fn
                is attention.spec(method).implementation(impl).fn)
