"""Row-invariant bf16 forwards (`ooospec.models.row_invariant`): a row's output is the same bits
whether it runs alone (AR's one-row step) or among the rows of a tree or a prefill chunk; torch's own
kernels come back inside `plain_rows`; fp32 is left alone; a profile cannot ask for it with a compiler."""

from __future__ import annotations

import copy
import textwrap

import pytest
import torch
import torch.nn.functional as F

from ooospec.models.loading import bf16_supported_on_cpu
from ooospec.models.registry import ProfileError, load_profile
from ooospec.models.row_invariant import (ATTENTION, KEY_MULTIPLE, RowInvariantProduct, plain_rows,
                                          row_invariant_attention, use_row_invariance, uses_row_invariance)
from ooospec.models.tiny import tiny_causal_lm

needs_bf16 = pytest.mark.skipif(not bf16_supported_on_cpu(), reason="this CPU has no native bf16 kernels "
                                "(the cpu profile runs fp32 here, where row invariance does not apply)")
LOW = torch.finfo(torch.bfloat16).min


@needs_bf16
@pytest.mark.parametrize("inputs, outputs", [(4864, 896), (1536, 576), (896, 4864)])
def test_a_row_alone_equals_the_same_row_among_others(inputs, outputs):
    """One row, as AR's step runs it, against that row inside 2-40-row and 700-row products."""
    generator = torch.Generator().manual_seed(inputs)
    weight = (0.05 * torch.randn(outputs, inputs, generator=generator)).bfloat16()
    product = RowInvariantProduct(weight)
    x = torch.randn(700, inputs, generator=generator).bfloat16()
    many = {rows: product(x[:rows]) for rows in (2, 3, 5, 9, 17, 40, 700)}
    for i in range(0, 40, 3):
        alone = product(x[i:i + 1])
        for rows, out in many.items():
            if i < rows:
                assert torch.equal(alone[0], out[i]), (i, rows)
    assert torch.equal(many[17], F.linear(x[:17], weight))  # several rows: torch's own product, bit for bit


