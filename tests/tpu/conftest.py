"""The TPU compile gate's summary: every compiled cell's row (method, topology, mode, T,
temp bytes per chip, compile seconds), collected from the workers' reports (pytest-xdist
ships ``user_properties``) and printed at the end of the run."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter):
    rows = [value for reports in terminalreporter.stats.values() for rep in reports
            if getattr(rep, "when", None) == "call"
            for key, value in getattr(rep, "user_properties", ()) if key == "tpu_gate_row"]
    if rows:
        terminalreporter.write_sep("-", f"TPU compile gate: {len(rows)} cells")
        for line in sorted(rows):
            terminalreporter.write_line(line)
