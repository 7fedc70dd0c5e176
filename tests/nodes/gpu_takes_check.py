"""The candidates, Pick Take, Regenerate and Continue nodes on a GPU, in-process with ComfyUI's model management (not
collected by pytest; same set-up as gpu_nodes_check.py, whose helpers it uses):

    PYTHONPATH=tests/nodes/gpu_stubs python3 tests/nodes/gpu_takes_check.py --comfy .comfyhost/comfyui --out /tmp/out

Records (JSON in --out, written after every phase):
  - candidates = 4 through the Composer (CUDA-graph batch decoder) against four candidates = 1 runs with seeds
    seed + i: whether each token stream is identical (and where it first differs), the Renderer batch and VAE Decode
    against each take rendered alone, Pick Take's lengths;
  - takes per minute through the Composer for N = 1, 4, 8, 16 (a given score, so the music stage only);
  - the memory refusal through the node: N = 16 long takes with only a few hundred MiB free must stop with
    "at most K candidates fit …";
  - Regenerate and Continue on CUDA: kept codes and samples, timings, CUDA memory before/after.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "host"))  # nodes_testlib imports comfy_client from there

import gpu_nodes_check as g  # noqa: E402
from nodes_testlib import SCORE_240  # noqa: E402

SCORE = SCORE_240  # four bars at 240 bpm: cuts by bar land on whole seconds


def save(out: Path) -> None:
    import json
    (out / "gpu_takes_check.json").write_text(json.dumps(g.results, indent=1, default=str))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=30.0, help="song length of the takes-per-minute phase")
    ap.add_argument("--cpu", action="store_true", help="dry run of this script on a machine without a GPU")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "yue2_gpu_takes"
    res = g.results
    t_start = time.perf_counter()
    try:
        pack = g.setup_comfy(Path(a.comfy).resolve(), work, None, a.cpu)
        import comfy.model_management as mm
        import numpy as np
        import soundfile as sf
        import torch
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        n = {c.__name__: c for c in pack.NODE_LIST}
        res["env"] = {"torch": torch.__version__, "device": str(mm.get_torch_device()),
                      "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
        name = "tiny_bf16.safetensors"
        if not (work / "ckpt" / name).exists():
            write_synthetic_checkpoint(str(work / "ckpt" / name), "tiny", "bf16")
        model = n["YuE2CheckpointLoader"].execute(name).args[0]
        compose = n["YuE2Composer"].execute

        # 1. four candidates against four single runs --------------------------------------------------------------
        rec = res["phases"]["candidates_vs_single"] = {"allocated_start_mb": g.cuda_mb()}
        t0 = time.perf_counter()
        _, batch, _, report = compose(model, "pop", "la", "full", 100, 4.0, max_abc_tokens=32, candidates=4).args
        rec["batch_seconds"] = round(time.perf_counter() - t0, 2)
        rec["report"] = report
        singles = [compose(model, "pop", "la", "full", 100 + i, 4.0, max_abc_tokens=32).args[1] for i in range(4)]
        rec["abc_first_difference"] = [first_difference(b.score.abc_ids, s.score.abc_ids)
                                       for b, s in zip(batch.takes, singles)]
        rec["codes_first_difference"] = [first_difference(b.codes, s.codes) for b, s in zip(batch.takes, singles)]
        latent = g.stage("render_batch", rec, lambda: n["YuE2Renderer"].execute(model, batch, 32, -1).args[0])
        audio = g.stage("decode_batch", rec, lambda: n["YuE2VAEDecode"].execute(model, latent).args[0])
        rec["picks"] = []
        for i in range(4):
            tokens, lat, aud, _, text = n["YuE2PickTake"].execute(batch, i, latent, audio).args
            alone = n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0]
            wave = n["YuE2VAEDecode"].execute(model, alone).args[0]
            rec["picks"].append({"frames": len(tokens.codes), "latent_equal_alone": torch.equal(lat["samples"],
                                                                                              alone["samples"]),
                                 "audio_equal_alone": torch.equal(aud["waveform"], wave["waveform"]),
                                 "samples": int(aud["waveform"].shape[-1])})
        rec["pick_report"] = text
        rec["allocated_end_mb"] = g.cuda_mb()
        save(out)

        # 2. takes per minute through the Composer (music stage only: a given score) ----------------------------------
        rec = res["phases"]["takes_per_minute"] = {}
        for count in (1, 4, 8, 16):
            t0 = time.perf_counter()
            _, toks, _, _ = compose(model, "pop", "la", "full", 7, a.seconds, abc_text=SCORE, candidates=count).args
            seconds = time.perf_counter() - t0
            frames = sum(len(t.codes) for t in (toks.takes if count > 1 else [toks]))
            rec[f"N={count}"] = {"seconds": round(seconds, 2), "takes_per_minute": round(60 * count / seconds, 1),
                                 "music_tokens_per_second": round(frames / seconds, 1)}
            save(out)

        # 3. too many candidates for the free memory, through the node ---------------------------------------------
        rec = res["phases"]["too_many"] = {}
        if torch.cuda.is_available():
            free = torch.cuda.mem_get_info()[0]
            hog = torch.empty(max(0, free - 700 * 2 ** 20), dtype=torch.uint8, device="cuda")
            rec["free_mb"] = round(torch.cuda.mem_get_info()[0] / 2 ** 20)
            try:
                compose(model, "pop", "la", "off", 7, 900.0, candidates=16)
                rec["raised"] = None
            except ValueError as exc:
                rec["raised"] = str(exc)
            del hog
            torch.cuda.empty_cache()
        save(out)

        # 4. Regenerate and Continue ------------------------------------------------------------------------------
        rec = res["phases"]["edit"] = {"allocated_start_mb": g.cuda_mb()}
        _, tokens, _, _ = compose(model, "pop", "la", "full", 3, 4.0, abc_text=SCORE).args
        lat = n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0]
        wav = n["YuE2VAEDecode"].execute(model, lat).args[0]
        rel = n["YuE2SaveSong"].execute(tokens, "gpu_parent", lat, wav).args[0]
        parent_dir = work / "out" / rel
        song = n["YuE2LoadSong"].execute(model, parent_dir.name).args[3]
        outs = g.stage("regenerate", rec, lambda: n["YuE2Regenerate"].execute(
            model, song, "bar 2", 5, 0.05, "").args)
        child = work / "out" / outs[4]
        pa = sf.read(str(parent_dir / "audio.flac"), dtype="int32")[0]
        ca = sf.read(str(child / "audio.flac"), dtype="int32")[0]
        pc, cc = np.load(parent_dir / "semantic.npy").tolist(), np.load(child / "semantic.npy").tolist()
        rec["regenerate"].update({"kept_codes_equal": pc[:25] == cc[:25], "new_codes_differ": pc[25:] != cc[25:],
                                  "kept_samples_equal": bool(np.array_equal(pa[:48000 - 2400], ca[:48000 - 2400])),
                                  "report": outs[5]})
        outs = g.stage("continue", rec, lambda: n["YuE2Continue"].execute(model, song, 2.0, 5, 0.05, "").args)
        child = work / "out" / outs[4]
        ca = sf.read(str(child / "audio.flac"), dtype="int32")[0]
        cc = np.load(child / "semantic.npy").tolist()
        end = len(pc) * 1920 - 64
        rec["continue"].update({"frames": len(cc), "kept_codes_equal": cc[:len(pc)] == pc,
                                "kept_samples_equal": bool(np.array_equal(pa[:end - 2400], ca[:end - 2400])),
                                "report": outs[5]})
        rec["allocated_end_mb"] = g.cuda_mb()
        res["ok"] = True
    except Exception:  # noqa: BLE001 - report whatever broke
        res["error"] = traceback.format_exc()
        res["ok"] = False
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    save(out)
    import json
    print(json.dumps(res, indent=1, default=str)[-8000:])
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
