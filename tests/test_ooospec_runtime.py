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
from ooospec.studies.hint_replay import StoredHints
from ooospec.decoding.hint import HintBank, align_hint, check_payload
from ooospec.decoding.loop import decode
from ooospec.models.tiny import FixedText, tiny_target
from ooospec.decoding.tree import TreeBudget
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


def test_payload_checks_name_the_problem_and_keep_the_rest():
    request = Request("r", "b", "eval", [{"role": "user", "content": "x"}], TOOLS, None)
    assert check_payload('{"name":"get_weather","arguments":{"city":"Paris"}}', request).calls == [
        Call("get_weather", {"city": "Paris"})]
    assert "not JSON" in check_payload('{"name": "get_weather", ', request).error
    assert "unknown function" in check_payload('{"name":"nope","arguments":{}}', request).error
    assert "not an object" in check_payload('{"name":"get_weather","arguments":[1]}', request).error
    assert "over the 64-byte limit" in check_payload('{"name":"get_weather","arguments":{"city":"' + "x" * 80 + '"}}',
                                                     request, max_bytes=64).error
    # a slot no parameter has, or of the wrong JSON type, is dropped with its reason; the rest is used
    checked = check_payload('{"name":"get_weather","arguments":{"city":3,"zip":"75001"}}', request)
    assert checked.calls == [Call("get_weather", {})] and len(checked.dropped) == 2
    assert any("zip: no such parameter" in d for d in checked.dropped)
    assert any("city: a int where the schema says string" in d for d in checked.dropped)
    # a list payload: the chosen call first, an unknown one dropped, the others kept
    checked = check_payload('[{"name":"nope","arguments":{}},{"name":"get_weather","arguments":{"city":"Oslo"}}]',
                            request)
    assert checked.calls == [Call("get_weather", {"city": "Oslo"})] and checked.dropped == ["unknown function 'nope'"]


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


def test_hint_follows_the_layout_the_target_writes(tokenizer):
    """Qwen's API-Bank answers come inline or fenced: the hint aligns with whichever is committed."""
    from ooospec.decoding.base import DecodeState
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    request = Request("r1", "apibank", "eval", [{"role": "user", "content": "weather"}], TOOLS, None)
    surface = QwenFencedJson()
    assert {v.layout_name for v in surface.layouts(request)} == {"fenced", "inline"}
    call = Call("get_weather", {"city": "Paris"})
    fenced = QwenFencedJson("fenced").render([call])
    bank = HintBank(StoredHints({request.id: call.compact()}))
    bank.begin(_ctx(request, tokenizer, surface))
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