def _tree_and_steps(prefix: int, rows: int, heads: int, kv_heads: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Attention of ``rows`` new tokens after ``prefix`` cached keys: each row as a one-query step
    (its own keys only, no mask) and as a row of one causal tree forward (explicit additive mask)."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, kv_heads, prefix + rows, 64, generator=generator).bfloat16()
    values = torch.randn(1, kv_heads, prefix + rows, 64, generator=generator).bfloat16()
    queries = (3 * torch.randn(1, heads, rows, 64, generator=generator)).bfloat16()
    mask = torch.zeros(rows, prefix + rows, dtype=torch.bfloat16)
    mask[:, prefix:] = torch.full((rows, rows), LOW, dtype=torch.bfloat16).triu(1)
    tree, _ = row_invariant_attention(None, queries, keys, values, mask.view(1, 1, rows, prefix + rows), scaling=0.125)
    pairs = []
    for i in range(rows):
        step, _ = row_invariant_attention(None, queries[:, :, i:i + 1], keys[:, :, :prefix + i + 1],
                                          values[:, :, :prefix + i + 1], None, scaling=0.125)
        pairs.append((step[0, 0], tree[0, i]))
    return pairs


@needs_bf16
@pytest.mark.parametrize("prefix", [300, KEY_MULTIPLE - 5, 777, 2 * KEY_MULTIPLE - 3])
@pytest.mark.parametrize("rows, heads, kv_heads", [(2, 14, 2), (9, 14, 2), (17, 9, 3)])
def test_one_query_steps_equal_the_rows_of_a_tree_forward(prefix, rows, heads, kv_heads):
    """Grouped heads as both targets have them, prefixes on both sides of a key block's end."""
    for i, (step, row) in enumerate(_tree_and_steps(prefix, rows, heads, kv_heads, seed=prefix + rows)):
        assert torch.equal(step, row), i


@needs_bf16
def test_a_tiny_models_steps_chunks_and_prefill_agree_bit_for_bit():
    """A whole decoder (hidden 256, grouped heads): one-row steps, a 9-row forward and a prefill in
    uneven chunks give the same logits as one forward over the same tokens."""
    model = tiny_causal_lm("qwen2", vocab_size=64, hidden=256, layers=2).to(torch.bfloat16)
    report = use_row_invariance(model)
    assert report.applied and uses_row_invariance(model)
    ids = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(input_ids=ids).logits[0]
        prefix = model(input_ids=ids[:, :40], use_cache=True).past_key_values
        cache = copy.deepcopy(prefix)
        steps = [model(input_ids=ids[:, p:p + 1], cache=cache, use_cache=True).logits[0, 0] for p in range(40, 60)]
        tree = model(input_ids=ids[:, 40:49], cache=copy.deepcopy(prefix), use_cache=True).logits[0]
        cache, chunked = None, None
        for start, end in ((0, 7), (7, 33), (33, 60)):
            out = model(input_ids=ids[:, start:end], cache=cache, use_cache=True)
            cache, chunked = out.past_key_values, out.logits[0]
    assert all(torch.equal(step, whole[40 + i]) for i, step in enumerate(steps))
    assert torch.equal(tree, whole[40:49])
    assert torch.equal(chunked, whole[33:])


@needs_bf16
def test_the_thread_count_does_not_change_a_row():
    """AR runs on one core, ToolSpec on both cores on two: a tree forward on two threads gives each row
    what one-row steps on one thread give it."""
    model = tiny_causal_lm("qwen2", vocab_size=64, hidden=256, layers=2).to(torch.bfloat16)
    use_row_invariance(model)
    ids = torch.randint(0, 64, (1, 50), generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            cache = model(input_ids=ids[:, :41], use_cache=True).past_key_values
            steps = [model(input_ids=ids[:, p:p + 1], cache=cache, use_cache=True).logits[0, 0] for p in range(41, 50)]
            torch.set_num_threads(2)
            whole = model(input_ids=ids).logits[0, 41:]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(step, whole[i]) for i, step in enumerate(steps))


@needs_bf16
def test_a_copy_of_a_row_invariant_model_packs_its_own_weights():
    """Studies copy a loaded target (`ooospec.studies.logit_ties`); oneDNN's packed weight cannot be
    copied, so the copy packs its own copied weight: same outputs, no shared state."""
    model = tiny_causal_lm("qwen2", vocab_size=64, hidden=256).to(torch.bfloat16)
    use_row_invariance(model)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(twin(input_ids=ids).logits, model(input_ids=ids).logits)
        twin.model.layers[0].mlp.down_proj.weight.zero_()
        twin.model.layers[0].mlp.down_proj.product = RowInvariantProduct(twin.model.layers[0].mlp.down_proj.weight)
        assert not torch.equal(twin(input_ids=ids).logits, model(input_ids=ids).logits)
    assert uses_row_invariance(twin)
    # cast away and back (as the logit-ties study does with a copy): packed again in the new dtype
    cast = copy.deepcopy(model).float().to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(cast(input_ids=ids).logits, model(input_ids=ids).logits)


@needs_bf16
def test_plain_rows_puts_torchs_kernels_back_and_then_restores():
    model = tiny_causal_lm("llama", vocab_size=64, hidden=128).to(torch.bfloat16)
    plain = copy.deepcopy(model)
    use_row_invariance(model)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        with plain_rows(model):
            assert model.config._attn_implementation == "sdpa"
            inside = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
        reference = plain(input_ids=ids).logits
    assert torch.equal(inside, reference)
    assert uses_row_invariance(model) and model.config._attn_implementation == ATTENTION
    assert after.shape == reference.shape


def test_fp32_is_left_alone():
    model = tiny_causal_lm("llama", vocab_size=64)
    report = use_row_invariance(model)
    assert not report.applied and "fp32" in report.reason
    assert not uses_row_invariance(model)
    assert not any(type(m).__name__ == "RowInvariantLinear" for m in model.modules())


def _profile(tmp_path, model_fields: str):
    text = textwrap.dedent("""\
        profile: rows-test
        models:
          m:
            source: {kind: local, path: /nowhere}
            dtype: bfloat16
        """) + textwrap.indent(textwrap.dedent(model_fields), "    ") + textwrap.dedent("""\
        roles:
          teacher: {model: m, surface: qwen_fenced_json}
          sidecar_base: {model: m}
          targets:
            t: {model: m, surface: qwen_fenced_json}
        """)
    path = tmp_path / "rows-test.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("fields, message", [
    ("rows: invariant\ncompile: inductor\n", "rows: invariant needs the eager kernels"),
    ("rows: sometimes\n", "'sometimes' is not one of ['invariant', 'plain']"),
])
def test_a_profile_asking_rows_it_cannot_have_is_refused_naming_the_field(tmp_path, fields, message):
    path = _profile(tmp_path, fields)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert "models.m.rows" in str(err.value) and message in str(err.value) and str(path) in str(err.value)


def test_the_cpu_profile_asks_row_invariance_of_its_decoding_models_and_the_compiled_one_does_not():
    cpu, compiled = load_profile("cpu"), load_profile("cpu-compiled")
    assert {spec.rows for spec in cpu.models.values()} == {"invariant"}
    assert {spec.rows for spec in compiled.models.values()} == {"plain"}
