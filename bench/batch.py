"""Many different songs at once on one GPU (issue #19 rows): `python -m yue2_core batch` on the full-size synthetic int8
file, 16 different requests of 3.6-minute songs (5,371 music tokens) with cot full and a 1,500-token lead sheet the
model writes (as bench/bench.py's whole song), run sequentially (--max-batch 1) and with --max-batch 4 and 8, each
without and with the overlap (the render stage of a batch beside the next batch's AR phases): songs per minute, system
RTF (wall seconds per second of music), peak VRAM (allocator and NVML), and each run's music tokens against the
sequential run's; next to the published peers (below). Prints the table and the ratios, writes JSON after every run.

    python bench/batch.py --workdir /tmp/yue2bench --json batch.json [--runs 1:off:4,8:on,...] [--budget-s 540]
    python bench/batch.py --dry-run-cpu --songs 4 --seconds 2 --abc-tokens 8    # the script on the CPU, tiny model

    python bench/batch.py --mixed --runs 8:on,8:on:cont    # songs of different lengths: static vs continuous batches

A run is MAX_BATCH:on|off[:SONGS][:ab2][:cont] (SONGS: the first SONGS requests, default all; ab2: the opt-in ODE
solver; cont: continuous batching, `batch --continuous`; without it `--no-continuous`). The default order puts the rows
that matter first, and a run whose estimated time (from the per-song rates measured so far) would pass --budget-s
is skipped and listed, so the whole part fits one 10-minute GPU call: the sequential rows run on the first 4
requests (about 15 s a song on an H200, 16 would take 4 minutes) and the table says so (its rates are per song).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bench as B  # noqa: E402

STYLES = ["indie pop, warm female vocals", "hard rock, male vocals", "lo-fi hip hop", "jazz trio, brushes",
          "synthwave, 80s", "acoustic folk", "drum and bass", "orchestral ballad"]
DEFAULT_RUNS = "1:off:4,8:on,4:on,8:off,4:off,1:on:4"
# Published peers (issue #19; /work/shared/reference/performance.md §1). System RTF = wall seconds / audio seconds.
PEERS = [
    ("vendor runtime, sequential (--concurrency 1)", "vendor-style baseline of bench/bench.py on this GPU: 47.6 s a "
     "3.6-min song (docs/bench_h200.json, 'whole song: ours int8 vs vendor-style bf16')", 47.55 / 214.84),
    ("vllm-omni fork, 4 prompts", "weighted RTF 1.086 → 0.386, GPU not stated (YuE issue #175)", 0.386),
    ("YuE2-Turbo, 4 requests", "RTX 5090, batched requests, next AR overlapped with the previous NAR/VAE "
     "(issue #19)", 0.096),
]
TARGET_RTF = 0.03  # issue #19: system RTF ≤ 0.03 at N = 8 on one H200


def song_tokens(i: int, seconds: float, mixed: bool) -> int:
    """Music tokens of song i: seconds × 25, or with `mixed` from a quarter to all of it (a fixed spread, the same
    every run: song i gets (1 + (7·i mod 16)) / 16 of it), as a queue of songs of different lengths."""
    full = int(round(seconds * 25))
    return max(1, full * (1 + (7 * i) % 16) // 16) if mixed else full


def requests(path, n, seconds, abc_tokens, mixed=False):
    """n different requests (style, lyrics, seed); the model writes each lead sheet (exactly `abc_tokens` tokens)
    and exactly `song_tokens` music tokens (random weights never end a phase)."""
    with open(path, "w") as f:
        for i in range(n):
            tokens = song_tokens(i, seconds, mixed)
            f.write(json.dumps({"id": f"song{i:02d}", "style": STYLES[i % len(STYLES)],
                                "lyrics": f"[Verse]\nline {i} of the song, la la la\n[Chorus]\n" + "oh " * (i + 1),
                                "seed": 1000 + i, "cot": "full",
                                "abc_sampling": {"min_tokens": abc_tokens, "max_tokens": abc_tokens},
                                "semantic_sampling": {"min_tokens": tokens, "max_tokens": tokens}}) + "\n")


class VramPeak:
    """Peak device memory used (NVML through pynvml, else nvidia-smi), sampled every 50 ms (nvidia-smi: 250 ms) in a
    thread, minus what was used when it started (the CUDA context and other processes)."""

    def __init__(self):
        self.peak = self.base = None
        self.stop = threading.Event()
        self.read = None
        if not torch.cuda.is_available():
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.read, self.period = (lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used), 0.05
        except Exception:  # no pynvml: nvidia-smi (MiB)
            def smi():
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      f"--id={torch.cuda.current_device()}"], capture_output=True, text=True,
                                     timeout=5)
                return int(out.stdout.split()[0]) * 2 ** 20
            try:
                smi()
                self.read, self.period = smi, 0.25
            except Exception:
                self.read = None

    def __enter__(self):
        if self.read is not None:
            self.base = self.peak = self.read()
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()
        return self

    def _loop(self):
        while not self.stop.wait(self.period):
            self.peak = max(self.peak, self.read())

    def __exit__(self, *exc):
        if self.read is not None:
            self.stop.set()
            self.thread.join()

    def gib(self):
        return None if self.peak is None else (self.peak - self.base) / 2 ** 30


class Timeline:
    """Seconds from the command's start at which each song first reached each stage (the batch command's progress
    events, recorded by wrapping `runner._Meter.emit` in this process): the engine load ends at the first event."""

    def __enter__(self):
        from yue2_core.batch import runner
        self.t0, self.first, self.real = time.perf_counter(), {}, runner._Meter.emit
        timeline = self

        def emit(meter, song_id, stage, **info):
            timeline.first.setdefault((song_id, stage), time.perf_counter() - timeline.t0)
            return timeline.real(meter, song_id, stage, **info)
        runner._Meter.emit = emit
        return self

    def __exit__(self, *exc):
        from yue2_core.batch import runner
        runner._Meter.emit = self.real

    def summary(self, results: list) -> dict:
        """load (s), first render start, last song complete, and the render stage's busy share between them (the
        songs' render + decode seconds over that span)."""
        times = self.first.values()
        renders = [t for (sid, st), t in self.first.items() if st == "render" and sid]
        done = [t for (sid, st), t in self.first.items() if st == "complete"]
        busy = sum((r.get("timing") or {}).get("render_seconds", 0) + (r.get("timing") or {}).get("decode_seconds", 0)
                   for r in results)
        out = {"load_s": min(times) if times else None, "first_render_s": min(renders) if renders else None,
               "last_complete_s": max(done) if done else None, "render_decode_busy_s": busy}
        if renders and done:
            out["render_stage_busy_share"] = busy / max(1e-9, max(done) - min(renders))
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def run(ckpt, req, out, max_batch, overlap, device, abc_tokens, steps, method="midpoint", continuous=False):
    from yue2_core.__main__ import main
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with VramPeak() as nvml, Timeline() as timeline:
        t = time.perf_counter()
        rc = main(["batch", req, "--output", out, "--checkpoint", ckpt, "--max-batch", str(max_batch),
                   "--device", device, "--offline", "--steps", str(steps), "--max-abc-tokens", str(abc_tokens),
                   "--overlap" if overlap else "--no-overlap", "--ode-method", method]
                  + (["--continuous"] if continuous else ["--no-continuous"]))
        wall = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else None
    return rc, wall, peak, nvml.gib(), timeline


