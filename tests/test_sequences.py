"""forward_logprobs against the plain computation: full forward, log_softmax, gather.

The shared-prompt forward and the fused log-softmax must change the cost, never the numbers: the
log-probs, the entropies and the gradients of a loss on them match the plain reference.
"""

from __future__ import annotations

import pytest
import torch

from float_bounds import entropy_atol, gradient_rtol, logprob_atol, rel_diff, within
from podsrl.train.sequences import can_share_prompts, forward_logprobs, pack, token_logprobs


def reference_logprobs(model, packed, temperature, *, magnitude: bool = False):
    """Full forward over [prompt; completion], log_softmax over the vocabulary, gather. ``magnitude``:
    also the largest |z / T| or |logsumexp(z / T)| over the completion tokens (what bounds the
    rounding of an entropy, float_bounds.entropy_atol)."""
    position_ids = (packed.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=position_ids).logits
    P, T = packed.prompt_width, packed.completion_ids.shape[1]
    logits = logits[:, P - 1 : P + T - 1].float() / temperature  # [N, T, V]
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, packed.completion_ids.unsqueeze(-1)).squeeze(-1)
    entropy = torch.distributions.Categorical(logits=logits.detach()).entropy()
    out = picked * packed.completion_mask, entropy * packed.completion_mask
    if not magnitude:
        return out
    mask = packed.completion_mask.bool()
    scaled = logits.detach()[mask]  # [tokens, V]
    largest = torch.maximum(scaled.abs().amax(dim=-1), torch.logsumexp(scaled, dim=-1).abs())  # [tokens]
    return (*out, float(largest.max()))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model.train()


def _batch(vocab: int, seed: int = 0):
    """Groups with a repeated prompt, prompts of different lengths, completions of different lengths."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda k: torch.randint(10, vocab, (k,), generator=g).tolist()  # noqa: E731
    prompts = [rand(7), rand(4), rand(9)]
    rows = [(0, 5), (0, 1), (0, 8), (1, 3), (1, 8), (2, 2), (0, 0), (2, 6)]  # (prompt, completion length)
    return [prompts[p] for p, _ in rows], [rand(k) for _, k in rows]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("share", [True, False])
def test_matches_plain_forward(tiny_model, one_thread, share, temperature):
    prompts, completions = _batch(tiny_model.config.vocab_size)
    packed = pack(prompts, completions, pad_id=0)
    assert len(packed.prompt_rows) == 3 and packed.prompt_index.tolist() == [0, 0, 0, 1, 1, 2, 0, 2]
    weights = torch.randn(packed.completion_ids.shape, generator=torch.Generator().manual_seed(1))

    tiny_model.zero_grad()
    want, want_entropy, entropy_magnitude = reference_logprobs(tiny_model, packed, temperature, magnitude=True)
    (want * weights).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}

    tiny_model.zero_grad()
    got, got_entropy = forward_logprobs(tiny_model, packed, temperature=temperature, with_entropy=True, share_prompts=share)
    (got * weights).sum().backward()

    # Two float32 computations of each log-prob, of each entropy (log-sum-exp minus a mean of the scaled
    # logits under p: two V-term reductions of values up to entropy_magnitude) and of each gradient
    # (float_bounds.py).
    vocab = tiny_model.config.vocab_size
    torch.testing.assert_close(got, want, rtol=0, atol=logprob_atol(vocab, float(want.detach().abs().max())))
    torch.testing.assert_close(got_entropy, want_entropy, rtol=0, atol=entropy_atol(vocab, entropy_magnitude))
    for name, param in tiny_model.named_parameters():
        # Summation order differs (one prompt pass, scattered gradients): compare relative norms.
        err = rel_diff(param.grad, want_grads[name])
        assert within(err, gradient_rtol(vocab), f"{name} share={share} T={temperature}"), f"{name}: relative gradient error {err:.2e}"


def test_completions_of_one_token(tiny_model, one_thread):
    """T = 1: no completion pass, the prompt pass's last logits give everything."""
    prompts, _ = _batch(tiny_model.config.vocab_size)
    completions = [[11], [12], [13], [14], [15], [16], [17], [18]]
    packed = pack(prompts, completions, pad_id=0)
    got, _ = forward_logprobs(tiny_model, packed, share_prompts=True)
    want, _ = reference_logprobs(tiny_model, packed, 1.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sharing_is_off_where_it_would_not_be_exact(tiny_model):
    assert can_share_prompts(tiny_model)
    tiny_model.gradient_checkpointing_enable()
    try:
        assert not can_share_prompts(tiny_model)
    finally:
        tiny_model.gradient_checkpointing_disable()
    assert not can_share_prompts(torch.nn.Linear(2, 2))


def test_pack_rejects_empty_prompts():
    with pytest.raises(ValueError, match="non-empty prompt"):
        pack([[1, 2], []], [[3], [4]], pad_id=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_against_log_softmax(chunk_size, dtype):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(10, 37, generator=g) * 4).to(dtype).requires_grad_()
    rows = torch.tensor([0, 0, 1, 2, 2, 2, 5, 9, 9])  # shared rows, some never used
    targets = torch.randint(0, 37, (9,), generator=g)
    upstream = torch.randn(9, generator=g)

    got, entropy = token_logprobs(logits, targets, rows=rows, temperature=0.8, with_entropy=True, chunk_size=chunk_size)
    (got * upstream).sum().backward()
    got_grad, logits.grad = logits.grad, None

    scaled = logits.float() / 0.8
    want = torch.log_softmax(scaled, dim=-1)[rows, targets]
    (want * upstream).sum().backward()
    assert got.dtype == torch.float32 and got_grad.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, torch.distributions.Categorical(logits=scaled.detach()).entropy()[rows], rtol=1e-5, atol=1e-5)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got_grad.float(), logits.grad.float(), **tol)


