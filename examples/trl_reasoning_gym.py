"""PODS in TRL on reasoning-gym's procedural tasks, graded by each dataset's own checker.

    pip install 'podsrl[trl,reasoning-gym]'
    python examples/trl_reasoning_gym.py --dataset leg_counting --config '{"max_animals": 3}'
    python examples/trl_reasoning_gym.py --datasets '[{"name": "chain_sum", "weight": 2}, {"name": "word_sorting"}]'
    python examples/trl_reasoning_gym.py --model smollm2-135m-instruct --cpu --answer-format plain \
        --n 4 --m 2 --per-device 8 --grad-accum 1 --max-tokens 16 --max-steps 1   # a CPU smoke run

The problems come from podsrl's ``reasoning_gym`` task (the same options as ``podsrl train
--task.name=reasoning_gym``: one dataset and its config, or a weighted mix; held-out problems
disjoint from the training ones), so ``podsrl train`` and this script train on the same problems
and score them alike. The TRL dataset has the columns ``prompt`` (the question and the task's
instruction, as a chat), ``answer`` and ``id``; the reward is podsrl's ``correctness`` through
``as_trl_reward(..., examples=task.train)``, which looks each row's Example up by its ``id``: the
Example carries its grader (the dataset's ``score_answer``, partial credit included unless
``--no-partial-credit``) and the reasoning-gym entry that grader needs, which a dataset column
could not hold faithfully (the entries' metadata differ per dataset, and some hold tuples).

``build(...)`` is what the script trains with; ``tests/test_reasoning_gym.py`` calls it and runs
the reward on a few rows.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from podsrl.integrations.rewards import as_trl_reward
from podsrl.tasks import Task, format_user_message, load_task


def build(**options: Any) -> tuple[Task, Any, Any]:
    """(the podsrl task, its training problems as a TRL dataset, the TRL reward function) for the
    ``reasoning_gym`` task's ``options`` (e.g. ``dataset="chain_sum", num_train=1000``)."""
    from datasets import Dataset

    task = load_task("reasoning_gym", **options)

    def chat(example) -> list[dict[str, str]]:
        system = [{"role": "system", "content": task.system_prompt}] if task.system_prompt else []
        return [*system, {"role": "user", "content": format_user_message(example, task)}]

    rows = [{"prompt": chat(ex), "answer": ex.answer, "id": ex.id} for ex in task.train]
    reward = as_trl_reward("correctness", examples=task.train + task.eval)  # the Examples carry their grader
    return task, Dataset.from_list(rows), reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    parser.add_argument("--dataset", default=None, help="one reasoning-gym dataset (default: leg_counting)")
    parser.add_argument("--config", default=None, help="its settings as JSON, e.g. '{\"max_animals\": 3}'")
    parser.add_argument("--datasets", default=None, help="a weighted mix as JSON: [{\"name\": ..., \"weight\": ..., \"config\": {...}}]")
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-format", default="tags", choices=["tags", "plain"])
    parser.add_argument("--no-partial-credit", action="store_true", help="reward 1 for full credit, else 0")
    parser.add_argument("--rule", default="max_variance", help="podsrl selection rule (all = GRPO)")
    parser.add_argument("--n", type=int, default=16, help="rollouts sampled per prompt (TRL num_generations)")
    parser.add_argument("--m", type=int, default=4, help="rollouts trained on per prompt")
    parser.add_argument("--per-device", type=int, default=64, help="completions per process per micro-step")
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (use_cpu=True, float32)")
    parser.add_argument("--output-dir", default="runs/trl-reasoning-gym-pods")
    args = parser.parse_args()

    from podsrl.integrations.trl import PODSConfig, PODSTrainer

    options: dict[str, Any] = {"num_train": args.num_train, "num_eval": 1, "seed": args.seed,
                               "answer_format": args.answer_format, "partial_credit": not args.no_partial_credit}  # fmt: skip
    if args.datasets:
        options["datasets"] = json.loads(args.datasets)
    else:
        options["dataset"] = args.dataset or "leg_counting"
        options["config"] = json.loads(args.config) if args.config else None
    _, train_dataset, reward = build(**options)
    config = PODSConfig(
        output_dir=args.output_dir,
        num_generations=args.n,
        pods_m=args.m,
        pods_rule=args.rule,
        per_device_train_batch_size=args.per_device,
        gradient_accumulation_steps=args.grad_accum,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        beta=0.0,
        max_steps=args.max_steps,
        logging_steps=1,
        report_to="none",
        use_cpu=args.cpu,
        bf16=not args.cpu,
    )
    trainer = PODSTrainer(model=args.model, reward_funcs=[reward], args=config, train_dataset=train_dataset)
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
