"""The nodes' first song against their second (issue #18: "the nodes show the same speed"), in fresh processes on a
full-size synthetic int8 checkpoint, through ComfyUI 0.3.75's real model management (not collected by pytest).

    PYTHONPATH=tests/nodes/gpu_stubs python tests/nodes/gpu_nodes_cold.py --comfy .comfyhost/comfyui --out /tmp/out

Two child processes share one TRITON_CACHE_DIR: the first starts with it empty, the second with it kept. Each runs
the graph's nodes the way the executor does — YuE2 Checkpoint Loader (which starts the background warm-up), then
Composer → Renderer → VAE Decode twice (seeds 1 and 2, the same lengths: `--abc-tokens` lead-sheet budget, `--seconds`
of music) — and reports every node's seconds. Writes gpu_nodes_cold.json in --out and prints a table with the ratio
song 1 / song 2 (the targets of issue #18 are for the engine: ≤ 1.25 with an empty cache, ≤ 1.05 with it kept).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _time_loading() -> dict:
    """Seconds each song spends making its parts ready, by step (wrapped in place, the way the nodes call them):
    `load` = all of `YuE2Model.load` — `patcher` (the part built from the file on the CPU, or the wait for the
    background read of it), `warm_up_wait` (the Checkpoint Loader's background warm-up), `load_models_gpu` (ComfyUI
    placing the weights on the GPU); `load_ar@THREAD` etc.: the reads themselves and the thread that ran them. A step
    timed on another thread than the main one is keyed `STEP@THREAD` (the background read calls `patcher` too: under
    `patcher` it counted off the song's path, 5.69 s of "patcher" in a 3.71 s `load`; review 43)."""
    import threading
    import comfy.model_management as mm
    model_cls = sys.modules["yue2_nodes.model"].YuE2Model
    timers: dict = {}

    def timed(key, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                thread = threading.current_thread()
                name = key if thread is threading.main_thread() else f"{key}@{thread.name}"
                timers[name] = timers.get(name, 0.0) + time.perf_counter() - t
        return wrapper
    model_cls.load = timed("load", model_cls.load)
    model_cls.patcher = timed("patcher", model_cls.patcher)
    model_cls.wait_warm_up = timed("warm_up_wait", model_cls.wait_warm_up)
    mm.load_models_gpu = timed("load_models_gpu", mm.load_models_gpu)
    # the reads themselves, by thread ("yue2-prefetch": `YuE2Model.prefetch`, off the song's path)
    module = sys.modules["yue2_nodes.model"]
    for fn in ("load_ar", "load_nar", "load_vae", "prepare_linears"):  # (float_linears@… in runs before stop 48)
        def by_thread(f, fn=fn):
            def wrapper(*args, **kwargs):
                key = f"{fn}@{threading.current_thread().name}"
                t = time.perf_counter()
                try:
                    return f(*args, **kwargs)
                finally:
                    timers[key] = timers.get(key, 0.0) + time.perf_counter() - t
            return wrapper
        setattr(module, fn, by_thread(getattr(module, fn)))
    return timers


def child(comfy: str, work: Path, abc_tokens: int, seconds: float, cpu: bool = False, ahead: bool = True) -> dict:
    from gpu_nodes_check import setup_comfy, stage
    t0 = time.perf_counter()
    pack = setup_comfy(Path(comfy).resolve(), work, None, cpu)
    if not ahead:
        sys.modules["yue2_nodes.model"].reads_ahead = lambda device: False
    import torch
    timers = _time_loading()
    n = {c.__name__: c for c in pack.NODE_LIST}
    rec: dict = {"import_seconds": round(time.perf_counter() - t0, 2)}
    model = stage("loader", rec, lambda: n["YuE2CheckpointLoader"].execute("full_int8.safetensors").args[0])
    songs = []
    for seed in (1, 2):
        r: dict = {}
        timers.clear()
        t = time.perf_counter()
        _, tokens, _, _ = stage("compose", r, lambda: n["YuE2Composer"].execute(
            model, "synth pop", "[verse]\nla la la", "full", seed, seconds, max_abc_tokens=abc_tokens).args)
        latent = stage("render", r, lambda: n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0])
        stage("decode", r, lambda: n["YuE2VAEDecode"].execute(model, latent).args[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        r["seconds"] = round(time.perf_counter() - t, 2)
        r["abc_tokens"], r["frames"] = len(tokens.score.abc_ids), len(tokens.codes)
        r["loading"] = {k: round(v, 2) for k, v in timers.items()}
        r["seconds_without_loading"] = round(r["seconds"] - timers.get("load", 0.0), 2)
        songs.append({k: (v["seconds"] if isinstance(v, dict) and "seconds" in v else v) for k, v in r.items()})
    rec["songs"] = songs
    rec["loader"] = rec["loader"]["seconds"]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--abc-tokens", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=214.84, help="music seconds (5,371 frames at 25/s)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--no-read-ahead", action="store_true",
                    help="(child) the stages read every part themselves (nodes.model.reads_ahead answers False)")
    ap.add_argument("--compare-reads", action="store_true",
                    help="a third process, cache kept, without the background reads of the later parts")
    ap.add_argument("--cpu", action="store_true", help="dry run of this script without a GPU (tiny checkpoint)")
    a = ap.parse_args()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "yue2_gpu_cold"
    if a.child:
        print("RESULT " + json.dumps(child(a.comfy, work, a.abc_tokens, a.seconds, a.cpu, not a.no_read_ahead)),
              flush=True)
        return 0
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    path = work / "ckpt" / "full_int8.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        sys.path.insert(0, str(HERE.parents[1]))
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        write_synthetic_checkpoint(str(path), "tiny" if a.cpu else "full", "int8", device="cpu" if a.cpu else "cuda")
    cache = tempfile.mkdtemp(prefix="yue2-nodes-cold-")
    results = {}
    runs = [("empty Triton cache", True), ("cache kept", True)]
    if a.compare_reads:
        runs.append(("cache kept, no background reads", False))
    for label, ahead in runs:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        p = subprocess.run([sys.executable, __file__, "--child", "--comfy", a.comfy, "--out", str(out),
                            "--abc-tokens", str(a.abc_tokens), "--seconds", str(a.seconds)] + ["--cpu"] * a.cpu
                           + ["--no-read-ahead"] * (not ahead), env=env, capture_output=True, text=True, timeout=400)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            results[label] = {"error": f"rc {p.returncode}: {p.stderr[-1500:]}"}
            print(f"{label}: failed (rc {p.returncode})\n{p.stderr[-1500:]}", flush=True)
            continue
        results[label] = json.loads(line[7:])
        (out / "gpu_nodes_cold.json").write_text(json.dumps(results, indent=1))
    print("\n| process | loader s | song 1 s (compose, render, decode) | song 2 s | song 1 / song 2 | song 1 loading s "
          "(patcher, warm-up wait, load_models_gpu) | song 1 without loading / song 2 without loading |\n"
          "|---|---|---|---|---|---|---|")
    for label, r in results.items():
        if "songs" not in r:
            continue
        s1, s2 = r["songs"]
        ld = s1.get("loading", {})
        r["ratio"] = s1["seconds"] / s2["seconds"]
        r["ratio_without_loading"] = s1["seconds_without_loading"] / s2["seconds_without_loading"]
        print(f"| {label} | {r['loader']:.2f} | {s1['seconds']:.2f} ({s1['compose']:.2f}, {s1['render']:.2f}, "
              f"{s1['decode']:.2f}) | {s2['seconds']:.2f} | {r['ratio']:.2f} | {ld.get('load', 0):.2f} "
              f"({ld.get('patcher', 0):.2f}, {ld.get('warm_up_wait', 0):.2f}, {ld.get('load_models_gpu', 0):.2f}) | "
              f"{r['ratio_without_loading']:.2f} |")
    (out / "gpu_nodes_cold.json").write_text(json.dumps(results, indent=1))
    return 0 if all("songs" in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
