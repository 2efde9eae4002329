"""PODS in TRL: Qwen2.5-1.5B-Instruct on GSM8K, 64 rollouts per prompt sampled with vLLM, 16 trained on.

    pip install 'podsrl[trl]' vllm            # a CUDA machine; TRL 1.16.x
    python examples/trl_gsm8k_qwen.py                           # one GPU, vLLM colocated
    accelerate launch --num_processes 8 examples/trl_gsm8k_qwen.py   # 8 GPUs (DDP), same script
    python examples/trl_gsm8k_qwen.py --rule all --m 16 --n 16   # the GRPO baseline with the same update size

GSM8K comes from the hub (openai/gsm8k) or from a local directory with train.jsonl/test.jsonl
(``--data ../shared/data/gsm8k``), through podsrl's task loader (reference answer = the number
after "####"). Rewards: podsrl's ``correctness`` (exact numeric match of the final answer) plus
0.1 x ``format`` (the answer is clearly marked), both as TRL reward functions (``as_trl_reward``).

What changes against a plain TRL GRPO script is two lines: ``PODSConfig``/``PODSTrainer`` instead
of ``GRPOConfig``/``GRPOTrainer``, and ``pods_m``. Batch arithmetic (TRL counts completions, not
prompts): with ``per_device_train_batch_size=P``, ``gradient_accumulation_steps=G`` and W
processes, one optimizer step samples ``P*G*W`` completions = ``P*G*W/n`` prompts and trains on
``P*G*W*m/n`` of them, in G micro-batches of ``P*m/n`` rows per process. The defaults below: P=64,
G=8, n=64, m=16 -> 8 prompts x 64 = 512 completions sampled per step on one GPU, 128 trained on,
in 8 micro-batches of 16.

Sized for one 80 GB GPU (H100/A100) in bf16 with vLLM taking 30% of the memory; lower
``--per-device`` (and raise ``--grad-accum``) on a smaller GPU.
"""

from __future__ import annotations

import argparse

from datasets import Dataset

from podsrl.integrations.rewards import as_trl_reward
from podsrl.integrations.trl import PODSConfig, PODSTrainer
from podsrl.tasks import format_user_message, load_task


def gsm8k(path: str, split: str, limit: int | None) -> Dataset:
    task = load_task("gsm8k", path=path)
    examples = task.train if split == "train" else task.eval
    rows = [
        {"prompt": [{"role": "user", "content": format_user_message(ex, task)}], "answer": ex.answer, "id": ex.id}
        for ex in examples[:limit]
    ]
    return Dataset.from_list(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    parser.add_argument("--data", default="openai/gsm8k", help="hub id or a directory with train.jsonl/test.jsonl")
    parser.add_argument("--rule", default="max_variance", help="podsrl selection rule (all = GRPO)")
    parser.add_argument("--n", type=int, default=64, help="rollouts sampled per prompt (TRL num_generations)")
    parser.add_argument("--m", type=int, default=16, help="rollouts trained on per prompt")
    parser.add_argument("--per-device", type=int, default=64, help="completions per process per micro-step")
    parser.add_argument("--grad-accum", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/trl-gsm8k-qwen-pods")
    parser.add_argument("--no-vllm", action="store_true", help="sample with transformers generate instead")
    args = parser.parse_args()

    config = PODSConfig(
        output_dir=args.output_dir,
        # PODS: sample n, train on the m of maximal reward variance per prompt.
        num_generations=args.n,
        pods_m=args.m,
        pods_rule=args.rule,
        # TRL's GRPO settings, as for any GRPOTrainer run.
        per_device_train_batch_size=args.per_device,
        gradient_accumulation_steps=args.grad_accum,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=10,
        reward_weights=[1.0, 0.1],  # correctness + 0.1 x format
        beta=0.0,
        loss_type="grpo",
        bf16=True,
        gradient_checkpointing=True,
        use_vllm=not args.no_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        vllm_enable_sleep_mode=True,
        max_steps=args.max_steps,
        logging_steps=1,
        save_steps=100,
        report_to="none",
        log_completions=False,
    )
    trainer = PODSTrainer(
        model=args.model,
        reward_funcs=[as_trl_reward("correctness"), as_trl_reward("format")],
        args=config,
        train_dataset=gsm8k(args.data, "train", None),
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
