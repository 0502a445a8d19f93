"""Where bf16 flips greedy tokens between a verify forward and AR's step, and what fp32 logits leave.

A speculative decode in bf16 differs from AR where a forward of several rows (a verify tree) picks
another argmax than AR's one-row step at the same position. This study produces such pairs on
purpose, at every position of real continuations: per request, the target's prompt runs once and its
cache is kept; from it AR writes its greedy continuation with one-row bf16 steps, and the same
tokens are read again in forwards of ``chunk`` rows (the path of a verify tree whose every node is
accepted). At each position it records:

* ``hidden``: the largest difference of the final norm's input (the residual stream) between the
  two computations: whether the body already differs before the head;
* per head (``bf16``: the model's own norm and head; ``fp32``: `ooospec.models.fp32_logits`): AR's
  argmax and top-2 gap, whether the chunk's argmax differs (a **flip**), whether AR's top-2 logits are
  exactly equal, and how far AR's top-2 gap moved in the chunk's forward (``gap_shift``).

Where the profile runs the target's forwards row-invariant (`ooospec.models.row_invariant`, the cpu
profile on a bf16 CPU), every request is read twice more: with torch's own kernels (``rows: plain``, the
arithmetic before it) and as served (``rows: invariant``), whose residual stream should not differ.

The near-tie rule of fp32 logits (`ooospec.models.arithmetic.FP32_LOGITS_GAPS`) is read off the largest
``gap_shift`` with fp32 logits. Requests: the API-disjoint dev split (evaluation data chooses nothing).

The prompt's cache comes from an fp32 prefill cast to bf16 where the CPU has no bf16 instructions (a
bf16 prefill emulated in software costs ~100 ms a token there); both computations read that same
cache, so the comparison is of the new rows only. The CPU and its bf16 kernels are recorded: on a CPU
without bf16 instructions torch's bf16 products are not oneDNN's, so their rounding pattern is that
machine's, not an avx512_bf16 or AMX machine's.

    python -m ooospec.studies.logit_ties --requests 20 --commit
"""

from __future__ import annotations

import argparse
import copy
import json
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ooospec.models.arithmetic import cpu_bf16_flag, cpu_model, machine_kind
from ooospec.models.fp32_logits import Fp32Logits, Fp32Norm, final_norm, own_head
from ooospec.models.row_invariant import RowInvariantProduct, plain_rows, two_row_linear, uses_row_invariance
from ooospec.paths import artifacts_dir, shown
from ooospec.progress import progress_bar

if TYPE_CHECKING:
    import pandas as pd

TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
CHUNK = 9  # rows of a verify forward: a budget-8 tree (the EPYC's choice), root included
MAX_TOKENS = 64


@dataclass(frozen=True)
class HeadReading:
    """One head at one position: AR's choice, and what the chunk's forward made of it."""

    ar_top1: int
    ar_gap: float
    exact_tie: bool
    flip: bool
    gap_shift: float  # |AR's top-2 gap - the same two tokens' gap in the chunk's forward|


@dataclass(frozen=True)
class Position:
    target: str
    request_id: str
    position: int
    rows: str  # ``plain``: torch's kernels; ``invariant``: row-invariant forwards (`ooospec.models.row_invariant`)
    hidden: float  # max |residual stream, step - chunk| at the final norm's input
    bf16: HeadReading
    fp32: HeadReading


class Heads:
    """The model's own bf16 norm and head, and the fp32-logits pair over the same weights; with
    ``invariant``, their products as a row-invariant model runs them (`ooospec.models.row_invariant`)."""

    def __init__(self, model: torch.nn.Module, invariant: bool = False):
        norm, _ = final_norm(model)
        head = model.get_output_embeddings()
        fp32_norm, fp32_head = Fp32Norm(norm, "study"), Fp32Logits(head, "study")
        if invariant:
            product = RowInvariantProduct(head.weight)
            self.bf16 = lambda h: product(norm(h)).float()
            fp32_head.screen_product, fp32_head.full_product = product, two_row_linear
        else:
            self.bf16 = lambda h: head(norm(h)).float()
        self.fp32 = lambda h: fp32_head(fp32_norm(h))