def parse_runs(text: str, songs: int) -> list[tuple[int, bool, int, str, bool]]:
    """MAX_BATCH:on|off[:SONGS][:ab2][:cont] items → (max batch, overlap, songs, ODE method, continuous batching)."""
    runs = []
    for part in filter(None, text.split(",")):
        fields = part.split(":")
        cont = fields[-1] == "cont"
        fields = fields[:-1] if cont else fields
        method = "midpoint"
        if fields[-1] == "ab2":
            fields, method = fields[:-1], "ab2"
        if len(fields) not in (2, 3) or fields[1] not in ("on", "off"):
            raise SystemExit(f"--runs: {part!r} is not MAX_BATCH:on|off[:SONGS][:ab2][:cont]")
        n = min(songs, int(fields[2])) if len(fields) == 3 else songs
        runs.append((int(fields[0]), fields[1] == "on", n, method, cont))
    return runs


def run_key(max_batch: int, overlap: bool, n: int, method: str, cont: bool = False) -> str:
    return (f"{max_batch}:{'on' if overlap else 'off'}:{n}" + (":ab2" if method == "ab2" else "")
            + (":cont" if cont else ""))


def estimate(per_song: dict, max_batch: int, overlap: bool) -> float | None:
    """Seconds per song of a run not made yet: the same setting's, else the other overlap setting's (× 1.4 when this
    one has none: the overlap hid up to that much on an H200 estimate), else the closest measured batch size's with
    the same overlap setting, else any closest one; None before the first run."""
    if (max_batch, overlap) in per_song:
        return per_song[(max_batch, overlap)]
    if (max_batch, not overlap) in per_song:
        return per_song[(max_batch, not overlap)] * (1.0 if overlap else 1.4)
    same = [k for k in per_song if k[1] == overlap] or list(per_song)
    if not same:
        return None
    return per_song[min(same, key=lambda k: abs(k[0] - max_batch))]


