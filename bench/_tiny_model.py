"""A seeded random Llama with the embedded model's tokenizer (49152 tokens, its chat template), for
the benchmarks' quick modes: the real prompts, chat formatting and decoding, in seconds. Shared by
bench/step_split.py, bench/trl_pods.py and bench/stop_check.py (each script's directory is on
``sys.path`` when it runs)."""

from __future__ import annotations

from pathlib import Path


def tiny_llama(path: Path, *, hidden: int, intermediate: int, heads: int, kv_heads: int, layers: int = 2, seed: int = 0) -> Path:
    """Save a random ``layers``-layer Llama (tied embeddings) and the embedded tokenizer to ``path``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from podsrl.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
