"""The sidecar's wave on llama.cpp (through llama-cpp-python's C API): a runtime made for small
decoders, measured as a lever of the wave (`ooospec.studies.wave_profile`).

The model is the served sidecar converted to GGUF (`ooospec.sidecar.gguf_export`). One context
holds the wave in a unified KV cache: sequence 0 is the request prefix, decoded once; each row is a
sequence of its own that starts as a copy of sequence 0 (the prefix's cells are shared, not
copied) and grows by its question, its tokens and its drafts. Rows that leave the wave, and draft
tokens a row rejects, are removed from the cache, so every row attends exactly to the prefix and
its own kept tokens at contiguous positions (the invariant of `ooospec.sidecar.row_forwards`).
Logits come back in fp32 for every position a forward asks for.

The KV cache is kept in the weights' own precision (f32 for f32 weights, bf16 for bf16, f16 for
8-bit weights), and flash attention is off: on the AVX2 kind it gave no gain, and the plain path
is the one checked against torch.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooospec.sidecar.row_forwards import ForwardTime

BATCH = 2048  # tokens per llama_decode call (and per micro-batch): a prefix is one forward
CONTEXT = 8192  # KV cells: the prefix once, then every row's question and kept tokens
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: the prefix and up to 255 rows
KV_TYPES = {"f32": 0, "bf16": 30, "q8_0": 1}  # ggml's F32, BF16, F16
_LOG_ERROR = 4  # ggml's GGML_LOG_LEVEL_ERROR


class RuntimeMissing(ImportError):
    """llama-cpp-python is not installed (``make setup`` builds it)."""


_LOG_CALLBACK: Any = None  # llama.cpp keeps a pointer to it: it must outlive every context


def llama_cpp() -> Any:
    """llama-cpp-python's C API, its loader's chatter silenced (errors still reach stderr)."""
    global _LOG_CALLBACK
    try:
        import llama_cpp.llama_cpp as lib
    except ImportError as err:
        raise RuntimeMissing(f"the llama.cpp runtime needs llama-cpp-python ({err}); `make setup` installs it") from err
    if _LOG_CALLBACK is None:
        def log(level: int, text: bytes, _: Any) -> None:
            if level == _LOG_ERROR:
                import sys

                sys.stderr.write(text.decode(errors="replace"))

        _LOG_CALLBACK = lib.llama_log_callback(log)
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        lib.llama_backend_init()
    return lib


@dataclass(frozen=True)
class PrefixHeld:
    """The prefix sequence 0 of a `LlamaCppSidecar` holds (a wave's reusable prefix state)."""

    tokens: tuple[int, ...]


class LlamaCppSidecar:
    """One GGUF sidecar loaded into one llama.cpp context (a `SidecarRuntime`), on ``threads``
    threads (default: torch's, as the process running the sidecar set them)."""

    def __init__(self, path: Path, weights: str, threads: int | None = None):
        if weights not in KV_TYPES:
            raise ValueError(f"weights {weights!r}: one of {', '.join(KV_TYPES)}")
        self.lib = lib = llama_cpp()
        self.name = f"llama.cpp {weights}"
        self.path, self.weights = Path(path), weights
        self.model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        if not self.model:
            raise ValueError(f"{path}: llama.cpp could not load it as a model")
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = CONTEXT, BATCH, BATCH, MAX_SEQUENCES
        params.n_threads = params.n_threads_batch = threads or torch.get_num_threads()
        params.type_k = params.type_v = KV_TYPES[weights]
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.kv_unified, params.no_perf = True, True
        self.context = lib.llama_init_from_model(self.model, params)
        if not self.context:
            raise ValueError(f"{path}: llama.cpp could not make a context for it")
        self.memory = lib.llama_get_memory(self.context)
        self.vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.batch = lib.llama_batch_init(BATCH, 0, 1)
        self.held: PrefixHeld | None = None

    def close(self) -> None:
        if self.context:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.context)
            self.lib.llama_model_free(self.model)
            self.context = self.model = None

    def reset(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)
        self.held = None

    def decode(self, items: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Forward of ``(token, position, sequence, wants logits)`` items; the logits asked for, in order."""
        out: list[np.ndarray] = []
        batch = self.batch
        for first in range(0, len(items), BATCH):
            chunk = items[first:first + BATCH]
            for i, (token, position, sequence, wants) in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, 1, wants
                batch.seq_id[i][0] = sequence
            batch.n_tokens = len(chunk)
            status = self.lib.llama_decode(self.context, batch)
            if status != 0:
                raise RuntimeError(f"{self.path.name}: llama_decode returned {status} on {len(chunk)} tokens "
                                   f"({'no KV cell left' if status == 1 else 'failed'}; context {CONTEXT} cells)")
            for i, (*_, wants) in enumerate(chunk):
                if wants:
                    pointer = self.lib.llama_get_logits_ith(self.context, i)
                    out.append(np.ctypeslib.as_array(pointer, shape=(self.vocab,)).copy())
        return np.stack(out) if out else np.zeros((0, self.vocab), dtype=np.float32)

    def row_forwards(self) -> "LlamaCppRowForwards":
        return LlamaCppRowForwards(self)

    def sequence_logits(self, prefix: list[int], tail: list[int]) -> torch.Tensor:
        """Logits after the prefix's last token and after every token of ``tail``, one sequence."""
        self.reset()
        ids = prefix + tail
        logits = self.decode([(t, p, 0, p >= len(prefix) - 1) for p, t in enumerate(ids)])
        self.reset()
        return torch.from_numpy(logits)


class LlamaCppRowForwards:
    """One wave's forwards in a `LlamaCppSidecar`'s context (`ooospec.sidecar.row_forwards.RowForwards`)."""

    def __init__(self, runtime: LlamaCppSidecar):
        self.rt = runtime
        self.sequences: list[int] = []
        self.positions: list[int] = []  # each active row's next position
        self._given: list[int] = []

    def prefix(self, prefix_ids: list[int]) -> tuple[PrefixHeld, ForwardTime]:
        start = time.perf_counter()
        self.rt.reset()
        self.rt.decode([(t, p, 0, False) for p, t in enumerate(prefix_ids)])
        self.rt.held = PrefixHeld(tuple(prefix_ids))
        return self.rt.held, ForwardTime("prefix", 1, len(prefix_ids), time.perf_counter() - start)

    def start(self, prefix_ids: list[int], questions: list[list[int]], share_prefix: bool = True,
              prefix_state: Any = None) -> tuple[torch.Tensor, list[ForwardTime]]:
        lib, memory = self.rt.lib, self.rt.memory
        if len(questions) >= MAX_SEQUENCES:
            raise ValueError(f"{len(questions)} rows: the llama.cpp sidecar runs at most {MAX_SEQUENCES - 1} in a wave")
        timeline: list[ForwardTime] = []
        self.sequences = list(range(1, len(questions) + 1))
        if share_prefix:
            if prefix_state is None:
                prefix_state, prefix_time = self.prefix(prefix_ids)
                timeline.append(prefix_time)
            if self.rt.held != prefix_state or prefix_state.tokens != tuple(prefix_ids):
                raise ValueError("the llama.cpp sidecar no longer holds this prefix (another prefix ran since)")
            lib.llama_memory_seq_keep(memory, 0)  # an earlier wave's rows leave; the prefix stays
            for sequence in self.sequences:
                lib.llama_memory_seq_cp(memory, 0, sequence, -1, -1)
            base, seqs = len(prefix_ids), questions
        else:  # every row carries the whole prefix
            self.rt.reset()
            base, seqs = 0, [prefix_ids + q for q in questions]
        items = [(t, base + j, s, j == len(q) - 1) for s, q in zip(self.sequences, seqs) for j, t in enumerate(q)]
        start = time.perf_counter()
        logits = self.rt.decode(items)
        timeline.append(ForwardTime("rows", len(seqs), max(len(q) for q in seqs), time.perf_counter() - start))
        self.positions = [base + len(q) for q in seqs]
        return torch.from_numpy(logits), timeline

    def step(self, tokens: list[list[int]]) -> tuple[torch.Tensor, ForwardTime]:
        width = max(len(t) for t in tokens)
        items = [(t, self.positions[i] + j, self.sequences[i], True) for i, row in enumerate(tokens)
                 for j, t in enumerate(row)]
        start = time.perf_counter()
        flat = torch.from_numpy(self.rt.decode(items))
        seconds = time.perf_counter() - start
        if width == 1:
            logits = flat.unsqueeze(1)
        else:
            logits = flat.new_zeros((len(tokens), width, flat.shape[-1]))
            first = 0
            for i, row in enumerate(tokens):
                logits[i, :len(row)] = flat[first:first + len(row)]
                first += len(row)
        self._given = [len(t) for t in tokens]
        return logits, ForwardTime("step", len(tokens), width, seconds)

    def accept(self, kept: list[int]) -> None:
        for i, k in enumerate(kept):
            if 1 + k < self._given[i]:  # the rejected draft tokens leave the row's sequence
                self.rt.lib.llama_memory_seq_rm(self.rt.memory, self.sequences[i], self.positions[i] + 1 + k, -1)
            self.positions[i] += 1 + k

    def keep(self, rows: list[int]) -> None:
        for i in sorted(set(range(len(self.sequences))) - set(rows)):
            self.rt.lib.llama_memory_seq_rm(self.rt.memory, self.sequences[i], -1, -1)
        self.sequences = [self.sequences[i] for i in rows]
        self.positions = [self.positions[i] for i in rows]

