"""The Ray scale-out measured (issue #17): songs per minute of `python -m yue2_core batch --ray auto` on 1, 2 and 4
GPUs of this machine, and a run with one engine actor killed in the middle.

    python bench/scale_ray.py --out $OUT                  # every GPU count in 1, 2, 4 this machine has, then the kill
    python bench/scale_ray.py --out $OUT --gpus 1         # one part (a device call is limited to 10 minutes) …
    python bench/scale_ray.py --out $OUT --gpus 2,4 --merge scale_h200.json   # … and the rest, merged into the JSON
    python bench/scale_ray.py --dry-run-cpu --out /tmp/x  # tiny model, 1 and 2 CPU actors, 4 short requests

What runs: the full-size synthetic int8 checkpoint (random weights of the release's shapes; the numbers say nothing
about audio) is written once on this machine, into --workdir (every actor reads the same file: one copy in the page
cache); 32 different requests (style, lyrics, seed and cot full/melody vary) of exactly 5,371 music tokens (3.6
minutes: min_tokens = max_tokens) go through the batch command, each GPU count in its own local Ray instance
(CUDA_VISIBLE_DEVICES limits it; one engine actor per GPU; --max-batch 8 songs per AR batch on each). From each
run's batch.json and stderr:

    songs_per_minute   complete songs / (last song finished − every engine loaded) × 60 — the steady rate;
                       end_to_end_songs_per_minute counts the whole command (Ray start, loading) too
    system_rtf         that window / the seconds of audio made (lower is faster)
    peak_vram_gib      per GPU: nvidia-smi's memory.used sampled every 0.5 s, and the worker's torch peak reserved
    summary_tail_s     batch.json's last write − the last song finished (the driver's writing after the work)
    efficiency         songs_per_minute[k] / (k × songs_per_minute[1]) (target ≥ 0.9)

The kill run (the largest count; --no-kill skips it): at half the no-kill run's window one actor that still holds
songs is killed with SIGKILL (as the OOM killer or a crash would); checked: every song complete exactly once, every
folder verifies (sha256), no partial folder; reported: the songs rerun, their lost seconds, and the extra wall time
over the no-kill run. Writes $OUT/scale_h200.json ({songs_per_minute: {gpus: value}, efficiency: {gpus: fraction},
…}; the dry run: scale_cpu_dry.json), scale_h200.log and each run's stderr (scale_<k>.stderr.log).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SONG_TOKENS = 5371  # 3.6 minutes at 25 music tokens per second (the song length)
STYLES = ["indie pop, warm female vocals", "hard rock, male vocals, distorted guitars", "lofi hip hop, mellow",
          "bluegrass, banjo and fiddle", "synthwave, retro, driving bass", "jazz trio, brushed drums",
          "k-pop, bright, dance", "ambient, evolving pads"]
LYRICS = ["[Verse]\nCity lights are calling me home\n[Chorus]\nOh, oh, carry me on",
          "[Verse]\nRoads of iron, engines roar\n[Chorus]\nWe ride tonight",
          "[Verse]\nRain on the window, coffee gone cold\n[Chorus]\nSlow days",
          "[Verse]\nDown by the river the willows sway\n[Chorus]\nSing it again",
          "[Verse]\nNeon horizon, midnight drive\n[Chorus]\nAlive, alive",
          "[Verse]\nBlue notes falling like the evening rain\n[Chorus]\nSwing low"]
LOG: list[str] = []


def log(text: str = "") -> None:
    print(text, flush=True)
    LOG.append(text)


def requests(n: int, tokens: int) -> list[dict]:
    """`n` different requests of exactly `tokens` music tokens."""
    return [{"id": f"song-{i:02d}", "style": STYLES[i % len(STYLES)], "lyrics": LYRICS[i % len(LYRICS)] + f" {i}",
             "cot": "full" if i % 2 == 0 else "melody", "seed": 1000 + i,
             "semantic_sampling": {"max_tokens": tokens, "min_tokens": tokens}} for i in range(n)]


class VramSampler:
    """Peak memory.used per GPU index from nvidia-smi every `every` seconds (GiB), while running."""

    def __init__(self, every: float = 0.5):
        self.every, self.peak, self.stop = every, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if shutil.which("nvidia-smi") else None

    def _run(self):
        while not self.stop.is_set():
            try:
                text = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,"
                                       "nounits"], capture_output=True, text=True, timeout=10).stdout
                for line in text.strip().splitlines():
                    index, used = (x.strip() for x in line.split(","))
                    self.peak[index] = max(self.peak.get(index, 0.0), float(used) / 1024)
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self.stop.wait(self.every)

    def __enter__(self):
        if self.thread:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=15)


class Run:
    """One `batch --ray auto` subprocess; its stderr is logged and watched (worker pids, which songs each holds)."""

    WORKER = re.compile(r"^ray: worker (\d+) pid (\d+)")
    LOADED = re.compile(r"^ray: \d+ workers loaded the model")
    ON = re.compile(r"^\[([^\]]+)\] on worker (\d+)")
    DONE = re.compile(r"^\[([^\]]+)\] (complete|failed)")

    def __init__(self, cmd: list[str], env: dict, stderr_path: Path):
        self.pids, self.holds, self.loaded_at, self.lines = {}, {}, None, 0
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT)
        self.file = open(stderr_path, "w")
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.file.write(line)
            with self.lock:
                self.lines += 1
                if m := self.WORKER.match(line):
                    self.pids[int(m[1])] = int(m[2])
                elif self.LOADED.match(line):
                    self.loaded_at = time.time()
                elif m := self.ON.match(line):
                    self.holds.setdefault(int(m[2]), set()).add(m[1])
                elif m := self.DONE.match(line):
                    for held in self.holds.values():
                        held.discard(m[1])
        self.file.close()

    def kill_one_holding(self) -> dict | None:
        """SIGKILL an actor that still holds songs (the highest index); None when none does."""
        with self.lock:
            busy = [(i, sorted(ids)) for i, ids in sorted(self.holds.items()) if ids and i in self.pids]
            if not busy:
                return None
            index, held = busy[-1]
            pid = self.pids[index]
            self.holds[index] = set()
        os.kill(pid, signal.SIGKILL)
        return {"worker": index, "pid": pid, "held": held, "at": time.time()}

    def wait(self, timeout: float) -> tuple[int, float]:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return rc, time.time()


def check_songs(out: Path, ids: list[str]) -> dict:
    """Every song complete exactly once and verified (sha256 of every file), nothing else in the folder."""
    from yue2_core.artifacts import load_song
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    results = summary["results"]
    names = sorted(p.name for p in out.iterdir())
    bad = []
    for i in ids:
        try:
            load_song(out / i)
        except Exception as exc:  # noqa: BLE001 - reported
            bad.append(f"{i}: {exc}")
    return {"complete": summary["complete"], "expected": summary["expected"], "failed": summary["failed"],
            "each_once": sorted(r["id"] for r in results) == sorted(ids) and summary["complete"] == len(ids),
            "verified": not bad, "verify_errors": bad[:5],
            "no_partial": names == sorted(["batch.json", *ids])}


def measure(out: Path, run: Run, t_end: float, vram: VramSampler) -> dict:
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    rows = [r for r in summary["results"] if r["status"] == "complete"]
    ray = summary["settings"].get("ray", {})
    loaded = ray.get("engines_loaded_at") or run.loaded_at or run.t0
    last = max((r["finished_at"] for r in rows), default=loaded)
    window = max(1e-9, last - loaded)
    audio = sum(r["audio_seconds"] or 0 for r in rows)
    peaks = {}
    for r in rows:
        if r.get("peak_vram_bytes") is not None:
            key = ",".join(r["worker"].get("gpu_ids") or []) or f"worker {r['worker']['index']}"
            peaks[key] = max(peaks.get(key, 0.0), r["peak_vram_bytes"] / 2 ** 30)
    return {"songs": len(rows), "window_s": round(window, 2), "wall_s": round(t_end - run.t0, 2),
            "songs_per_minute": round(len(rows) / window * 60, 3),
            "end_to_end_songs_per_minute": round(len(rows) / (t_end - run.t0) * 60, 3),
            "system_rtf": round(window / audio, 5) if audio else None, "audio_seconds": round(audio, 1),
            "load_s": round(loaded - run.t0, 2),
            "summary_tail_s": round((out / "batch.json").stat().st_mtime - last, 3),
            "peak_vram_gib_nvidia_smi": {k: round(v, 2) for k, v in sorted(vram.peak.items())},
            "peak_vram_gib_torch_reserved": {k: round(v, 2) for k, v in sorted(peaks.items())},
            "songs_per_worker": _per_worker(rows), "deaths": ray.get("deaths", [])}


def _per_worker(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        key = str(r["worker"]["index"])
        out[key] = out.get(key, 0) + 1
    return out


def batch_cmd(args, req: Path, out: Path, ckpt: str, workers: int) -> tuple[list[str], dict]:
    cmd = [sys.executable, "-m", "yue2_core", "batch", str(req), "--output", str(out), "--checkpoint", ckpt,
           "--ray", "auto", "--max-batch", str(args.max_batch), "--steps", str(args.steps)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)  # a fresh local instance per run, limited to its GPUs
    if args.dry_run_cpu:
        cmd += ["--device", "cpu", "--ray-cpu-workers", str(workers), "--max-abc-tokens", "8"]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(workers))
    return cmd, env


def one_run(args, req: Path, ckpt: str, workers: int, ids: list[str], kill_after: float | None = None) -> dict:
    tag = f"{workers}{'_kill' if kill_after is not None else ''}"
    out = Path(args.workdir) / f"run_{tag}"
    shutil.rmtree(out, ignore_errors=True)
    cmd, env = batch_cmd(args, req, out, ckpt, workers)
    log(f"-- {workers} {'CPU actors' if args.dry_run_cpu else 'GPUs'}"
        f"{f', one actor killed {kill_after:.1f} s after loading' if kill_after is not None else ''}")
    killed = None
    with VramSampler() as vram:
        run = Run(cmd, env, Path(args.out) / f"scale_{tag}.stderr.log")
        if kill_after is not None:
            while run.proc.poll() is None and (run.loaded_at is None or time.time() < run.loaded_at + kill_after):
                time.sleep(0.05)
            if run.proc.poll() is None:
                killed = run.kill_one_holding()
            log(f"   killed: {killed}" if killed else "   kill skipped: no actor held songs at that time")
        rc, t_end = run.wait(timeout=args.timeout)
    row = {"returncode": rc, **measure(out, run, t_end, vram), "checks": check_songs(out, ids)}
    if killed:
        summary = json.loads((out / "batch.json").read_text("utf-8"))
        rerun = [r for r in summary["results"] if r.get("attempts", 1) > 1]
        row["kill"] = {**killed, "rerun": [r["id"] for r in rerun],
                       "lost_seconds": {r["id"]: r["lost_seconds"] for r in rerun}}
    log(f"   rc {rc} · {row['songs']} songs in {row['window_s']} s after loading ({row['load_s']} s) · "
        f"{row['songs_per_minute']} songs/min · system RTF {row['system_rtf']} · summary tail "
        f"{row['summary_tail_s']} s · per worker {row['songs_per_worker']} · checks {row['checks']}")
    log(f"   peak VRAM GiB: nvidia-smi {row['peak_vram_gib_nvidia_smi']} · torch reserved "
        f"{row['peak_vram_gib_torch_reserved']}")
    return row


def machine() -> dict:
    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": os.environ.get("YUE2_COMMIT") or _git_commit()}
    try:
        import ray
        info["ray"] = ray.__version__
    except ImportError:
        info["ray"] = None
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def checkpoint(args) -> str:
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    os.makedirs(args.workdir, exist_ok=True)
    profile, fmt = ("tiny", "bf16") if args.dry_run_cpu else ("full", "int8")
    path = os.path.join(args.checkpoint_dir or args.workdir, f"yue2_{profile}_{fmt}.safetensors")
    if not os.path.exists(path):
        t = time.time()
        rep = write_synthetic_checkpoint(path, profile, fmt, device="cpu" if args.dry_run_cpu else "cuda:0")
        log(f"wrote {path}: {rep['data_bytes']:,} bytes in {time.time() - t:.1f} s")
    else:
        log(f"using {path}")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/yue2_gpu"), help="logs and JSON (default $OUT)")
    ap.add_argument("--workdir", default="/tmp/yue2scale", help="checkpoint, requests and the batch folders")
    ap.add_argument("--checkpoint-dir", default=None, help="where the synthetic checkpoint is (or is written); "
                    "default --workdir (bench/bench.py's /tmp/yue2bench holds the same int8 file)")
    ap.add_argument("--gpus", default=None, help="GPU counts to run, e.g. 1,2,4 (default: those of 1, 2, 4 that "
                    "this machine has)")
    ap.add_argument("--songs", type=int, default=None, help="requests (default 32; dry run 4)")
    ap.add_argument("--tokens", type=int, default=None, help=f"music tokens per song (default {SONG_TOKENS}; dry "
                    "run 30)")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=None, help="ODE steps (default 32; dry run 4)")
    ap.add_argument("--no-kill", action="store_true", help="skip the run with an actor killed")
    ap.add_argument("--merge", default=None, help="an earlier scale JSON whose GPU counts are kept")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one batch command may take")
    ap.add_argument("--dry-run-cpu", action="store_true", help="tiny model, 1 and 2 CPU actors, 4 short requests")
    args = ap.parse_args(argv)
    dry = args.dry_run_cpu
    args.songs = args.songs or (4 if dry else 32)
    args.tokens = args.tokens or (30 if dry else SONG_TOKENS)
    args.steps = args.steps or (4 if dry else 32)
    os.makedirs(args.out, exist_ok=True)
    name = "scale_cpu_dry" if dry else "scale_h200"
    if dry:
        counts = [int(c) for c in (args.gpus or "1,2").split(",")]
    else:
        import torch
        have = torch.cuda.device_count()
        if have == 0:
            log("no CUDA GPU here: use --dry-run-cpu")
            return 2
        counts = [int(c) for c in args.gpus.split(",")] if args.gpus else [c for c in (1, 2, 4) if c <= have]
        if max(counts) > have:
            log(f"--gpus {args.gpus}: this machine has {have} GPUs")
            return 2
    info = machine()
    log(f"scale_ray: {info}")
    log(f"{args.songs} requests of {args.tokens} music tokens ({args.tokens / 25:.1f} s), --max-batch "
        f"{args.max_batch}, {args.steps} ODE steps; counts {counts}")
    ckpt = checkpoint(args)
    req = Path(args.workdir) / "requests.jsonl"
    rows = requests(args.songs, args.tokens)
    req.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    ids = [r["id"] for r in rows]
    result = {"songs_per_minute": {}, "efficiency": {}, "system_rtf": {}, "peak_vram_gib": {},
              "summary_tail_s": {}, "runs": {}, "machine": info,
              "setup": {"songs": args.songs, "music_tokens": args.tokens, "max_batch": args.max_batch,
                        "steps": args.steps, "checkpoint": ckpt, "dry_run_cpu": dry}}
    if args.merge and os.path.exists(args.merge):
        old = json.loads(Path(args.merge).read_text("utf-8"))
        for key in ("songs_per_minute", "system_rtf", "peak_vram_gib", "summary_tail_s", "runs"):
            result[key].update(old.get(key, {}))
    ok = True
    for k in counts:
        row = one_run(args, req, ckpt, k, ids)
        result["runs"][str(k)] = row
        checks = row["checks"]
        ok &= row["returncode"] == 0 and checks["each_once"] and checks["verified"] and checks["no_partial"]
    if not args.no_kill:
        k = max(counts)
        half = result["runs"][str(k)]["window_s"] / 2
        row = one_run(args, req, ckpt, k, ids, kill_after=half)
        base = result["runs"][str(k)]
        row["extra_seconds_over_no_kill"] = round(row["window_s"] - base["window_s"], 2)
        result["runs"][f"{k}_kill"] = row
        result["kill"] = {"workers": k, **row.get("kill", {"skipped": True}), "checks": row["checks"],
                          "extra_seconds_over_no_kill": row["extra_seconds_over_no_kill"]}
        log(f"   kill: every song once {row['checks']['each_once']}, verified {row['checks']['verified']}, no "
            f"partial {row['checks']['no_partial']}; extra {row['extra_seconds_over_no_kill']} s over the no-kill run")
        checks = row["checks"]
        ok &= row["returncode"] == 0 and checks["each_once"] and checks["verified"] and checks["no_partial"]
        ok &= bool(row.get("kill", {}).get("rerun"))  # the kill came while the actor held songs, and they reran
    for key, row in result["runs"].items():
        if key.endswith("_kill"):
            continue
        result["songs_per_minute"][key] = row["songs_per_minute"]
        result["system_rtf"][key] = row["system_rtf"]
        result["summary_tail_s"][key] = row["summary_tail_s"]
        result["peak_vram_gib"][key] = row["peak_vram_gib_nvidia_smi"] or row["peak_vram_gib_torch_reserved"]
    one = result["songs_per_minute"].get("1")
    for key, spm in result["songs_per_minute"].items():
        result["efficiency"][key] = round(spm / (int(key) * one), 3) if one else None
    log(f"songs per minute {result['songs_per_minute']} · efficiency (fraction of linear) {result['efficiency']} · "
        f"system RTF {result['system_rtf']}")
    Path(args.out, f"{name}.json").write_text(json.dumps(result, indent=1) + "\n", "utf-8")
    Path(args.out, f"{name}.log").write_text("\n".join(LOG) + "\n", "utf-8")
    log(f"wrote {Path(args.out, name + '.json')} and {name}.log; checks {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
