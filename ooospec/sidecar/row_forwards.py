"""The forwards of one slot wave, behind one small protocol, so the wave's loop
(`ooospec.sidecar.predictor.SlotPredictor.generate_rows`) does not depend on the runtime that runs
the sidecar model: torch here (`TorchRowForwards`), llama.cpp in `ooospec.sidecar.llama_cpp_rows`.

A wave's rows share one request prefix. `RowForwards.start` runs the prefix (or reuses a prefix
state) and every row's question after it, and returns each row's next-token logits; `step` gives
every active row its chosen token (and a draft after it) in one forward; `accept` says how many
draft tokens each row keeps, the rest never being attended again; `keep` lets only some rows go on.
Invariant: whatever the runtime, row ``i`` sees exactly the prefix, its own question and its own
kept tokens, at contiguous positions, as if it ran alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ooospec.models.cache import expand_cache


@dataclass(frozen=True)
class ForwardTime:
    """One forward of a wave: its kind (``prefix``, ``rows``: the questions' first forward, ``step``),
    the rows it carried, the tokens per row, and its seconds."""

    kind: str
    rows: int
    tokens: int
    seconds: float


class RowForwards(Protocol):
    """What a wave asks of the runtime that runs the sidecar model (one wave per object)."""

    def prefix(self, prefix_ids: list[int]) -> tuple[Any, ForwardTime]:
        """The prefix's state (batch 1), reusable by later `start` calls of the same runtime."""

    def start(self, prefix_ids: list[int], questions: list[list[int]], share_prefix: bool = True,
              prefix_state: Any = None) -> tuple[torch.Tensor, list[ForwardTime]]:
        """Logits ``[rows, vocab]`` after each row's question, and the forwards that made them.
        ``share_prefix`` False: every row carries the whole prefix (the no-sharing ablation)."""

    def step(self, tokens: list[list[int]]) -> tuple[torch.Tensor, ForwardTime]:
        """One forward: active row ``i`` continues with ``tokens[i]`` (its token, then its draft);
        logits ``[rows, width, vocab]``, position ``j`` of a row read only for ``j < len(tokens[i])``."""

    def accept(self, kept: list[int]) -> None:
        """Row ``i`` keeps its token and ``kept[i]`` draft tokens of the last `step`."""

    def keep(self, rows: list[int]) -> None:
        """Only these active rows (indices into the active rows, in order) go on."""


class SidecarRuntime(Protocol):
    """A runtime holding its own copy of the sidecar model, loaded once, making one wave's forwards."""

    name: str

    def row_forwards(self) -> RowForwards:
        """The forwards of a new wave (a prefix state of an earlier wave may be reused)."""


class TorchRowForwards:
    """The wave on a torch sidecar: one batch, its KV cache, attention mask and positions.

    The questions are left-padded after the prefix; the mask and explicit positions keep each
    row's positions contiguous. A row that leaves the batch leaves the cache; a rejected draft
    token stays in the cache, masked."""

    def __init__(self, model: torch.nn.Module, pad_id: int, gathered_head: bool = True):
        self.model, self.pad_id, self.gathered_head = model, pad_id, gathered_head
        self.cache: Any = None
        self.mask = self.next_pos = torch.empty(0)
        self._width = 1

    @torch.no_grad()
    def prefix(self, prefix_ids: list[int]) -> tuple[Any, ForwardTime]:
        start = time.perf_counter()
        cache = self.model(input_ids=torch.tensor([prefix_ids]), use_cache=True, logits_to_keep=1).cache
        return cache, ForwardTime("prefix", 1, len(prefix_ids), time.perf_counter() - start)

    @torch.no_grad()
    def start(self, prefix_ids: list[int], questions: list[list[int]], share_prefix: bool = True,
              prefix_state: Any = None) -> tuple[torch.Tensor, list[ForwardTime]]:
        batch = len(questions)
        timeline: list[ForwardTime] = []
        if share_prefix:
            if prefix_state is None:
                prefix_state, prefix_time = self.prefix(prefix_ids)
                timeline.append(prefix_time)
            cache, seqs, base = expand_cache(prefix_state, batch), questions, len(prefix_ids)
        else:
            cache, seqs, base = None, [prefix_ids + q for q in questions], 0
        width = max(len(s) for s in seqs)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        tail_mask = torch.zeros((batch, width), dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, width - len(seq):] = torch.tensor(seq)
            tail_mask[i, width - len(seq):] = 1
        self.mask = torch.cat([torch.ones((batch, base), dtype=torch.long), tail_mask], dim=1)
        positions = (base + tail_mask.cumsum(-1) - 1).clamp(min=base if base else 0)
        start = time.perf_counter()
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions, cache=cache,
                         use_cache=True, logits_to_keep=self._last_position(width))
        timeline.append(ForwardTime("rows", batch, width, time.perf_counter() - start))
        self.cache, self.next_pos = out.cache, positions[:, -1:] + 1
        return out.logits[:, -1], timeline

    def _last_position(self, width: int) -> int | torch.Tensor:
        """Which positions of the rows' first forward the head reads: each row's last one.

        Gathered by index (``gathered_head``), the head's input is one contiguous batch; sliced
        (``logits_to_keep=1``) it is a strided view of the batch's hidden states, which a linear
        layer does not fold into one matrix product: in bf16 torch then multiplies row by row and
        copies the whole vocabulary matrix for each (profiled on a 2-core EPYC with avx512_bf16:
        about 500 of the 726 ms of an 8-row API-Bank forward). Both give the same logits."""
        return torch.tensor([width - 1]) if self.gathered_head else 1

    @torch.no_grad()
    def step(self, tokens: list[list[int]]) -> tuple[torch.Tensor, ForwardTime]:
        width = max(len(t) for t in tokens)
        ids = torch.full((len(tokens), width), self.pad_id, dtype=torch.long)
        step_mask = torch.zeros((len(tokens), width), dtype=torch.long)
        for pos, row in enumerate(tokens):
            ids[pos, :len(row)] = torch.tensor(row)
            step_mask[pos, :len(row)] = 1
        self.mask = torch.cat([self.mask, step_mask], dim=1)
        start = time.perf_counter()
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=self.next_pos + torch.arange(width),
                         cache=self.cache, use_cache=True)
        seconds = time.perf_counter() - start
        self.cache, self._width = out.cache, width
        return out.logits, ForwardTime("step", len(tokens), width, seconds)

    def accept(self, kept: list[int]) -> None:
        for pos, k in enumerate(kept):  # rejected draft positions: never attended
            self.mask[pos, self.mask.shape[1] - self._width + 1 + k:] = 0
        self.next_pos = self.next_pos + torch.tensor(kept).unsqueeze(1) + 1

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
