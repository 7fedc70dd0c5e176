"""The nodes on a GPU, in-process with ComfyUI's real model management (not collected by pytest: the CI host has no
GPU, and a CPU host cannot observe offload, comfyui_host.md §8).

    python tests/nodes/gpu_nodes_check.py --comfy .comfyhost/comfyui --out /tmp/out [--full] [--reserve-gb N]
        [--own-weights]
    python tests/nodes/gpu_nodes_check.py --comfy .comfyhost/comfyui --out /tmp/out --diagnose 5.5 [--one-stream]
    python tests/nodes/gpu_nodes_check.py --comfy .comfyhost/comfyui --out /tmp/out --novram [--without-load-whole]

On the project's GPU machine (no PyAV or torchsde in its image, both imported by ComfyUI at module level but never
called here) put the import stubs first: PYTHONPATH=tests/nodes/gpu_stubs, and carry .comfyhost/comfyui.

Imports ComfyUI 0.3.75 from --comfy (args as the server would have them), the pack's nodes, writes synthetic
checkpoints and calls the node classes the way the executor does. Checks and records (JSON in --out, written after
every phase so a timeout still reports):
  - each part is a ModelPatcher whose module lands on the GPU with every parameter and buffer (int8 codes, the NAR's
    position table) and in the compute dtype; the NAR's int8 linears are dequantized before ComfyUI sizes it;
  - peak CUDA memory of each stage against the working-memory estimate passed to load_models_gpu;
  - with --reserve-gb (ComfyUI's --reserve-vram), that a stage offloads the other YuE2 parts when memory is short;
  - CUDA memory after each of several runs (flat), and after a Cancel during composing (back to the baseline);
  - a Cancel inside each stage (planning, music tokens, NAR, VAE) via the progress callback, then a full song:
    the Cancel raises ComfyUI's InterruptProcessingException, the next song runs, memory returns to the baseline;
  - --full: the same on a full-size synthetic int8 checkpoint (the release's dimensions): tokens/s and peaks;
  - --own-weights: a LoRA and a VAE file on the model, the later parts read in the background or not: the same
    tokens, latent and audio bit for bit, and the LoRA changes the song.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
results: dict = {"phases": {}}


def save(out: Path) -> None:
    (out / "gpu_nodes_check.json").write_text(json.dumps(results, indent=1, default=str))


def setup_comfy(comfy: Path, workdir: Path, reserve_gb: float | None, cpu: bool = False, novram: bool = False):
    sys.path.insert(0, str(comfy))
    os.chdir(comfy)
    import utils.extra_config  # noqa: F401  (before any comfy.* import, comfyui_host.md §6.2)
    from comfy.cli_args import args
    args.cpu = cpu
    args.novram = novram  # read when comfy.model_management is imported (by the pack, below)
    if reserve_gb is not None:
        args.reserve_vram = reserve_gb
    import folder_paths
    (workdir / "ckpt").mkdir(parents=True, exist_ok=True)
    (workdir / "out").mkdir(parents=True, exist_ok=True)
    folder_paths.add_model_folder_path("checkpoints", str(workdir / "ckpt"), is_default=True)
    folder_paths.set_output_directory(str(workdir / "out"))
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # yue2_core
    spec = importlib.util.spec_from_file_location("yue2_nodes", REPO / "nodes" / "__init__.py",
                                                  submodule_search_locations=[str(REPO / "nodes")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["yue2_nodes"] = module
    spec.loader.exec_module(module)
    return module


def cuda_mb(fn: str = "memory_allocated") -> float:
    import torch
    return round(getattr(torch.cuda, fn)() / 2 ** 20, 1) if torch.cuda.is_available() else 0.0


def loaded_parts() -> list[str]:
    import comfy.model_management as mm
    return [type(m.model.model).__name__ for m in mm.current_loaded_models if m.model is not None]


def placement(model) -> dict:
    """Where each built part's tensors are, and in which dtypes."""
    out = {}
    for part, patcher in model._patchers.items():
        tensors = list(patcher.model.parameters()) + list(patcher.model.buffers())
        out[part] = {"devices": sorted({str(t.device) for t in tensors}),
                     "dtypes": sorted({str(t.dtype).split(".")[-1] for t in tensors}),
                     "patcher_size_mb": round(patcher.model_size() / 2 ** 20, 1),
                     "loaded_mb": round(patcher.loaded_size() / 2 ** 20, 1)}
    return out


