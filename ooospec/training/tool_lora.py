"""The SmolLM2 tool target's LoRA: teach SmolLM2-135M-Instruct to answer with a JSON call.

Zero-shot SmolLM2 answers in prose, so the cpu profile's second target is SmolLM2 plus this
adapter, trained on the train split's gold calls rendered in the target's own surface format
(`llama_json`) after the target's own prompt (`ooospec.models.prompts.prompt_ids`, the same
function the decoder uses, so training and decoding see identical prompts). The prompt asks for
exactly one call, so the completion is the request's first gold call. After training, greedy
outputs on dev requests are parsed with the surface format and the parse rate is recorded next to
the frozen adapter.

CLI: ``python -m ooospec.training.tool_lora [--preset full|budget|smoke]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ooospec.data.request import Call, Request
from ooospec.paths import artifacts_dir, shown
from ooospec.provenance import file_sha256_or_none
from ooospec.stage import FrozenAssetMissing, Stage, append_jsonl, canonical_json, config_key
from ooospec.models.adapters import (TOOL_TARGET, freeze_adapter, read_frozen, tool_adapter_committed_dir, tool_adapter_pointer, update_frozen_record)
from ooospec.training.lora import (AdapterRun, LoraTrainConfig, TrainExample, attach_lora, mean_completion_nll, save_loss_curve, train_lora)
from ooospec.progress import progress_bar

STAGE_NAME = "tool_lora"


@dataclass
class ToolLoraConfig:
    profile: str = "cpu"
    target: str = TOOL_TARGET
    base: str = "profile"  # "tiny": a random 2-layer model with a minimal chat template (smoke runs)
    train_requests: int | None = 300
    dev_requests: int | None = 40
    max_prompt_tokens: int = 768
    max_new_tokens: int = 160
    threads: int = 1
    lora: dict[str, Any] = field(default_factory=lambda: LoraTrainConfig(
        lr=6e-4, batch_size=2, max_batch_tokens=2048, step_completion_tokens=160).to_dict())

    def key(self) -> str:
        return config_key(asdict(self))


PRESETS = {
    "full": ToolLoraConfig(),
    "budget": ToolLoraConfig(train_requests=50, dev_requests=10, max_prompt_tokens=512),
    "smoke": ToolLoraConfig(base="tiny", train_requests=6, dev_requests=2, max_new_tokens=8),
}


@dataclass
class ToolTargetParts:
    """What training needs from the target: tokenizer, prompt style, surface, end token."""

    model: torch.nn.Module
    tokenizer: Any
    prompt_style: str
    surface: Any
    eos_id: int
    info: dict[str, Any]

    def prompt_ids(self, request: Request) -> list[int]:
        from ooospec.models.prompts import prompt_ids

        return prompt_ids(self.tokenizer, request, self.prompt_style)

    def completion_ids(self, call: Call) -> list[int]:
        text = self.surface.render([call])
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_id]


def load_parts(cfg: ToolLoraConfig) -> ToolTargetParts:
    from ooospec.models.formats import get_surface
    from ooospec.models.registry import load_profile

    profile = load_profile(cfg.profile)
    role = profile.target(cfg.target)
    if cfg.base == "tiny":
        from ooospec.models.tiny import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer(seed=cfg.lora.get("seed", 0))
        eos_id, info = tokenizer.eos_token_id, {"model": "tiny random llama (smoke)"}
    else:
        from ooospec.models.loading import load_model

        model, tokenizer = load_model(role.model, profile, dtype="float32")  # LoRA training runs in fp32
        eos_id = tokenizer.get_vocab()[role.eos_tokens[0]]
        loaded = getattr(model, "loaded_from", None)
        info = {"model": role.model, "location": getattr(loaded, "location", None)}
    return ToolTargetParts(model, tokenizer, role.prompt or "chat_template_tools", get_surface(role.surface or ""),
                           eos_id, info)


def tool_examples(requests: list[Request], parts: ToolTargetParts, max_prompt_tokens: int,
                  limit: int | None, seed: int) -> tuple[list[TrainExample], dict[str, int]]:
    """(prompt -> first gold call) pairs of a seeded subset; every skip counted by reason."""
    dropped: dict[str, int] = {}
    pool = [r for r in sorted(requests, key=lambda r: r.id)]
    random.Random(seed).shuffle(pool)
    examples = []
    for request in pool:
        if limit is not None and len(examples) >= limit:
            dropped["beyond subset limit"] = dropped.get("beyond subset limit", 0) + 1
            continue
        if not request.gold:
            dropped["no gold call"] = dropped.get("no gold call", 0) + 1
            continue
        prompt = parts.prompt_ids(request)
        if len(prompt) > max_prompt_tokens:
            dropped[f"prompt longer than {max_prompt_tokens} tokens"] = dropped.get(f"prompt longer than {max_prompt_tokens} tokens", 0) + 1
            continue
        examples.append(TrainExample.single(request.id, prompt, parts.completion_ids(request.gold[0])))
    return examples, dropped


@torch.no_grad()
def greedy_text(model: torch.nn.Module, tokenizer: Any, prompt: list[int], eos_id: int, max_new_tokens: int) -> tuple[str, int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                         max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_id,
                         pad_token_id=tokenizer.pad_token_id)
    new = out[0, len(prompt):].tolist()
    if new and new[-1] == eos_id:
        new = new[:-1]
    return tokenizer.decode(new, skip_special_tokens=False), len(new)


def evaluate_tool_target(parts: ToolTargetParts, requests: list[Request], max_new_tokens: int,
                         out_path: Path | None = None) -> dict[str, Any]:
    """Greedy outputs on ``requests``: how often they parse into a call, name a real tool, match gold."""
    if out_path is not None and out_path.exists():
        out_path.unlink()
    parsed = valid = name_ok = exact = 0
    seconds = 0.0
    for request in progress_bar(requests, desc="tool target dev", unit="req"):
        start = time.perf_counter()
        text, n_new = greedy_text(parts.model, parts.tokenizer, parts.prompt_ids(request), parts.eos_id, max_new_tokens)
        seconds += time.perf_counter() - start
        calls = parts.surface.parse(text)
        first = calls[0] if calls else None
        gold = request.gold[0] if request.gold else None
        parsed += first is not None
        valid += first is not None and request.tool(first.name) is not None
        name_ok += first is not None and gold is not None and first.name == gold.name
        same = first is not None and gold is not None and canonical_json(first.to_dict()) == canonical_json(gold.to_dict())
        exact += same
        if out_path is not None:
            append_jsonl(out_path, [{"id": request.id, "source": request.source, "text": text, "new_tokens": n_new,
                                     "parsed": None if first is None else first.to_dict(), "exact": same}])
    n = max(len(requests), 1)
    return {"requests": len(requests), "parse_rate": round(parsed / n, 4), "valid_call_rate": round(valid / n, 4),
            "name_match_rate": round(name_ok / n, 4), "exact_match_rate": round(exact / n, 4),
            "mean_generate_s": round(seconds / n, 3)}


def prompt_fingerprint(parts: ToolTargetParts, request: Request) -> str:
    """Hash of one rendered prompt: a later change of the prompt function is detectable."""
    return hashlib.sha256(json.dumps(parts.prompt_ids(request)).encode()).hexdigest()[:16]


def train_tool_lora(cfg: ToolLoraConfig, requests: dict[str, list[Request]] | None = None, force: bool = False,
                    progress: Callable[[str], None] = print, retrain: bool = False) -> AdapterRun:
    """Train, evaluate and freeze the tool adapter, or find one of the same config (stage, then committed)."""
    stage = Stage(STAGE_NAME, asdict(cfg))
    if stage.done and not force:
        progress(f"tool lora: reusing {shown(stage.path('adapter'))}")
        return AdapterRun(stage.path("adapter"), read_frozen(stage.path("adapter")), "stage")
    committed = tool_adapter_committed_dir()
    if not force and (committed / "FROZEN.json").exists() and read_frozen(committed).get("config_key") == cfg.key():
        progress(f"tool lora: reusing committed {shown(committed)}")
        return AdapterRun(committed, read_frozen(committed), "committed")
    if not (force or retrain) and requests is None and cfg.key() == PRESETS["full"].key():
        found = read_frozen(committed).get("config_key") if (committed / "FROZEN.json").exists() else "nothing"
        raise FrozenAssetMissing(f"tool lora: the full preset's adapter is a frozen asset; {shown(committed)} holds "
                                 f"{found}, expected config key {cfg.key()}. Restore it with git, or re-derive it on "
                                 "purpose with `-p retrain True` in notebooks/02_sidecar.ipynb")
    started = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    lora = LoraTrainConfig(**cfg.lora)
    if requests is None:
        from ooospec.data import load_split

        requests = {"train": load_split("train"), "dev": load_split("dev")}
    parts = load_parts(cfg)
    train, train_dropped = tool_examples(requests["train"], parts, cfg.max_prompt_tokens, cfg.train_requests, lora.seed)
    dev_examples, dev_dropped = tool_examples(requests["dev"], parts, cfg.max_prompt_tokens, cfg.dev_requests, lora.seed)
    progress(f"tool lora: {len(train)} train / {len(dev_examples)} dev examples")
    parts.model = attach_lora(parts.model, lora)
    result = train_lora(parts.model, train, lora, parts.tokenizer.pad_token_id, work_dir=stage.dir, desc="tool lora")
    save_loss_curve(result.loss_log, stage.path("loss.json"), stage.path("loss.png"), f"{cfg.target} tool LoRA")
    dev_ids = {ex.id for ex in dev_examples}
    dev_requests = [r for r in requests["dev"] if r.id in dev_ids]
    record = {
        "name": cfg.target, "profile": cfg.profile, "config": asdict(cfg), "config_key": cfg.key(),
        "base": parts.info, "prompt_style": parts.prompt_style, "surface": parts.surface.describe(),
        "prompt_fingerprint": {dev_requests[0].id: prompt_fingerprint(parts, dev_requests[0])} if dev_requests else {},
        "examples": {"train": len(train), "dev": len(dev_examples), "train_dropped": train_dropped, "dev_dropped": dev_dropped},
        "train": result.to_dict(),
        "provenance": {"data_sha256": {s: file_sha256_or_none(artifacts_dir() / "data" / f"{s}.jsonl") for s in ("train", "dev")},
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    }
    freeze_adapter(parts.model, stage.path("adapter"), record)
    # the dev check runs the target as `load_target` builds it: adapter merged into the weights
    parts.model = parts.model.merge_and_unload().eval()
    metrics = evaluate_tool_target(parts, dev_requests, cfg.max_new_tokens, stage.path("dev_outputs.jsonl"))
    metrics["completion_nll"] = round(mean_completion_nll(parts.model, dev_examples, parts.tokenizer.pad_token_id, lora), 4)
    wall = round(time.perf_counter() - started, 1)
    update_frozen_record(stage.path("adapter"), dev_metrics=metrics, wall_s=wall)
    stage.path("checkpoint.pt").unlink(missing_ok=True)
    stage.mark_done(adapter=str(stage.path("adapter")), dev_metrics=metrics, wall_s=wall)
    if cfg.base == "profile":
        tool_adapter_pointer(cfg.profile).write_text(json.dumps({"adapter": str(stage.path("adapter"))}))
    return AdapterRun(stage.path("adapter"), read_frozen(stage.path("adapter")), None)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train the SmolLM2 tool target's LoRA adapter.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    run = train_tool_lora(PRESETS[args.preset], force=args.force)
    print(json.dumps(run.dev_metrics, indent=2))


if __name__ == "__main__":
    main()
