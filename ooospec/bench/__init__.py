"""The benchmark around the engine: methods by name, the runner, summaries, figures.

`methods` turns a method name (``"ooospec:no_fsm"``) into draft sources and a tree budget;
`runner` decodes methods x targets x benchmarks into per-request records; `summary` turns records
into tables; `plots` and `attribution` draw them; `study` (with `compare` and `verify_cost`) is
the ToolSpec chapter's AR / PLD / ToolSpec comparison and verify-cost curve; `paper_numbers`
holds the paper's claims for side-by-side figures. Nothing here is imported by the engine.
"""
