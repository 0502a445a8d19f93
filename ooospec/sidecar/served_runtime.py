"""Which runtime runs the served sidecar's wave on this machine: the serving rule's outcome per CPU kind.

A wave's time is the machine's, so the rule on the differences page ("Serving a faster wave") is
applied per CPU kind, as the tree budget is: a runtime is served on a kind where, measured there, its
answers do not lower the whole-call agreement on the 129 API-disjoint dev requests (paired interval)
and its wave hands the chosen call over at least 10% earlier. `SERVED` holds the kinds where one
passed, with the torch sidecar's arithmetic it passed in; everywhere else the wave runs on torch.

* ``avx512_bf16`` in bf16 (AMD EPYC, Zen 4): llama.cpp on the sidecar converted in its own bf16
  arithmetic (`ooospec.sidecar.gguf_export`). Whole call 0.504 against 0.504 on the 129 requests
  (+0.000 [-0.023, +0.023]), the median wave 0.75 s against 1.02 s, the chosen call 19% earlier on
  the wave study's 30 dev requests (``artifacts/committed/sidecar-disjoint-dev/``,
  ``artifacts/committed/wave-profile/avx512_bf16.json``).
* AVX2 in fp32: llama.cpp is slower (0.86x in f32; its prefix forward is compute-bound), not served.
* ``amx_bf16``: not measured, so not served.

``runtime="torch"`` is the control everywhere; an explicit ``llama.cpp:<weights>`` is served as
asked. A machine whose llama-cpp-python is missing runs torch, said in one line
(`ooospec.sidecar.gguf_export.load_runtime`).
"""

from __future__ import annotations

import torch

from ooospec.models.arithmetic import machine_kind

SERVED_BY_RULE = "served"  # the runtime option that asks for this table's choice
# CPU kind -> (the torch sidecar's dtype the rule was measured in, the runtime served there)
SERVED: dict[str, tuple[torch.dtype, str]] = {"avx512_bf16": (torch.bfloat16, "llama.cpp:bf16")}


def served_runtime(kind: str, dtype: torch.dtype) -> str:
    """The runtime the rule serves on ``kind`` for a sidecar in ``dtype``; ``torch`` where none passed
    there, or where the sidecar runs in another arithmetic than the one measured (a bf16 CPU capped to
    AVX2 kernels runs fp32, and its wave was not measured on llama.cpp)."""
    measured, runtime = SERVED.get(kind, (None, "torch"))
    return runtime if dtype == measured else "torch"


def resolve_runtime(runtime: str, dtype: torch.dtype) -> str:
    """``runtime`` as the sidecar will run: `SERVED_BY_RULE` becomes this machine's choice; any
    other name (``torch``, ``llama.cpp:<weights>``) is kept as asked."""
    return served_runtime(machine_kind(), dtype) if runtime == SERVED_BY_RULE else runtime