def test_token_logprobs_masked_vocabulary():
    logits = torch.tensor([[0.0, -torch.inf, 0.0, -torch.inf], [100.0, 0.0, 0.0, 0.0]], requires_grad=True)
    lp, entropy = token_logprobs(logits, torch.tensor([0, 0]), with_entropy=True)
    torch.testing.assert_close(lp.detach(), torch.tensor([-0.6931472, 0.0]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, torch.tensor([0.6931472, 0.0]), rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("make", ["product", "product, viewed", "exp of a product", "leaf", "transposed product"])
def test_the_gradient_overwrites_the_logits_only_where_nothing_reads_them_after(make, dtype):
    """Logits an output layer's product makes (through views) take their own gradient in place; logits
    whose producer keeps them for its backward (exp), a caller's own tensor and a non-contiguous view
    get a fresh one. The gradients match log_softmax's either way (the overwritten ones included)."""
    from podsrl.train import sequences

    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(12, 8, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(37, 8, generator=g).to(dtype).requires_grad_()
    rows = torch.tensor([0, 0, 1, 2, 4, 4, 7, 11])
    targets = torch.randint(0, 37, (8,), generator=g)
    upstream = torch.randn(8, generator=g)

    def logits_of(h, w):
        if make == "product":
            return h @ w.T  # [12, 37]
        if make == "product, viewed":
            return (h @ w.T).view(3, 4, 37).reshape(12, 37)
        if make == "exp of a product":
            return (h @ w.T / 4).exp()  # exp's backward reads its output
        if make == "transposed product":
            return (w @ h.T).T
        return h.detach().float().matmul(w.detach().float().T).to(dtype).requires_grad_()  # a leaf

    logits = logits_of(hidden, weight)
    assert sequences._gradient_in_place(logits) == (make in ("product", "product, viewed"))
    before = logits.detach().clone()
    got, _ = token_logprobs(logits, targets, rows=rows, temperature=0.8, chunk_size=5, overwrite_logits=True)
    (got * upstream).sum().backward()
    got_grads = [t.grad for t in ((logits,) if make == "leaf" else (hidden, weight))]
    if make not in ("product", "product, viewed"):
        assert torch.equal(logits.detach(), before)  # left as it was

    h2, w2 = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = before.clone().requires_grad_() if make == "leaf" else logits_of(h2, w2)
    want = torch.log_softmax(ref.float() / 0.8, dim=-1)[rows, targets]
    (want * upstream).sum().backward()
    want_grads = [ref.grad] if make == "leaf" else [h2.grad, w2.grad]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a.float(), b.float(), **tol)


@pytest.mark.parametrize("share", [True, False])
def test_a_models_logits_take_their_gradient_in_place(tiny_model, one_thread, share, monkeypatch):
    """The output layer's logits of a transformers model (shared prompt or not) are overwritten by their
    gradient: the update's [rows x tokens x V] gradient tensor is not allocated."""
    from podsrl.train import sequences

    seen = []
    real = sequences._gradient_in_place
    monkeypatch.setattr(sequences, "_gradient_in_place", lambda logits: seen.append(real(logits)) or seen[-1])
    prompts, completions = _batch(tiny_model.config.vocab_size)
    got, _ = forward_logprobs(tiny_model, pack(prompts, completions, pad_id=0), share_prompts=share, overwrite_logits=True)
    got.sum().backward()
    assert seen and all(seen), seen


def test_logits_are_overwritten_only_when_asked_so_a_graph_can_be_kept(tiny_model, one_thread):
    """By default the backward leaves the logits alone: a caller may backpropagate twice through one
    forward (retain_graph), as a per-token gradient norm does."""
    prompts, completions = _batch(tiny_model.config.vocab_size)
    got, _ = forward_logprobs(tiny_model, pack(prompts, completions, pad_id=0))
    first = torch.autograd.grad(got[0, 0], list(tiny_model.parameters()), retain_graph=True, allow_unused=True)
    again = torch.autograd.grad(got[0, 0], list(tiny_model.parameters()), allow_unused=True)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("share", [True, False])
def test_the_forward_reads_shared_key_value_heads_in_place_on_a_cpu(tiny_model, one_thread, share, monkeypatch):
    """The tiny model's 4 query heads share 2 key/value heads. On a CPU the forward's attention reads
    them in place: transformers' ``repeat_kv`` (whose copies attention would save for the backward) is
    not called, in the forward nor the backward, and the model's attention is ``sdpa`` again afterwards
    (the values and gradients: test_matches_plain_forward, against the plain forward, which copies).
    Under gradient checkpointing it copies as before, and the backward's recomputation matches."""
    import transformers.integrations.sdpa_attention as sdpa

    real, calls = sdpa.repeat_kv, []
    monkeypatch.setattr(sdpa, "repeat_kv", lambda h, n: calls.append(n) or real(h, n))
    packed = pack(*_batch(tiny_model.config.vocab_size), pad_id=0)
    tiny_model.zero_grad()
    got, _ = forward_logprobs(tiny_model, packed, share_prompts=share, overwrite_logits=True)
    got.sum().backward()
    assert calls == [] and tiny_model.config._attn_implementation == "sdpa"
    reference_logprobs(tiny_model, packed, 1.0)
    assert calls, "the plain forward copies the heads: the check above can fail"

    calls.clear()
    tiny_model.zero_grad()
    tiny_model.gradient_checkpointing_enable()
    try:
        checkpointed, _ = forward_logprobs(tiny_model, packed, share_prompts=share)
        checkpointed.sum().backward()  # recomputes each layer: the same attention as its forward, or it raises
    finally:
        tiny_model.gradient_checkpointing_disable()
    assert calls and tiny_model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(checkpointed, got, rtol=0, atol=logprob_atol(tiny_model.config.vocab_size, float(got.detach().abs().max())))
