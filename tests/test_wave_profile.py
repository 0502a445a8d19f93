"""The wave study's bookkeeping on a tiny sidecar: phases add up to the wave, the chosen call's
completion, lever summaries against the control, operator kinds."""

import torch

from ooospec.data.request import Call, Request
from ooospec.studies.wave_profile import (CONTROL, LEVERS, HeadClock, StudyRequest, chosen_complete, op_kind,
                                          profile_wave, rotated, summarize)

from tiny_sidecar import TOOLS, sharp_predictor

torch.set_num_threads(1)


def item() -> StudyRequest:
    request = Request("r1", "test", "dev", [{"role": "user", "content": "weather in Paris, please, in celsius?"}],
                      TOOLS, [Call("get_weather", {"city": "Paris"})])
    return StudyRequest("dev", request, request.gold[0])


TORCH_LEVERS = [lever for lever in LEVERS if LEVERS[lever].get("runtime", "torch") == "torch"]


def test_every_lever_splits_its_wave_into_phases_that_add_up():
    predictor = sharp_predictor()
    models = {"served": predictor.model, "int8": predictor.model, "packed": predictor.model}  # one tiny model for all
    clocks = {"served": HeadClock(predictor.model)}
    clocks["int8"] = clocks["packed"] = clocks["served"]
    lines = [profile_wave(predictor, models, clocks, item(), lever) for lever in TORCH_LEVERS]
    assert [line.lever for line in lines] == TORCH_LEVERS  # llama.cpp's: tests/test_llama_cpp_rows.py
    for line in lines:
        parts = line.prefix_s + line.rows_s + line.steps_s + line.between_s
        assert abs(parts - line.wave_s) < 1e-3  # each part rounded to 0.1 ms
        assert line.forwards == 2 + line.steps and line.rows == 4 and line.head_s > 0
        assert line.followed or not line.whole_call  # the chosen call is one of the payload's
        assert line.chosen_s is None or line.chosen_s <= line.wave_s
        assert line.first_s <= line.wave_s
    # the tiny model's answers do not depend on the head's input or on the model copy
    assert len({line.payload for line in lines if LEVERS[line.lever].get("mode", "wave") == "wave"}) == 1
    assert predictor.gathered_head and predictor.span_drafts is None  # the last levers change the model only


def test_the_chosen_call_is_complete_when_its_function_row_and_rows_are():
    predictor = sharp_predictor()
    wave = predictor.predict_wave(item().request)
    done = chosen_complete(wave)
    if wave.call is None:
        assert done is None
    else:
        mine = [r.done_after for r in wave.rows if r.key.function in (None, wave.call.name)]
        assert done == max(mine) <= wave.forwards


def test_levers_rotate_and_are_summarized_against_the_control():
    assert [rotated(["a", "b", "c"], i) for i in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                                ["a", "b", "c"]]
    base = {"source": "dev", "chosen_s": 1.0, "whole_call": True}
    lines = []
    for rid, payload in (("a", "x"), ("b", "y")):
        for lever, wave_s in zip(LEVERS, (4.0, 2.0, 1.6, 2.0, 1.5, 1.5, 1.0)):
            changed = lever != CONTROL and rid == "b" and "int8" in lever
            lines.append({**base, "request_id": rid, "lever": lever, "wave_s": wave_s, "first_s": wave_s,
                          "prefix_s": 0.5 if rid == "a" else 1.0,
                          "payload": "z" if changed else payload, "whole_call": not changed,
                          "followed": not changed and "chosen" not in lever})
    summary = {s.lever: s for s in summarize(lines)}
    assert summary[CONTROL].speedup == 1.0 and summary["gathered head"].speedup == 2.0
    assert summary["+ int8"].speedup == 4.0
    assert (summary["+ int8"].same_payload, summary["+ int8"].whole_call) == (1, 1)
    assert summary["gathered head"].same_payload == 2 and summary["gathered head"].n == 2
    assert (summary["+ chosen wave"].speedup, summary["+ chosen wave"].followed) == (2.5, 0)
    # the prefix-only bound: the control's 4.0 s over a prefix forward of 0.5 s and of 1.0 s
    assert {s.prefix_bound for s in summary.values()} == {6.0}


def test_operators_are_sorted_into_kinds():
    assert op_kind("aten::addmm") == op_kind("mkldnn::_linear_pointwise") == "products"
    assert op_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert op_kind("aten::copy_") == op_kind("aten::cat") == op_kind("aten::index_select") == "copies"
    assert op_kind("aten::silu") == "other operators"


def test_the_packed_lever_is_a_packed_copy_in_bf16_and_the_model_itself_in_fp32():
    import torch

    from ooospec.models.loading import bf16_supported_on_cpu
    from ooospec.models.row_invariant import RowInvariantLinear
    from ooospec.models.tiny import tiny_causal_lm
    from ooospec.studies.wave_profile import packed_model

    fp32 = tiny_causal_lm("llama", vocab_size=64)
    assert packed_model(fp32) is fp32
    if not bf16_supported_on_cpu():
        return
    bf16 = fp32.to(torch.bfloat16)
    packed = packed_model(bf16)
    assert packed is not bf16 and not any(isinstance(m, RowInvariantLinear) for m in bf16.modules())
    assert all(type(m) is not torch.nn.Linear for m in packed.modules())
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(packed(input_ids=ids).logits, bf16(input_ids=ids).logits)  # several rows: the same bits
