"""The OoO-Spec runtime: sidecar service, hint bank, non-blocking boundaries, faults.

Mechanism tests run a tiny random Llama with SmolLM2's real tokenizer (hint alignment works on
text, so the tokenizer must be real) and the oracle predictor in the sidecar process.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from ooospec.data.request import Call, Request
from ooospec.decoding.base import DecodeContext, EventTrace
from ooospec.decoding.hint import HintBank, align_hint, validate_payload
from ooospec.decoding.loop import decode
from ooospec.models.tiny import tiny_causal_lm, tiny_target
from ooospec.decoding.tree import TreeBudget
from ooospec.models.surface import SurfaceFormat
from ooospec.sidecar.service import SidecarService
from ooospec.sidecar.specs import faulty_sidecar, oracle_sidecar

TOOLS = [{"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
HINT = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n    "unit": "celsius"\n  }\n}\n```'


def test_align_fast_path_and_realignment_after_a_wrong_value():
    assert align_hint("", HINT).remainder == HINT
    assert align_hint(HINT[:20], HINT).remainder == HINT[20:]
    wrong = HINT[: HINT.index("Paris")] + 'Lyon",\n    "'
    alignment = align_hint(wrong, HINT, cursor=HINT.index("Paris"))
    assert alignment is not None and alignment.remainder.startswith('unit": "celsius"')
    assert align_hint("zzzzqqqq", HINT) is None  # nothing shared: propose nothing
    assert align_hint(HINT, HINT) is None  # hint used up


def test_payload_validation_names_the_problem():
    request = Request("r", "b", "eval", [{"role": "user", "content": "x"}], TOOLS, None)
    assert validate_payload('{"name":"get_weather","arguments":{"city":"Paris"}}', request)[0] == Call(
        "get_weather", {"city": "Paris"})
    assert "not JSON" in validate_payload('{"name": "get_weather", ', request)[1]
    assert "unknown function" in validate_payload('{"name":"nope","arguments":{}}', request)[1]
    assert "not an object" in validate_payload('{"name":"get_weather","arguments":[1]}', request)[1]


class FixedText(SurfaceFormat):
    """A surface whose rendering of any call is a fixed text (here: the AR output)."""

    name = "fixed_text"

    def __init__(self, text: str):
        self.text = text

    def render(self, calls):
        return self.text

    def parse(self, text):
        return []


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from ooospec.models.loading import checkpoint_location
    from ooospec.models.registry import load_profile

    location, kwargs = checkpoint_location(load_profile("cpu").model("smollm2-135m-instruct"))
    return AutoTokenizer.from_pretrained(location, **kwargs)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    torch.manual_seed(0)
    return tiny_causal_lm("llama", seed=3, vocab_size=len(tokenizer), hidden=64)


def _ctx(request, tokenizer, surface):
    ids = tokenizer.encode("Weather in Paris please, in celsius. Call the tool.", add_special_tokens=False)
    return DecodeContext(request=request, tokenizer=tokenizer, surface=surface, prompt_ids=ids,
                         eos_token_ids=[], trace=EventTrace())


def _request(rid="r1"):
    return Request(rid, "test", "eval", [{"role": "user", "content": "weather"}], TOOLS, None)


def test_hint_is_accepted_and_output_stays_identical(tiny, tokenizer):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=40)
    surface = FixedText(tokenizer.decode(ar.output_ids, skip_special_tokens=False))
    oracle = oracle_sidecar({request.id: {"name": "get_weather", "arguments": {}}})
    with SidecarService(oracle, placement="process") as service:
        for blocking in (True, False):
            bank = HintBank(service, blocking=blocking, max_tokens=16)
            out = decode(tiny_target(tiny, tokenizer), [bank], _ctx(request, tokenizer, surface), max_new_tokens=40,
                         budget=TreeBudget(max_nodes=16, max_depth=16))
            assert out.output_ids == ar.output_ids
            kinds = [e["kind"] for e in out.trace.events]
            assert kinds.index("sidecar_submit") < kinds.index("prefill_start")  # submitted on arrival
            service.wait_idle()
            if blocking:  # waited at the first boundary: the hint drove the whole decode
                assert bank.stats.ready_round == 0
                assert out.source_counts["hint"] > 0 and out.forwards < ar.forwards
                assert "hint_ready" in kinds and "sidecar_wave" in kinds


@pytest.mark.parametrize("fault", ["crash", "hang", "garbage", "unknown_function", "raise"])
def test_sidecar_faults_never_change_the_output(tiny, tokenizer, fault):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=12)
    spec = faulty_sidecar(fault)
    with SidecarService(spec, placement="process", timeout_s=0.5) as service:
        bank = HintBank(service, blocking=True)
        out = decode(tiny_target(tiny, tokenizer), [bank], _ctx(request, tokenizer, FixedText("x")), max_new_tokens=12)
    assert out.output_ids == ar.output_ids
    assert bank.stats.error, "the trace must say why there was no hint"
    assert any(e["kind"] == "hint_rejected" for e in out.trace.events)


def test_killing_the_sidecar_mid_request(tiny, tokenizer):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=30)
    spec = oracle_sidecar({}, wave_s=30.0)  # busy for the whole request
    with SidecarService(spec, placement="process") as service:
        bank = HintBank(service)

        class Killer(HintBank):
            """Kills the sidecar process at the third boundary, then polls as usual."""

            def propose(self, state):
                if state.round_index == 2:
                    os.kill(service.pid, signal.SIGKILL)
                    service._worker.join(timeout=10)
                return super().propose(state)

        bank = Killer(service)
        out = decode(tiny_target(tiny, tokenizer), [bank], _ctx(request, tokenizer, FixedText("x")), max_new_tokens=30)
    assert out.output_ids == ar.output_ids
    assert "died" in (bank.stats.error or "")


def test_thread_placement_and_superseded_jobs(tokenizer):
    request_a, request_b = _request("a"), _request("b")
    calls = {"a": {"name": "get_weather", "arguments": {"city": "A"}},
             "b": {"name": "get_weather", "arguments": {"city": "B"}}}
    with SidecarService(oracle_sidecar(calls, wave_s=0.2), placement="thread") as service:
        first = service.submit(request_a)
        threading.Event().wait(0.05)  # a is in its wave; b and c queue behind it
        service.submit(_request("c"))
        second = service.submit(request_b)
        assert second.wait(5).payload == '{"name":"get_weather","arguments":{"city":"B"}}'
        assert first.wait(5).payload_bytes > 0
        assert service.wait_idle(5)


class _ReadyTicket:
    """A ticket whose result is already there (no sidecar process needed)."""

    def __init__(self, payload):
        from ooospec.sidecar.service import SidecarResult

        self.result = SidecarResult("r1", payload=payload, payload_bytes=len(payload))

    def poll(self):
        return self.result

    wait = poll


def test_hint_follows_the_layout_the_target_writes(tokenizer):
    """Qwen's API-Bank answers come inline or fenced: the hint aligns with whichever is committed."""
    from ooospec.decoding.base import DecodeState
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    request = Request("r1", "apibank", "eval", [{"role": "user", "content": "weather"}], TOOLS, None)
    surface = QwenFencedJson()
    assert {v.variant for v in surface.variants(request)} == {"fenced", "inline"}
    call = Call("get_weather", {"city": "Paris"})
    fenced = QwenFencedJson("fenced").render([call])
    bank = HintBank(service=None)
    bank.ctx = _ctx(request, tokenizer, surface)
    bank.hints, bank.done_polling = [], False  # what `begin` sets, without a sidecar
    bank.ticket = _ReadyTicket(call.compact())
    state = DecodeState(bank.ctx)
    state.commit(tokenizer.encode(fenced[: fenced.index('"get')], add_special_tokens=False))
    (draft,) = bank.propose(state)
    proposed = tokenizer.decode(draft.tokens)
    assert fenced[fenced.index('"get'):].startswith(proposed) and proposed.startswith('"get_weather",\n')
    inline = QwenFencedJson("inline").render([call])
    state = DecodeState(bank.ctx)
    state.commit(tokenizer.encode(inline[:12], add_special_tokens=False))
    (draft,) = bank.propose(state)
    assert inline[12:].startswith(tokenizer.decode(draft.tokens))