def stage(name: str, record: dict, fn):
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = cuda_mb()
    t0 = time.perf_counter()
    value = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    record[name] = {"seconds": round(time.perf_counter() - t0, 2), "allocated_before_mb": before,
                    "peak_mb": cuda_mb("max_memory_allocated"), "allocated_after_mb": cuda_mb(),
                    "loaded_after": loaded_parts()}
    return value


def estimates(memory, model, tokens, abc_budget: int, music_tokens: int) -> dict:
    """The working-memory estimates the nodes passed to load_models_gpu for this song (MiB)."""
    dims, dtype, prefix, frames = model.dims, model.dtype, len(tokens.prefix), len(tokens.codes)
    cuda = model.device.type == "cuda"
    planning_prefix = prefix - len(tokens.score.abc_ids) - 2
    return {"plan_mb": round(memory.ar_phase(dims, dtype, planning_prefix, abc_budget, 1, cuda) / 2 ** 20, 1),
            "semantic_mb": round(memory.ar_phase(dims, dtype, prefix, music_tokens, 1, cuda) / 2 ** 20, 1),
            "render_mb": round(memory.render(dims, dtype, prefix, frames, cuda) / 2 ** 20, 1),
            "vae_tile_mb": round(memory.vae_tile(model.info.vae, frames, 1024, 16) / 2 ** 20, 1)}


def song(pack, ckpt: str, seed: int, seconds: float, abc_tokens: int, record: dict, style="synth pop",
         lyrics="[verse]\nla la la"):
    n = {c.__name__: c for c in pack.NODE_LIST}
    model, _ = stage("load", record, lambda: n["YuE2CheckpointLoader"].execute(ckpt).args)
    out = stage("compose", record, lambda: n["YuE2Composer"].execute(
        model, style, lyrics, "full", seed, seconds, max_abc_tokens=abc_tokens).args)
    _, tokens, _, report = out
    latent = stage("render", record, lambda: n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0])
    audio = stage("decode", record, lambda: n["YuE2VAEDecode"].execute(model, latent).args[0])
    record["report"] = report
    record["frames"] = len(tokens.codes)
    record["samples"] = int(audio["waveform"].shape[-1])
    record["placement"] = placement(model)
    return model, tokens


def cancel_each_stage(pack, ckpt: str) -> dict:
    """Cancel inside each stage — planning, music tokens, NAR rendering, VAE decode — by pressing Cancel from the
    nodes' progress callback once that stage has reported its first step; after each, one full song must run.
    Records CUDA allocated MiB after the song before any Cancel (the baseline), after each Cancel and after the
    song that follows it."""
    import comfy.model_management as mm
    import torch

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prog = sys.modules["yue2_nodes.progress"]
    n = {c.__name__: c for c in pack.NODE_LIST}
    model = n["YuE2CheckpointLoader"].execute(ckpt).args[0]
    lyrics = "[verse]\nla la la"
    _, tokens, _, _ = n["YuE2Composer"].execute(model, "pop", lyrics, "full", 5, 8.0, max_abc_tokens=64).args
    latent = n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0]
    n["YuE2VAEDecode"].execute(model, latent)
    song(pack, ckpt, 6, 4.0, 32, {})
    sync()
    rec = {"baseline_allocated_mb": cuda_mb()}
    original = prog.StageProgress.__call__
    for target in ("plan", "semantic", "render", "decode"):
        def pressed(self, stage_name, done, total, info, _target=target):
            if stage_name == _target and done >= 1:
                mm.interrupt_current_processing(True)
            return original(self, stage_name, done, total, info)
        prog.StageProgress.__call__ = pressed
        raised = None
        try:
            if target in ("plan", "semantic"):
                n["YuE2Composer"].execute(model, "pop", lyrics, "full", 7, 8.0, max_abc_tokens=64)
            elif target == "render":
                n["YuE2Renderer"].execute(model, tokens, 32, 11)
            else:
                n["YuE2VAEDecode"].execute(model, latent)
        except mm.InterruptProcessingException:
            raised = "InterruptProcessingException"
        finally:
            prog.StageProgress.__call__ = original
            mm.interrupt_current_processing(False)
        sync()
        after_cancel = cuda_mb()
        ok = True
        try:
            song(pack, ckpt, 6, 4.0, 32, {})
        except Exception as exc:  # noqa: BLE001 - recorded
            ok = f"{type(exc).__name__}: {exc}"
        sync()
        rec[target] = {"raised": raised, "allocated_after_cancel_mb": after_cancel,
                       "next_song_ok": ok, "allocated_after_next_song_mb": cuda_mb()}
    rec["flat"] = all(rec[t]["allocated_after_next_song_mb"] <= rec["baseline_allocated_mb"] + 1.0
                      for t in ("plan", "semantic", "render", "decode"))
    return rec


