"""Which runtime serves the sidecar's wave (`ooospec.sidecar.served_runtime`): the serving rule's
table per CPU kind, the served sidecar's options unchanged by it, and the served sidecar, in its own
process as the bench starts it, running the runtime the table names for this machine and saying so in
what reaches the records."""

import pytest
import torch

from ooospec.sidecar import served_runtime
from ooospec.sidecar.gguf_export import load_runtime
from ooospec.sidecar.predictor import SlotPredictor
from ooospec.sidecar.served_runtime import SERVED_BY_RULE, machine_kind, resolve_runtime
from ooospec.sidecar.service import SidecarService
from ooospec.sidecar.specs import slot_sidecar
from ooospec.studies.wave_profile import dev_requests, served_adapter


def test_the_rule_serves_llama_cpp_where_it_passed_and_torch_elsewhere():
    choose = served_runtime.served_runtime
    assert choose("avx512_bf16", torch.bfloat16) == "llama.cpp:bf16"
    assert choose("avx512_bf16", torch.float32) == "torch"  # capped to AVX2 kernels: fp32, never measured
    assert choose("amx_bf16", torch.bfloat16) == "torch"  # not measured there
    assert choose("avx2", torch.float32) == "torch"  # measured slower there
    assert resolve_runtime("torch", torch.bfloat16) == "torch"  # the control, on any kind
    assert resolve_runtime("llama.cpp:q8_0", torch.float32) == "llama.cpp:q8_0"  # asked for by name


def test_the_served_sidecars_options_are_unchanged_and_a_named_runtime_is_another_spec(tmp_path):
    served = slot_sidecar(tmp_path).options
    assert "runtime" not in served  # run keys hash the options: the served sidecar's stay as they were
    assert slot_sidecar(tmp_path, runtime=SERVED_BY_RULE).options == served
    assert slot_sidecar(tmp_path, runtime="torch").options == {**served, "runtime": "torch"}


def _named(runtime: str) -> str:
    return runtime.replace(":", " ")  # how a loaded runtime names itself (torch: ``torch``)


def test_the_served_sidecar_runs_this_kinds_runtime_in_its_own_process():
    """The real path: the bench's spec, a spawned sidecar process, one dev request."""
    request = dev_requests(1)[0].request
    dtype = next(SlotPredictor.from_frozen(served_adapter()).model.parameters()).dtype
    expected = served_runtime.served_runtime(machine_kind(), dtype)
    with SidecarService(slot_sidecar(served_adapter())).start() as service:
        result = service.submit(request).wait(timeout_s=120)
    assert result.error is None and result.payload
    assert result.detail["runtime"] == _named(expected)


def test_a_kind_that_serves_llama_cpp_gives_that_runtimes_own_answers(monkeypatch):
    """As if this machine's kind served llama.cpp in the sidecar's own arithmetic: the served sidecar
    (placed in a thread, so the table can be patched) answers exactly as that runtime asked for by
    name, and names it."""
    pytest.importorskip("llama_cpp")
    own = lambda kind, dtype: "llama.cpp:" + ("f32" if dtype == torch.float32 else "bf16")  # noqa: E731
    monkeypatch.setattr(served_runtime, "served_runtime", own)
    request = dev_requests(1)[0].request
    named = SlotPredictor.from_frozen(served_adapter())
    dtype = next(named.model.parameters()).dtype
    named.runtime = load_runtime(own(None, dtype), served_adapter(), "cpu",
                                 lambda: SlotPredictor.from_frozen(served_adapter(), packed=False))
    expected = named.predict_wave(request).payload
    with SidecarService(slot_sidecar(served_adapter()), placement="thread").start() as service:
        result = service.submit(request).wait(timeout_s=120)
    assert result.detail["runtime"] == _named(own(None, dtype))
    assert result.payload == expected


def test_the_bench_asks_for_the_served_runtime_and_takes_its_control_by_name():
    from ooospec.bench.config import BenchConfig, notebook_config

    assert BenchConfig().sidecar_runtime == SERVED_BY_RULE
    assert notebook_config("05_bench", {"sidecar_runtime": "torch"}).sidecar_runtime == "torch"
    assert notebook_config("06_ablations").sidecar_runtime == SERVED_BY_RULE  # a chapter without the parameter
    with pytest.raises(ValueError, match="sidecar_runtime must be served, torch or llama.cpp:<weights>, got 'onnx'"):
        BenchConfig(sidecar_runtime="onnx")