TWO_TOOLS = TOOLS + [{"name": "get_time", "description": "time",
                      "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}]


def _bank_on(request, tokenizer, payload, **options):
    """A hint bank whose sidecar answer is already there, begun on ``request`` (fenced Qwen surface)."""
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    bank = HintBank(StoredHints({request.id: payload}), **options)
    bank.begin(_ctx(request, tokenizer, QwenFencedJson("fenced")))
    return bank


def test_no_hint_in_prose(tokenizer):
    """Prose whose last word occurs in the hint gets no proposal once the bank reads the committed
    text with the schema FSM; the call's opening and its inside still do."""
    from ooospec.decoding.base import DecodeState
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    request = _request()
    payload = Call("get_weather", {"city": "Paris"}).compact()
    prose = "Sure, I will look up the weather in Paris"
    for gate, expected in ((True, 0), (False, 1)):
        bank = _bank_on(request, tokenizer, payload, gate=gate)
        state = DecodeState(bank.ctx)
        state.commit(tokenizer.encode(prose, add_special_tokens=False))
        assert len(bank.propose(state)) == expected  # ungated: "Paris" aligns into the call's value
    bank = _bank_on(request, tokenizer, payload)
    assert bank.propose(DecodeState(bank.ctx))  # at the opening: the whole call
    call_text = QwenFencedJson("fenced").render([Call("get_weather", {"city": "Paris"})])
    state = DecodeState(bank.ctx)
    state.commit(tokenizer.encode(prose + "\n" + call_text[:20], add_special_tokens=False))
    (draft,) = bank.propose(state)
    assert call_text[20:].startswith(tokenizer.decode(draft.tokens))  # a call begun after prose


def test_the_hint_follows_the_function_the_target_writes(tokenizer):
    """The sidecar chose get_weather, the target writes get_time: with ``follow`` the payload's
    get_time slots are proposed and accepted (replayed against the target's output); without it
    the hint never proposes them. The output is the reference either way."""
    from ooospec.studies.hint_replay import ReferenceVerifier
    from ooospec.decoding.toolspec import ToolSpec
    from ooospec.decoding.tree import TreeBudget
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson
    from ooospec.models.target import TargetModel

    request = Request("r1", "test", "eval", [{"role": "user", "content": "what time is it?"}], TWO_TOOLS, None)
    surface = QwenFencedJson("fenced")
    written = surface.render([Call("get_time", {"zone": "Europe/Oslo"})])
    reference = tokenizer.encode(written, add_special_tokens=False)
    chosen, other = Call("get_weather", {"city": "Paris"}), Call("get_time", {"zone": "Europe/Oslo"})
    payload = f"[{chosen.compact()},{other.compact()}]"
    target = TargetModel("replay", None, tokenizer, surface, [])
    credited = {}
    for follow in (True, False):
        bank = HintBank(StoredHints({request.id: payload}), follow=follow)
        out = decode(target, [bank, ToolSpec()], _ctx(request, tokenizer, surface), len(reference), TreeBudget(16, 16),
                     verifier=ReferenceVerifier(reference, [], len(tokenizer)))
        assert out.output_ids == reference
        credited[follow] = out.source_counts["hint"]
    value_tokens = len(tokenizer.encode("Europe/Oslo", add_special_tokens=False))
    assert credited[True] >= credited[False] + value_tokens  # the value only the followed call knows


def test_the_hint_depth_follows_acceptance():
    from ooospec.decoding.hint import DepthSchedule

    schedule = DepthSchedule(start=8, grow=2, shrink=4, floor=2, cap=12)
    for accepted, depth in ((True, 10), (True, 12), (True, 12), (False, 8), (False, 4), (False, 2), (False, 2)):
        schedule.update(accepted)
        assert schedule.depth == depth


def test_a_replay_counts_what_the_target_does(tiny, tokenizer):
    """`ReferenceVerifier` (the target's greedy output known) gives the same rounds, tree sizes and
    accepted tokens as verifying with the model itself: what the dev replay's counts rest on."""
    from ooospec.studies.hint_replay import ReferenceVerifier
    from ooospec.decoding.toolspec import ToolSpec

    request = _request()
    target = tiny_target(tiny, tokenizer)
    ar = decode(target, [], _ctx(request, tokenizer, None), max_new_tokens=40)
    text = tokenizer.decode(ar.output_ids, skip_special_tokens=False)
    surface = FixedText(text[: len(text) // 2] + "zzz")  # a hint right for half the output, then wrong
    runs = {}
    for kind in ("model", "replay"):
        bank = HintBank(StoredHints({request.id: Call("get_weather", {}).compact()}), max_tokens=12)
        verifier = ReferenceVerifier(ar.output_ids, [], len(tokenizer)) if kind == "replay" else None
        runs[kind] = decode(target, [bank, ToolSpec()], _ctx(request, tokenizer, surface), 40, TreeBudget(8, 8),
                            verifier=verifier)
    assert runs["replay"].output_ids == runs["model"].output_ids == ar.output_ids
    shape = {k: [(r.tree_size, r.accepted, r.credits) for r in out.rounds] for k, out in runs.items()}
    assert shape["replay"] == shape["model"] and len(shape["model"]) < ar.forwards


class _BusyFor:
    """A sidecar stand-in whose job is in flight for the first ``rounds`` boundaries."""

    def __init__(self, rounds):
        self.rounds, self.asked = rounds, 0

    @property
    def idle(self):
        self.asked += 1
        return self.asked > self.rounds


def test_elastic_cores_follow_the_sidecar_and_keep_the_output(tiny, tokenizer):
    """The target computes on two threads only while no sidecar job is in flight and gives the core
    back when the request ends; it writes AR's tokens either way (a two-thread forward sums in
    another order: the bench's lossless check against one-thread AR covers real requests)."""
    from ooospec.bench.placement import CorePlan, ElasticCores

    request = _request()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=12)
        elastic = ElasticCores(_BusyFor(3), CorePlan(None, None), threads=1)
        out = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), 12, placement=elastic)
        assert torch.get_num_threads() == 1  # given back at the end
        assert out.output_ids == ar.output_ids
        threads = [r.threads for r in out.rounds]
        # asked before the prefill (busy: one thread) and before each round
        assert out.trace.of_kind("prefill_end")[0]["threads"] == 1
        assert threads == [1, 1] + [2] * (len(threads) - 2)
        assert elastic.switches == 2 and elastic.switch_s > 0  # widened once, narrowed at the end
        assert [e["threads"] for e in out.trace.of_kind("round")] == threads
        # no job in flight when the sources have begun (a skipped wave): the prefill runs wide too
        idle = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), 12,
                      placement=ElasticCores(_BusyFor(0), CorePlan(None, None), threads=1))
        assert idle.trace.of_kind("prefill_end")[0]["threads"] == 2 and {r.threads for r in idle.rounds} == {2}
        assert idle.output_ids == ar.output_ids and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_elastic_chunked_prefill_widens_inside_the_prefill_and_then_runs_the_rest_at_once(tiny, tokenizer):
    """With ``prefill_chunk`` the elastic target asks at every chunk while the sidecar is busy,
    widens at the first chunk after the job is done, and then runs the rest of the prompt in one
    forward (it stays wide until the request ends); the output is AR's."""
    from ooospec.bench.placement import CorePlan, ElasticCores

    request = _request()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=12)
        elastic = ElasticCores(_BusyFor(3), CorePlan(None, None), threads=1, prefill_chunk=2)
        sizes, forward = [], tiny.forward

        def counting(*args, **kwargs):
            sizes.append(kwargs["input_ids"].shape[1])
            return forward(*args, **kwargs)

        tiny.forward = counting
        try:
            out = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), 12, placement=elastic)
        finally:
            del tiny.forward
        prompt = out.trace.of_kind("prefill_start")[0]["prompt_tokens"]
        assert prompt > 6
        # busy before the prefill and at the first two chunk boundaries, idle at the third
        assert sizes[:4] == [2, 2, 2, prompt - 6]
        assert out.trace.of_kind("prefill_end")[0]["threads"] == 2 and {r.threads for r in out.rounds} == {2}
        assert out.output_ids == ar.output_ids and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_service_says_whether_a_job_is_in_flight(tokenizer):
    request = _request()
    with SidecarService(oracle_sidecar({request.id: {"name": "get_weather", "arguments": {}}}, wave_s=0.3),
                        placement="thread") as service:
        assert service.idle
        ticket = service.submit(request)
        assert not service.idle  # the wave is running: the target keeps to its own core
        ticket.wait(5)
        assert service.idle


