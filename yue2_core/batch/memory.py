"""How many songs one AR batch may hold within a memory budget (`--budget GiB`), from the same estimates the candidate
batches use (`candidates.kv_bytes_per_song`, the decoder's sampler buffers) and the render stage's working set.

    with the overlap:     budget ≥ weights + headroom + N × per_song + stage
    without the overlap:  budget ≥ weights + headroom + max(N × per_song, stage)
    per_song = max over the rows and their phases of
               2 · layers · kv_heads · head_dim · dtype bytes × (prompt + budget tokens) × (2 with CFG)
               + the sampler's per-song buffers (Exp(1) draws [max_tokens, top_k + pad] fp32, outputs, logits rows)
    stage    = max over the rows of max(NAR render of the song's largest chunk, one VAE tile) (+ 384 MiB on a GPU)

With the overlap (`runner.iter_songs(overlap=True)`) one song is rendered (NAR) and decoded (VAE) on a worker thread
while the next batch's AR phases hold their K/V caches, so the two add up; without it the render stage starts after
the batch decoder freed its buffers, so the larger of the two counts.

`weights` is the checkpoint's tensor bytes (× 2 when bf16 weights are computed in fp32), `headroom` 512 MiB on a GPU
(prefill activations, workspaces, graph pools: `candidates.HEADROOM_BYTES`), none on the CPU. The prompt of a row
whose score the model writes is counted at its longest (planning prefix + ABC budget + 2). The estimate is for the
batch decoder; the CPU path runs rows one at a time and needs less.
"""
from __future__ import annotations

from ..candidates import GIB, HEADROOM_BYTES, _sampler_bytes, kv_bytes_per_song
from ..constants import LATENT_DIM, VAE_CORE_FRAMES, VAE_HALO_FRAMES
from ..errors import RequestError

# What a CUDA stage needs on top of its tensors (cuBLAS/cuBLASLt workspaces of the worker's own stream, Triton
# scratch): nodes/memory.py's CUDA_OVERHEAD, measured on an H200 through the ComfyUI nodes (220–400 MiB).
STAGE_OVERHEAD = 384 * 2 ** 20


def song_bytes(dims, dtype_bytes: int, counts: dict, item) -> int:
    """Bytes one row needs in its larger AR phase: K/V for prompt + budget positions (× 2 with CFG) plus the
    sampler's buffers. `counts`: `requests.prompt_tokens` of the row."""
    kv = dict(layers=dims.layers, kv_heads=dims.kv_heads, head_dim=dims.head_dim, dtype_bytes=dtype_bytes)
    b, cfg = item.budgets, item.request.guidance != 1.0
    sem = b.semantic_sampling()
    need = kv_bytes_per_song(counts["semantic"], sem.max_tokens, cfg, **kv) + _sampler_bytes(
        sem, "semantic", 2 if cfg else 1, dtype_bytes)
    if counts["planning"]:
        abc = b.abc_sampling()
        need = max(need, kv_bytes_per_song(counts["planning"], abc.max_tokens, False, **kv)
                   + _sampler_bytes(abc, "abc", 1, dtype_bytes))
    return need


def _layer_activations(dims, dtype_bytes: int, positions: int) -> int:
    """Live tensors of one transformer layer over `positions` tokens (layers run one after the other): q‖k‖v, the
    attention output, gate‖up, the SwiGLU product and two residual-stream copies (nodes/memory.py's rule)."""
    qkv = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    return positions * (qkv + dims.heads * dims.head_dim + 3 * dims.ffn + 2 * dims.hidden) * dtype_bytes


def render_bytes(dims, dtype_bytes: int, prefix_tokens: int, frames: int) -> int:
    """Device bytes of the NAR render (`nar.render`) of a song of `frames` music frames after a `prefix_tokens`
    prompt, at its largest chunk (`nar.chunk_ranges`): the AR K/V of prefix + chunk codes + 1 (every layer, kept for
    the whole ODE solve, in buffers with room for the NAR's own chunk + 2 positions: `ChunkRenderer`) and the larger
    of the AR prefill's and the NAR's layer activations (the NAR's over chunk + 2 frames), plus the ODE state: six [chunk, 64] fp32 tensors (state, noise, two
    velocities, midpoint, output). The fused attention keeps no score matrix (CUDA); off CUDA add
    `heads × rows × keys × 4` — the batch sizes GPUs, so it is not counted here."""
    from ..nar import chunk_ranges
    chunk = max(b - a for a, b in chunk_ranges(max(1, int(frames)), int(prefix_tokens)))
    ar_positions = int(prefix_tokens) + chunk + 1
    per_position = 2 * dims.layers * dims.kv_heads * dims.head_dim * dtype_bytes
    prefill = _layer_activations(dims, dtype_bytes, ar_positions)
    nar = _layer_activations(dims, dtype_bytes, chunk + 2)
    return per_position * (ar_positions + chunk + 2) + max(prefill, nar) + chunk * LATENT_DIM * 4 * 6


