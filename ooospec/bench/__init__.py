"""The benchmark around the engine: methods by name, one runner, the tables and figures of the book.

A run: `config` (what is asked) -> `plan` (resolved against adapters and weights) -> `runner`
(methods x targets x benchmarks, interleaved per request, with `sampling`, `placement`, `sidecars`,
`records` and `slices`) -> per-request records. `runner.decode_requests` is the same loop for the
studies and the lossless test. `methods` turns a method name (``"ooospec:no_fsm"``) into draft
sources and a tree budget; `tree_budget` chooses the budget per machine.

Records -> `tables`, `speedups` (same-work ratios with `intervals`), `hint_tables`, `ablations`,
`timelines`, `outputs`, `verdict`; `plots` and `attribution` draw them. Studies: `cost_studies`
(verify cost, arithmetic), `lossless_audit`, `compile_study`, `hint_replay`, `hint_check`.
`paper_numbers` holds the paper's claims for side-by-side figures. Nothing here is imported by the
engine.
"""
