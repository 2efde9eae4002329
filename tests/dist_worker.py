"""One optimizer step per case, on fixed rollouts, at any world size: what tests/test_distributed.py
runs alone (``python tests/dist_worker.py SPEC``) and under ``torchrun --nproc-per-node=2``.

SPEC is a JSON file: {"model": dir, "reward": "file.py:fn", "out": dir, "cases": {name: {...}}}, a
case being {"overrides": {"section.key": value}, "uniform_second_half": bool}. For every case rank 0
writes ``out/<name>-w<world>.safetensors`` (the trainable weights after the step, full tensors) and
``out/<name>-w<world>.json`` (the step's metrics).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))

from conftest import exit_without_teardown, tiny_config_dict  # noqa: E402

from podsrl.run import checkpoint as ckpt  # noqa: E402
from podsrl.train import distributed  # noqa: E402
from podsrl.train import loop as trainer
from podsrl.config import from_dict  # noqa: E402
from podsrl.engines import Rollouts, Sampling  # noqa: E402


class FixedEngine:
    """Completions that depend only on (prompt, sample index), never on the rank, the seed or the
    weights: the same rollouts at any world size. With ``uniform_from``, the prompts at global
    position >= uniform_from get n identical completions (zero-variance groups)."""

    def __init__(self, tokenizer, *, offset: int = 0, uniform_from: int | None = None):
        self.tokenizer, self.offset, self.uniform_from = tokenizer, offset, uniform_from

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Rollouts:
        eos = self.tokenizer.eos_token_id
        completions = []
        for b, prompt in enumerate(prompt_ids):
            uniform = self.uniform_from is not None and self.offset + b >= self.uniform_from
            for j in range(sampling.n):
                rng = random.Random(hash((tuple(prompt), 0 if uniform else j)) % (2**31))
                length = rng.randint(1, sampling.max_new_tokens)
                ids = [rng.randint(200, 5000) for _ in range(length)]
                if length < sampling.max_new_tokens:
                    ids[-1] = eos
                completions.append(ids)
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        truncated = [c[-1] != eos for c in completions]
        return Rollouts(prompt_ids=prompt_ids, completion_ids=completions, texts=texts, truncated=truncated)

    def sync_weights(self, model) -> None:
        pass

    def close(self) -> None:
        pass


def main(spec_path: str) -> None:
    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    dist = None
    for name, case in spec["cases"].items():
        cfg = from_dict(tiny_config_dict(Path(spec["model"]), Path(spec["reward"].split(":")[0]), **case["overrides"]))
        dist = distributed.init(cfg)  # the process group is made once and reused
        s = trainer.setup(cfg, dist)
        B, world = cfg.train.prompts_per_step, dist.world
        uniform_from = B // 2 if case.get("uniform_second_half") else None
        s.engine = FixedEngine(s.policy.tokenizer, offset=dist.rank * (B // world), uniform_from=uniform_from)
        model = s.policy.model
        model.train()
        optimizer, scheduler = trainer.make_optimizer(cfg, model)
        metrics = trainer.train_step(s, model, optimizer, scheduler, ckpt.TrainState())
        weights = ckpt.full_weights(model, dist)
        if dist.is_main:
            tag = f"{name}-w{world}"
            save_file({k: v.detach().float().contiguous().cpu().clone() for k, v in weights.items()}, str(out / f"{tag}.safetensors"))
            (out / f"{tag}.json").write_text(json.dumps(metrics))
        dist.barrier()
    if dist is not None:
        dist.close()


if __name__ == "__main__":
    main(sys.argv[1])
    exit_without_teardown()
