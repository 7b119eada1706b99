"""The TPU compile gate (``experiments/tpu_gate.py``): every registered spec with a "pallas"
implementation, and jax's own TPU flash attention as the anchor, compiled with libtpu for
``v5e:2x2`` and ``v5p:2x2x1`` at T = 8K, 32K, 128K (forward and forward+backward) and the
forward at T = 1M on ``v5p:2x2x1``, from this CPU host. A cell passes when it compiles and
its HBM temporaries per chip stay within the O(T) bounds of ``tpu_gate.bounds``; the rows
are printed at the end of the run (``tests/tpu/conftest.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("libtpu", reason="the TPU compile gate needs libtpu: pip install "
                                     "'lcjax[tpu]' (make test installs it)")

from experiments import tpu_gate  # noqa: E402

GROUPS = [(m, topo, mode) for m in tpu_gate.methods() for topo in tpu_gate.TOPOLOGIES
          for mode in tpu_gate.MODES]


def _check(rows, record_property):
    for row in rows:
        record_property("tpu_gate_row", tpu_gate.row_line(row))
    failed = [f"{tpu_gate._name(r)}: {r['error']}" for r in rows if not r["ok"]]
    violations = tpu_gate.bounds(rows)
    assert not failed and not violations, "\n".join(failed + violations)


def test_registry_has_the_pallas_specs():
    """The gate takes its rows from the registry; these five must be among them."""
    assert {"asentmax", "entmax", "plash", "sparsemax", "token_sparse"} <= set(
        tpu_gate.pallas_methods())


@pytest.mark.parametrize(("method", "topology", "mode"), GROUPS,
                         ids=[f"{m}-{t}-{mode}" for m, t, mode in GROUPS])
def test_compiles_at_8k_32k_128k_in_linear_memory(method, topology, mode, record_property):
    rows = [tpu_gate.compile_cell(tpu_gate.Cell(method, topology, t, mode))
            for t in tpu_gate.LENGTHS]
    _check(rows, record_property)


@pytest.mark.parametrize("method", tpu_gate.methods())
def test_forward_compiles_at_1m_on_v5p(method, record_property):
    topology, length = tpu_gate.LONG
    _check([tpu_gate.compile_cell(tpu_gate.Cell(method, topology, length, "fwd"))],
           record_property)
