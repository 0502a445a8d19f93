"""The benchmark harness: a run from what is asked to per-request records, and nothing else.

A run: `config` (what is asked, and a notebook's parameters as a config) -> `plan` (resolved
against adapters and weights) -> `runner` (methods x targets x benchmarks, interleaved per request,
with `sampling`, `placement`, `sidecars`, `oracle_calls`, `records` and `slices`) -> per-request
records. `runner.decode_requests` is the same loop for the studies and the lossless test.
`methods` turns a method name (``"ooospec:no_fsm"``) into draft sources and a tree budget;
`tree_budget` chooses the budget per machine from `verify_cost` and the committed acceptance.

What a chapter shows of the records lives in `ooospec.report`, the studies that measure around a
run in `ooospec.studies`, and `make reproduce`'s planning and the Ray sweep in `ooospec.reproduce`:
the harness imports none of them. Nothing here is imported by the engine.
"""
