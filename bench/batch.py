"""Many different songs at once on one GPU: `python -m yue2_core batch` sequential (--max-batch 1) vs --max-batch 4
and 8 on the full-size synthetic int8 file, in one process run per setting (same requests): songs per minute, system
RTF (wall seconds per second of music), peak VRAM; and the batched rows' music tokens against the sequential run's.

    python bench/batch.py --workdir /tmp/yue2bench --songs 16 --seconds 60 --json batch.json [--dry-run-cpu]

Each request brings its own lead sheet (random weights never end one), so the AR part is the music phase; songs
differ in style, lyrics and seed. Issue target: system RTF ≤ 0.03 at N = 8 (3.6-minute songs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bench as B  # noqa: E402

SCORE = ("X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=96\nV: Vocal clef=treble name=\"Vocal Melody\" snm=\"Vocal\"\n"
         "V: Ins clef=treble name=\"Ins Melody\" snm=\"Inst.\"\nK:C\n% verse\nV: Vocal\n\"C\"c8d8e8f8|\"G\"g16e16|\n"
         "V: Ins\nC32|G,32|\n")
STYLES = ["indie pop, warm female vocals", "hard rock, male vocals", "lo-fi hip hop", "jazz trio, brushes",
          "synthwave, 80s", "acoustic folk", "drum and bass", "orchestral ballad"]


def requests(path, n, seconds):
    tokens = int(round(seconds * 25))
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"song{i:02d}", "style": STYLES[i % len(STYLES)],
                                "lyrics": f"[Verse]\nline {i} of the song, la la la", "seed": 1000 + i, "abc": SCORE,
                                "semantic_sampling": {"min_tokens": tokens, "max_tokens": tokens}}) + "\n")


def run(ckpt, req, out, max_batch, device):
    from yue2_core.__main__ import main
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    rc = main(["batch", req, "--output", out, "--checkpoint", ckpt, "--max-batch", str(max_batch), "--device", device,
               "--offline", "--steps", "32" if device == "cuda" else "2"])
    wall = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else 0.0
    return rc, wall, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--songs", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--json", default="batch.json")
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    device = "cuda"
    if args.dry_run_cpu:
        B.DEVICE, B.PROFILE, device = "cpu", "tiny", "cpu"
    ckpt = B.make_checkpoints(args.workdir)["int8"]
    req = os.path.join(args.workdir, "batch_requests.jsonl")
    requests(req, args.songs, args.seconds)
    music = args.songs * args.seconds
    rows, out = [], {"machine": {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                 "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                                 "commit": os.environ.get("YUE2_COMMIT", "")}, "runs": {}}
    folders = {}
    for n in [int(x) for x in args.batches.split(",")]:
        folder = os.path.join(args.workdir, f"batch_out_{n}_{int(time.time())}")
        rc, wall, peak = run(ckpt, req, folder, n, device)
        folders[n] = folder
        summary = json.load(open(os.path.join(folder, "batch.json")))
        if rc != 0:
            print(f"--max-batch {n}: exit {rc}, {summary.get('complete')} of {args.songs} complete "
                  f"({wall:.1f} s); see the table above for each song's reason", flush=True)
        rows.append((n, rc, summary.get("complete"), wall, 60 * args.songs / wall, wall / music, peak))
        out["runs"][n] = {"exit": rc, "complete": summary.get("complete"), "wall_s": wall,
                          "songs_per_minute": 60 * args.songs / wall, "system_rtf": wall / music, "peak_gib": peak}
    first = min(folders)
    def codes(folder, i):
        path = os.path.join(folder, f"song{i:02d}", "semantic.npy")
        return np.load(path) if os.path.exists(path) else None

    for n, folder in folders.items():  # the batched songs' tokens against the first (sequential) run's
        pairs = [(codes(folder, i), codes(folders[first], i)) for i in range(args.songs)]
        same = sum(a is not None and b is not None and np.array_equal(a, b) for a, b in pairs)
        out["runs"][n]["same_tokens_as_sequential"] = f"{same}/{args.songs}"
    print(f"\n{args.songs} songs × {args.seconds:g} s, int8, {out['machine']['gpu']}")
    print("| --max-batch | exit | complete | wall s | songs/min | system RTF | peak GiB | tokens = sequential |")
    print("|---|---|---|---|---|---|---|---|")
    for n, rc, done, wall, spm, rtf, peak in rows:
        print(f"| {n} | {rc} | {done} | {wall:.1f} | {spm:.1f} | {rtf:.4f} | {peak:.2f} | "
              f"{out['runs'][n]['same_tokens_as_sequential']} |")
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
