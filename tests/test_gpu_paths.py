"""The logic of branches that only a GPU takes, tested on the CPU (docs/distributed.md, "GPU-only
branches": the inventory, with what only a GPU can show and the check that shows it).

- Each rank takes cuda:LOCAL_RANK; a launch with more processes than GPUs names LOCAL_RANK.
- On GPUs ``distributed.init`` binds NCCL to that GPU (``device_id``, ``set_device``) and Dist's
  collectives run there; with gloo asked for on GPUs they run on the CPU.
- A checkpoint written on a GPU (its optimizer state and RNG states saved as CUDA tensors) reads
  on a machine without one: ``podsrl export``, ``podsrl eval --run`` and ``--resume`` there.
- The vLLM engine's GPU options reach ``vllm.LLM``, and sleep mode releases and restores the
  engine's memory around the update in the right order (a stand-in for ``vllm.LLM``).
"""

from __future__ import annotations

import types

import pytest
import torch

from podsrl.errors import ConfigError
from podsrl.train import distributed


@pytest.fixture
def two_gpus(monkeypatch):
    """torch believes it sees two GPUs (nothing here allocates on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_each_rank_takes_the_gpu_of_its_local_rank(two_gpus):
    assert distributed.rank_device("auto", 1, 4) == torch.device("cuda", 1)
    assert distributed.rank_device("cuda", 0, 4) == torch.device("cuda", 0)
    assert distributed.rank_device("cpu", 1, 4) == torch.device("cpu")
    assert distributed.rank_device("cuda:1", 0, 1) == torch.device("cuda", 1)  # one process may pin a GPU
    with pytest.raises(ConfigError, match=r"model.device: LOCAL_RANK 2 but this machine has 2 GPU\(s\); launch at most 2 processes per node"):
        distributed.rank_device("auto", 2, 4)


@pytest.mark.parametrize("backend", ["auto", "nccl", "gloo"])
def test_init_on_gpus_binds_the_group_to_the_rank_gpu(two_gpus, make_config, monkeypatch, backend):
    calls = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("set_device", device))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kwargs: calls.setdefault("init", kwargs))
    d = distributed.init(make_config(**{"train.prompts_per_step": 2, "distributed.backend": backend}))
    gpu = torch.device("cuda", 1)
    expected = "gloo" if backend == "gloo" else "nccl"
    assert (d.rank, d.world, d.local_rank, d.backend) == (1, 2, 1, expected)
    assert calls["set_device"] == gpu  # before the group: torch's object collectives use the current device
    assert calls["init"]["backend"] == expected and calls["init"]["device_id"] == gpu  # barrier's device, eager NCCL init
    assert d.device == (gpu if expected == "nccl" else torch.device("cpu"))  # where Dist's tensor collectives run


def test_a_checkpoint_written_on_a_gpu_reads_on_a_cpu(tmp_path, monkeypatch):
    """On a GPU the optimizer state (AdamW's moments) and the CUDA RNG states are saved as CUDA
    tensors; torch.load without a map_location then fails on a machine without a GPU, which is
    where a run trained on a cluster is often exported or evaluated. Simulated by tagging every
    storage of state.pt "cuda:0" as it is written, as torch.save does for CUDA tensors."""
    import torch.serialization

    from podsrl.run import checkpoint as ckpt

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        path = ckpt.save(tmp_path, model, optimizer, scheduler, ckpt.TrainState(step=1), policy=ckpt.SavePolicy(log=lambda *_: None))
    with pytest.raises(RuntimeError, match="CUDA device"):  # the file holds what a GPU writes
        torch.load(path / "state.pt", weights_only=False)
    assert ckpt.read_train_state(path).step == 1  # podsrl export, podsrl eval --run
    fresh = torch.nn.Linear(4, 2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    state = ckpt.load(path, fresh, fresh_optimizer, torch.optim.lr_scheduler.LambdaLR(fresh_optimizer, lambda i: 1.0))  # --resume
    assert state.step == 1 and torch.equal(fresh.weight, model.weight)
    moments = [s["exp_avg"] for s in fresh_optimizer.state.values()]
    assert moments and all(t.device.type == "cpu" for t in moments)


def _engine(**attributes):
    from podsrl.engines.vllm import VLLMEngine

    engine = object.__new__(VLLMEngine)  # no vLLM: the engine's own logic around it
    engine.__dict__.update({"max_model_len": 1024, **attributes})  # the length the engine settled on (capped at the model's context)
    return engine


def test_vllm_gpu_options_reach_the_engine(monkeypatch):
    from podsrl.engines.vllm import CPU_KV_CACHE_GIB, VLLMOptions

    options = VLLMOptions(dtype=torch.bfloat16, gpu_memory_utilization=0.45, enable_sleep_mode=True, enforce_eager=False, seed=3)
    on_gpu = _engine(on_cpu=False, sleep_mode=True, external=False)._llm_arguments("/m", options)
    assert on_gpu["gpu_memory_utilization"] == 0.45 and on_gpu["enable_sleep_mode"] is True and on_gpu["dtype"] == torch.bfloat16
    assert on_gpu["enforce_eager"] is False and on_gpu["seed"] == 3
    assert "block_size" not in on_gpu and "kv_cache_memory_bytes" not in on_gpu  # vLLM sizes them on a GPU
    sized = _engine(on_cpu=False, sleep_mode=False, external=False)._llm_arguments("/m", VLLMOptions(kv_cache_gib=1.5))
    assert sized["kv_cache_memory_bytes"] == int(1.5 * 2**30)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    on_cpu = _engine(on_cpu=True, sleep_mode=False, external=False)._llm_arguments("/m", VLLMOptions())
    assert on_cpu["block_size"] == 32 and on_cpu["kv_cache_memory_bytes"] == int(CPU_KV_CACHE_GIB * 2**30)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    per_rank = _engine(on_cpu=False, sleep_mode=False, external=True)._llm_arguments("/m", VLLMOptions(seed=10))
    assert per_rank["distributed_executor_backend"] == "external_launcher" and per_rank["tensor_parallel_size"] == 1
    assert per_rank["seed"] == 13  # seed + rank


def test_vllm_sleep_mode_frees_the_engine_around_the_update(monkeypatch):
    """Sleep mode (GPU only): after generating the engine sleeps (weights to host memory, KV cache
    freed); the weight sync wakes the weights alone and loads into them; the next generation wakes
    the rest and drops the prefix cache computed with the old weights."""
    from podsrl.engines import Sampling

    monkeypatch.setitem(__import__("sys").modules, "vllm.inputs", types.SimpleNamespace(TokensPrompt=dict))
    calls = []

    class LLM:
        def generate(self, requests, params, use_tqdm=False):
            calls.append("generate")
            token = types.SimpleNamespace(logprob=-0.5)
            sample = types.SimpleNamespace(index=0, token_ids=[5, 2], logprobs=[{5: token}, {2: token}], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[sample]) for _ in requests]

        def sleep(self, level):
            calls.append(f"sleep({level})")

        def wake_up(self, tags=None):
            calls.append(f"wake_up({tags})")

        def reset_prefix_cache(self):
            calls.append("reset_prefix_cache")

    tokenizer = types.SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: ["x" for _ in ids])
    engine = _engine(llm=LLM(), version="0", max_model_len=64, sleep_mode=True, _asleep=False, eos_ids={2}, tokenizer=tokenizer,
                     _SamplingParams=lambda **kw: kw, _reload=lambda weights_iterator: calls.append("reload"))  # fmt: skip
    sampling = Sampling(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=None)
    engine.generate([[1, 2]], sampling)
    engine.sync_weights(torch.nn.Linear(2, 2))
    engine.generate([[1, 2]], sampling)
    assert calls == ["generate", "sleep(1)", "wake_up(['weights'])", "reload", "reset_prefix_cache",
                     "wake_up(None)", "reset_prefix_cache", "generate", "sleep(1)"]  # fmt: skip
