"""Where the target and the sidecar compute on a 2-core CPU: static pins, and the elastic core.

The bench pins the target to the first core and the sidecar process to the second ("own core",
the CPU analogue of the paper's second device). Placed statically, the sidecar's core idles once
its wave is done, while the equal-hardware control (ToolSpec with both cores) uses it throughout.
`ElasticCores` lends that core to the target whenever the sidecar has nothing to compute: at every
verify boundary the target runs two threads on both cores if no sidecar job is in flight, one on
its own core if one is; a request's arrival gives the core back before its job is submitted.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from ooospec.decoding.base import CorePlacement
from ooospec.sidecar.service import SidecarService


@dataclass(frozen=True)
class CorePlan:
    target_core: int | None
    sidecar_core: int | None

    @property
    def pinned(self) -> bool:
        return self.target_core is not None


@contextmanager
def placed(cores: set[int] | None, threads: int) -> Iterator[None]:
    """Run the block on ``cores`` (None: where we are) with ``threads`` torch threads; restore after."""
    old_affinity, old_threads = os.sched_getaffinity(0), torch.get_num_threads()
    if cores:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old_affinity)
        torch.set_num_threads(old_threads)


@contextmanager
def pinned_cores(threads: int, pin: bool) -> Iterator[CorePlan]:
    """Pin this process (the target) to one core and leave the next for the sidecar; restore after."""
    cores = sorted(os.sched_getaffinity(0))
    plan = CorePlan(cores[0], cores[1]) if pin and len(cores) >= 2 else CorePlan(None, None)
    with placed({plan.target_core} if plan.pinned else None, threads):
        yield plan


class ElasticCores(CorePlacement):
    """The target on both cores (``2 * threads``) while ``service`` is idle, on its own core
    (``threads``) while a sidecar job is in flight. Reading the service's state never waits (a
    zero-timeout drain of its result queue). ``switches`` and ``switch_s`` say what the switching cost.
    With ``prefill_chunk`` the target's own prefill runs in chunks with a boundary between them while
    it is narrow, so the switch can happen inside the prefill, where the sidecar's wave usually
    ends; once wide, the rest of the prompt runs in one forward (`settled`)."""

    def __init__(self, service: SidecarService, cores: CorePlan, threads: int = 1, prefill_chunk: int | None = None):
        self.service, self.cores, self.threads = service, cores, threads
        self.prefill_chunk = prefill_chunk
        self.wide = False
        self.switches, self.switch_s = 0, 0.0

    def _set(self, wide: bool) -> None:
        if wide == self.wide:
            return
        start = time.perf_counter()
        if self.cores.pinned:
            own = {self.cores.target_core}
            os.sched_setaffinity(0, own | {self.cores.sidecar_core} if wide else own)
        torch.set_num_threads(2 * self.threads if wide else self.threads)
        self.wide = wide
        self.switches += 1
        self.switch_s += time.perf_counter() - start

    def begin(self) -> None:
        self._set(False)  # the sidecar is about to get this request's job

    def boundary(self) -> None:
        self._set(self.service.idle)

    def end(self) -> None:
        self._set(False)

    @property
    def settled(self) -> bool:
        """Once wide, the target stays wide for the rest of its prefill: the request's one sidecar
        job is done, or (a deferred wave, `ooospec.decoding.wave_policy`) is submitted only after
        the prefill, when the next boundary makes the target narrow again."""
        return self.wide