def live_cuda_tensors(exclude: set, top: int = 8) -> list:
    """The largest live CUDA tensors that are not model weights: [(MiB, shape, dtype)] (what a leak would hold)."""
    import gc

    import torch
    found = {}
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.is_cuda and obj.data_ptr() not in exclude:
                found[obj.data_ptr()] = (round(obj.untyped_storage().nbytes() / 2 ** 20, 2), list(obj.shape),
                                         str(obj.dtype).split(".")[-1])
        except Exception:  # noqa: BLE001, S112 - objects that only look like tensors
            continue
    return sorted(found.values(), reverse=True)[:top]


def weight_ptrs(model) -> set:
    return {t.data_ptr() for p in model._patchers.values() for t in [*p.model.parameters(), *p.model.buffers()]}


def reuse_capture_stream() -> None:
    """Make yue2_core.fast.decode capture on one side stream per device instead of a new torch.cuda.Stream per graph
    (diagnosis of the +64 MiB per song: PyTorch keeps a cuBLAS workspace for every stream it has seen)."""
    import torch

    import yue2_core.fast.decode as dec
    streams = {}

    def stream(device=None, *args, **kwargs):
        key = str(device)
        if key not in streams:
            streams[key] = torch.cuda.Stream(device, *args, **kwargs)
        return streams[key]

    class CudaProxy:
        Stream = staticmethod(stream)

        def __getattr__(self, name):
            return getattr(torch.cuda, name)

    class TorchProxy:
        cuda = CudaProxy()

        def __getattr__(self, name):
            return getattr(torch, name)

    dec.torch = TorchProxy()


def diagnose(pack, work: Path, out: Path, hog_free_gb: float, one_stream: bool = False) -> None:
    """One model reused over several songs (as ComfyUI's cache does with the loader's output); what stays allocated;
    dropping the model; and a GPU with only `hog_free_gb` free, where stages must offload each other's parts."""
    import gc

    import comfy.model_management as mm
    import torch
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    n = {c.__name__: c for c in pack.NODE_LIST}
    path = work / "ckpt" / "tiny_bf16.safetensors"
    if not path.exists():
        write_synthetic_checkpoint(str(path), "tiny", "bf16")
    if one_stream:
        reuse_capture_stream()
    rec = results["phases"]["reuse"] = {"allocated_start_mb": cuda_mb(), "after_run_mb": [], "one_stream": one_stream}
    model = n["YuE2CheckpointLoader"].execute("tiny_bf16.safetensors").args[0]

    def one(model, seed, seconds=4.0, abc=32):
        tokens = n["YuE2Composer"].execute(model, "pop", "la", "full", seed, seconds, max_abc_tokens=abc).args[1]
        latent = n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0]
        n["YuE2VAEDecode"].execute(model, latent)

    for seed in range(1, 5):
        one(model, seed)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rec["after_run_mb"].append(cuda_mb())
    rec["weights_mb"] = round(sum(p.model_size() for p in model._patchers.values()) / 2 ** 20, 1)
    rec["live_non_weight_tensors"] = live_cuda_tensors(weight_ptrs(model))
    save(out)
    del model
    rec["after_del_mb"] = cuda_mb()
    gc.collect()
    rec["after_gc_mb"] = cuda_mb()
    mm.cleanup_models()
    rec["loaded_after_del"] = loaded_parts()
    rec["live_after_gc"] = live_cuda_tensors(set())
    save(out)

    if not torch.cuda.is_available():
        return
    full = work / "ckpt" / "full_int8.safetensors"
    if not full.exists():
        write_synthetic_checkpoint(str(full), "full", "int8", device="cuda")
    free = torch.cuda.mem_get_info()[0]
    hog = torch.empty(max(0, free - int(hog_free_gb * 2 ** 30)), dtype=torch.uint8, device="cuda")
    rec = results["phases"]["small_gpu"] = {"free_gb": round(torch.cuda.mem_get_info()[0] / 2 ** 30, 2), "runs": []}
    model = n["YuE2CheckpointLoader"].execute("full_int8.safetensors").args[0]
    for seed in (11, 12):
        run = {}
        tokens = stage("compose", run, lambda: n["YuE2Composer"].execute(
            model, "pop", "la", "full", seed, 20.0, max_abc_tokens=128).args[1])
        latent = stage("render", run, lambda: n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0])
        audio = stage("decode", run, lambda: n["YuE2VAEDecode"].execute(model, latent).args[0])
        run["samples"] = int(audio["waveform"].shape[-1])
        run["placement"] = placement(model)
        rec["runs"].append(run)
        save(out)
    del hog


