"""rollout.sampler_dtype = "fast" (podsrl/engines/dtype.py): bfloat16 where the sampler runs it
faster than float32 (a GPU with bfloat16, a CPU with native bfloat16 arithmetic by its flags in
/proc/cpuinfo), else the policy's dtype, with the reason; the vLLM engine is built in it (a stand-in
for vllm.LLM), the run's start-up line and config.toml say it, and the transformers engine, which
samples with the policy itself, accepts it and changes nothing."""

from __future__ import annotations

import types

import pytest
import torch

from podsrl.config import Config, ConfigError, load, to_toml
from podsrl.engines import dtype as sampler_dtypes
from podsrl.engines.dtype import SamplerDtype, cpu_bf16, resolve_sampler_dtype

# Two logical CPUs as Linux lists them (the flags lines trimmed to what matters).
X86_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
X86_AMX_ONLY = "processor\t: 0\nflags\t\t: fpu avx2 amx_bf16 amx_tile\n"
X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
X86_HYBRID = "processor\t: 0\nflags\t\t: fpu avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"  # a core without: not native
ARM_BF16 = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\nCPU implementer\t: 0x41\n"
ARM_NO_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def gpu(monkeypatch, bf16: bool) -> list[dict]:
    """torch believes it sees a GPU with (or without) native bfloat16; returns the calls' kwargs."""
    calls: list[dict] = []

    def is_bf16_supported(**kwargs):
        calls.append(kwargs)
        return bf16 or kwargs.get("including_emulation", True)  # pre-Ampere: emulated only

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    return calls