def reading(ar: torch.Tensor, chunk: torch.Tensor) -> HeadReading:
    top = torch.topk(ar, 2)
    first = int(ar.argmax())  # greedy's choice: at an exact tie, the first index (topk may order a tie otherwise)
    second = int(top.indices[1]) if int(top.indices[0]) == first else int(top.indices[0])
    gap = float(top.values[0] - top.values[1])
    return HeadReading(first, gap, gap == 0.0, int(chunk.argmax()) != first,
                       abs(gap - float(chunk[first] - chunk[second])))


class NormInput:
    """Keeps the final norm's inputs of each forward (the residual stream at the head)."""

    def __init__(self, model: torch.nn.Module):
        norm, _ = final_norm(model)
        self.seen: list[torch.Tensor] = []
        self.handle = norm.register_forward_pre_hook(lambda _, args: self.seen.append(args[0][0].detach()))

    def take(self) -> torch.Tensor:
        out, self.seen = self.seen[-1], []
        return out


def _bf16_cache(cache: Any) -> Any:
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.to(torch.bfloat16), layer.values.to(torch.bfloat16)
    return cache


@torch.no_grad()
def request_positions(target: Any, bf16_model: torch.nn.Module, heads: Heads, hook: NormInput,
                      request: Any, chunk: int = CHUNK, max_tokens: int = MAX_TOKENS, arm: str = "plain") -> list[Position]:
    """Every position of AR's bf16 continuation of one request (module docstring). Both passes
    start from the prompt's cache less its last token and re-read that token, so the first output
    token is compared too; each head reads the rows as the model does (AR one row per product, the
    chunk's forward all of its rows in one)."""
    ids = target.prompt_ids(request)
    prefix = _bf16_cache(target.model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1).past_key_values)
    prefix.crop(-1)
    eos = set(target.eos_token_ids)

    def forward(cache: Any, inputs: list[int]) -> torch.Tensor:
        bf16_model(input_ids=torch.tensor([inputs]), cache=cache, use_cache=True, logits_to_keep=1)
        return hook.take()

    cache, token, tokens, ar = copy.deepcopy(prefix), ids[-1], [], []
    for _ in range(max_tokens):
        hidden = forward(cache, [token])
        ar.append((hidden[0], heads.bf16(hidden)[0], heads.fp32(hidden)[0]))
        token = int(ar[-1][1].argmax())
        tokens.append(token)
        if token in eos:
            break
    inputs, cache, rows = [ids[-1]] + tokens[:-1], copy.deepcopy(prefix), []
    for start in range(0, len(inputs), chunk):
        hidden = forward(cache, inputs[start:start + chunk])
        rows.extend(zip(hidden, heads.bf16(hidden), heads.fp32(hidden)))
    return [Position(target.name, request.id, i, arm, float((a[0].float() - c[0].float()).abs().max()),
                     reading(a[1], c[1]), reading(a[2], c[2])) for i, (a, c) in enumerate(zip(ar, rows))]


def run(targets: tuple[str, ...], requests: int, profile: str = "cpu", chunk: int = CHUNK) -> list[Position]:
    """The study over the first ``requests`` API-disjoint dev requests, per target, on one thread."""
    from ooospec.data.api_disjoint import load_api_disjoint
    from ooospec.models.target import load_target

    torch.set_num_threads(1)
    work = load_api_disjoint().dev[:requests]
    out: list[Position] = []
    for name in targets:
        target = load_target(name, profile)
        with own_head(target.model):  # a bf16 CPU loads the target with fp32 logits: the study makes both heads
            target.model.float()  # the prompt's cache in fp32 (module docstring), its bf16 copy decodes
            bf16_model = copy.deepcopy(target.model).to(torch.bfloat16)
            hook = NormInput(bf16_model)
            # a profile with row-invariant forwards: read with torch's kernels too, the arithmetic before it
            arms = ("plain", "invariant") if uses_row_invariance(bf16_model) else ("plain",)
            for arm in arms:
                heads = Heads(bf16_model, invariant=arm == "invariant")
                with plain_rows(bf16_model) if arm == "plain" else nullcontext():
                    for request in progress_bar(work, desc=f"logit ties: {name}, {arm} rows", unit="request"):
                        out.extend(request_positions(target, bf16_model, heads, hook, request, chunk, arm=arm))
    return out