def subset(path, n, out):
    with open(path) as f:
        lines = f.readlines()[:n]
    with open(out, "w") as f:
        f.writelines(lines)
    return out


def _codes(folder, song_id, name="semantic.npy"):
    path = os.path.join(folder, song_id, name)
    return np.load(path) if os.path.exists(path) else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--songs", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5371 / 25, help="music per song (default 3.6 min = 5,371 tokens)")
    ap.add_argument("--abc-tokens", type=int, default=1500, help="lead-sheet tokens the model writes per song")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="MAX_BATCH:on|off[:SONGS][:ab2][:cont], comma-separated, in "
                    "this order (ab2: the opt-in solver; cont: --continuous)")
    ap.add_argument("--mixed", action="store_true", help="songs of different lengths (a quarter to all of --seconds, "
                    "`song_tokens`): what continuous batching is for")
    ap.add_argument("--budget-s", type=float, default=540.0, help="skip a run expected to end after this many "
                                                                  "seconds from the start (one 10-min GPU call)")
    ap.add_argument("--json", default="batch.json")
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    t_start = time.perf_counter()
    device, steps = "cuda", 32
    if args.dry_run_cpu:
        B.DEVICE, B.PROFILE, device, steps = "cpu", "tiny", "cpu", 2
    ckpt = B.make_checkpoints(args.workdir, ("int8",))["int8"]
    req = os.path.join(args.workdir, "batch_requests.jsonl")
    requests(req, args.songs, args.seconds, args.abc_tokens, args.mixed)
    # the mean song's audio (vae.output_length at 48 kHz); every run's first n songs
    audio_of = lambda n: sum(1920 * song_tokens(i, args.seconds, args.mixed) - 64 for i in range(n)) / 48000 / n  # noqa: E731
    audio_s = audio_of(args.songs)
    out = {"machine": {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                       "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                       "commit": os.environ.get("YUE2_COMMIT", "")},
           "setup": {"songs": args.songs, "music_tokens": round(args.seconds * 25), "mixed_lengths": args.mixed,
                     "abc_tokens": args.abc_tokens,
                     "audio_seconds_per_song": audio_s, "ode_steps": steps, "checkpoint": os.path.basename(ckpt)},
           "peers": [{"name": n, "source": s, "system_rtf": r} for n, s, r in PEERS], "runs": {}, "skipped": []}
    per_song: dict = {}  # (max_batch, overlap) → seconds per song measured, for the time estimates
    folders: dict = {}
    for max_batch, overlap, n, method, cont in parse_runs(args.runs, args.songs):
        key = run_key(max_batch, overlap, n, method, cont)
        known = estimate(per_song, max_batch, overlap)
        elapsed = time.perf_counter() - t_start
        if known is not None and elapsed + 1.1 * known * n + 15 > args.budget_s:
            print(f"skipping --max-batch {max_batch} overlap {'on' if overlap else 'off'} ({n} songs): about "
                  f"{known * n:.0f} s, {elapsed:.0f} s of {args.budget_s:.0f} used", flush=True)
            out["skipped"].append(key)
            continue
        folder = os.path.join(args.workdir, f"batch_out_{key.replace(':', '_')}_{int(time.time())}")
        path = req if n == args.songs else subset(req, n, os.path.join(args.workdir, f"batch_requests_{n}.jsonl"))
        rc, wall, peak, nvml, timeline = run(ckpt, path, folder, max_batch, overlap, device, args.abc_tokens, steps,
                                             method, cont)
        folders[key] = folder
        summary = json.load(open(os.path.join(folder, "batch.json")))
        done = summary.get("complete") or 0
        if rc != 0:
            print(f"--max-batch {max_batch}: exit {rc}, {done} of {n} complete ({wall:.1f} s); see the table "
                  "above for each song's reason", flush=True)
        per_song[(max_batch, overlap)] = wall / max(1, n)
        stages = {}
        for r in summary.get("results", []):
            for k, v in (r.get("timing") or {}).items():
                stages[k] = stages.get(k, 0.0) + v
        out["runs"][key] = {"max_batch": max_batch, "overlap": overlap, "ode_method": method, "continuous": cont,
                            "songs": n, "exit": rc, "complete": done,
                            "wall_s": wall, "songs_per_minute": 60 * n / wall,
                            "system_rtf": wall / (n * audio_of(n)),
                            "peak_gib_allocator": peak, "peak_gib_nvml": nvml,
                            "stage_seconds_summed": {k: round(v, 2) for k, v in stages.items()},
                            "timeline": timeline.summary(summary.get("results", []))}
        tl = out["runs"][key]["timeline"]
        load = tl.get("load_s") or 0.0
        out["runs"][key]["system_rtf_after_load"] = (wall - load) / (n * audio_of(n))
        print(f"timeline {key}: engine loaded at {load:.1f} s, first render at {tl.get('first_render_s')} s, last "
              f"song at {tl.get('last_complete_s')} s; render stage busy {tl.get('render_decode_busy_s')} s "
              f"(share {tl.get('render_stage_busy_share')}); system RTF {wall / (n * audio_of(n)):.4f}, after the "
              f"load {out['runs'][key]['system_rtf_after_load']:.4f}", flush=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    seq = next((k for k in folders if k.startswith("1:off")), None)
    for key, folder in folders.items():  # music tokens against the sequential run's (the songs both ran)
        r = out["runs"][key]
        if seq is not None:
            ids = [f"song{i:02d}" for i in range(min(r["songs"], out["runs"][seq]["songs"]))]
            same = sum(_codes(folder, i) is not None and _codes(seq_f, i) is not None
                       and np.array_equal(_codes(folder, i), _codes(seq_f, i))
                       for seq_f in [folders[seq]] for i in ids)
            r["same_tokens_as_sequential"] = f"{same}/{len(ids)}"
        twin = run_key(r["max_batch"], not r["overlap"], r["songs"], r["ode_method"], r.get("continuous", False))
        static = run_key(r["max_batch"], r["overlap"], r["songs"], r["ode_method"])
        if r.get("continuous") and static in folders:  # continuous vs static batches: the same songs
            ids = [f"song{i:02d}" for i in range(r["songs"])]
            same = sum(_codes(folder, i) is not None and _codes(folders[static], i) is not None
                       and np.array_equal(_codes(folder, i), _codes(folders[static], i)) for i in ids)
            r["same_tokens_as_static"] = f"{same}/{len(ids)}"
        if twin in folders:  # the same batches without / with the overlap: the songs must be identical
            ids = [f"song{i:02d}" for i in range(r["songs"])]
            same = sum(all(_codes(folder, i, f) is not None and np.array_equal(_codes(folder, i, f),
                                                                               _codes(folders[twin], i, f))
                           for f in ("semantic.npy", "latent.npy")) for i in ids)
            r["same_song_as_other_overlap_setting"] = f"{same}/{len(ids)}"
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    runs = out["runs"]
    lengths = (f"{audio_s:.1f} s of music on average (mixed lengths, a quarter to all of {round(args.seconds * 25)} "
               "music tokens)" if args.mixed else f"{audio_s:.1f} s of music ({round(args.seconds * 25)} music tokens)")
    print(f"\n{args.songs} different requests × {lengths} (cot full, {args.abc_tokens} ABC tokens, {steps} ODE steps), "
          f"int8, {out['machine']['gpu']}")
    print("| --max-batch | overlap | batching | ODE | songs | exit | complete | wall s | songs/min | system RTF | RTF "
          "after the load | peak GiB (allocator) | peak GiB (NVML) | tokens = sequential | same songs overlap on/off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, r in runs.items():
        nv = "–" if r["peak_gib_nvml"] is None else f"{r['peak_gib_nvml']:.2f}"
        al = "–" if r["peak_gib_allocator"] is None else f"{r['peak_gib_allocator']:.2f}"
        note = f" (first {r['songs']})" if r["songs"] < args.songs else ""
        ode = r.get("ode_method", "midpoint") + (" (opt-in)" if r.get("ode_method") == "ab2" else "")
        batching = "continuous" if r.get("continuous") else "static"
        print(f"| {r['max_batch']} | {'on' if r['overlap'] else 'off'} | {batching} | {ode} | {r['songs']}{note} | "
              f"{r['exit']} | "
              f"{r['complete']} | {r['wall_s']:.1f} | {r['songs_per_minute']:.2f} | {r['system_rtf']:.4f} | "
              f"{r.get('system_rtf_after_load', float('nan')):.4f} | {al} | "
              f"{nv} | {r.get('same_tokens_as_sequential', '–')} | {r.get('same_song_as_other_overlap_setting', '–')} |")
    for name, source, rtf in PEERS:
        print(f"| {name} | | | | | | | | {60 / (rtf * audio_s):.2f} | {rtf:.3f} | | | | | {source} |")
    if out["skipped"]:
        print(f"skipped (time budget): {', '.join(out['skipped'])}")
    print("\nratios (songs per minute; system RTF ratios are the inverse):")
    base = runs.get(seq) if seq else None
    for key, r in runs.items():
        parts = []
        if base is not None and key != seq:
            parts.append(f"{r['songs_per_minute'] / base['songs_per_minute']:.2f}× sequential")
        twin = run_key(r["max_batch"], False, r["songs"], r["ode_method"], r.get("continuous", False))
        static = run_key(r["max_batch"], r["overlap"], r["songs"], r["ode_method"])
        if r.get("continuous") and static in runs:
            parts.append(f"{r['songs_per_minute'] / runs[static]['songs_per_minute']:.2f}× static batches "
                         f"(tokens equal: {r.get('same_tokens_as_static', '–')})")
        if r["overlap"] and twin in runs:
            parts.append(f"{r['songs_per_minute'] / runs[twin]['songs_per_minute']:.2f}× the same without overlap")
        for name, _, rtf in PEERS:
            parts.append(f"{rtf / r['system_rtf']:.1f}× {name.split(',')[0]}")
        print(f"- {key}: " + "; ".join(parts))
    for method in ("midpoint", "ab2"):
        best8 = [r["system_rtf"] for r in runs.values() if r["max_batch"] == 8 and r["ode_method"] == method]
        if best8:
            print(f"issue target: system RTF ≤ {TARGET_RTF} at N = 8 — best measured with the {method} solver "
                  f"{min(best8):.4f} ({'met' if min(best8) <= TARGET_RTF else 'not met'})")


if __name__ == "__main__":
    main()
