"""The one verifier every method shares: a token tree in, one target forward, the accepted tokens out.

Cache invariant (`VerifierState`): the KV cache holds every committed token except the last one.
That last token is the *root* of the next tree: each round feeds ``[root] + tree nodes`` with an
explicit 4-D additive mask (each row sees the cached prefix, itself and its ancestors) and
explicit position ids (prefix length + depth), so the model's own attention code does tree
attention; no modeling file is forked. transformers 5.x passes a 4-D mask through unchanged
(`masking_utils._preprocess_mask_arguments` returns early on ``attention_mask.ndim == 4``), and both
its ``sdpa`` and ``eager`` attention add a float mask to the scores.

After the forward, the greedy walk accepts the longest path whose every token equals the argmax
at its parent, plus the bonus token (the argmax at the path's last row). The KV entries of the
root and the accepted path are gathered into place and everything else is cut off, which keeps a
stock `DynamicCache` exactly as if the accepted tokens had been fed one by one.
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from ooospec.decoding.base import SHARED
from ooospec.decoding.tree import DraftTree
from ooospec.models.lean_decoder import lean_decoder_of


@dataclass
class VerifierState:
    """The KV cache of one request and the pending root: the last committed token, the only
    committed token whose KV entry the cache does not hold yet. The committed token ids themselves
    live in the loop's `DecodeState`; the verifier needs only the root and the cache length."""

    cache: DynamicCache
    root: int
    cache_len: int

    def clone(self) -> "VerifierState":
        """An independent copy (a shared prefill for several methods on one request)."""
        return VerifierState(copy.deepcopy(self.cache), self.root, self.cache_len)


@dataclass
class Round:
    """What one verify forward did."""

    tree_size: int
    accepted_nodes: list[int]  # tree node indices on the accepted path (after truncation)
    new_tokens: list[int]  # committed this round: accepted path tokens + bonus (maybe truncated)
    credits: list[str]  # per new token: the source of its node, "shared" (several), or "bonus"
    forward_s: float
    finish: str | None = None  # "eos" | "length" | None
    margins: list[float] = field(default_factory=list)  # top-1 minus top-2 logit per new token


def _cache_layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    for index, layer in enumerate(layers):
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cache layer {index} is a {type(layer).__name__}; the tree verifier commits by "
                "gathering KV rows and supports only full-attention DynamicLayer caches"
            )
    return layers


def _make_dense(layer: DynamicLayer) -> None:
    layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()


def commit_kv(cache: DynamicCache, prefix_len: int, keep_rows: list[int], dense: bool = False) -> None:
    """Keep the cached prefix plus the rows ``keep_rows`` of the last forward (row 0 = root),
    moved into consecutive positions; drop every other entry the forward appended.

    ``dense``: always leave dense tensors. Cutting a cache's tail is otherwise a view whose strides
    are those of the longer tensor; an eager forward does not care (its next concatenation copies
    anyway), but a compiled one guards on strides and would recompile for every layout."""
    contiguous = keep_rows == list(range(len(keep_rows)))
    rows = [prefix_len + r for r in keep_rows]
    end = prefix_len + len(keep_rows)
    for layer in _cache_layers(cache):
        if not layer.is_initialized:
            continue
        index = None if contiguous else torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
        if contiguous:
            layer.keys = layer.keys[:, :, :end, :]
            layer.values = layer.values[:, :, :end, :]
            if dense:
                _make_dense(layer)
        else:
            layer.keys = torch.cat([layer.keys[:, :, :prefix_len], layer.keys.index_select(2, index)], dim=2)
            layer.values = torch.cat(
                [layer.values[:, :, :prefix_len], layer.values.index_select(2, index)], dim=2
            )


def node_credit(sources: list[str]) -> str:
    """The credit of an accepted node: its one proposing source, or ``shared`` for several."""
    return sources[0] if len(set(sources)) == 1 else SHARED