def own_weights(pack, work: Path) -> dict:
    """A LoRA stack and a VAE file on the model, on the GPU, with the later parts read in the background (the
    default on CUDA, `YuE2Model.prefetch` through the derived model) and without (`reads_ahead` off): the same music
    tokens, latent and audio bit for bit; and the LoRA changes the song (it was applied). Tiny int8 and bf16."""
    import folder_paths
    import torch
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora.synthetic import write_adapter
    from yue2_core.weights.synthetic_vae import write_vae
    ym = sys.modules["yue2_nodes.model"]
    n = {c.__name__: c for c in pack.NODE_LIST}
    for kind in ("loras", "vae"):
        (work / kind).mkdir(parents=True, exist_ok=True)
        folder_paths.add_model_folder_path(kind, str(work / kind), is_default=True)
    out = {}
    for fmt in ("int8", "bf16"):
        name = f"tiny_{fmt}.safetensors"
        dims = inspect_checkpoint(str(work / "ckpt" / name)).dims
        lora = f"aitk_{fmt}.safetensors"
        write_adapter("aitk", work / "loras" / lora, dims, rank=4, seed=3)
        write_vae(str(work / "vae" / "vae_file.safetensors"), layout="vendor-file", seed=5, encoder=False)
        runs = {}
        for label, ahead, with_lora in (("background reads", None, True), ("no background reads", False, True),
                                        ("no LoRA", None, False)):
            real = ym.reads_ahead
            ym.reads_ahead = lambda device, on=ahead is not False: on  # on: what CUDA does (forced for --cpu)
            try:
                model = n["YuE2CheckpointLoader"].execute(name).args[0]
                if with_lora:
                    model = n["YuE2LoRA"].execute(model, lora, 1.0, 1.0).args[0]
                model = n["YuE2VAELoader"].execute(model, "vae_file.safetensors").args[0]
                _, tokens, _, _ = n["YuE2Composer"].execute(model, "synth pop", "[verse]\nla la", "full", 11, 4.0,
                                                           max_abc_tokens=32).args
                thread = model.root._prefetch_thread
                latent = n["YuE2Renderer"].execute(model, tokens, 32, -1).args[0]
                audio = n["YuE2VAEDecode"].execute(model, latent).args[0]
            finally:
                ym.reads_ahead = real
            runs[label] = {"codes": tokens.codes, "latent": latent["samples"].float().cpu(),
                           "audio": audio["waveform"].float().cpu(), "thread": None if thread is None else thread.name,
                           "placement": placement(model.root)}
        a, b, c = runs["background reads"], runs["no background reads"], runs["no LoRA"]
        out[fmt] = {
            "prefetch_thread": [a["thread"], b["thread"]],
            "codes_equal": list(a["codes"]) == list(b["codes"]),
            "latent_equal": bool(torch.equal(a["latent"], b["latent"])),
            "audio_equal": bool(torch.equal(a["audio"], b["audio"])),
            "lora_changes_song": not (list(a["codes"]) == list(c["codes"])
                                      and bool(torch.equal(a["latent"], c["latent"]))),
            "placement": a["placement"]}
        out[fmt]["ok"] = (a["thread"] == "yue2-prefetch" and b["thread"] is None and out[fmt]["codes_equal"]
                          and out[fmt]["latent_equal"] and out[fmt]["audio_equal"] and out[fmt]["lora_changes_song"])
    return out


