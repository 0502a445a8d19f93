"""Target prompts (both styles), EOS resolution, and the clear error for an untrained tool adapter."""

from __future__ import annotations

import pytest

from ooospec.data.request import Request
from ooospec.models import target as target_module
from ooospec.models.prompts import prompt_ids, prompt_text
from ooospec.models.registry import load_profile
from ooospec.models.target import eos_token_ids, load_target
from ooospec.models.tiny import tiny_tokenizer

TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|eos|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

REQUEST = Request(
    id="req-1", benchmark="test", split="dev",
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wetter in München?"}],
    tools=[{"name": "get_weather", "description": "Weather now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    gold=None,
)


def test_chat_template_tools_passes_openai_style_tools():
    tok = tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    text = prompt_text(tok, REQUEST, "chat_template_tools")
    assert text.startswith('TOOLS:{"type": "function", "function": {"name": "get_weather"')
    assert text.endswith("user: Wetter in München?<|eos|>\nassistant: ")
    assert tok.decode(prompt_ids(tok, REQUEST, "chat_template_tools")) == text


def test_system_tools_json_lists_tools_and_keeps_the_system_message():
    tok = tiny_tokenizer()
    text = prompt_text(tok, REQUEST, "system_tools_json")
    system = text.split("<|eos|>")[0]
    assert system.startswith("system: You are a function-calling assistant.")
    assert '{"name":"get_weather","description":"Weather now."' in system
    assert system.endswith("Be brief.")
    assert text.count("system: ") == 1 and text.endswith("assistant: ")


def test_unknown_prompt_style_and_bad_template_name_the_request():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="unknown prompt style"):
        prompt_text(tok, REQUEST, "xml")
    tok.chat_template = "{{ raise_exception('no tools here') }}"
    with pytest.raises(ValueError, match="request req-1"):
        prompt_text(tok, REQUEST, "chat_template_tools")


def test_eos_tokens_resolve_or_fail_naming_the_profile():
    profile = load_profile("cpu")
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"cpu.yaml.*eos_tokens.*<\|im_end\|>"):
        eos_token_ids(tok, profile.targets["qwen2.5-coder-0.5b"], profile)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    assert eos_token_ids(tok, profile.targets["smollm2-135m-tool"], profile) == [tok.convert_tokens_to_ids("<|im_end|>")]


def test_tool_target_without_adapter_says_how_to_train_it(monkeypatch):
    def no_adapter(profile):
        raise FileNotFoundError("no tool-calling adapter; train it first: make sidecar")

    monkeypatch.setattr("ooospec.models.adapters.tool_adapter_path", no_adapter)
    monkeypatch.setattr(target_module, "load_model", lambda *a, **k: pytest.fail("loaded a model before the adapter check"))
    with pytest.raises(FileNotFoundError, match="train it first"):
        load_target("smollm2-135m-tool")


def test_unknown_target_lists_known_targets():
    with pytest.raises(KeyError, match="qwen2.5-coder-0.5b"):
        load_target("gpt-4o")
