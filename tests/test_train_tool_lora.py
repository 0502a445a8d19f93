"""The SmolLM2 tool target's LoRA stage on a tiny base, and `tool_adapter_path` resolution."""

import json

import pytest
import torch

from ooospec.data.request import Call, Request
from ooospec.training.tool_lora import PRESETS, load_parts, tool_examples, train_tool_lora
from ooospec.models.adapters import (ADAPTER_HASH_FILE, tool_adapter_committed_dir, tool_adapter_path, tool_adapter_pointer)
from ooospec.training.lora import IGNORE_INDEX, completion_labels

torch.set_num_threads(1)

TOOLS = [{"name": "get_time", "description": "Time in a zone",
          "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}]


def request(rid, zone, gold=True):
    return Request(rid, "test", "train", [{"role": "user", "content": f"time in {zone}?"}], TOOLS,
                   [Call("get_time", {"zone": zone})] if gold else None)


def test_examples_are_target_prompt_plus_rendered_first_call():
    parts = load_parts(PRESETS["smoke"])
    reqs = [request("a", "UTC"), request("b", "CET", gold=False)]
    examples, dropped = tool_examples(reqs, parts, max_prompt_tokens=4096, limit=None, seed=0)
    assert dropped == {"no gold call": 1} and len(examples) == 1
    (ex,) = examples
    assert ex.prefix_ids == parts.prompt_ids(reqs[0])
    completion = ex.branches[0].completion_ids
    assert parts.tokenizer.decode(completion[:-1]) == '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    assert completion[-1] == parts.eos_id
    labels = completion_labels(len(ex.prefix_ids), completion)
    assert labels.count(IGNORE_INDEX) == len(ex.prefix_ids)
    _, too_long = tool_examples(reqs[:1], parts, max_prompt_tokens=5, limit=None, seed=0)
    assert too_long == {"prompt longer than 5 tokens": 1}


def test_tool_lora_stage_on_a_tiny_base(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    splits = {"train": [request(f"t{i}", z) for i, z in enumerate(["UTC", "CET", "PST", "JST"])],
              "dev": [request("d0", "EST")]}
    run = train_tool_lora(PRESETS["smoke"], requests=splits, progress=lambda _: None)
    record = run.record
    assert run.reused is None and len(run.loss_log) == record["train"]["steps"]
    assert record["examples"]["train"] == 4 and record["dev_metrics"]["requests"] == 1
    assert set(record["dev_metrics"]) >= {"parse_rate", "valid_call_rate", "exact_match_rate", "completion_nll"}
    assert record["surface"]["name"] == "llama_json" and record["prompt_style"] == "system_tools_json"
    # a tiny smoke run never becomes the adapter the target loads
    assert not tool_adapter_pointer("cpu").exists()
    again = train_tool_lora(PRESETS["smoke"], requests=splits, progress=lambda _: None)
    assert again.reused == "stage" and again.record["sha256"] == record["sha256"]


def test_tool_adapter_path_prefers_the_latest_then_committed(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m ooospec.training.tool_lora"):
        tool_adapter_path("cpu")
    committed = tool_adapter_committed_dir()
    committed.mkdir(parents=True)
    (committed / "adapter_model.safetensors").write_bytes(b"weights")
    (committed / "FROZEN.json").write_text(json.dumps({"profile": "cpu"}))
    from ooospec.models.adapters import directory_sha256

    (committed / ADAPTER_HASH_FILE).write_text(directory_sha256(committed))
    assert tool_adapter_path("cpu") == committed
    latest = tmp_path / "elsewhere"
    latest.mkdir()
    (latest / "FROZEN.json").write_text(json.dumps({"profile": "cpu"}))
    (latest / ADAPTER_HASH_FILE).write_text(directory_sha256(latest))
    tool_adapter_pointer("cpu").write_text(json.dumps({"adapter": str(latest)}))
    assert tool_adapter_path("cpu") == latest
    (committed / "adapter_model.safetensors").write_bytes(b"tampered")
    tool_adapter_pointer("cpu").unlink()
    with pytest.raises(ValueError, match="changed since freezing"):
        tool_adapter_path("cpu")