@pytest.mark.parametrize(
    "machine, cpuinfo, native, evidence",
    [
        ("x86_64", X86_BF16, True, "avx512_bf16 and amx_bf16 in /proc/cpuinfo"),
        ("AMD64", X86_AMX_ONLY, True, "amx_bf16 in /proc/cpuinfo"),
        ("x86_64", X86_NO_BF16, False, "no avx512_bf16 or amx_bf16 in /proc/cpuinfo"),
        ("x86_64", X86_HYBRID, False, "no avx512_bf16 or amx_bf16"),
        ("aarch64", ARM_BF16, True, "bf16 in /proc/cpuinfo"),
        ("arm64", ARM_NO_BF16, False, "no bf16 in /proc/cpuinfo"),
        ("aarch64", X86_BF16, False, "/proc/cpuinfo has no 'features' line"),  # x86 flags do not count on ARM
        ("x86_64", "", False, "/proc/cpuinfo has no 'flags' line"),
        ("ppc64le", X86_BF16, False, "x86-64 and aarch64 Linux only, and this CPU is ppc64le"),
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(no_gpu, machine, cpuinfo, native, evidence):
    found, why = cpu_bf16(cpuinfo, machine)
    assert found is native and evidence in why, why
    choice = resolve_sampler_dtype("fast", torch.float32, cpuinfo=cpuinfo, machine=machine)
    assert choice.dtype == (torch.bfloat16 if native else torch.float32)
    assert evidence in choice.reason
    if native:
        assert choice.reason.startswith("the CPU has native bfloat16 arithmetic")
    else:
        assert choice.reason.startswith("the policy's dtype; ")


def test_unreadable_cpu_flags_keep_the_policy_dtype_and_say_why(no_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(sampler_dtypes, "CPUINFO", str(tmp_path / "cpuinfo"))  # no such file (macOS, a sandbox)
    choice = resolve_sampler_dtype("fast", torch.float32, machine="x86_64")
    assert choice.dtype == torch.float32
    assert "unknown" in choice.reason and "cannot be read (FileNotFoundError)" in choice.reason, choice.reason
    (tmp_path / "cpuinfo").write_text(X86_BF16)  # the file is read when no text is given
    assert resolve_sampler_dtype("fast", torch.float32, machine="x86_64").dtype == torch.bfloat16


def test_on_a_gpu_fast_is_bfloat16_where_the_gpu_has_it_natively(monkeypatch):
    calls = gpu(monkeypatch, bf16=True)
    choice = resolve_sampler_dtype("fast", torch.float32, cpuinfo=X86_NO_BF16, machine="x86_64")  # the CPU's flags do not matter
    assert choice == SamplerDtype("fast", torch.bfloat16, "the GPU has native bfloat16 (torch.cuda.is_bf16_supported())")
    assert calls == [{"including_emulation": False}]  # torch >= 2.3 counts emulation unless told not to
    gpu(monkeypatch, bf16=False)  # a GPU before Ampere: emulated bfloat16 is no faster
    choice = resolve_sampler_dtype("fast", torch.float32, cpuinfo=X86_BF16, machine="x86_64")
    assert choice.dtype == torch.float32 and "is_bf16_supported() is false" in choice.reason


def test_fast_keeps_a_16_bit_policy_dtype_where_bfloat16_gains_nothing(no_gpu):
    assert resolve_sampler_dtype("fast", torch.float16, cpuinfo=X86_BF16, machine="x86_64").dtype == torch.float16
    assert resolve_sampler_dtype("fast", torch.bfloat16, cpuinfo=X86_BF16, machine="x86_64").dtype == torch.bfloat16
    assert resolve_sampler_dtype("fast", torch.bfloat16, cpuinfo=X86_NO_BF16, machine="x86_64").dtype == torch.bfloat16  # the policy's


def test_the_other_settings_resolve_as_before(monkeypatch):
    gpu(monkeypatch, bf16=True)  # whatever the machine
    assert resolve_sampler_dtype("auto", torch.float32) == SamplerDtype("auto", torch.float32, "the policy's dtype")
    for name in ("float32", "bfloat16", "float16"):
        assert resolve_sampler_dtype(name, torch.float32) == SamplerDtype(name, getattr(torch, name), "as set")
    describe = resolve_sampler_dtype("fast", torch.float32).describe()
    assert describe == "bfloat16 (rollout.sampler_dtype = 'fast': the GPU has native bfloat16 (torch.cuda.is_bf16_supported()))"


def test_the_config_takes_fast_and_names_it_among_the_values():
    # "fast" is the default (issue 46: the corrected bfloat16 sampler learned at least as well per
    # training minute, docs/results.md); the float32 sampler is one setting away.
    assert load().rollout.sampler_dtype == "fast"
    assert load(overrides=["--rollout.sampler_dtype=auto"]).rollout.sampler_dtype == "auto"
    assert load().rollout.importance_sampling_correction  # the bfloat16 sampler's gap is corrected by default
    with pytest.raises(ConfigError, match=r"rollout\.sampler_dtype: unknown value 'fp8'; valid values: auto, bfloat16, fast, float16, float32"):
        load(overrides=["--rollout.sampler_dtype=fp8"])


def test_vllm_is_built_in_the_resolved_dtype_and_keeps_the_reason(no_gpu, monkeypatch, tmp_path):
    """from_config: "fast" on a CPU with native bfloat16 builds vLLM in bfloat16 (a stand-in for the
    engine's construction), without it in the policy's dtype; the engine keeps the answer."""
    from podsrl.engines import make_engine
    from podsrl.engines.vllm import VLLMEngine

    monkeypatch.setattr(sampler_dtypes.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(sampler_dtypes, "CPUINFO", str(tmp_path / "cpuinfo"))
    built = []
    monkeypatch.setattr(VLLMEngine, "__init__", lambda self, path, tokenizer, options, **kw: built.append(options.dtype))
    policy = types.SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=None, path="/m")
    for cpuinfo, dtype in ((X86_BF16, torch.bfloat16), (X86_NO_BF16, torch.float32)):
        (tmp_path / "cpuinfo").write_text(cpuinfo)
        engine = make_engine(load(overrides=["--rollout.engine=vllm", "--rollout.sampler_dtype=fast"]).rollout, policy)
        assert built[-1] == dtype and engine.sampler_dtype.dtype == dtype and engine.sampler_dtype.setting == "fast"
    engine = VLLMEngine.from_config(load(overrides=["--rollout.sampler_dtype=auto"]).rollout, policy)
    assert built[-1] == torch.float32 and engine.sampler_dtype == SamplerDtype("auto", torch.float32, "the policy's dtype")


def test_the_transformers_engine_takes_fast_and_changes_nothing(monkeypatch):
    """It samples with the policy itself: "fast" (the default) is accepted like
    "auto"; a dtype named outright is still refused, since the run would not sample in it."""
    from podsrl.engines import make_engine
    from podsrl.engines.hf import TransformersEngine

    policy = types.SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=None, path="/m")
    engine = make_engine(load(overrides=["--rollout.engine=transformers", "--rollout.sampler_dtype=fast"]).rollout, policy)
    assert isinstance(engine, TransformersEngine) and engine.model is policy.model
    assert getattr(engine, "sampler_dtype", None) is None  # nothing to report: the start-up line says nothing
    with pytest.raises(ConfigError, match=r"rollout\.sampler_dtype = 'bfloat16'.*or 'fast', which changes nothing"):
        make_engine(load(overrides=["--rollout.engine=transformers", "--rollout.sampler_dtype=bfloat16"]).rollout, policy)


def _setup(engine, cfg: Config | None = None):
    from podsrl.train.distributed import Dist
    from podsrl.train.precision import MixedPrecision

    return types.SimpleNamespace(cfg=cfg or load(overrides=["--rollout.engine=vllm", "--rollout.sampler_dtype=fast"]), dist=Dist(), engine=engine,
                                 precision=MixedPrecision("none", False, "as set"))  # fmt: skip


def test_the_start_up_line_and_config_toml_say_what_fast_resolved_to(tmp_path):
    from podsrl.run import rundir
    from podsrl.train.loop import _config_notes, _device_line

    choice = SamplerDtype("fast", torch.bfloat16, "the CPU has native bfloat16 arithmetic, avx512_bf16 and amx_bf16 in /proc/cpuinfo")
    s = _setup(types.SimpleNamespace(sampler_dtype=choice))
    line = _device_line(s, torch.nn.Linear(2, 2))
    assert line.endswith(
        "rollout engine vllm, sampler bfloat16 (rollout.sampler_dtype = 'fast': the CPU has native bfloat16 "
        f"arithmetic, avx512_bf16 and amx_bf16 in /proc/cpuinfo), importance correction {s.cfg.rollout.importance_sampling_mode} "
        "(clip_max 3; rollout.importance_sampling_mode)"
    ), line
    off = load(overrides=["--rollout.engine=vllm", "--rollout.importance_sampling_correction=false"])
    assert _device_line(_setup(s.engine, off), torch.nn.Linear(2, 2)).endswith(
        "no importance correction (rollout.importance_sampling_correction = false)"
    )
    bounded = load(overrides=["--rollout.engine=vllm", "--rollout.importance_sampling_mode=token_mask", "--rollout.importance_sampling_clip_min=0.5"])
    assert "importance correction token_mask (clip_max 3, clip_min 0.5; " in _device_line(_setup(s.engine, bounded), torch.nn.Linear(2, 2))
    notes = _config_notes(s)
    assert notes == {"rollout.sampler_dtype": "bfloat16 where the run last started: " + choice.reason}
    claim = rundir.prepare(tmp_path / "run", s.cfg)
    claim.open()
    try:
        claim.write_config(s.cfg, notes=notes)
    finally:
        claim.close()
    text = (tmp_path / "run" / "config.toml").read_text()
    assert 'sampler_dtype = "fast"  # bfloat16 where the run last started: the CPU has native bfloat16' in text, text
    assert load(tmp_path / "run" / "config.toml") == s.cfg  # the comment reads back as nothing; "fast" stays "fast"
    # A dtype named outright needs no note; an engine without a sampler of its own (transformers) has none.
    assert _config_notes(_setup(types.SimpleNamespace(sampler_dtype=SamplerDtype("float32", torch.float32, "as set")))) == {}
    assert _config_notes(_setup(types.SimpleNamespace())) == {}
    assert "sampler" not in _device_line(_setup(types.SimpleNamespace()), torch.nn.Linear(2, 2))


def test_to_toml_writes_each_note_on_its_setting_line_only():
    cfg = Config()
    text = to_toml(cfg, {"rollout.sampler_dtype": "two\nlines"})
    assert 'sampler_dtype = "fast"  # two lines\n' in text  # one line: a newline would end the comment
    assert to_toml(cfg, {}) == to_toml(cfg) and "#" not in "".join(line for line in to_toml(cfg).splitlines() if "sampler_dtype" in line)
