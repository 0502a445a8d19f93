"""`torch.compile` for a decoding model: the CPU inductor with weight freezing, warmed up at load.

Why: on CPU the eager forward of a 0.5B model at batch 1 spends much of a one-row step outside the
matrix products (Python dispatch, many small kernels), and a small-M matrix product leaves BLAS's
matrix-vector path (the verify-cost study in the ToolSpec chapter). The inductor fuses the small
kernels, and with ``freezing`` the weights become constants, prepacked for oneDNN. Measured here
(Qwen target, bf16, 1 thread, 400-token prefix, a probe): the one-row step 91 -> 56 ms.

Three things a reader of the speed figures must be able to trust:

Compilation happens at the entry point of a decoding run (as gpt-fast compiles in its ``main``):
the caller loads a target (`ooospec.models.target.load_target`, eager) and hands it to
`compile_target`, which compiles it as its profile asks; loading stays in `ooospec.models`, so the
engine never loads a model itself. The verifier is told (`TreeVerifier.for_target`) and keeps its
cache dense.

* **Compile time is never timed.** Compilation is lazy; `compile_for_decoding` runs the three
  call shapes the verifier uses (a prefill, a one-row step, tree forwards with a 4-D mask) on a
  dummy prefix before the model is handed out, and records how long that took and how many graphs
  existed then; a bench run records how many were compiled later, inside its decodes (none,
  measured). The verifier keeps the KV cache dense for a compiled model: a compiled forward guards
  on the cache's strides and would otherwise recompile for each layout.
* **Same arithmetic, same outputs.** A compiled forward sums in another order than an eager one,
  so whether it keeps greedy outputs is measured, not assumed: every speculative method must stay
  identical to AR *in the compiled arithmetic* (the lossless tests and the audit), and the study
  compares compiled AR against eager AR on the same requests.
* **No silent fallback.** A machine or torch build that cannot compile (no C++ compiler, an
  unsupported op) runs the eager model with one line on stderr saying why.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from ooospec.decoding.base import Draft
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier, commit_kv
from ooospec.models.packed_linear import pack_linears
from ooospec.models.target import CompileReport, TargetModel

WARM_UP_PREFIX = 48  # tokens of the dummy prefix: long enough that no size is specialized as 0/1
WARM_UP_TREES = (1, 3, 8)  # tree sizes (nodes) run once each: rows 2, 4 and 9 make the row count dynamic


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a run compares it with
    `CompileReport.graphs` to show that no compilation happened inside its timed decodes)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _warm_up(model: Any) -> None:
    """Every call shape of `TreeVerifier`, so compilation happens here and not in a timed decode."""
    verifier = TreeVerifier(model, eos_token_ids=[], dense_cache=True)
    vocab = model.config.get_text_config().vocab_size
    prefix = [(7 * i + 11) % vocab for i in range(WARM_UP_PREFIX)]
    state, _ = verifier.prefill(prefix)
    for nodes in (0, *WARM_UP_TREES, 0):
        drafts = [Draft([(13 * i + 5) % vocab for i in range(nodes)], "pld")] if nodes else []
        tree = build_tree(drafts, TreeBudget(max_nodes=max(nodes, 1), max_depth=max(nodes, 1)))
        start = state.cache_len
        verifier.forward_tree(state, tree)
        commit_kv(state.cache, start, [], dense=True)


def compile_for_decoding(model: Any, mode: str | None, name: str = "model") -> CompileReport:
    """Compile ``model`` in place for batch-1 greedy decoding (``mode`` ``inductor``) and warm it
    up; on any failure the model is left eager and one line on stderr says why."""
    if mode is None:
        return CompileReport(None, 0.0)
    if mode != "inductor":
        raise ValueError(f"{name}: unknown compile mode {mode!r}; known: ['inductor']")
    start = time.perf_counter()
    if not hasattr(torch, "compile") or not hasattr(model, "compile"):
        return _fallback(model, name, "this torch build has no torch.compile", start)
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    # One compiled frame serves every model of the process (the forward's decorator is shared), about
    # four graphs per architecture (prefill, step, 2-row tree, any tree): room for several, and a
    # hit limit raises instead of silently running eager
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    dynamo_config.fail_on_recompile_limit_hit = True
    # freezing: the weights become constants of the compiled graph (folded, prepacked for oneDNN),
    # which is most of the gain measured here; dynamo then guards on each weight's identity, so a
    # second model compiles its own graphs instead of reusing another model's constants (tested).
    # Set for the process (the per-call `options` did not engage it, measured); inference only:
    # LoRA training never compiles.
    inductor_config.freezing = True
    try:
        # dynamic: the prefix grows every step and the row count changes with the tree
        model.compile(backend="inductor", dynamic=True)
        with torch.no_grad():
            _warm_up(model)
    except Exception as err:  # noqa: BLE001 - any compiler failure means: run eager, say so
        return _fallback(model, name, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", start)
    return CompileReport("inductor", time.perf_counter() - start, graphs=compiled_graphs())


def _fallback(model: Any, name: str, reason: str, start: float) -> CompileReport:
    if hasattr(model, "_compiled_call_impl"):
        model._compiled_call_impl = None  # back to the eager forward
    print(f"{name}: torch.compile (inductor) unavailable, running eager: {reason}", file=sys.stderr)
    return CompileReport(None, time.perf_counter() - start, fallback=reason)


def compile_target(target: TargetModel) -> TargetModel:
    """Compile ``target``'s model as its profile asks (``compile_mode``; None: eager) and record what
    happened in ``target.compiled``. After any adapter merge: freezing makes the merged weights
    constants of the compiled graph. A model left eager in fp32 on the CPU gets its multi-row
    products on oneDNN-packed weights (`ooospec.models.packed_linear`; the records say so)."""
    target.compiled = compile_for_decoding(target.model, target.compile_mode, target.name)
    if target.compiled.mode is None:
        pack_linears(target.model)
    return target
