"""How many songs one AR batch may hold within a memory budget (`--budget GiB`), from the same estimates the candidate
batches use (`candidates.kv_bytes_per_song`, the decoder's sampler buffers).

    budget ≥ weights + headroom + N × per_song
    per_song = max over the rows and their phases of
               2 · layers · kv_heads · head_dim · dtype bytes × (prompt + budget tokens) × (2 with CFG)
               + the sampler's per-song buffers (Exp(1) draws [max_tokens, top_k + pad] fp32, outputs, logits rows)

`weights` is the checkpoint's tensor bytes (× 2 when bf16 weights are computed in fp32), `headroom` 512 MiB on a GPU
(prefill activations, workspaces, graph pools: `candidates.HEADROOM_BYTES`), none on the CPU. The prompt of a row
whose score the model writes is counted at its longest (planning prefix + ABC budget + 2). The estimate is for the
batch decoder; the CPU path runs rows one at a time and needs less.
"""
from __future__ import annotations

from ..candidates import GIB, HEADROOM_BYTES, _sampler_bytes, kv_bytes_per_song
from ..errors import RequestError


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


def fit_batch(budget_bytes: int, weights_bytes: int, per_song: int, headroom: int) -> int:
    """Largest N with weights + headroom + N × per_song ≤ budget (0 when not even one fits)."""
    return max(0, (int(budget_bytes) - int(weights_bytes) - int(headroom)) // max(1, int(per_song)))


def size_batch(per_song: int, *, budget_bytes: int, weights_bytes: int, max_batch: int | None,
               on_cuda: bool, default: int = 8) -> int:
    """The batch size: `max_batch` when it fits the budget, else RequestError naming the largest that fits; without
    `max_batch`, min(`default`, what fits). RequestError when not even one song fits (the weights alone, or one
    song's K/V)."""
    headroom = HEADROOM_BYTES if on_cuda else 0
    most = fit_batch(budget_bytes, weights_bytes, per_song, headroom)
    where = (f"a budget of {budget_bytes / GIB:.2f} GiB (weights {weights_bytes / GIB:.2f} GiB"
             f"{f', headroom {headroom / GIB:.2f} GiB' if headroom else ''}; each song up to {per_song / GIB:.3f} GiB "
             "for its K/V cache and sampler)")
    if most < 1:
        raise RequestError(f"not even one song fits in {where}; raise --budget or lower the songs' budgets "
                           "(semantic_sampling.max_tokens, --max-seconds)")
    if max_batch is None:
        return min(default, most)
    if type(max_batch) is not int or max_batch < 1:
        raise RequestError(f"--max-batch must be a positive integer, got {max_batch!r}")
    if max_batch > most:
        raise RequestError(f"--max-batch {max_batch} does not fit: at most {most} songs fit in {where}; use "
                           f"--max-batch {most} or a larger --budget")
    return max_batch


def weights_bytes(info, compute_fp32: bool) -> int:
    """The checkpoint's tensor bytes, doubled for bf16 weights computed in fp32 (an estimate: int8 NAR layers
    become bf16 on a GPU, and the VAE is fp32 either way)."""
    data = int(getattr(info, "data_bytes", 0) or 0)
    return data * 2 if compute_fp32 and getattr(info, "format", "bf16") == "bf16" else data


__all__ = ["song_bytes", "fit_batch", "size_batch", "weights_bytes"]
