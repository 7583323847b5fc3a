"""Benchmarks: `python -m workers.bench <name> [--json]`. Each prints a human summary and, as
its last line, one JSON object with the figures (ratios are measured side by side in one run)."""
