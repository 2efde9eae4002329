"""Prompt + completion token lists -> padded tensors, and the policy's per-token log-probs on them.

The one place where the model meets the loss: ``forward_logprobs`` runs the causal LM on
[prompt; completion] and returns, for each completion position, log pi(token) (with the sampling
temperature applied to the logits, as the rollouts were drawn with it) and optionally the entropy of
the next-token distribution (D3S token scores). Only the completion positions' logits are kept and
the log-softmax is taken in chunks, so memory holds one float32 [chunk, vocab] copy at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from podsrl.tokens import entropy_from_logits


@dataclass
class Packed:
    input_ids: Tensor  # [N, P + T] left-padded prompt, then right-padded completion
    attention_mask: Tensor  # [N, P + T]
    completion_mask: Tensor  # [N, T] bool, True on real completion tokens
    completion_ids: Tensor  # [N, T]
    prompt_width: int  # P


def pack(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int) -> Packed:
    """Left-pad prompts to a common width P and right-pad completions to T (each row: one rollout)."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"pack: {len(prompt_ids)} prompts for {len(completion_ids)} completions")
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    N = len(prompt_ids)
    input_ids = torch.full((N, P + T), pad_id, dtype=torch.long)
    attention = torch.zeros((N, P + T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attention[i, P - len(p) : P] = 1
        if c:
            input_ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attention[i, P : P + len(c)] = 1
    completion_mask = attention[:, P:].bool()  # [N, T]
    return Packed(input_ids, attention, completion_mask, input_ids[:, P:], P)


def forward_logprobs(
    model: torch.nn.Module,
    packed: Packed,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs [N, T] of the completion tokens (differentiable) and entropy [N, T] (detached).

    Padding positions hold 0. Position ids follow the attention mask, so left padding does not shift
    the prompt's positions (matching what `generate` and vLLM saw).
    """
    position_ids = (packed.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, P+T]
    P = packed.prompt_width
    # The logits that predict completion token t sit at position P + t - 1.
    hidden_logits = model(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask,
        position_ids=position_ids,
        logits_to_keep=packed.input_ids.shape[1] - P + 1,
    ).logits[:, :-1, :]  # [N, T, V]
    if temperature != 1.0:
        hidden_logits = hidden_logits / temperature
    targets = packed.completion_ids  # [N, T]
    N, T, V = hidden_logits.shape
    flat = hidden_logits.reshape(N * T, V)
    flat_targets = targets.reshape(N * T)
    pieces = []
    for start in range(0, N * T, chunk_size):
        logits = flat[start : start + chunk_size].float()  # [chunk, V]
        picked = logits.gather(-1, flat_targets[start : start + chunk_size, None]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(logits, dim=-1))
    logprobs = torch.cat(pieces).view(N, T) * packed.completion_mask
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(hidden_logits.detach(), chunk_size=chunk_size) * packed.completion_mask
    return logprobs, entropy
