"""Both profiles validate, and a broken profile fails with the file and the field named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ooospec.models.registry import ProfileError, load_profile
from ooospec.paths import configs_dir


def test_cpu_profile_roles():
    profile = load_profile("cpu")
    assert profile.teacher.model == "qwen2.5-coder-0.5b-instruct"
    assert profile.sidecar_base.model == "smollm2-135m-instruct"
    assert set(profile.targets) == {"qwen2.5-coder-0.5b", "smollm2-135m-tool"}
    assert profile.targets["qwen2.5-coder-0.5b"].surface == "qwen_fenced_json"
    assert profile.targets["smollm2-135m-tool"].surface == "llama_json"
    assert profile.targets["smollm2-135m-tool"].adapter == "tool_lora"
    for spec in profile.models.values():
        assert spec.source.kind == "pypi_gguf" and len(spec.source.sha256) == 64
    assert len(profile.models["qwen2.5-coder-0.5b-instruct"].source.files) == 6


def test_paper_profile_has_the_papers_seven_targets():
    profile = load_profile("paper")
    assert profile.sidecar_base.model == "qwen3-0.6b"
    assert profile.models[profile.teacher.model].source.repo == "Qwen/Qwen2.5-32B-Instruct"
    assert len(profile.targets) == 7
    repos = {profile.models[t.model].source.repo for t in profile.targets.values()}
    assert {"Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
            "meta-llama/Llama-3.1-8B-Instruct"} <= repos
    assert all(profile.models[t.model].source.kind == "hub" for t in profile.targets.values())


def test_model_lookup_by_role_and_unknown_name():
    profile = load_profile("cpu")
    assert profile.model("teacher").name == "qwen2.5-coder-0.5b-instruct"
    assert profile.model("smollm2-135m-tool").name == "smollm2-135m-instruct"
    with pytest.raises(KeyError, match="known models.*qwen2.5-coder-0.5b-instruct"):
        profile.model("gpt-5")


def _broken(tmp_path: Path, edit) -> Path:
    raw = yaml.safe_load((configs_dir() / "cpu.yaml").read_text())
    edit(raw)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda r: r["models"]["smollm2-135m-instruct"]["source"].update(sha256="abc"), "models.smollm2-135m-instruct.source.sha256"),
        (lambda r: r["models"]["smollm2-135m-instruct"]["source"].update(kind="ftp"), "models.smollm2-135m-instruct.source.kind"),
        (lambda r: r["models"]["smollm2-135m-instruct"].update(dtyp="float32"), "models.smollm2-135m-instruct"),
        (lambda r: r["roles"]["teacher"].update(model="nope"), "roles.teacher.model"),
        (lambda r: r["roles"]["targets"]["qwen2.5-coder-0.5b"].update(surface="xml"), "roles.targets.qwen2.5-coder-0.5b.surface"),
        (lambda r: r["roles"]["targets"]["smollm2-135m-tool"].pop("eos_tokens"), "roles.targets.smollm2-135m-tool"),
        (lambda r: r["roles"]["sidecar_base"].update(num_layers=0), "roles.sidecar_base.num_layers"),
        (lambda r: r["models"]["qwen2.5-coder-0.5b-instruct"]["source"]["files"].append("/abs/file.bin"), "source.files"),
    ],
)
def test_broken_profile_names_file_and_field(tmp_path, edit, field):
    path = _broken(tmp_path, edit)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(path) in str(err.value)
    assert field in str(err.value)


def test_unknown_profile_and_bad_yaml(tmp_path):
    with pytest.raises(ProfileError, match="known profiles.*cpu"):
        load_profile("no-such-profile")
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)


def test_derived_profiles_change_only_arithmetic_and_placement():
    cpu = load_profile("cpu")
    assert {(s.dtype, s.device) for s in cpu.models.values()} == {("bfloat16", "cpu")}
    for name, dtype, device, compiled in (("cpu-fp32", "float32", "cpu", None), ("gpu-small", "bfloat16", "cuda", None),
                                          ("cpu-compiled", "bfloat16", "cpu", "inductor")):
        derived = load_profile(name)
        assert derived.name == name and derived.targets == cpu.targets and derived.teacher == cpu.teacher
        assert derived.lineage == (name, "cpu")
        for model, spec in derived.models.items():
            assert spec.source == cpu.models[model].source
            assert (spec.dtype, spec.device, spec.compile) == (dtype, device, compiled)


def _write(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_extends_errors_name_the_file_and_field(tmp_path):
    bad_compile = _write(tmp_path, "comp", {"extends": "cpu", "profile": "x",
                                            "models": {"smollm2-135m-instruct": {"compile": "tensorrt"}}})
    with pytest.raises(ProfileError, match=r"comp.yaml: models.smollm2-135m-instruct.compile: 'tensorrt' is not one of"):
        load_profile(bad_compile)
    bad_device = _write(tmp_path, "dev", {"extends": "cpu", "profile": "x",
                                          "models": {"smollm2-135m-instruct": {"device": "tpu"}}})
    with pytest.raises(ProfileError, match=r"dev.yaml: models.smollm2-135m-instruct.device: 'tpu'"):
        load_profile(bad_device)
    unknown = _write(tmp_path, "unk", {"extends": "cpu", "profile": "x", "models": {"nope": {"dtype": "bfloat16"}}})
    with pytest.raises(ProfileError, match=r"unk.yaml: models.nope: not a model of the extended profile 'cpu'"):
        load_profile(unknown)
    missing = _write(tmp_path, "miss", {"extends": "no-such-profile", "profile": "x"})
    with pytest.raises(ProfileError, match="unknown profile 'no-such-profile'"):
        load_profile(missing)


def test_unavailable_placement_falls_back_with_one_line(capsys, monkeypatch):
    import torch

    from ooospec.models import loading

    spec = load_profile("gpu-small").models["smollm2-135m-instruct"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "bf16_supported_on_cpu", lambda: False)
    monkeypatch.setattr(loading, "_SAID", set())  # what this process has already been told
    assert loading.runtime_placement(spec) == ("float32", "cpu")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no CUDA device" in err[0] and "no native bf16 kernels" in err[1]
    assert loading.runtime_placement(spec) == ("float32", "cpu") and not capsys.readouterr().err  # said once


def test_the_machine_names_bf16_instructions_only_where_the_cpu_has_them():
    """oneDNN runs bf16 on an AVX512 CPU without bf16 instructions; records say which it was, and
    records from before the flag was kept read as they always did."""
    from ooospec.models.arithmetic import Arithmetic

    base = dict(dtype="bfloat16", requested="bfloat16", device="cpu", cpu="Xeon", cpu_capability="AVX512",
                bf16_kernels=True, cores=2, torch="2.13.0")
    assert Arithmetic(**base, bf16_flag="avx512_bf16").machine() == "a 2-core avx512_bf16 CPU (Xeon)"
    assert Arithmetic(**base, bf16_flag="none").machine() == (
        "a 2-core AVX512 CPU (Xeon; bf16 in oneDNN's avx512_core kernels, without bf16 instructions)")
    assert Arithmetic.from_dict(base).machine() == "a 2-core avx512_bf16 CPU (Xeon)"  # an older record
    fp32 = {**base, "dtype": "float32", "cpu_capability": "AVX2", "bf16_kernels": False}
    assert Arithmetic(**fp32, bf16_flag="none").machine() == "a 2-core AVX2 CPU (Xeon)"
    assert Arithmetic(**fp32, bf16_flag="avx512_bf16").machine() == (  # make KERNELS=avx2
        "a 2-core AVX2 CPU (Xeon; kernels capped at AVX2 on a CPU with avx512_bf16)")
