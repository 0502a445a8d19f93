"""Measurements around a bench run, each a stage or a committed artifact of its own.

`forward_cost` (verify cost curves, the arithmetic study), `compile_study` (eager beside compiled),
`lossless_audit`, `hint_replay` (hint uses replayed against committed outputs),
`tree_budget_acceptance` (the dev acceptance the bench's budget rule reads) and
`machine_calibration` (this machine's forward times, which the time plan and the replay read).
`target_cache` loads a target once per process for all of them. A study may import the harness
(`ooospec.bench`), the report (its tables use the same intervals) and every layer below.
"""
