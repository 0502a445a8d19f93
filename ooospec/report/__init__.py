"""Everything a chapter shows: tables, intervals, figures and verdicts made from records.

Records -> `tables`, `speedups` (same-work ratios with `intervals`), `hint_tables`, `ablations`,
`timelines`, `ar_accuracy` (AR's outputs scored), `accuracy`, `hint_check`, `verdict`; `figures`
and `attribution` draw them; `paper_numbers` holds the paper's claims for side-by-side figures;
`training_chapters` holds the teacher's and the sidecar's tables and figures. A report reads
records and committed artifacts; it runs no decoding of its own, so it may import the harness and
every layer below it, and nothing imports it but the studies, `ooospec.reproduce` and the notebooks.
"""
