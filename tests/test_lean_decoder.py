"""The lean decoder (`ooospec.models.lean_decoder`): its logits agree with transformers' forward
within the arithmetic's rounding (so a wrong weight layout cannot pass), every row of a tree forward
is AR's one-row step bit for bit, greedy speculation on it reproduces AR, and a model it does not know
keeps transformers' forward with one line naming it."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from ooospec.decoding.base import Draft
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.lean_decoder import Product, lean_decoder_of, use_lean_decoder
from ooospec.models.loading import bf16_supported_on_cpu
from ooospec.models.tiny import tiny_causal_lm

DTYPES = [torch.float32] + ([torch.bfloat16] if bf16_supported_on_cpu() else [])


def _model(arch: str, dtype: torch.dtype, seed: int = 0):
    model = tiny_causal_lm(arch, seed=seed, vocab_size=96, layers=2, hidden=64).to(dtype)
    assert use_lean_decoder(model, where=f"tiny {arch}").applied
    return model


def _prefilled(model, length: int = 37, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=generator).tolist()
    verifier = TreeVerifier(model, eos_token_ids=[])
    state, _ = verifier.prefill(ids)
    return verifier, state


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logits_agree_with_transformers(arch, dtype):
    """Same cache, same rows: the lean forward against transformers', within what the dtype rounds
    (bf16: a few of its steps on the logits' scale; fp32: 1e-4), argmax equal where the top-2 are apart."""
    model = _model(arch, dtype)
    verifier, state = _prefilled(model)
    rows = torch.tensor([[state.root, 5, 17, 3, 60]])
    positions = torch.arange(state.cache_len, state.cache_len + 5).view(1, -1)
    ours = lean_decoder_of(model)(rows, cache=copy.deepcopy(state.cache), position_ids=positions).logits[0].float()
    with torch.no_grad():
        theirs = model(input_ids=rows, cache=copy.deepcopy(state.cache), position_ids=positions,
                       use_cache=True).logits[0].float()
    scale = theirs.abs().max()
    tolerance = 0.05 * scale if dtype == torch.bfloat16 else 1e-4 * scale
    assert (ours - theirs).abs().max() <= tolerance
    top2 = theirs.topk(2, dim=-1).values
    apart = (top2[:, 0] - top2[:, 1]) > 2 * tolerance
    assert torch.equal(ours.argmax(-1)[apart], theirs.argmax(-1)[apart])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_wrong_weight_layout_cannot_pass(arch):
    """The agreement test's tolerance catches a weight read in the wrong layout (gate and up swapped
    in the fused product of one layer): the check is not vacuous."""
    dtype = DTYPES[-1]
    model = _model(arch, dtype)
    verifier, state = _prefilled(model)
    lean = lean_decoder_of(model)
    broken = copy.copy(lean)
    broken.layers = [copy.copy(layer) for layer in lean.layers]
    mlp = model.model.layers[0].mlp
    broken.layers[0].gate_up = Product(mlp.up_proj, mlp.gate_proj)
    rows = torch.tensor([[state.root, 5, 17]])
    positions = torch.arange(state.cache_len, state.cache_len + 3).view(1, -1)
    good = lean(rows, cache=copy.deepcopy(state.cache), position_ids=positions).logits[0].float()
    bad = broken(rows, cache=copy.deepcopy(state.cache), position_ids=positions).logits[0].float()
    assert (good - bad).abs().max() > 0.05 * good.abs().max()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tree_rows_equal_one_row_steps(arch, dtype):
    """A random 12-node tree verified in one forward: every row's logits and the committed cache are
    the bits of AR's one-row steps along that row's path."""
    model = _model(arch, dtype, seed=3)
    verifier, state = _prefilled(model, seed=3)
    rng = random.Random(0)
    drafts = [Draft([rng.randrange(96) for _ in range(4)], "pld") for _ in range(3)]
    tree = build_tree(drafts, TreeBudget(max_nodes=12, max_depth=4))
    tree_logits = verifier.forward_tree(copy.deepcopy(state), tree)
    for row, path in enumerate([[]] + [_path(tree, node) for node in range(tree.size)]):
        step = copy.deepcopy(state)
        tokens = [state.root] + [tree.tokens[n] for n in path]
        for i, token in enumerate(tokens):
            logits = verifier.decoder(input_ids=torch.tensor([[token]]), cache=step.cache,
                                      position_ids=torch.tensor([[state.cache_len + i]])).logits[0, -1]
        assert torch.equal(logits, tree_logits[row]), (row, path)


def _path(tree, node: int) -> list[int]:
    """The nodes from the root's child down to ``node``."""
    path = [node]
    while tree.parents[path[0]] != -1:
        path.insert(0, tree.parents[path[0]])
    return path


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_speculation_reproduces_ar(dtype):
    """Greedy decoding with random drafts (some right, some wrong) commits AR's tokens, 40 of them."""
    model = _model("qwen2", dtype, seed=5)
    verifier, state = _prefilled(model, seed=5)
    ar_state, ar = copy.deepcopy(state), []
    while len(ar) < 40:
        ar += verifier.step(ar_state, build_tree([], TreeBudget(1, 1)), 40 - len(ar)).new_tokens
    spec, rng = [], random.Random(1)
    while len(spec) < 40:
        done = len(spec)
        right = ar[done:done + 3]  # a draft AR would write, and a wrong one beside it
        drafts = [Draft(right, "pld"), Draft([rng.randrange(96) for _ in range(3)], "retrieval")]
        spec += verifier.step(state, build_tree(drafts, TreeBudget(8, 4)), 40 - done).new_tokens
    assert spec == ar


def test_an_unknown_architecture_keeps_transformers_forward(capsys):
    model = tiny_causal_lm("qwen3", vocab_size=96)
    report = use_lean_decoder(model, where="configs/x.yaml: models.tiny")
    assert not report.applied and lean_decoder_of(model) is None
    line = capsys.readouterr().out.strip()
    assert line.startswith("configs/x.yaml: models.tiny: transformers' forward decodes") and "Qwen3" in line
    assert TreeVerifier(model, []).decoder is model


def test_records_name_the_lean_decoder():
    from ooospec.models.arithmetic import arithmetic_of, running_arithmetic
    from ooospec.models.registry import load_profile

    model = _model("llama", DTYPES[-1])
    assert "lean decoder" in running_arithmetic(model).kernels
    spec = load_profile("cpu").model("qwen2.5-coder-0.5b-instruct")
    assert spec.forward == "lean" and "lean decoder" in arithmetic_of(spec).kernels
    assert load_profile("cpu-transformers").model("qwen2.5-coder-0.5b-instruct").forward == "transformers"
    assert load_profile("cpu-compiled").model("qwen2.5-coder-0.5b-instruct").forward == "transformers"


def test_a_disagreeing_forward_is_refused_naming_request_and_position():
    from ooospec.models.lean_decoder import LeanMismatch, check_against_transformers

    model = _model("llama", DTYPES[-1])
    verifier, state = _prefilled(model)
    assert check_against_transformers(model, state.cache, [state.root, 4, 9], "tiny/r1") < 0.05
    lean = lean_decoder_of(model)
    mlp = model.model.layers[1].mlp
    lean.layers[1].gate_up = Product(mlp.up_proj, mlp.gate_proj)  # a wrong layout
    with pytest.raises(LeanMismatch, match=r"^tiny/r1: position 37: "):
        check_against_transformers(model, state.cache, [state.root, 4, 9], "tiny/r1")


REAL = [("qwen2.5-coder-0.5b", "apibank"), ("smollm2-135m-tool", "bfcl")]


@pytest.mark.slow
@pytest.mark.parametrize("name, benchmark", REAL, ids=[r[0] for r in REAL])
def test_real_targets_agree_and_decode_losslessly(name, benchmark):
    """On the cpu profile: the lean forward agrees with transformers' on real requests' first
    decode steps, and PLD and ToolSpec reproduce AR on it bit for bit (row invariance leaves no
    near-tie to excuse)."""
    from ooospec.bench.runner import StudySettings, decode_requests
    from ooospec.bench.sampling import sample_requests
    from ooospec.data import load_split
    from ooospec.models.lean_decoder import check_against_transformers
    from ooospec.models.target import load_target

    try:
        target = load_target(name, "cpu")
    except FileNotFoundError as err:
        pytest.skip(f"{name}: {err}")
    requests = sample_requests(load_split(f"eval_{benchmark}"), 3, 4, benchmark)
    verifier = TreeVerifier.for_target(target)
    for request in requests[:2]:
        state, _ = verifier.prefill(target.prompt_ids(request))
        assert check_against_transformers(target.model, state.cache, [state.root], f"{name}/{request.id}") < 0.05
    records = decode_requests(target, requests, ["pld", "toolspec"],
                              StudySettings(max_new_tokens=24, budget=TreeBudget(8, 8), progress=False))
    checked = [r for r in records if r["method"] != "ar"]
    assert len(checked) == 2 * len(requests)
    assert all(r["identical_to_ar"] for r in checked)


def test_a_copied_and_cast_model_decodes_in_its_new_dtype():
    """A study copies a target and casts it (`ooospec.studies.logit_ties`): the copy's lean decoder
    packs its products again in the new dtype and reads the cast norms, and still agrees."""
    from ooospec.models.lean_decoder import check_against_transformers

    model = _model("qwen2", DTYPES[-1])
    copied = copy.deepcopy(model).to(torch.float32)
    verifier, state = _prefilled(copied)
    assert lean_decoder_of(copied).model is copied
    assert check_against_transformers(copied, state.cache, [state.root, 7], "tiny/cast") < 1e-4
