"""The public entry point (`ooospec.api.decode`): every method writes AR's output token for token on
the tiny models, a bad method name or a missing sidecar is refused in one clear line, and the
module's docstring example runs as written."""

from __future__ import annotations

import doctest

import pytest
import torch

import ooospec.api
from ooospec.api import decode
from ooospec.models.formats import get_surface
from ooospec.models.target import TargetModel
from ooospec.models.tiny import tiny_model_and_tokenizer, tiny_tool_target
from ooospec.sidecar.service import SidecarService
from ooospec.sidecar.specs import oracle_sidecar

torch.set_num_threads(1)
TOOLS = [{"name": "get_weather", "description": "Current weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHATS = ["Weather in Paris?", "and in Oslo, please?", "Is it raining in Lyon today?"]


@pytest.fixture(scope="module")
def random_target() -> TargetModel:
    """A random tiny Llama: its greedy text is noise, which makes a stricter lossless check than a call."""
    model, tokenizer = tiny_model_and_tokenizer(seed=3)
    return TargetModel("tiny", model, tokenizer, get_surface("hermes_tool_call"), [tokenizer.eos_token_id],
                       prompt_style="system_tools_json")


@pytest.fixture(scope="module")
def tool_target() -> TargetModel:
    return tiny_tool_target({"name": "get_weather", "arguments": {"city": "Oslo"}})


@pytest.mark.parametrize("which", ["random_target", "tool_target"])
def test_ar_toolspec_and_ooospec_write_the_same_tokens(which, request):
    target = request.getfixturevalue(which)
    hints = {f"r{i}": {"name": "get_weather", "arguments": {"city": "Oslo"}} for i in range(len(CHATS))}
    with SidecarService(oracle_sidecar(hints), placement="thread") as sidecar:
        for i, chat in enumerate(CHATS):
            messages = [{"role": "user", "content": chat}]
            ar = decode(target, messages, TOOLS, "ar", max_new_tokens=80, request_id=f"r{i}")
            toolspec = decode(target, messages, TOOLS, "toolspec", max_new_tokens=80, request_id=f"r{i}")
            ooo = decode(target, messages, TOOLS, "ooospec", sidecar=sidecar, max_new_tokens=80, request_id=f"r{i}")
            static = decode(target, messages, TOOLS, "ooospec:static:budget=4", sidecar=sidecar, max_new_tokens=80,
                            request_id=f"r{i}")
            assert toolspec.output_ids == ar.output_ids == ooo.output_ids == static.output_ids
            assert ar.target_forwards == len(ar.output_ids) and ar.mat == 1.0
            assert ooo.method == "ooospec" and static.method == "ooospec:static:budget=4"
            assert sum(r.new_tokens for r in ooo.rounds) + 1 == len(ooo.output_ids)
            if which == "tool_target":
                assert ar.call is not None and ar.call.to_dict() == hints[f"r{i}"] and ooo.call == ar.call
                assert ooo.target_forwards < ar.target_forwards


def test_openai_wrapped_tools_and_the_default_request_id(tool_target):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    wrapped = [{"type": "function", "function": TOOLS[0]}]
    plain, openai = decode(tool_target, messages, TOOLS, "toolspec"), decode(tool_target, messages, wrapped, "toolspec")
    assert plain.output_ids == openai.output_ids and plain.request_id == openai.request_id
    assert plain.request_id.startswith("api-")


def test_bad_methods_and_sidecars_are_refused_with_a_clear_line(tool_target):
    messages = [{"role": "user", "content": "Weather?"}]
    with pytest.raises(ValueError, match=r"unknown base 'eagle'.*methods: ar, pld, toolspec, ooospec"):
        decode(tool_target, messages, TOOLS, "eagle")
    with pytest.raises(ValueError, match=r"unknown option 'turbo'"):
        decode(tool_target, messages, TOOLS, "toolspec:turbo")
    with pytest.raises(ValueError, match=r"'ooospec' drafts from a sidecar: pass sidecar="):
        decode(tool_target, messages, TOOLS, "ooospec")
    with pytest.raises(ValueError, match=r"'toolspec' uses no sidecar"):
        decode(tool_target, messages, TOOLS, "toolspec", sidecar=object())
    with pytest.raises(ValueError, match=r"pass the sidecar itself"):
        decode(tool_target, messages, TOOLS, "ooospec:oracle", sidecar=object())


def test_the_docstring_example_runs():
    outcome = doctest.testmod(ooospec.api, optionflags=doctest.ELLIPSIS)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_the_sidecar_hint_reaches_the_tree(tool_target):
    """Through the API the sidecar's call is drafted: with ``blocking`` (the hint awaited at the
    first boundary, so the check does not race the sidecar thread) hint tokens are committed."""
    messages = [{"role": "user", "content": "Weather?"}]
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    with SidecarService(oracle_sidecar({"r": call}), placement="thread") as sidecar:
        out = decode(tool_target, messages, TOOLS, "ooospec:blocking", sidecar=sidecar, request_id="r")
    toolspec = decode(tool_target, messages, TOOLS, "toolspec", request_id="r")
    assert out.output_ids == toolspec.output_ids and out.call.to_dict() == call
    assert out.result.source_counts["hint"] > 0 and toolspec.result.source_counts["hint"] == 0
