"""Log-normalisers and entropies of logits, chunked: the one pass the update's log-probs and D3S's
token scores share.

- :func:`log_normaliser` returns logsumexp(logits / T) and optionally the entropy of softmax(logits /
  T), ``chunk_size`` rows at a time in float32, so a bf16 [N, T, V] logits tensor never gets a full
  float32 copy.
- :func:`entropy_from_logits` runs under ``torch.no_grad`` (the D3S score is a selection weight, not a
  training signal) and returns float32 whatever the logits' dtype. Logits that cannot be viewed as
  [positions, V] (e.g. ``logits[:, :-1]``) are processed one leading index at a time rather than
  copied.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_from_logits", "log_normaliser"]


@torch.no_grad()
def log_normaliser(
    logits: Tensor, *, temperature: float = 1.0, with_entropy: bool = False, chunk_size: int = 256
) -> tuple[Tensor, Tensor | None]:
    """logsumexp(logits / temperature) [R] and, optionally, the entropy [R] of softmax(logits /
    temperature), both float32 and detached; logits [R, V] of any float dtype, ``chunk_size`` rows
    at a time (two float32 [chunk, V] buffers, reused from chunk to chunk)."""
    R, V = logits.shape
    lse = torch.empty(R, dtype=torch.float32, device=logits.device)
    entropy = torch.empty(R, dtype=torch.float32, device=logits.device) if with_entropy else None
    # Two [chunk, V] float32 buffers for all chunks: a fresh one per chunk (over 32 MiB at 256 x a
    # 49k vocabulary) is a fresh mmap on glibc, whose page zeroing cost more than the arithmetic.
    d_buf = torch.empty((min(chunk_size, R), V), dtype=torch.float32, device=logits.device)
    e_buf = torch.empty_like(d_buf)
    for s in range(0, R, chunk_size):
        x = logits[s : s + chunk_size]
        d, e = d_buf[: x.shape[0]], e_buf[: x.shape[0]]
        d.copy_(x)  # float32, owned: modified in place
        if temperature != 1.0:
            d.div_(temperature)
        m = d.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an all -inf row: no NaN from -inf - -inf
        d.sub_(m)  # x - max <= 0
        torch.exp(d, out=e)
        z = e.sum(dim=-1, keepdim=True)  # [c, 1]
        lse[s : s + chunk_size] = (m + z.log()).squeeze(-1)
        if entropy is not None:
            # H = -sum p log p with p = e / z, log p = d - log z:  H = log z - sum(e * d) / z.
            d.clamp_(min=torch.finfo(torch.float32).min)  # -inf where e == 0: 0 * finite = 0
            dot = torch.bmm(e.unsqueeze(1), d.unsqueeze(2)).view(-1, 1)  # [c, 1]
            entropy[s : s + chunk_size] = (z.log() - dot / z).clamp(min=0).squeeze(-1)
    return lse, entropy


@torch.no_grad()
def entropy_from_logits(logits: Tensor, *, chunk_size: int = 1024) -> Tensor:
    """Entropy of softmax(logits) over the last dim. logits [..., V] -> [...] float32, detached."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError(f"logits must be a floating tensor [..., V], got {getattr(logits, 'dtype', type(logits))}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    vocab = logits.shape[-1]
    try:
        flat = logits.view(-1, vocab)  # [P, V]
    except RuntimeError:
        # Not viewable as [P, V] (e.g. logits[:, :-1]): recurse over the first dim rather than
        # let reshape copy the whole tensor.
        return torch.stack([entropy_from_logits(part, chunk_size=chunk_size) for part in logits.unbind(0)])
    _, entropy = log_normaliser(flat, with_entropy=True, chunk_size=chunk_size)  # [P]
    return entropy.reshape(logits.shape[:-1])
