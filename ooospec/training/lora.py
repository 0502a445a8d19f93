"""LoRA supervised fine-tuning on a causal LM, loss on completion tokens only.

Two users: the slot sidecar (many short rows per request, all sharing one long request prefix)
and the SmolLM2 tool target (one prompt -> one rendered call). Both are expressed as
`TrainExample`: a shared ``prefix`` plus one or more ``branches`` (prompt tail + completion).
A multi-branch example runs the prefix once with gradients, expands its KV cache over the
branches and runs all branches as one batch, so a request with 20 slot rows costs one prefix
plus 20 short tails instead of 20 full prompts (measured on SmolLM2, 8 layers: 6.7x faster, same
loss and gradient). Single-branch examples are batched, sorted by length so padding stays small.

Loss is the mean negative log-likelihood over completion tokens of one optimizer step; no prompt
token is ever a label (`completion_labels`). Training is one pass by default, with a fixed seed,
checkpoints every few steps (an interrupted run resumes at the same step with the same batch
order) and a loss curve saved as JSON and PNG. Freezing the final adapter with its sha256, and
refusing one whose files no longer match, is `ooospec.models.adapters`.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ooospec.models.cache import expand_cache
from ooospec.progress import log_line, progress_bar

IGNORE_INDEX = -100


@dataclass
class Branch:
    """One completion after the shared prefix: ``prompt_ids`` are context, ``completion_ids`` are learned."""

    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass
class TrainExample:
    """A prefix shared by one or more branches (a request's slot rows, or a single SFT pair)."""

    id: str
    prefix_ids: list[int]
    branches: list[Branch]

    @property
    def n_tokens(self) -> int:
        return len(self.prefix_ids) + sum(len(b.prompt_ids) + len(b.completion_ids) for b in self.branches)

    @property
    def n_completion_tokens(self) -> int:
        return sum(len(b.completion_ids) for b in self.branches)

    @classmethod
    def single(cls, id: str, prompt_ids: list[int], completion_ids: list[int]) -> "TrainExample":
        return cls(id, list(prompt_ids), [Branch([], list(completion_ids))])


@dataclass
class LoraTrainConfig:
    """Everything that determines the adapter (the stage key is built from it)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    lr: float = 2e-4
    warmup_frac: float = 0.05
    weight_decay: float = 0.0
    epochs: int = 1
    seed: int = 0
    batch_size: int = 4  # single-branch examples per forward
    max_batch_tokens: int = 1536  # single-branch: padded tokens per forward
    max_branches: int = 48  # multi-branch: branches per forward (a bigger request is split)
    step_completion_tokens: int = 256  # optimizer step once this many completion tokens were seen
    checkpoint_every: int = 25
    max_grad_norm: float = 1.0
    # "bf16": forward and backward under CPU autocast to bfloat16 (the LoRA weights, the optimizer
    # state and the loss stay fp32); None: plain fp32. Left out of the key when None, so adapters
    # trained before the option existed keep their keys.
    autocast: str | None = None

    def __post_init__(self) -> None:
        if self.autocast not in (None, "bf16"):
            raise ValueError(f"LoraTrainConfig.autocast must be None or 'bf16', got {self.autocast!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["autocast"] is None:
            del out["autocast"]
        return out

    def autocast_context(self):
        """The context every training forward and backward runs in."""
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast == "bf16")


def completion_labels(prompt_len: int, completion_ids: Sequence[int]) -> list[int]:
    """Labels for ``prompt + completion``: ``IGNORE_INDEX`` on every prompt position."""
    return [IGNORE_INDEX] * prompt_len + list(completion_ids)


def attach_lora(model: torch.nn.Module, cfg: LoraTrainConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


# ---------------------------------------------------------------- loss of one forward unit


def _branch_batch(branches: list[Branch], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded branch tails and their labels (labels already shifted to predict-next form)."""
    length = max(len(b.prompt_ids) + len(b.completion_ids) for b in branches)
    ids = torch.full((len(branches), length), pad_id, dtype=torch.long)
    labels = torch.full((len(branches), length), IGNORE_INDEX, dtype=torch.long)
    for i, b in enumerate(branches):
        seq = b.prompt_ids + b.completion_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, : len(seq)] = torch.tensor(completion_labels(len(b.prompt_ids), b.completion_ids))
    return ids, labels