@dataclass(frozen=True)
class TieSummary:
    """One target and head over every position of the study."""

    target: str
    rows: str
    head: str
    positions: int
    hidden_differs: int  # positions whose residual stream already differs between the two forwards
    exact_ties: int  # AR's top-2 logits exactly equal
    flips: int
    flips_at_exact_ties: int
    largest_flip_gap: float  # AR's top-2 gap at the widest flip
    largest_gap_shift: float


def summarize(positions: list[Position]) -> list[TieSummary]:
    out = []
    for target, rows in dict.fromkeys((p.target, p.rows) for p in positions):
        mine = [p for p in positions if (p.target, p.rows) == (target, rows)]
        for head in ("bf16", "fp32"):
            reads = [getattr(p, head) for p in mine]
            flips = [r for r in reads if r.flip]
            out.append(TieSummary(target, rows, head, len(mine), sum(p.hidden > 0 for p in mine), sum(r.exact_tie for r in reads),
                                  len(flips), sum(r.exact_tie for r in flips), max((r.ar_gap for r in flips), default=0.0),
                                  max((r.gap_shift for r in reads), default=0.0)))
    return out


def machine() -> dict[str, str]:
    from ooospec.models.loading import bf16_supported_on_cpu

    return {"cpu": cpu_model(), "bf16_flag": cpu_bf16_flag(), "onednn_bf16": str(bf16_supported_on_cpu()),
            "torch": torch.__version__}


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / "logit-ties"


def committed_tables() -> list[tuple[str, "pd.DataFrame"]]:
    """Each committed study (one per CPU kind): a caption naming the machine, and its summary by
    target and head."""
    import pandas as pd

    out = []
    for path in sorted(committed_dir().glob("*.json")):
        study = json.loads(path.read_text())
        made = study["machine"]
        caption = (f"{path.stem}: {made['cpu']} (bf16 instructions: {made['bf16_flag']}), torch {made['torch']}; "
                   f"{study['requests']} API-disjoint dev requests per target, forwards of {study['chunk']} rows")
        table = pd.DataFrame(study["summary"]).rename(columns={
            "hidden_differs": "residual differs", "exact_ties": "AR top-2 equal", "flips_at_exact_ties": "at equal",
            "largest_flip_gap": "widest flip", "largest_gap_shift": "largest gap shift"})
        if "rows" not in table:  # a study made before row-invariant forwards: torch's kernels
            table.insert(1, "rows", "plain")
        out.append((caption, table.set_index(["target", "rows", "head"])))
    return out


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="API-disjoint dev requests per target")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--chunk", type=int, default=CHUNK)
    parser.add_argument("--commit", action="store_true", help="write the summary under artifacts/committed/logit-ties/")
    args = parser.parse_args(argv)
    positions = run(tuple(args.targets), args.requests, chunk=args.chunk)
    summary = summarize(positions)
    print(pd.DataFrame([asdict(s) for s in summary]).to_string(index=False))
    if args.commit:
        out = committed_dir() / f"{machine_kind()}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        flips = [asdict(p) for p in positions if p.bf16.flip or p.fp32.flip]
        out.write_text(json.dumps({"machine": machine(), "requests": args.requests, "chunk": args.chunk,
                                   "summary": [asdict(s) for s in summary], "flips": flips}, indent=1) + "\n")
        print(f"wrote {shown(out)}")


if __name__ == "__main__":
    main()