def _top2_gap(logits: torch.Tensor) -> list[float]:
    top = torch.topk(logits.float(), 2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


class TreeVerifier:
    """Greedy, batch-1 tree verification for any HF causal LM with a `DynamicCache`."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: list[int], track_margins: bool = False,
                 dense_cache: bool = False):
        self.model = model
        self.eos = set(int(t) for t in eos_token_ids)
        self.track_margins = track_margins
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.config = model.config
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        # a compiled model (`ooospec.decoding.compiled`) guards on the cache's strides: its caller says so
        self.dense_cache = dense_cache
        # decode and verify forwards run the model's lean decoder where one is attached
        # (`ooospec.models.lean_decoder`); the prefill, the same for every method, runs the model
        self.decoder = lean_decoder_of(model) or model

    @classmethod
    def for_target(cls, target: Any, track_margins: bool = False) -> "TreeVerifier":
        """The verifier of a `TargetModel`, told whether its model runs compiled."""
        return cls(target.model, target.eos_token_ids, track_margins, dense_cache=target.compiled.mode is not None)

    def _forward(self, input_ids: list[int], decode: bool = False, **kwargs) -> torch.Tensor:
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        out = (self.decoder if decode else self.model)(input_ids=ids, use_cache=True, **kwargs)
        return out.logits[0]

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int], chunk: int | None = None,
                between: Callable[[], bool | None] | None = None) -> tuple[VerifierState, float | None]:
        """Run the prompt, returning the state (its root is the first output token) and that
        token's top-2 gap. With ``chunk``, the prompt runs in forwards of ``chunk`` tokens on one
        cache, ``between`` called before every one but the first (a placement may change there);
        once ``between`` returns True (the placement will not change again) the rest of the prompt
        runs in one forward, since every further chunk would only re-read the weights. The cache
        and first token are those of one forward up to the arithmetic's rounding."""
        if not prompt_ids:
            raise ValueError("prefill needs a non-empty prompt")
        if chunk is not None and chunk < 1:
            raise ValueError(f"prefill chunk must be >= 1, got {chunk}")
        cache = DynamicCache(config=self.config)
        kwargs = {"logits_to_keep": 1} if self._logits_to_keep else {}
        ids = list(prompt_ids)
        start, size = 0, chunk or len(ids)
        while start < len(ids):
            if start and between is not None and between():
                size = len(ids) - start
            logits = self._forward(ids[start:start + size], cache=cache, **kwargs)[-1]
            start += size
        for layer in _cache_layers(cache):
            if self.dense_cache and layer.is_initialized:  # the prefill leaves transposed views
                _make_dense(layer)
        first = int(logits.argmax())
        margin = _top2_gap(logits) if self.track_margins else None
        return VerifierState(cache, first, len(prompt_ids)), margin

    @torch.no_grad()
    def forward_tree(self, state: VerifierState, tree: DraftTree) -> torch.Tensor:
        """Logits ``[1+n, vocab]`` of the root and every tree node; the cache then also holds the
        rows of this forward (`commit_kv` keeps the accepted ones)."""
        prefix_len = state.cache_len
        if tree.size == 0:
            # a plain one-token step, exactly what `generate` runs
            return self._forward(
                [state.root],
                decode=True,
                cache=state.cache,
                position_ids=torch.tensor([[prefix_len]], device=self.device),
            )
        return self._forward(
            [state.root] + tree.tokens,
            decode=True,
            cache=state.cache,
            attention_mask=tree.attention_mask(prefix_len, self.dtype).to(self.device),
            position_ids=tree.position_ids(prefix_len).to(self.device),
        )

    @torch.no_grad()
    def step(self, state: VerifierState, tree: DraftTree, limit: int) -> Round:
        """One verify round committing at most ``limit`` (>= 1) new tokens into ``state``'s cache;
        the caller appends `Round.new_tokens` to its committed ids."""
        if limit < 1:
            raise ValueError(f"step needs room for at least one token, got limit={limit}")
        prefix_len = state.cache_len
        start = time.perf_counter()
        logits = self.forward_tree(state, tree)
        predicted = logits.argmax(dim=-1).tolist()
        accepted = tree.walk(predicted)
        rows = [0] + [node + 1 for node in accepted]
        new_tokens = [tree.tokens[node] for node in accepted] + [predicted[rows[-1]]]
        credits = [node_credit(tree.sources[node]) for node in accepted] + ["bonus"]

        cut = len(new_tokens)
        for j, token in enumerate(new_tokens):
            if token in self.eos:
                cut = j + 1
                break
        cut = min(cut, limit)
        new_tokens = new_tokens[:cut]
        finish = "eos" if new_tokens[-1] in self.eos else ("length" if cut == limit else None)
        kept = len(new_tokens)
        accepted = accepted[: kept - 1]
        credits = credits[:kept]
        # the last new token is the next root: its KV entry is written by the next forward
        commit_kv(state.cache, prefix_len, rows[:kept], dense=self.dense_cache)
        state.root, state.cache_len = new_tokens[-1], prefix_len + kept
        margins = _top2_gap(logits[rows[:kept]]) if self.track_margins else []
        return Round(
            tree_size=tree.size,
            accepted_nodes=accepted,
            new_tokens=new_tokens,
            credits=credits,
            forward_s=time.perf_counter() - start,
            finish=finish,
            margins=margins,
        )
