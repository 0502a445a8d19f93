"""LoRA SFT mechanics on a tiny random Llama: label masking, prefix sharing, training, resume, freezing."""

import torch
import pytest

from ooospec.models.tiny import tiny_model_and_tokenizer
from ooospec.models.adapters import directory_sha256, freeze_adapter, load_frozen_adapter, read_frozen
from ooospec.training.lora import (IGNORE_INDEX, Branch, LoraTrainConfig, TrainExample, Unit, attach_lora, batch_nll, completion_labels, frozen_linears_in_bf16, length_groups, plan_steps, plan_units, save_loss_curve, shared_prefix_nll, step_line, train_lora)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=1)


def manual_completion_nll(model, prompt, completion):
    """Reference: full forward, sum -log p over exactly the completion tokens."""
    ids = torch.tensor([prompt + completion])
    logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
    return -sum(logp[len(prompt) + i - 1, tok] for i, tok in enumerate(completion))


def test_completion_labels_mask_every_prompt_position():
    assert completion_labels(3, [7, 8]) == [IGNORE_INDEX] * 3 + [7, 8]


def test_no_prompt_token_contributes_to_the_loss(tiny):
    model, _ = tiny
    prompt, completion = [5, 6, 7, 8, 9, 10], [11, 12, 13]
    example = TrainExample.single("x", prompt, completion)
    torch.testing.assert_close(batch_nll(model, [example], pad_id=0), manual_completion_nll(model, prompt, completion))
    # gradient reaches the logits only at positions that predict a completion token
    captured = {}

    def keep_logits(module, args, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep_logits)
    try:
        batch_nll(model, [example], pad_id=0).backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    logits = captured["logits"]
    first = len(prompt) + len(completion) - logits.shape[1]  # absolute position of the first kept logit
    touched = [first + j for j in range(logits.shape[1]) if logits.grad[0, j].abs().sum() > 0]
    assert touched == [len(prompt) - 1 + i for i in range(len(completion))]


def test_padding_in_a_batch_does_not_change_the_loss(tiny):
    model, _ = tiny
    a = TrainExample.single("a", [5, 6, 7], [8, 9])
    b = TrainExample.single("b", [5, 6, 7, 20, 21, 22, 23], [24])
    together = batch_nll(model, [a, b], pad_id=0)
    apart = batch_nll(model, [a], 0) + batch_nll(model, [b], 0)
    torch.testing.assert_close(together, apart, rtol=1e-5, atol=1e-5)


def test_shared_prefix_loss_and_gradient_equal_separate_rows(tiny):
    model, _ = tiny
    prefix = list(range(30, 60))
    branches = [Branch([61, 62], [63, 64, 65]), Branch([66], [67]), Branch([68, 69, 70], [71, 72])]
    assert [len(g) for g in length_groups(branches)] == [1, 2]  # the prefix KV serves two branch batches
    shared = shared_prefix_nll(model, prefix, branches, pad_id=0)
    g_shared = torch.autograd.grad(shared, model.model.layers[0].self_attn.q_proj.weight)[0]
    separate = sum(manual_completion_nll(model, prefix + b.prompt_ids, b.completion_ids) for b in branches)
    g_separate = torch.autograd.grad(separate, model.model.layers[0].self_attn.q_proj.weight)[0]
    torch.testing.assert_close(shared, separate, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g_shared, g_separate, rtol=1e-4, atol=1e-5)


def test_units_bucket_by_length_and_order_is_seeded():
    cfg = LoraTrainConfig(batch_size=2, max_batch_tokens=100)
    singles = [TrainExample.single(str(n), [1] * n, [2]) for n in (30, 5, 29, 6)]
    grouped = TrainExample("g", [1] * 10, [Branch([3], [4])] * 5)
    units = plan_units(singles + [grouped], cfg, seed=0)
    batches = sorted(sorted(ex.id for ex in u.examples) for u in units if not u.shared)
    assert batches == [["29", "30"], ["5", "6"]]
    assert sum(u.shared for u in units) == 1
    assert [u.examples[0].id for u in plan_units(singles, cfg, 3)] == [u.examples[0].id for u in plan_units(singles, cfg, 3)]
    assert isinstance(units[0], Unit)
    steps = plan_steps(singles, LoraTrainConfig(batch_size=1, step_completion_tokens=2, epochs=2))
    assert len(steps) == 4 and all(len(s) == 2 for s in steps)


def small_examples(tokenizer):
    enc = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tokenizer.eos_token_id
    prefix = enc("Tools:\n[0] get_weather: Get the weather.\nDialogue:\nuser: weather in Paris?\n")
    return [
        TrainExample("r1", prefix, [Branch(enc("Q: function index\nA:"), enc(" 0") + [eos]),
                                    Branch(enc("Q: get_weather.city\nA:"), enc(' "Paris"') + [eos])]),
        TrainExample.single("s1", enc("user: time in Oslo?\n"), enc(' {"name":"get_time"}') + [eos]),
    ]


@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_tiny_lora_training_lowers_the_loss(tmp_path, autocast):
    model, tokenizer = tiny_model_and_tokenizer(seed=2)
    cfg = LoraTrainConfig(lr=2e-2, dropout=0.0, step_completion_tokens=1, epochs=15, warmup_frac=0.0, autocast=autocast)
    model = attach_lora(model, cfg)
    result = train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id)
    losses = [e["loss"] for e in result.loss_log]
    assert result.finished and len(losses) == 30
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4
    save_loss_curve(result.loss_log, tmp_path / "loss.json", tmp_path / "loss.png", "tiny")
    assert (tmp_path / "loss.png").stat().st_size > 1000


