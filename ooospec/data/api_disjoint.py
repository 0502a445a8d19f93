"""The API-disjoint dev split: requests whose functions the training split never offers.

The hash split (`ooospec.data.splits`) puts a request in dev by its prompt hash, so most dev
requests offer tools that training requests offer too (API-Bank's APIs, Seal-Tools' pool). A
sidecar chosen on such a dev is chosen on APIs it has seen, while BFCL and ToolAlpaca share no
tool name with training. Every sidecar choice is therefore made on this split instead; the hash
dev stays beside it for continuity.

How it is drawn, deterministically from the built ``train`` and ``dev`` files (no model, no trace):

1. The pool is train + dev. A request's *names* are its offered tools and gold call names,
   normalised as in the decontamination check (`normalize_name`), benchmark protocol tools aside.
2. Requests are visited in the order of a salted hash of their prompt hash. Each stratum (source x
   tool-count bin) has a quota proportional to its share of the pool, and no source takes more
   than ``max_per_source`` (Seal-Tools is 60% of the pool and no evaluation benchmark). A visited request whose
   stratum still has room becomes a *seed*: its names join the held-out set, unless that would
   take more than ``max_dropped_per_seed`` further requests out of training (a popular API would
   empty the training split of its source).
3. ``dev`` = every pool request all of whose names are held out; ``train`` = every pool request
   none of whose names is held out; the rest (some names held out, some not) is dropped from both
   and counted. So no function name of dev occurs in train, by construction (`check_disjoint`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from ooospec.data.request import Request
from ooospec.data.splits import PROTOCOL_TOOLS, normalize_name

DEFAULT_DEV_REQUESTS = 240
MAX_PER_SOURCE = 40
DEFAULT_SALT = "api-disjoint-v1"
MAX_DROPPED_PER_SEED = 8
TOOL_BINS = ((1, 1), (2, 2), (3, 4), (5, 99))


def function_names(request: Request) -> frozenset[str]:
    """Normalised names of the functions a request offers or calls (protocol tools aside)."""
    names = {t["name"] for t in request.tools} | {c.name for c in request.gold or []}
    return frozenset(normalize_name(n) for n in names if n not in PROTOCOL_TOOLS)


def source_of(request: Request) -> str:
    return request.id.split("-", 1)[0]


def tool_bin(request: Request) -> str:
    n = len(request.tools)
    low, high = next((lo, hi) for lo, hi in TOOL_BINS if lo <= n <= hi or hi == 99)
    return f"{low}" if low == high else f"{low}+" if high == 99 else f"{low}-{high}"


def stratum(request: Request) -> tuple[str, str]:
    return source_of(request), tool_bin(request)


@dataclass
class ApiDisjointSplit:
    """The split and what it cost: ``dropped`` requests share names with both sides."""

    train: list[Request]
    dev: list[Request]
    dropped: list[Request]
    held_out: frozenset[str]
    seeds: int
    settings: dict[str, object] = field(default_factory=dict)

    def counts(self) -> dict[str, object]:
        """Per side: requests, by source and by tool-count bin (what the book shows)."""
        out: dict[str, object] = {"settings": self.settings, "held_out_names": len(self.held_out),
                                  "seeds": self.seeds}
        for side in ("train", "dev", "dropped"):
            requests = getattr(self, side)
            out[side] = {"requests": len(requests), "by_source": dict(sorted(Counter(map(source_of, requests)).items())),
                         "by_tools": dict(sorted(Counter(min(len(r.tools), 9) for r in requests).items()))}
        return out


def _order(requests: Iterable[Request], salt: str) -> list[Request]:
    return sorted(requests, key=lambda r: hashlib.sha256(f"{salt}:{r.prompt_hash}".encode()).hexdigest())


def api_disjoint_split(train: list[Request], dev: list[Request], dev_requests: int = DEFAULT_DEV_REQUESTS,
                       salt: str = DEFAULT_SALT, max_dropped_per_seed: int = MAX_DROPPED_PER_SEED,
                       max_per_source: int = MAX_PER_SOURCE) -> ApiDisjointSplit:
    """Draw the split described in the module docstring from the hash split's two sides."""
    pool = [r for r in train + dev if function_names(r)]
    users: dict[str, list[int]] = {}
    for i, request in enumerate(pool):
        for name in function_names(request):
            users.setdefault(name, []).append(i)
    strata = Counter(stratum(r) for r in pool)
    quota = {s: max(1, round(dev_requests * n / len(pool))) for s, n in strata.items()}
    index = {id(r): i for i, r in enumerate(pool)}
    held: set[str] = set()
    taken: set[int] = set()  # pool indices touched by a held-out name
    filled: Counter = Counter()
    by_source: Counter = Counter()
    seeds = 0
    for request in _order(pool, salt):
        i = index[id(request)]
        if (i in taken or filled[stratum(request)] >= quota[stratum(request)]
                or by_source[source_of(request)] >= max_per_source):
            continue
        touched = {j for name in function_names(request) for j in users[name]} - taken
        if len(touched) - 1 > max_dropped_per_seed:
            continue
        held |= function_names(request)
        taken |= touched
        seeds += 1
        for j in touched:  # a touched request that now lies wholly in held-out names is dev too
            if function_names(pool[j]) <= held:
                filled[stratum(pool[j])] += 1
                by_source[source_of(pool[j])] += 1
    dev_side = [r for r in pool if function_names(r) <= held]
    train_side = [r for r in pool if not function_names(r) & held]
    dropped = [r for r in pool if function_names(r) & held and not function_names(r) <= held]
    settings = {"dev_requests": dev_requests, "salt": salt, "max_dropped_per_seed": max_dropped_per_seed,
                "max_per_source": max_per_source, "pool": len(pool)}
    split = ApiDisjointSplit(train_side, dev_side, dropped, frozenset(held), seeds, settings)
    check_disjoint(split.train, split.dev)
    return split


class NotDisjoint(AssertionError):
    """A dev function name occurs in training (the message names the request and the name)."""


def check_disjoint(train: Iterable[Request], dev: Iterable[Request]) -> None:
    seen = {name: r.id for r in train for name in function_names(r)}
    for request in dev:
        shared = sorted(n for n in function_names(request) if n in seen)
        if shared:
            raise NotDisjoint(f"dev request {request.id} offers {shared[0]!r}, also offered by training request "
                              f"{seen[shared[0]]}")


def load_api_disjoint(**kwargs: object) -> ApiDisjointSplit:
    """The split drawn from the built data files (`ooospec.data.load_split`)."""
    from ooospec.data import load_split

    return api_disjoint_split(load_split("train"), load_split("dev"), **kwargs)  # type: ignore[arg-type]