def vae_tile_bytes(vae_cfg, frames: int, core: int = VAE_CORE_FRAMES, halo: int = VAE_HALO_FRAMES) -> int:
    """Device bytes of one halo-crop VAE tile (`vae.decode_tiled`, fp32): at the decoder's widest point a block's
    input plus six live tensors of its upsampled output, per latent frame (nodes/memory.py: 3.05 MB per frame for
    the release VAE, 2.9 MB measured on the CPU), over min(core, frames) + 2·halo frames, plus two copies of the
    largest weight-normalised convolution (recomputed in every forward). `core` 1024 is the largest tile
    `pipeline.vae_core_frames` picks."""
    rate, peak = 1, vae_cfg.latent_dim + vae_cfg.first_channels
    for c_in, c_out, stride in vae_cfg.blocks:
        peak = max(peak, c_in * rate + 6 * c_out * rate * stride)
        rate *= stride
    peak = max(peak, 2 * vae_cfg.blocks[-1][1] * rate + vae_cfg.out_channels * rate)
    largest = max(c_in * c_out * 2 * stride for c_in, c_out, stride in vae_cfg.blocks)
    return 2 * largest * 4 + peak * 4 * (min(int(core), max(1, int(frames))) + 2 * int(halo))


def stage_bytes(dims, vae_cfg, dtype_bytes: int, counts: dict, item, on_cuda: bool) -> int:
    """Device bytes of one song's render stage — its NAR render, then its VAE decode, one after the other, so the
    larger of `render_bytes` and `vae_tile_bytes` — plus STAGE_OVERHEAD on a GPU. `counts`: `requests.prompt_tokens`
    of the row (its longest semantic prompt); the song is counted at its full music budget. `vae_cfg` None (a caller
    without the checkpoint's VAE geometry): the NAR part only."""
    frames = item.budgets.semantic_sampling().max_tokens
    need = render_bytes(dims, dtype_bytes, counts["semantic"], frames)
    if vae_cfg is not None:
        need = max(need, vae_tile_bytes(vae_cfg, frames))
    return need + (STAGE_OVERHEAD if on_cuda else 0)


def fit_batch(budget_bytes: int, weights_bytes: int, per_song: int, headroom: int, stage: int = 0,
              overlap: bool = False) -> int:
    """Largest N with weights + headroom + N × per_song + stage ≤ budget (`overlap`: the render stage runs beside
    the AR batch), or with weights + headroom + max(N × per_song, stage) ≤ budget (without it); 0 when not even one
    fits."""
    room = int(budget_bytes) - int(weights_bytes) - int(headroom)
    if overlap:
        room -= int(stage)
    elif int(stage) > room:
        return 0
    return max(0, room // max(1, int(per_song)))


def _size(n: float) -> str:
    """Bytes for a message: GiB with two decimals, or MiB / KiB for small amounts (never "0.000 GiB")."""
    for unit, scale in (("GiB", GIB), ("MiB", 2 ** 20)):
        if n >= 0.1 * scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1024:.1f} KiB"


def size_batch(per_song: int, *, budget_bytes: int, weights_bytes: int, max_batch: int | None,
               on_cuda: bool, default: int = 8, stage: int = 0, overlap: bool = False,
               songs: int | None = None) -> int:
    """The batch size: `max_batch` (at most `songs`, the queue's length: no more rows are ever used) when it fits
    the budget, else RequestError naming the largest that fits; without `max_batch`, min(`default`, what fits).
    `stage`: the render stage's bytes (`stage_bytes`), added to the AR batch with `overlap`, else compared with it.
    RequestError when not even one song fits (the weights alone, one song's K/V, or the render stage)."""
    headroom = HEADROOM_BYTES if on_cuda else 0
    most = fit_batch(budget_bytes, weights_bytes, per_song, headroom, stage, overlap)
    render = ""
    if stage:
        render = (f"; the render stage {_size(stage)} (NAR render and VAE tile of the longest song"
                  f"{', beside the AR batch: --overlap' if overlap else ''})")
    where = (f"a budget of {_size(budget_bytes)} (weights {_size(weights_bytes)}"
             f"{f', headroom {_size(headroom)}' if headroom else ''}; each song up to {_size(per_song)} "
             f"for its K/V cache and sampler{render})")
    if most < 1:
        raise RequestError(f"not even one song fits in {where}; raise --budget or lower the songs' budgets "
                           "(semantic_sampling.max_tokens, --max-seconds)"
                           + ("; --no-overlap needs less" if overlap and stage else ""))
    if max_batch is None:
        return max(1, min(default, most, songs if songs is not None else default))
    if type(max_batch) is not int or max_batch < 1:
        raise RequestError(f"--max-batch must be a positive integer, got {max_batch!r}")
    rows = max_batch if songs is None else min(max_batch, max(1, songs))
    if rows > most:
        queue = f" (the queue's {songs} songs)" if rows < max_batch else ""
        raise RequestError(f"--max-batch {max_batch}{queue} does not fit: at most {most} songs fit in {where}; use "
                           f"--max-batch {most} or a larger --budget")
    return rows


def weights_bytes(info, compute_fp32: bool) -> int:
    """The checkpoint's tensor bytes, doubled for bf16 weights computed in fp32 (an estimate: int8 NAR layers
    become bf16 on a GPU, and the VAE is fp32 either way)."""
    data = int(getattr(info, "data_bytes", 0) or 0)
    return data * 2 if compute_fp32 and getattr(info, "format", "bf16") == "bf16" else data


__all__ = ["song_bytes", "fit_batch", "size_batch", "weights_bytes", "render_bytes", "vae_tile_bytes", "stage_bytes",
           "STAGE_OVERHEAD"]