def partial_unload(pack) -> dict:
    """--novram: ComfyUI unloads the AR partially under memory pressure (`LoadedModel.model_unload(bytes)`), then the
    next Composer run reloads it — `load_whole` must finish that load (review 42: left partial with `model_lowvram`
    False, which ComfyUI's `partially_load` reads as loaded). Records the AR's modules' devices after the squeeze and
    after the reload, and whether the second run's tokens equal the first's (same seed)."""
    import comfy.model_management as mm
    n = {c.__name__: c for c in pack.NODE_LIST}
    model = n["YuE2CheckpointLoader"].execute("tiny_bf16.safetensors").args[0]
    compose = lambda: n["YuE2Composer"].execute(model, "synth pop", "[verse]\nla la", "full", 21, 4.0,  # noqa: E731
                                                max_abc_tokens=32).args[1]
    first = compose()
    ar = model.patcher("ar")
    devices = lambda: sorted({str(t.device) for t in list(ar.model.parameters()) + list(ar.model.buffers())})  # noqa
    (entry,) = [m for m in mm.current_loaded_models if m.model is ar]
    if entry.model_unload(1):  # the least ComfyUI frees: its first module(s) in its own order, the rest stays
        mm.current_loaded_models.remove(entry)  # unloaded whole (nothing was on the GPU): as `free_memory` does
    out = {"squeezed": {"loaded_mb": round(ar.loaded_size() / 2 ** 20, 1),
                        "size_mb": round(ar.model_size() / 2 ** 20, 1),
                        "lowvram": bool(getattr(ar.model, "model_lowvram", False)), "devices": devices()}}
    t0 = time.perf_counter()
    second = compose()
    out["reloaded"] = {"loaded_mb": round(ar.loaded_size() / 2 ** 20, 1), "devices": devices(),
                       "compose_seconds": round(time.perf_counter() - t0, 2)}
    out["same_tokens"] = list(first.codes) == list(second.codes)
    # partial: some of the AR's modules moved to the CPU (ComfyUI's own loaded-bytes count may still say whole: on
    # an H100, 182.6 of 182.6 MiB "loaded" with a module on the CPU, `model_lowvram` True)
    out["ok"] = ("cpu" in out["squeezed"]["devices"] and len(out["squeezed"]["devices"]) > 1
                 and out["reloaded"]["loaded_mb"] == out["squeezed"]["size_mb"]
                 and out["reloaded"]["devices"] == [str(mm.get_torch_device())] and out["same_tokens"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfy", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--reserve-gb", type=float, default=None)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--cpu", action="store_true", help="dry run of this script on a machine without a GPU")
    ap.add_argument("--diagnose", type=float, default=None, metavar="FREE_GB",
                    help="instead: reuse one model over runs, drop it, then run on a GPU with FREE_GB free")
    ap.add_argument("--one-stream", action="store_true", help="with --diagnose: one graph-capture stream per device")
    ap.add_argument("--novram", action="store_true", help="ComfyUI's --novram (VRAMState.NO_VRAM): the tiny songs, "
                    "Cancel and placement under it (nodes.model.load_whole)")
    ap.add_argument("--own-weights", action="store_true", help="also: a LoRA and a VAE file on the model, with and "
                    "without the background reads of the later parts (same tokens, latent, audio)")
    ap.add_argument("--without-load-whole", action="store_true",
                    help="with --novram: nodes.model.load_whole turned off, to show what it fixes")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "yue2_gpu_check"
    t_start = time.perf_counter()
    try:
        pack = setup_comfy(Path(a.comfy).resolve(), work, a.reserve_gb, a.cpu, a.novram)
        if a.without_load_whole:
            sys.modules["yue2_nodes.model"].load_whole = lambda patcher: None
        import comfy.model_management as mm
        import torch
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        from yue2_nodes import memory
        results["env"] = {"torch": torch.__version__, "device": str(mm.get_torch_device()),
                          "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                          "vram_state": str(mm.vram_state), "reserve_gb": a.reserve_gb,
                          "load_whole": not a.without_load_whole,
                          "free_mb": round(mm.get_free_memory() / 2 ** 20)}
        save(out)
        if a.diagnose is not None:
            diagnose(pack, work, out, a.diagnose, a.one_stream)
            results["ok"] = True
            raise SystemExit
        for fmt in ("bf16", "int8"):
            name = f"tiny_{fmt}.safetensors"
            path = work / "ckpt" / name
            if not path.exists():
                write_synthetic_checkpoint(str(path), "tiny", fmt)
            rec = results["phases"][f"tiny_{fmt}"] = {}
            model, tokens = song(pack, name, 1, 4.0, 32, rec)
            rec["estimates"] = estimates(memory, model, tokens, 32, 100)
            # runs in a row: CUDA memory after each must stay flat
            rec["allocated_after_runs_mb"] = []
            for seed in range(2, 5):
                song(pack, name, seed, 4.0, 32, {})
                rec["allocated_after_runs_mb"].append(cuda_mb())
            save(out)
        if a.novram:
            rec = results["phases"]["partial_unload"] = partial_unload(pack)
            save(out)
            if not rec["ok"] and not a.without_load_whole:
                raise RuntimeError(f"partial unload under --novram: {rec}")
        # Cancel during composing: a timer presses Cancel (allocated bytes change here because another checkpoint's
        # parts get loaded; cancel_each_stage below compares like with like)
        rec = results["phases"]["cancel"] = {"allocated_before_mb": cuda_mb()}
        n = {c.__name__: c for c in pack.NODE_LIST}
        model = n["YuE2CheckpointLoader"].execute("tiny_bf16.safetensors").args[0]
        timer = threading.Timer(1.5, mm.interrupt_current_processing)
        timer.start()
        try:
            n["YuE2Composer"].execute(model, "pop", "la", "full", 99, 60.0, max_abc_tokens=4096)
            rec["raised"] = None
        except mm.InterruptProcessingException:
            rec["raised"] = "InterruptProcessingException"
        mm.interrupt_current_processing(False)
        rec["allocated_after_mb"] = cuda_mb()
        rec["reserved_after_mb"] = cuda_mb("memory_reserved")
        save(out)
        results["phases"]["cancel_each_stage"] = cancel_each_stage(pack, "tiny_bf16.safetensors")
        save(out)
        if a.own_weights:
            rec = results["phases"]["own_weights"] = own_weights(pack, work)
            save(out)
            if not all(r["ok"] for r in rec.values()):
                raise RuntimeError(f"own weights: {json.dumps(rec, default=str)[:2000]}")
        if a.full and time.perf_counter() - t_start < a.budget_s * 0.3:
            path = work / "ckpt" / "full_int8.safetensors"
            t0 = time.perf_counter()
            write_synthetic_checkpoint(str(path), "full", "int8", device="cuda" if torch.cuda.is_available() else "cpu")
            rec = results["phases"]["full_int8"] = {"write_seconds": round(time.perf_counter() - t0, 1)}
            save(out)
            model, tokens = song(pack, "full_int8.safetensors", 7, 20.0, 256, rec)
            rec["estimates"] = estimates(memory, model, tokens, 256, 500)
            save(out)
            if time.perf_counter() - t_start < a.budget_s * 0.8:
                rec2 = results["phases"]["full_int8_again"] = {
                    "note": "a second loader call makes a second model object while this script still holds the "
                            "first (ComfyUI's executor would reuse the cached loader output), so both stay loaded "
                            "until memory is needed: allocated bytes roughly double here by design, not a leak"}
                song(pack, "full_int8.safetensors", 8, 20.0, 256, rec2)
                rec2["loaded_models"] = loaded_parts()
        results["ok"] = True
    except SystemExit:
        pass
    except Exception:  # noqa: BLE001 - report whatever broke
        results["error"] = traceback.format_exc()
        results["ok"] = False
    results["seconds"] = round(time.perf_counter() - t_start, 1)
    save(out)
    print(json.dumps(results, indent=1, default=str)[-6000:])
    return 0 if results.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