def test_the_hint_still_proposes_inside_a_call_of_an_unknown_function(tokenizer):
    """Targets invent functions (the FSM, bound to the schema, loses the call): the bank still reads
    an opened, unclosed call of the surface as inside a call, and proposes; after the call closes,
    it does not."""
    from ooospec.decoding.base import DecodeState
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    request = _request()
    bank = _bank_on(request, tokenizer, Call("get_weather", {"city": "Paris"}).compact())
    invented = QwenFencedJson("fenced").render([Call("weather_now", {"city": "Paris"})])
    state = DecodeState(bank.ctx)
    state.commit(tokenizer.encode(invented[: invented.index("Paris")], add_special_tokens=False))
    (draft,) = bank.propose(state)
    assert tokenizer.decode(draft.tokens).startswith('Paris"\n  }')
    state = DecodeState(bank.ctx)
    state.commit(tokenizer.encode(invented + "\nThat is all.", add_special_tokens=False))
    assert bank.propose(state) == []


def test_the_wave_gate_backs_off_while_waves_come_late():
    from ooospec.decoding.wave_gate import WaveGate

    gate, submitted = WaveGate(late_run=2, first_skip=2), []
    outcomes = iter([False, False, False, True, True])  # late, late, a late probe, then in time
    for _ in range(12):
        submitted.append(gate.submit())
        if submitted[-1]:
            gate.record(next(outcomes, True))
    # two late waves close it for two requests; the late probe closes it for four; in time opens it
    assert submitted == [True, True, False, False, True, False, False, False, False, True, True, True]
    with pytest.raises(ValueError, match="late_run"):
        WaveGate(late_run=0)