def _nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed NLL of position t predicting label t+1 (labels aligned with the input ids)."""
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")


def length_groups(branches: list[Branch], ratio: float = 2.0) -> list[list[Branch]]:
    """Branches sorted by length and cut where a branch is ``ratio`` times the group's shortest.

    A request's rows are short (``null``, a number) except the direct-call row; padding every
    row to the longest would more than double the branch compute.
    """
    ordered = sorted(branches, key=lambda b: len(b.prompt_ids) + len(b.completion_ids))
    groups: list[list[Branch]] = []
    for branch in ordered:
        length = len(branch.prompt_ids) + len(branch.completion_ids)
        if groups and length <= ratio * (len(groups[-1][0].prompt_ids) + len(groups[-1][0].completion_ids)):
            groups[-1].append(branch)
        else:
            groups.append([branch])
    return groups


def shared_prefix_nll(model: torch.nn.Module, prefix_ids: list[int], branches: list[Branch],
                      pad_id: int) -> torch.Tensor:
    """Summed completion NLL of all branches, computing the prefix once.

    The prefix runs with gradients (batch 1); its KV cache is expanded over each length group of
    branches, so backpropagation reaches the prefix through every group. Every branch has a
    non-empty prompt tail in the sidecar, but a branch whose first token is a completion token is
    handled too: its label is predicted from the prefix's last position.
    """
    prefix = torch.tensor([prefix_ids], dtype=torch.long)
    # the LM head over a long prefix costs as much as a few layers; only its last row can be needed
    out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)
    total = torch.zeros((), dtype=torch.float32)
    p = len(prefix_ids)
    for group in length_groups(branches):
        ids, labels = _branch_batch(group, pad_id)
        first_is_completion = labels[:, 0] != IGNORE_INDEX
        if first_is_completion.any():
            last = out.logits[0, -1].float().log_softmax(-1)
            total = total - last[ids[first_is_completion, 0]].sum()
        cache = expand_cache(out.cache, len(group))
        positions = torch.arange(p, p + ids.shape[1]).unsqueeze(0).expand(len(group), -1)
        # right padding: a real token never sees a pad, so no attention mask is needed
        tail = model(input_ids=ids, cache=cache, position_ids=positions)
        total = total + _nll_sum(tail.logits, labels)
    return total


def batch_nll(model: torch.nn.Module, examples: list[TrainExample], pad_id: int) -> torch.Tensor:
    """Summed completion NLL of single-branch examples in one right-padded batch."""
    seqs, labs = [], []
    for ex in examples:
        (branch,) = ex.branches
        prompt = ex.prefix_ids + branch.prompt_ids
        seqs.append(prompt + branch.completion_ids)
        labs.append(completion_labels(len(prompt), branch.completion_ids))
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), length), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, (s, lab) in enumerate(zip(seqs, labs)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(s)] = torch.tensor(lab)
        mask[i, : len(s)] = 1
    # logits only where a label can be predicted: from the earliest prompt end onwards
    keep = length - (min(len(lab) - len(ex.branches[0].completion_ids) for lab, ex in zip(labs, examples)) - 1)
    out = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep)
    return _nll_sum(out.logits, labels[:, length - keep :])


@dataclass
class Unit:
    """One forward pass: a padded batch of single-branch examples, or one multi-branch example."""

    examples: list[TrainExample]

    @property
    def shared(self) -> bool:
        return len(self.examples) == 1 and len(self.examples[0].branches) > 1

    @property
    def n_completion_tokens(self) -> int:
        return sum(ex.n_completion_tokens for ex in self.examples)

    @property
    def n_tokens(self) -> int:
        return sum(ex.n_tokens for ex in self.examples)


def unit_nll(model: torch.nn.Module, unit: Unit, pad_id: int) -> torch.Tensor:
    if unit.shared:
        ex = unit.examples[0]
        return shared_prefix_nll(model, ex.prefix_ids, ex.branches, pad_id)
    return batch_nll(model, unit.examples, pad_id)


def plan_units(examples: list[TrainExample], cfg: LoraTrainConfig, seed: int) -> list[Unit]:
    """Forward units in a seeded random order; single-branch examples bucketed by length.

    Sorting by length before chunking keeps padding small; shuffling the chunks (not the
    examples) keeps the order random across lengths.
    """
    units: list[Unit] = []
    singles = sorted((ex for ex in examples if len(ex.branches) == 1), key=lambda ex: ex.n_tokens)
    batch: list[TrainExample] = []
    for ex in singles:
        longest = max([ex.n_tokens] + [b.n_tokens for b in batch])
        if batch and (len(batch) >= cfg.batch_size or longest * (len(batch) + 1) > cfg.max_batch_tokens):
            units.append(Unit(batch))
            batch = []
        batch.append(ex)
    if batch:
        units.append(Unit(batch))
    for ex in examples:
        if len(ex.branches) > 1:
            for start in range(0, len(ex.branches), cfg.max_branches):
                units.append(Unit([TrainExample(ex.id, ex.prefix_ids, ex.branches[start : start + cfg.max_branches])]))
    random.Random(seed).shuffle(units)
    return units


def plan_steps(examples: list[TrainExample], cfg: LoraTrainConfig) -> list[list[Unit]]:
    """Optimizer steps of every epoch: units accumulated until a completion-token budget."""
    steps: list[list[Unit]] = []
    for epoch in range(cfg.epochs):
        current: list[Unit] = []
        seen = 0
        for unit in plan_units(examples, cfg, cfg.seed + epoch):
            current.append(unit)
            seen += unit.n_completion_tokens
            if seen >= cfg.step_completion_tokens:
                steps.append(current)
                current, seen = [], 0
        if current:
            steps.append(current)
    return steps


# ---------------------------------------------------------------- the training loop


@dataclass
class TrainResult:
    steps: int  # optimizer steps done so far (== planned_steps when finished)
    planned_steps: int
    examples: int
    tokens: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float
    final_loss: float
    loss_log: list[dict[str, Any]] = field(default_factory=list)
    resumed_at: int = 0  # steps a checkpoint already held when this call started
    resumed_after_s: float = 0.0  # training seconds those steps took (``seconds`` includes them)

    @property
    def finished(self) -> bool:
        return self.steps == self.planned_steps

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("loss_log")
        return data


def _lr_lambda(total: int, warmup: int) -> Callable[[int], float]:
    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        return max(0.0, (total - step) / max(total - warmup, 1))
    return schedule


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


@contextmanager
def frozen_linears_in_bf16(model: torch.nn.Module) -> Iterator[int]:
    """Every frozen fp32 ``Linear`` weight held as a bf16 copy while the block runs; yields how many.

    Under bf16 autocast a frozen weight is cast to bf16 on every forward (autocast caches the casts
    of weights that require grad only): a fifth of a sidecar training step on a CPU with bf16
    kernels. Casting once rounds the same way, so loss and gradients are bit-identical
    (tests/test_train.py). A head tied to the input embedding (SmolLM2's) gets its own copy; the
    embedding keeps fp32. The fp32 weights come back on exit, so merging and saving see them."""
    swapped: list[tuple[torch.nn.Module, torch.nn.Parameter]] = []
    try:
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, torch.nn.Linear) and weight is not None and not weight.requires_grad \
                    and weight.dtype == torch.float32:
                swapped.append((module, weight))
                module.weight = torch.nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)
        yield len(swapped)
    finally:
        for module, weight in swapped:
            module.weight = weight


def _save_checkpoint(path: Path, model, optimizer, scheduler, step: int, log: list, elapsed: float) -> None:
    from peft import get_peft_model_state_dict

    tmp = path.with_suffix(".tmp")
    torch.save({"adapter": get_peft_model_state_dict(model), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step, "log": log, "elapsed": elapsed,
                "rng": torch.get_rng_state()}, tmp)
    tmp.replace(path)


def _load_checkpoint(path: Path, model, optimizer, scheduler) -> tuple[int, list, float]:
    from peft import set_peft_model_state_dict

    state = torch.load(path, weights_only=False)
    set_peft_model_state_dict(model, state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    return state["step"], state["log"], state["elapsed"]


def train_lora(model: torch.nn.Module, examples: list[TrainExample], cfg: LoraTrainConfig, pad_id: int,
               work_dir: Path | None = None, desc: str = "lora", stop_after: int | None = None) -> TrainResult:
    """Train the trainable (LoRA) parameters of ``model`` in place.

    With ``work_dir``, a checkpoint is written every ``cfg.checkpoint_every`` steps and a later
    call with the same examples and config resumes after the last one. ``stop_after`` ends a
    time-boxed session after that many steps (checkpointed); it is not part of the config, since
    the finished adapter does not depend on where a run was interrupted.
    """
    if not examples:
        raise ValueError("train_lora: no training examples")
    torch.manual_seed(cfg.seed)
    steps = plan_steps(examples, cfg)
    params = _trainable(model)
    if not params:
        raise ValueError("train_lora: the model has no trainable parameters (attach_lora first)")
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(len(steps), math.ceil(cfg.warmup_frac * len(steps))))
    ckpt = work_dir / "checkpoint.pt" if work_dir else None
    start, log, elapsed = 0, [], 0.0
    if ckpt is not None and ckpt.exists():
        start, log, elapsed = _load_checkpoint(ckpt, model, optimizer, scheduler)
    model.train()
    t0 = time.perf_counter() - elapsed
    tokens = sum(u.n_tokens for s in steps[:start] for u in s)
    bar = progress_bar(total=len(steps), initial=start, desc=desc, unit="step")
    end = len(steps) if stop_after is None else min(len(steps), stop_after)
    with frozen_linears_in_bf16(model) if cfg.autocast == "bf16" else nullcontext():
        for index in range(start, end):
            units = steps[index]
            n_target = sum(u.n_completion_tokens for u in units)
            total = 0.0
            for unit in units:
                with cfg.autocast_context():
                    loss = unit_nll(model, unit, pad_id) / n_target
                loss.backward()
                total += loss.item()
                tokens += unit.n_tokens
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            log.append({"step": index + 1, "loss": total, "completion_tokens": n_target, "tokens": tokens,
                        "lr": scheduler.get_last_lr()[0], "elapsed_s": round(time.perf_counter() - t0, 3)})
            bar.update(1)
            bar.set_postfix(loss=f"{total:.3f}")
            if (index + 1) % cfg.checkpoint_every == 0 or index + 1 == end:
                if ckpt is not None:
                    _save_checkpoint(ckpt, model, optimizer, scheduler, index + 1, log, time.perf_counter() - t0)
                log_line(step_line(desc, log, len(steps), cfg.checkpoint_every, saved=ckpt is not None))
    bar.close()
    model.eval()
    seconds = time.perf_counter() - t0
    return TrainResult(steps=len(log), planned_steps=len(steps), examples=len(examples), tokens=tokens,
                       completion_tokens=sum(ex.n_completion_tokens for ex in examples) * cfg.epochs,
                       seconds=round(seconds, 2), tokens_per_s=round(tokens / max(seconds, 1e-9), 1),
                       final_loss=_tail_mean(log), loss_log=log, resumed_at=start,
                       resumed_after_s=round(elapsed, 2))


def step_line(desc: str, log: list[dict[str, Any]], planned: int, window: int, saved: bool = False) -> str:
    """Where a training is, for its log: step, mean loss and seconds a step over the last ``window``
    steps, time left at that pace. ``elapsed_s`` counts training seconds from step 0 across resumed
    sessions (the checkpoint carries it), so the window may span a resume."""
    recent = log[-window:]
    before = log[-window - 1]["elapsed_s"] if len(log) > window else 0.0
    per_step = (recent[-1]["elapsed_s"] - before) / len(recent)
    left = (planned - recent[-1]["step"]) * per_step
    return (f"{desc}: step {recent[-1]['step']} of {planned}, loss {_tail_mean(log, window):.3f} (last {len(recent)}), "
            f"{per_step:.1f} s a step, about {_duration(left)} left" + (", checkpoint saved" if saved else ""))


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _tail_mean(log: list[dict[str, Any]], window: int = 10) -> float:
    tail = [entry["loss"] for entry in log[-window:]]
    return round(sum(tail) / len(tail), 4) if tail else float("nan")


@torch.no_grad()
def mean_completion_nll(model: torch.nn.Module, examples: list[TrainExample], pad_id: int,
                        cfg: LoraTrainConfig | None = None) -> float:
    """Token-mean completion NLL of ``examples`` (the fixed dev loss)."""
    cfg = cfg or LoraTrainConfig()
    model.eval()
    total, count = 0.0, 0
    for unit in plan_units(examples, cfg, seed=0):
        total += unit_nll(model, unit, pad_id).item()
        count += unit.n_completion_tokens
    return total / max(count, 1)


# ---------------------------------------------------------------- loss curve


def save_loss_curve(log: list[dict[str, Any]], json_path: Path, png_path: Path, title: str) -> None:
    """The per-step loss (and a running mean) as JSON and as a figure."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend choice

    json_path.write_text(json.dumps(log, indent=1))

    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    steps = [e["step"] for e in log]
    losses = [e["loss"] for e in log]
    ax.plot(steps, losses, lw=0.8, alpha=0.5, label="step loss")
    window = max(1, len(losses) // 20)
    smooth = [sum(losses[max(0, i - window + 1) : i + 1]) / len(losses[max(0, i - window + 1) : i + 1])
              for i in range(len(losses))]
    ax.plot(steps, smooth, lw=1.6, label=f"running mean ({window})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("completion NLL (nats/token)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


# ---------------------------------------------------------------- freezing and loading


@dataclass
class AdapterRun:
    """A frozen adapter a stage produced or found: its directory, record, and where it came from.

    The stage's side files (loss curve, counts, dev outputs) sit next to the adapter directory,
    in the stage directory or in its committed copy.
    """

    adapter_dir: Path
    record: dict[str, Any]
    reused: str | None  # None: trained now; "stage" or "committed": found finished

    @property
    def dev_metrics(self) -> dict[str, Any]:
        return self.record["dev_metrics"]

    @property
    def loss_log(self) -> list[dict[str, Any]]:
        return json.loads((self.adapter_dir.parent / "loss.json").read_text())

    @property
    def loss_png(self) -> Path:
        return self.adapter_dir.parent / "loss.png"

    def side_file(self, name: str) -> Path:
        return self.adapter_dir.parent / name