def test_frozen_weights_held_in_bf16_give_the_same_loss_and_gradients_under_autocast():
    """Casting a frozen weight once rounds as autocast's cast on every forward does; the tied head
    gets its own copy (the embedding stays fp32) and every fp32 weight comes back on exit."""
    model, tokenizer = tiny_model_and_tokenizer(seed=5)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied, as SmolLM2's
    cfg = LoraTrainConfig(lr=1e-3, dropout=0.0, autocast="bf16")
    model = attach_lora(model, cfg)
    example = small_examples(tokenizer)[0]
    fp32 = {name: p for name, p in model.named_parameters() if not p.requires_grad}

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        with cfg.autocast_context():
            loss = shared_prefix_nll(model, example.prefix_ids, example.branches, tokenizer.pad_token_id)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    loss, grads = loss_and_grads()
    with frozen_linears_in_bf16(model) as swapped:
        assert swapped > 0 and model.get_input_embeddings().weight.dtype == torch.float32
        assert model.base_model.model.lm_head.weight.dtype == torch.bfloat16
        held_loss, held_grads = loss_and_grads()
    assert held_loss == loss and all(torch.equal(a, b) for a, b in zip(grads, held_grads))
    assert all(p is fp32[name] for name, p in model.named_parameters() if not p.requires_grad)
    assert model.base_model.model.lm_head.weight is model.get_input_embeddings().weight


def test_autocast_is_validated_and_kept_out_of_the_key_when_off():
    assert "autocast" not in LoraTrainConfig().to_dict()  # adapters trained before the option keep their keys
    assert LoraTrainConfig(autocast="bf16").to_dict()["autocast"] == "bf16"
    with pytest.raises(ValueError, match="autocast"):
        LoraTrainConfig(autocast="fp8")


def test_interrupted_training_resumes_to_the_same_adapter(tmp_path):
    cfg = LoraTrainConfig(lr=1e-2, dropout=0.0, step_completion_tokens=1, epochs=3, checkpoint_every=2)

    def fresh():
        model, tokenizer = tiny_model_and_tokenizer(seed=3)
        return attach_lora(model, cfg), tokenizer

    model, tokenizer = fresh()
    whole = train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id, work_dir=None)
    expected = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    model, tokenizer = fresh()
    part = train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id, work_dir=tmp_path, stop_after=3)
    assert not part.finished and part.steps == 3
    model, tokenizer = fresh()  # a new process: only the checkpoint carries state over
    resumed = train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id, work_dir=tmp_path)
    assert resumed.finished and [e["loss"] for e in resumed.loss_log] == pytest.approx([e["loss"] for e in whole.loss_log], rel=1e-5)
    for name, param in model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param, expected[name])


def test_a_training_logged_to_a_file_says_where_it_is(tmp_path, capsys, monkeypatch):
    """No bar without a terminal, so a line per checkpoint (and at the end of a session) instead;
    none where OOOSPEC_NO_PROGRESS is set (a chapter under papermill)."""
    from ooospec.progress import NO_PROGRESS_ENV

    cfg = LoraTrainConfig(lr=1e-2, dropout=0.0, step_completion_tokens=1, epochs=3, checkpoint_every=2)
    model, tokenizer = tiny_model_and_tokenizer(seed=3)
    model = attach_lora(model, cfg)
    monkeypatch.delenv(NO_PROGRESS_ENV, raising=False)
    part = train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id, work_dir=tmp_path, desc="tiny",
                      stop_after=3)
    lines = capsys.readouterr().err.splitlines()
    planned = part.planned_steps
    assert [line.split(",")[0] for line in lines] == [f"tiny: step 2 of {planned}", f"tiny: step 3 of {planned}"]
    assert all(line.endswith("left, checkpoint saved") for line in lines)
    monkeypatch.setenv(NO_PROGRESS_ENV, "1")
    train_lora(model, small_examples(tokenizer), cfg, tokenizer.pad_token_id, work_dir=tmp_path, desc="tiny")
    assert capsys.readouterr().err == ""


def test_step_line_reads_the_pace_across_a_resume():
    log = [{"step": i, "loss": 0.5, "elapsed_s": 40.0 * i} for i in range(1, 151)]  # cumulative training seconds
    line = step_line("sidecar lora", log, 342, 25)
    assert line == "sidecar lora: step 150 of 342, loss 0.500 (last 25), 40.0 s a step, about 2.1 h left"
    assert step_line("t", log[:3], 5, 25, saved=True) == "t: step 3 of 5, loss 0.500 (last 3), 40.0 s a step, about 1 min left, checkpoint saved"


def test_frozen_adapter_verifies_its_sha256(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer(seed=4)
    model = attach_lora(model, LoraTrainConfig())
    sha = freeze_adapter(model, tmp_path / "adapter", {"name": "t", "num_layers": 2})
    record = read_frozen(tmp_path / "adapter")
    assert record["sha256"] == sha == directory_sha256(tmp_path / "adapter")
    base, _ = tiny_model_and_tokenizer(seed=4)
    load_frozen_adapter(base, tmp_path / "adapter", merge=True)
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="adapter files changed since freezing"):
        read_frozen(tmp_path / "adapter")