def test_a_late_sidecar_loses_its_waves_not_the_output(tiny, tokenizer):
    """A sidecar whose hint is never ready before the request finishes: after two such requests the
    bank skips the next waves (never submitted, said in the trace), and every output is AR's; the
    control (`every_wave`) submits every wave."""
    from ooospec.decoding.out_of_order import ooospec_sources

    requests = [_request(f"r{i}") for i in range(5)]
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(requests[0], tokenizer, None), max_new_tokens=8)
    calls = {r.id: {"name": "get_weather", "arguments": {"city": "Paris"}} for r in requests}
    surface = FixedText(HINT)
    with SidecarService(oracle_sidecar(calls, wave_s=0.8), placement="thread") as service:
        for every_wave, expected in ((False, [True, True, False, False, True]), (True, [True] * 5)):
            bank, toolspec = ooospec_sources(service, every_wave=every_wave)
            assert (bank.wave_gate is None) == every_wave
            submitted = []
            for request in requests:
                out = decode(tiny_target(tiny, tokenizer), [bank, toolspec], _ctx(request, tokenizer, surface),
                             max_new_tokens=8, budget=TreeBudget(8, 8))
                service.wait_idle()
                kinds = [e["kind"] for e in out.trace.events]
                submitted.append(bank.stats.submitted)
                assert ("sidecar_submit" in kinds) == bank.stats.submitted != ("sidecar_skipped" in kinds)
                assert out.output_ids == ar.output_ids
                assert bank.stats.error.startswith("hint not ready" if bank.stats.submitted else "wave skipped")
            assert submitted == expected


def test_a_ticket_returns_a_first_delivery_once_then_the_final_answer():
    request = _request()
    chosen = {"name": "get_weather", "arguments": {"city": "Paris"}}
    final = '[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{"zone":"UTC"}}]'
    spec = oracle_sidecar({request.id: chosen}, wave_s=0.4, early_s=0.05, final={request.id: final})
    with SidecarService(spec, placement="thread") as service:
        ticket = service.submit(request, "progressive_wave")
        seen = []
        while not seen or seen[-1].early:
            result = ticket.poll()
            if result is not None:
                seen.append(result)
        assert [r.early for r in seen] == [True, False]
        assert seen[0].payload == '{"name":"get_weather","arguments":{"city":"Paris"}}' and seen[1].payload == final
        assert ticket.poll() is seen[1]  # the final answer stays
        assert seen[0].wave_end <= seen[1].wave_end and service.wait_idle(5)


def test_a_progressive_hint_is_taken_at_its_first_delivery_and_survives_a_bad_final(tiny, tokenizer):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=40)
    surface = FixedText(tokenizer.decode(ar.output_ids, skip_special_tokens=False))
    # both deliveries are in before the first boundary: the bank takes them in order
    spec = oracle_sidecar({request.id: {"name": "get_weather", "arguments": {}}}, wave_s=0.0, early_s=0.0,
                          final={request.id: '{"name": "get_weather", '})  # the final answer is not JSON
    with SidecarService(spec, placement="thread") as service:
        bank = HintBank(service, mode="progressive_wave", blocking=True, max_tokens=16)
        out = decode(tiny_target(tiny, tokenizer), [bank], _ctx(request, tokenizer, surface), max_new_tokens=40,
                     budget=TreeBudget(max_nodes=16, max_depth=16))
        service.wait_idle(5)
    assert out.output_ids == ar.output_ids
    assert bank.stats.ready_round == 0 and bank.stats.error is None  # the first delivery drove the decode
    assert out.source_counts["hint"] > 0 and bank.stats.extra["early"]["early"] is True
    kinds = [e["kind"] for e in out.trace.events]
    assert "hint_rejected" not in kinds and bank.done_polling  # the final came within the decode
    assert "not JSON" in bank.stats.extra["final_error"] and "hint_final_rejected" in kinds  # recorded, hint kept
