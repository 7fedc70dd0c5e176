"""The first song in a fresh process against the second (issue #18 item 1), on the full-size synthetic int8 file.

    python bench/cold_start.py --json bench.json [--abc-tokens 1500 --frames 5371]

Four fresh processes, each: load, song 1, song 2 (timed from `generate`; a warm-up still running is waited for
inside song 1): (a) an empty TRITON_CACHE_DIR, warm-up on (its kernels compiled in child processes,
YUE2_WARMUP_PROCS unset); (b) the same cache directory kept, warm-up on (the marker found: no children); (c) the
"before" baseline: an empty cache, YUE2_WARMUP=0; (d) an empty cache, warm-up in-process only
(YUE2_WARMUP_PROCS=0: the gain of the parallel compile). Prints a table, each warm-up's children and marker
decision, and merges the rows into the --json file (bench.py's layout: {"metrics": {name: {ours, baseline, unit,
note}}}).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def child(path: str, abc_n: int, sem_n: int) -> None:
    """One process: load, two songs; prints one JSON line."""
    import torch
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import Sampling, SongRequest
    t = time.perf_counter()
    eng = YuE2Engine.load(path, device="cuda")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t
    fixed = lambda p, n: Sampling(p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.penalty_window, n, n)  # noqa
    b = Budgets(abc=fixed(Sampling(0.7, 0.9, 30, 1.005, 100, 32, 4096), abc_n), semantic=fixed(Sampling(), sem_n))
    songs = []
    for seed in (1, 2):
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        song = eng.generate(SongRequest("synthetic benchmark", "[Verse]\nla la", cot="full", seed=seed), b)
        torch.cuda.synchronize()
        songs.append({"seconds": time.perf_counter() - t, "stages": song.timing,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30,
                      "capture": [song.score.timing.get("graph_capture_seconds", 0),
                                  song.tokens.timing.get("graph_capture_seconds", 0)]})
    print("RESULT " + json.dumps({"load": load_s, "songs": songs, "warm_up": getattr(eng, "warm_up_report", {})}),
          flush=True)


def run(path, abc_n, sem_n, cache_dir, warm: bool, procs: str | None = None) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, YUE2_WARMUP="1" if warm else "0")
    env.pop("YUE2_WARMUP_PROCS", None)
    if env.get("PYTHONPYCACHEPREFIX"):  # --pycache: bytecode written by the first process, read by the later ones
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if procs is not None:
        env["YUE2_WARMUP_PROCS"] = procs
    p = subprocess.run([sys.executable, __file__, "--child", path, "--abc-tokens", str(abc_n), "--frames",
                        str(sem_n)], env=env, capture_output=True, text=True, timeout=400)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"child failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(line[7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/yue2bench")
    ap.add_argument("--json", default="")
    ap.add_argument("--abc-tokens", type=int, default=1500)
    ap.add_argument("--frames", type=int, default=5371)
    ap.add_argument("--child", default="")
    ap.add_argument("--cases", type=int, default=4, choices=(1, 2, 3, 4),
                    help="run only the first N processes (2: empty cache and cache kept, both with the warm-up)")
    ap.add_argument("--pycache", default="",
                    help="PYTHONPYCACHEPREFIX for every process (a fresh folder): Python's bytecode caches written "
                         "by the first process and read by the later ones, as on a machine whose packages were "
                         "byte-compiled at install (pip does); without it, on a machine whose site-packages cannot "
                         "be written or PYTHONDONTWRITEBYTECODE is set (the project's GPU machine), every process "
                         "compiles the modules it imports from source; PYTHONDONTWRITEBYTECODE is unset for them")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.abc_tokens, a.frames)
    path = os.path.join(a.workdir, "yue2_full_int8.safetensors")  # bench.py's file (same name, profile, seed)
    if not os.path.exists(path):
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        os.makedirs(a.workdir, exist_ok=True)
        write_synthetic_checkpoint(path, profile="full", fmt="int8", seed=0, device="cuda")
    if a.pycache:
        os.makedirs(a.pycache, exist_ok=True)
        os.environ["PYTHONPYCACHEPREFIX"] = a.pycache
    import torch as _torch
    site = os.path.dirname(os.path.dirname(_torch.__file__))
    print(f"bytecode: sys.dont_write_bytecode {sys.dont_write_bytecode}, site-packages {site} writable "
          f"{os.access(site, os.W_OK)}, PYTHONPYCACHEPREFIX {os.environ.get('PYTHONPYCACHEPREFIX') or '-'}",
          flush=True)
    cache = tempfile.mkdtemp(prefix="yue2-cold-cache-")
    rows = {}
    inproc = "empty cache, warm-up in-process only (YUE2_WARMUP_PROCS=0)"
    for label, cache_dir, warm, procs in (
            ("empty cache, warm-up", cache, True, None), ("cache kept, warm-up", cache, True, None),
            ("empty cache, no warm-up", tempfile.mkdtemp(prefix="yue2-cold-nowarm-"), False, None),
            (inproc, tempfile.mkdtemp(prefix="yue2-cold-inproc-"), True, "0"))[:a.cases]:
        try:
            rows[label] = run(path, a.abc_tokens, a.frames, cache_dir, warm, procs)
        except Exception as exc:  # one failed process must not lose the others
            print(f"{label}: {exc}", flush=True)
    print("\n| process | load s | song 1 s (stages) | song 2 s | song 1 / song 2 | peak GiB song 1 / 2 |\n"
          "|---|---|---|---|---|---|")
    metrics = {}
    for label, r in rows.items():
        s1, s2 = r["songs"]
        st = ", ".join(f"{k.replace('_seconds', '')} {v:.2f}" for k, v in s1["stages"].items() if k != "total_seconds")
        ratio = s1["seconds"] / s2["seconds"]
        print(f"| {label} | {r['load']:.1f} | {s1['seconds']:.2f} ({st}; capture {s1['capture']}) | "
              f"{s2['seconds']:.2f} | {ratio:.2f} | {s1.get('peak_gib', 0):.2f} / {s2.get('peak_gib', 0):.2f} |")
        w = r.get("warm_up") or {}
        ch = w.get("children") or {}
        if w:
            print(f"  warm-up: {w.get('seconds', 0):.1f} s, children {ch.get('count', 0)} "
                  f"(failed {ch.get('failed', 0)}, own seconds {ch.get('child_seconds')}, kernel variants "
                  f"{ch.get('variants')}), marker {w.get('marker')} (written {w.get('marker_written')}); stages "
                  + ", ".join(f"{k} {v:.2f}" for k, v in (w.get("stages") or {}).items()))
        print(f"  warm-up report: {w}")
        r["ratio"] = ratio
    names = {"empty cache, warm-up": "first song / warm, empty Triton cache (ratio)",
             "cache kept, warm-up": "first song / warm, cache kept (ratio)",
             "empty cache, no warm-up": "first song / warm, empty Triton cache, no warm-up (ratio)",
             inproc: "first song / warm, empty Triton cache, warm-up in-process only (ratio)"}
    targets = {"empty cache, warm-up": "target ≤ 1.25", "cache kept, warm-up": "target ≤ 1.05",
               "empty cache, no warm-up": "the before baseline (YUE2_WARMUP=0)",
               inproc: "the round-1 warm-up (YUE2_WARMUP_PROCS=0: no child processes)"}
    for label, r in rows.items():
        s1, s2 = r["songs"]
        metrics[names[label]] = {"ours": r["ratio"], "baseline": None, "unit": "x",
                                 "note": f"{targets[label]}; song 1 {s1['seconds']:.2f} s, song 2 {s2['seconds']:.2f} s, "
                                         f"load {r['load']:.1f} s (not incl.); ABC {a.abc_tokens} + music {a.frames}"}
    if "empty cache, warm-up" in rows and "empty cache, no warm-up" in rows:
        gain = rows["empty cache, no warm-up"]["songs"][0]["seconds"] / rows["empty cache, warm-up"]["songs"][0]["seconds"]
        metrics["first song, empty Triton cache: no warm-up / warm-up (gain)"] = {
            "ours": gain, "baseline": None, "unit": "x", "note": "per-technique gain of the background warm-up"}
    if "empty cache, warm-up" in rows and inproc in rows:
        gain = rows[inproc]["songs"][0]["seconds"] / rows["empty cache, warm-up"]["songs"][0]["seconds"]
        metrics["first song, empty Triton cache: in-process warm-up / child processes (gain)"] = {
            "ours": gain, "baseline": None, "unit": "x",
            "note": "per-technique gain of compiling in child processes (load "
                    f"{rows[inproc]['load']:.1f} → {rows['empty cache, warm-up']['load']:.1f} s)"}
    for name, m in metrics.items():
        print(f"  {name:60s} {m['ours']:.2f} {m['note']}")
    if a.json:
        data = {"machine": {}, "metrics": {}, "errors": {}}
        if os.path.exists(a.json):
            with open(a.json) as f:
                data = json.load(f)
        data.setdefault("metrics", {}).update(metrics)
        data.setdefault("cold_start", {}).update(rows)
        with open(a.json, "w") as f:
            json.dump(data, f, indent=2)


if __name__ == "__main__":
    main()
