"""The NAR expert: flow-matching renderer from semantic codes to 64-channel VAE latents (runtime.md §5).

Per chunk of n frames (chunking: `chunk_ranges`): the AR expert is prefilled over prefix + codec ids + MUSIC_END
(A tokens) and its per-layer K/V kept; the NAR input for L = n + 2 slots (zero START row, n frames, zero END row) is
`vae2llm(state) + time_embedder(t̃) + pe[0 … L−1]`; NAR layer i attends, without a mask, to [AR K/V of layer i ‖
its own K/V] with RoPE positions A … A+L−1; the output `llm2vae(norm(x))[1:-1]` is the velocity (≈ noise − data).
`solve` integrates 32 explicit-midpoint steps from t = 1 (noise) to 0 with the state kept in the model dtype (opt-in:
`method="ab2"`, one evaluation per step). On CUDA one evaluation is captured per chunk as a CUDA graph and replayed.

Module tree = checkpoint keys under `model.diffusion_model.`: `model.layers.{i}.…`, `model.norm`, `vae2llm`,
`llm2vae`, `time_embedder.mlp.{0,2}`, `latent_pos_embed.pe`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .constants import CODEC_OFFSET, CODEC_SIZE, CONTEXT, LATENT_DIM, MAX_ODE_STEPS, MUSIC_END, RAW_T_CLAMP
from .errors import RequestError
from .layers import (CUDA_ONLY_BACKENDS, UNMASKED_BACKENDS, Block, ModelDims, RMSNorm, make_linear, rope_cos_sin,
                     unmasked_attention)
from .switches import choice, flag


class TimestepEmbedder(nn.Module):
    """t̃ [N] on the 0…1 scale → [N, H]: [cos(t̃·f) ‖ sin(t̃·f)] with f_j = exp(−ln(10000)·j/128), j < 128, in fp32
    (cos first), cast to the model dtype, then Linear(256→H) → SiLU → Linear(H→H) (runtime.md §5.5)."""

    def __init__(self, hidden: int, freq: int, quant: dict, dtype):
        super().__init__()
        self.freq = freq
        self.mlp = nn.Sequential(
            make_linear(freq, hidden, bias=True, quant_group=quant.get("time_embedder.mlp.0"), dtype=dtype),
            nn.SiLU(),
            make_linear(hidden, hidden, bias=True, quant_group=quant.get("time_embedder.mlp.2"), dtype=dtype))

    def forward(self, t: torch.Tensor, dtype) -> torch.Tensor:
        half = self.freq // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = t.float().unsqueeze(-1) * freqs.unsqueeze(0)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(emb.to(dtype))


class _PosEmbed(nn.Module):
    def __init__(self, rows: int, hidden: int, dtype):
        super().__init__()
        self.register_buffer("pe", torch.zeros(rows, hidden, dtype=dtype))


class _Backbone(nn.Module):
    def __init__(self, dims: ModelDims, quant: dict, dtype):
        super().__init__()
        self.layers = nn.ModuleList(Block(dims, quant, f"model.layers.{i}.", dtype) for i in range(dims.layers))
        self.norm = RMSNorm(dims.hidden, dims.eps, dtype)


class NARModel(nn.Module):
    """NAR expert (the `model.diffusion_model.` tree). `timestep_shift` = 1.0 in the release (runtime.md §4.1)."""

    def __init__(self, dims: ModelDims, quant: dict | None = None, dtype=torch.bfloat16, timestep_shift: float = 1.0):
        super().__init__()
        quant = quant or {}
        self.dims, self.timestep_shift = dims, timestep_shift
        self.model = _Backbone(dims, quant, dtype)
        self.vae2llm = make_linear(dims.latent_dim, dims.hidden, bias=True, quant_group=quant.get("vae2llm"),
                                   dtype=dtype)
        self.llm2vae = make_linear(dims.hidden, dims.latent_dim, bias=True, quant_group=quant.get("llm2vae"),
                                   dtype=dtype)
        self.time_embedder = TimestepEmbedder(dims.hidden, dims.time_freq, quant, dtype)
        self.latent_pos_embed = _PosEmbed(dims.pe_rows, dims.hidden, dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def shifted_t(self, raw_t: float | torch.Tensor) -> torch.Tensor:
        """t̃ = shift·σ/(1 + (shift−1)·σ), σ = sigmoid(raw_t) computed in the model dtype on the device. `raw_t`: a
        Python float, or a 0-d tensor of the model dtype on the device (what a CUDA graph reads at replay; a float
        stored into such a tensor by `fill_` is rounded exactly as `torch.tensor(raw_t, dtype=…)` rounds it)."""
        if not isinstance(raw_t, torch.Tensor):
            raw_t = torch.tensor(raw_t, dtype=self.dtype, device=self.device)
        s = torch.sigmoid(raw_t)
        shift = self.timestep_shift
        return shift * s / (1 + (shift - 1) * s)


def attention_backend(device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                      head_dim: int | None = None) -> str:
    """The backend of the NAR attention (`layers.unmasked_attention`): YUE2_NAR_ATTN = auto (default) | gqa | fa3 |
    cudnn | flash | efficient | math. auto = "fa3" where FlashAttention-3 can run for the model on `device`, in
    `dtype`, with heads of `head_dim` (`fast.flash_attn.unusable_for`: a Hopper GPU, compute capability 9.x, and an
    interface that imports — PyPI fa3-fwd or flash-attn-4, or a flash-attention hopper/ build; on an H200 0.868 ms
    at the song's shapes against 1.019 ms for PyTorch's choice, docs/experiments/nar_fa3_h200_2026-12-04.log) —
    else "gqa", PyTorch's own choice (on an H200 with torch 2.11 and cuDNN 9.19 that is cuDNN's Hopper kernel; 1.07
    ms with the heads folded for cuDNN, 1.82 flash, 3.50 efficient: bench/nar_attention.py,
    docs/experiments/nar_attention_h200_2026-11-30.log). A FlashAttention package that is installed but fails to
    import gets one warning per process on a Hopper GPU. The others stay selectable for GPUs where the automatic
    choice is worse. A backend of CUDA GPUs only (`layers.CUDA_ONLY_BACKENDS`: fa3, cudnn, efficient) named for a
    model on another device is "gqa" there, without a word: the switch check warned before the work (a CPU run).
    Raises RequestError for another value."""
    name = choice("YUE2_NAR_ATTN", ("auto",) + UNMASKED_BACKENDS, "auto")
    if name in CUDA_ONLY_BACKENDS and device is not None and torch.device(device).type != "cuda":
        return "gqa"
    if name != "auto":
        return name
    hopper = (device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
              and torch.version.hip is None and torch.cuda.get_device_capability(torch.device(device))[0] == 9)
    if not hopper:  # where FlashAttention-3 was measured faster
        return "gqa"
    from .fast import flash_attn
    if flash_attn.unusable_for(device, dtype or torch.bfloat16, head_dim or 128) is None:
        return "fa3"
    if flash_attn.find() is None and flash_attn.broken() and not _FA3_WARNED:  # installed, but it cannot load
        _FA3_WARNED.append(1)
        import warnings
        warnings.warn(f"FlashAttention-3 is installed but does not import ({flash_attn.broken()}); the NAR uses "
                      "PyTorch's attention (reinstall it for this torch/CUDA, or set YUE2_NAR_ATTN=gqa)")
    return "gqa"


_FA3_WARNED: list = []  # the warning above, once per process


_NAR_STREAMS: dict = {}  # device → the NAR's own side stream (only while decode graphs may be captured beside it)
_GRAPH_FAILED: dict[str, str] = {}  # device → why capturing the NAR velocity failed (eager from then on, one warning)


def graph_wanted(device: torch.device) -> bool:
    """Whether `ChunkRenderer` captures its velocity in a CUDA graph on `device`: a CUDA device, YUE2_NAR_GRAPH not
    "0" (validated on every device: RequestError for a value other than 0/1), and no capture failed on that device
    before in this process (`_GRAPH_FAILED`)."""
    want = flag("YUE2_NAR_GRAPH", True)
    return want and torch.device(device).type == "cuda" and str(device) not in _GRAPH_FAILED


class ChunkRenderer:
    """One chunk's conditioning and velocity field. `ar_kv` = per-layer (K, V) [1, nkv, A, D] of the chunk's AR
    tokens from `ARModel.layer_kv` (copied into per-layer [AR ‖ NAR] buffers, so the caller may drop it);
    `frames` = n. The AR part is invariant during the solve.

    `graph` (default: `graph_wanted`, i.e. on CUDA unless YUE2_NAR_GRAPH=0): the first `velocity` runs eagerly on a
    side stream (kernel choice, Triton compilation, workspaces), the second captures one evaluation in a CUDA graph
    — static state and timestep buffers, the timestep a 0-d device tensor filled before each replay, the [AR ‖ NAR]
    K/V buffers fixed for the chunk — and every later one replays it: the same kernels in the same order as the
    eager path, so the same bits, without ~2 ms of host launch time per evaluation of the full model. A capture that
    fails (any exception) leaves the renderer eager, with one warning per device and process. `close()` frees the
    graph and its private memory pool (one evaluation's activations) at once."""

    def __init__(self, nar: NARModel, ar_kv: list[tuple[torch.Tensor, torch.Tensor]], frames: int,
                 fused: bool | None = None, ar_len: int | None = None, graph: bool | None = None):
        if len(ar_kv) != nar.dims.layers:
            raise RequestError(f"AR K/V has {len(ar_kv)} layers, the NAR expert {nar.dims.layers}")
        self.nar, self.frames = nar, frames
        self.graphed = graph_wanted(nar.device) if graph is None else bool(graph) and nar.device.type == "cuda"
        self.evaluations = 0  # velocity calls so far (the first is the eager warm-up of a graphed renderer)
        self._graph = self._g_state = self._g_raw = self._g_out = self._side = None
        if fused is None:
            fused = flag("YUE2_FUSED", True) and nar.device.type == "cuda"
        if fused:
            from .fast import fused as fused_mod
            d = nar.dims
            fused = fused_mod.available() and fused_mod.supports(d.heads, d.kv_heads, d.head_dim)
        self.fused = bool(fused)
        self.attention = attention_backend(nar.device, nar.dtype, nar.dims.head_dim)
        self.ar_len = ar_kv[0][0].shape[2] if ar_len is None else ar_len
        self.length = frames + 2
        if self.ar_len + self.length > CONTEXT:
            raise RequestError(f"chunk of {frames} frames after {self.ar_len} AR tokens exceeds the {CONTEXT} context")
        dev = nar.device
        positions = torch.arange(self.ar_len, self.ar_len + self.length, device=dev)[None]
        self.cos, self.sin = rope_cos_sin(positions, nar.dims.head_dim, nar.dims.rope_theta)
        self.positions = positions[0]
        local = torch.arange(self.length, device=dev).clamp(max=nar.dims.pe_rows - 1)
        self.pos_emb = nar.latent_pos_embed.pe[local][None]
        # one [AR ‖ NAR] key/value buffer per layer: the AR part is written once, the NAR tail on every evaluation
        total = self.ar_len + self.length
        if all(k.shape[2] == total for k, _ in ar_kv):  # made by layer_kv(..., extra=n + 2): used in place
            self.keys, self.values = [k for k, _ in ar_kv], [v for _, v in ar_kv]
            return
        self.keys, self.values = [], []
        for k, v in ar_kv:
            kb = k.new_empty(k.shape[0], k.shape[1], self.ar_len + self.length, k.shape[3])
            vb = torch.empty_like(kb)
            kb[:, :, :self.ar_len] = k[:, :, :self.ar_len]
            vb[:, :, :self.ar_len] = v[:, :, :self.ar_len]
            self.keys.append(kb)
            self.values.append(vb)

    def velocity(self, state: torch.Tensor, raw_t: float) -> torch.Tensor:
        """state [n, 64] in the model dtype → velocity [n, 64] (a new tensor) at raw timestep `raw_t` (t̃ =
        sigmoid(raw_t)); graphed on CUDA as the class says."""
        self.evaluations += 1
        if self.graphed and self.evaluations > 1:
            out = self._replay(state, raw_t)
            if out is not None:
                return out
        if self.graphed and self.evaluations == 1:  # warm-up on the capture stream, as the capture will run
            return self._on_capture_stream(lambda: self._velocity(state, raw_t))
        return self._velocity(state, raw_t)

    def _velocity(self, state: torch.Tensor, raw_t: float | torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self._velocity_fused(state, raw_t)
        nar = self.nar
        x_nar = torch.nn.functional.pad(state, (0, 0, 1, 1))
        x = nar.vae2llm(x_nar[None])
        x = x + nar.time_embedder(nar.shifted_t(raw_t).expand(self.length), nar.dtype)[None]
        x = x + self.pos_emb
        b, t, _ = x.shape
        for layer, keys, values in zip(nar.model.layers, self.keys, self.values):
            q, k, v = layer.self_attn.project(layer.input_layernorm(x), self.cos, self.sin)
            keys[:, :, self.ar_len:] = k.transpose(1, 2)
            values[:, :, self.ar_len:] = v.transpose(1, 2)
            h = unmasked_attention(q.transpose(1, 2), keys, values, self.attention)
            x = x + layer.self_attn.o_proj(h.transpose(1, 2).reshape(b, t, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return nar.llm2vae(nar.model.norm(x))[0, 1:-1]

    # -- CUDA graph --------------------------------------------------------------------------------------------
    def _stream(self) -> "torch.cuda.Stream":
        """The side stream of the warm-up and the capture, chosen at the first evaluation: `fast.decode`'s capture
        stream (its cuBLAS workspace exists already: PyTorch keeps one per stream for the process), or — while
        another thread may capture decode graphs on that stream (`fast.decode.concurrent_capture`, the batch
        command's render worker) — a stream of the NAR's own."""
        if getattr(self, "_side", None) is None:
            from .fast import decode as fd
            if fd.thread_capture_stream() is not None:  # a green context's stream (batch overlap, fd.capture_on)
                self._side = fd.thread_capture_stream()
            elif getattr(fd, "_CONCURRENT", [0])[0]:
                key = str(self.nar.device)
                if key not in _NAR_STREAMS:
                    _NAR_STREAMS[key] = torch.cuda.Stream(self.nar.device)
                self._side = _NAR_STREAMS[key]
            else:
                self._side = fd._capture_stream(self.nar.device)
        return self._side

    def _on_capture_stream(self, fn):
        """fn() on the side stream the graph is captured on, ordered after and before the current stream's work."""
        dev = self.nar.device
        stream, current = self._stream(), torch.cuda.current_stream(dev)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            out = fn()
        current.wait_stream(stream)
        out.record_stream(current)  # allocated on the side stream, read on this one
        return out

    def _capture(self, state: torch.Tensor) -> None:
        """Capture one evaluation on the side stream, under `fast.decode.CAPTURE_LOCK`, through
        `fast.decode.capture_on_stream` (the first error of a failed capture is the one raised, the current stream
        restored). Alone on the GPU in capture mode "global" after what `torch.cuda.graph` does on entry (a device
        synchronize and `empty_cache()`, which returns earlier chunks' graph pools). While another thread works on the
        GPU (the batch command's render worker beside the AR, `fast.decode._CONCURRENT`) as the AR decoder captures
        there, `fast.decode._capture_beside_worker`: mode "thread_local" and without that entry, whose synchronize
        would wait for the other thread's queued work (measured on an H200: 16 batch songs 104.0 → 102.9 s,
        docs/experiments/batch_h200_2026-12-04_a29852a_fa3.log; alone on the GPU the two styles take the same time,
        docs/experiments/nar_fa3_h200_2026-12-04.log). The stream's earlier work is ordered by `wait_stream`."""
        from .fast import decode as fd
        nar = self.nar
        self._g_state = torch.empty_like(state, memory_format=torch.contiguous_format)
        self._g_raw = torch.zeros((), dtype=nar.dtype, device=nar.device)
        graph = torch.cuda.CUDAGraph()
        stream, current = self._stream(), torch.cuda.current_stream(nar.device)

        def evaluation():
            self._g_out = self._velocity(self._g_state, self._g_raw)

        with fd.CAPTURE_LOCK:  # _CONCURRENT read and the capture together
            stream.wait_stream(current)
            if fd._CONCURRENT[0]:
                fd._capture_beside_worker(graph, None, stream, evaluation)
            else:
                fd.capture_on_stream(graph, None, stream, evaluation, "global", settle=True)
            current.wait_stream(stream)
        self._graph = graph

    def _replay(self, state: torch.Tensor, raw_t: float) -> torch.Tensor | None:
        """The graphed evaluation (captured on the first call after the warm-up), or None once it failed."""
        if self._graph is None:
            try:
                self._capture(state)
            except Exception as exc:  # capture refused (an op that syncs, an allocator or driver error): eager
                from .errors import brief
                self.close()
                self.graphed = False
                key = str(self.nar.device)
                if key not in _GRAPH_FAILED:
                    _GRAPH_FAILED[key] = brief(exc)
                    import warnings
                    warnings.warn(f"CUDA graph of the NAR velocity unavailable on {key} ({_GRAPH_FAILED[key]}); "
                                  "the renderer runs its kernels eagerly (same results, ~2 ms more per evaluation)")
                return None
        self._g_state.copy_(state)
        self._g_raw.fill_(raw_t)
        self._graph.replay()
        return self._g_out.clone()  # the static output is overwritten by the next replay

    def close(self) -> None:
        """Free the captured graph, its memory pool and static buffers (the renderer stays usable, eagerly)."""
        self._graph = self._g_state = self._g_raw = self._g_out = None
        self.graphed = False

    def _velocity_fused(self, state: torch.Tensor, raw_t: float | torch.Tensor) -> torch.Tensor:
        """`velocity` with the fused Triton kernels of `fast.fused` (same rounding points: add+RMSNorm,
        QK-norm+RoPE writing k/v into the key buffers, SiLU·up), for CUDA."""
        from .fast import fused
        nar, d = self.nar, self.nar.dims
        x = nar.vae2llm(torch.nn.functional.pad(state, (0, 0, 1, 1))[None])
        x = x + nar.time_embedder(nar.shifted_t(raw_t).expand(self.length), nar.dtype)[None]
        x = x + self.pos_emb
        cos, sin = self.cos[0], self.sin[0]
        delta = None
        for layer, keys, values in zip(nar.model.layers, self.keys, self.values):
            att = layer.self_attn
            x, qkv = _norm_product(x, delta, layer.input_layernorm.weight, d.eps, att.qkv_proj)
            q = fused.qk_norm_rope_store(qkv.reshape(self.length, -1), att.q_norm.weight, att.k_norm.weight, cos,
                                         sin, self.positions, keys, values, d.heads, d.kv_heads, d.head_dim, d.eps,
                                         shared_row=True)
            h = unmasked_attention(q.transpose(0, 1)[None], keys, values, self.attention)
            x, gate_up = _norm_product(x, att.o_proj(h.transpose(1, 2).reshape(1, self.length, -1)),
                                       layer.post_attention_layernorm.weight, d.eps, layer.mlp.gate_up_proj)
            delta = _silu_product(gate_up.reshape(self.length, -1), layer.mlp.down_proj)
        return _norm_product(x, delta, nar.model.norm.weight, d.eps, nar.llm2vae)[1][0, 1:-1]


# The W8A8 NAR's producers (stop 52): add+RMSNorm and SiLU·up write the next product's int8 codes and row scales
# themselves (`fast.w8a8.add_rmsnorm_quantize` / `silu_mul_quantize`, the separate quantizer's arithmetic) — the
# separate quantizer read each activation twice, more than the int8 GEMM saved (stop 51, one H100: the solve 0.89×
# the bf16 linears'; stop 52 with the producers 1.03–1.04×). False: the activations written in bf16 and quantized
# apart (bench/nar_w8a8.py compares both).
W8A8_PRODUCERS = True


def _takes_codes(linear, rows: int) -> bool:
    """Whether `linear` (a NAR layer) multiplies `rows` rows from codes made by its producer: a W8A8-marked ConvRot
    linear with groups of 256, no adapter, more rows than the W8A16 kernels take, Triton importable. The device is
    not checked: the only caller, the fused velocity, runs on CUDA (or in Triton's CPU interpreter, in tests)."""
    from .fast import w8a8
    from .fast.int8_kernels import MAX_ROWS
    from .weights.quant import ConvRotLinear
    return (W8A8_PRODUCERS and isinstance(linear, ConvRotLinear) and linear.w8a8 and linear.lora_side is None
            and linear.group == 256 and linear.in_features % 256 == 0 and rows > MAX_ROWS and w8a8.available())


def _norm_product(x: torch.Tensor, delta, w: torch.Tensor, eps: float, linear) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, linear(RMSNorm(x + delta)·w)) for x [1, L, hidden] bf16 — through codes written by the norm when
    `_takes_codes`, else `fast.fused.add_rmsnorm` and the linear."""
    from .fast import fused
    if x.dtype == torch.bfloat16 and _takes_codes(linear, x.numel() // x.shape[-1]):
        from .fast import w8a8
        x, codes, scales = w8a8.add_rmsnorm_quantize(x, delta, w, eps)
        return x, w8a8.linear_from_codes(linear, codes, scales, tuple(x.shape[:-1]))
    x, y = fused.add_rmsnorm(x, delta, w, eps)
    return x, linear(y)


def _silu_product(gate_up: torch.Tensor, linear) -> torch.Tensor:
    """linear(silu(gate)·up)[None] for gate‖up [L, 2F] — through codes written by SiLU·up when `_takes_codes`."""
    from .fast import fused
    if gate_up.dtype == torch.bfloat16 and _takes_codes(linear, gate_up.shape[0]):
        from .fast import w8a8
        codes, scales = w8a8.silu_mul_quantize(gate_up.contiguous())
        return w8a8.linear_from_codes(linear, codes, scales, (1, gate_up.shape[0]))
    return linear(fused.silu_mul(gate_up)[None])


class _PinnedStaging:
    """Page-locked buffers for `float_linears`' copies between a CPU module and a CUDA work device, grown as needed.
    Copies from and to pageable memory are staged by the driver and synchronous: the full-size NAR's conversion took
    2.04 s alone and 3.84 s beside the Composer's music decode (which it slowed by ≈ 1.1 s); through these buffers
    0.38 s alone and 2.29 s beside it (H100, separate processes, tests/nodes/gpu_nodes_cold.py, 2026-12-06)."""

    def __init__(self, device: torch.device):
        self.device, self.bufs, self.refused = device, {}, False

    def get(self, name: str, nbytes: int) -> torch.Tensor:
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < nbytes:
            buf = self.bufs[name] = torch.empty(max(nbytes, 2 ** 20), dtype=torch.uint8, pin_memory=True)
        return buf[:nbytes]

    def take(self, codes: int, scales: int, weight: int):
        """(codes, scales, weight) buffers of these byte sizes, or None — for good — once page-locked memory was
        refused (a machine or container that limits it): the plain copies then, not the CPU's slow conversion."""
        if self.refused:
            return None
        try:
            return self.get("codes", codes), self.get("scales", scales), self.get("weight", weight)
        except RuntimeError:  # cudaHostAlloc refused
            self.refused = True
            return None


def _dequantize_on(work: torch.device, child, dtype, staging: "_PinnedStaging | None") -> torch.Tensor:
    """`child.dequantized(dtype)` computed on `work` and returned on the child's device, bit-equal to
    `dequantize(weight.to(work), scale.to(work), …).to(child's device)`."""
    from .weights.quant import dequantize
    from .fast.decode import CAPTURE_LOCK
    home = child.weight.device
    # Under CAPTURE_LOCK, which every graph capture holds: the nodes run this on a background thread beside the
    # Composer (`nodes.model.YuE2Model.prefetch`), whose captures in mode "global" the runtime invalidates on any
    # other thread's cudaMalloc, pinned allocation or stream sync (review 43). One layer at a time: a capture waits
    # for at most one layer's conversion.
    with CAPTURE_LOCK:
        q, s = child.weight.detach().contiguous(), child.weight_scale.detach().contiguous()
        bufs = None if staging is None or home.type != "cpu" else staging.take(
            q.numel() * q.element_size(), s.numel() * s.element_size(),
            q.numel() * torch.empty((), dtype=dtype).element_size())
        if bufs is None:  # not a CPU module, or page-locked memory refused: the plain copies (slower, same bits)
            return dequantize(child.weight.to(work), child.weight_scale.to(work), child.group, dtype).to(home)
        src, s_src, dst = bufs
        src.copy_(q.view(-1).view(torch.uint8))
        on_work = src.to(work, non_blocking=True).view(q.dtype).view(q.shape)
        s_src.copy_(s.reshape(-1).view(torch.uint8))
        scale = s_src.to(work, non_blocking=True).view(s.dtype).view(s.shape)
        w = dequantize(on_work, scale, child.group, dtype)
        dst.copy_(w.view(-1).view(torch.uint8), non_blocking=True)
        torch.cuda.current_stream(work).synchronize()  # dst holds the weight; src may be refilled
        shape = w.shape
        del on_work, scale, w  # the device blocks freed under the lock too
        return dst.clone().view(dtype).view(shape)


def float_linears(nar: NARModel, work_device: torch.device | str | None = None, pinned: bool = True) -> int:
    """Replace the NAR's int8 ConvRot linears by bf16 nn.Linear layers holding the dequantized weights (done once,
    in place, on GPUs: the NAR's ~5k-row GEMMs run faster in bf16 than through int8 kernels, performance.md §6.2;
    memory: 2 bytes per weight instead of 1). `work_device` (e.g. the GPU while the module sits on the CPU) does the
    dequantization there one layer at a time — about 20× faster than the CPU's fp32 Hadamard products for the
    full-size NAR — and falls back to the module's device when it runs out of memory. A CUDA work device for a CPU
    module copies through page-locked buffers (`_PinnedStaging`) unless `pinned` is False (ComfyUI's
    `--disable-pinned-memory`). Returns how many layers were converted."""
    from .weights.quant import ConvRotLinear
    work = None if work_device is None else torch.device(work_device)
    staging = _PinnedStaging(work) if pinned and work is not None and work.type == "cuda" else None
    count = 0
    for parent in list(nar.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ConvRotLinear):
                # built on the meta device: nn.Linear's random init of a 2.8 GB NAR takes ~9 s on a CPU, for
                # weights that are overwritten at once
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta",
                                dtype=nar.dtype)
                weight = None
                if work is not None and work != child.weight.device:
                    try:
                        weight = _dequantize_on(work, child, nar.dtype, staging)
                    except (torch.cuda.OutOfMemoryError, RuntimeError):  # out of memory, cuBLAS workspace
                        weight = None
                        if torch.cuda.is_available():
                            from .fast.decode import CAPTURE_LOCK
                            with CAPTURE_LOCK:  # cudaFree: never beside a graph capture (`_dequantize_on`)
                                torch.cuda.empty_cache()
                if weight is None:
                    weight = child.dequantized(nar.dtype)
                lin.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
                if child.bias is not None:
                    lin.bias = nn.Parameter(child.bias.detach().to(nar.dtype).clone(), requires_grad=False)
                setattr(parent, name, lin)
                count += 1
    if staging is not None:
        from .fast.decode import CAPTURE_LOCK
        with CAPTURE_LOCK:  # the page-locked buffers go back to PyTorch's host cache (events recorded): not mid-capture
            staging.bufs.clear()
    return count


NAR_LINEARS_SWITCH = "YUE2_NAR_LINEARS"
NAR_LINEARS = ("bf16", "w8a8", "auto")  # the switch's values; DEFAULT_NAR_LINEARS when unset
DEFAULT_NAR_LINEARS = "auto"  # since stop 53 (W8A8 on Hopper GPUs: w8a8_pays)


def switch_value() -> str:
    """YUE2_NAR_LINEARS as set ("bf16", "w8a8" or "auto"; unset: DEFAULT_NAR_LINEARS). RequestError for another
    value."""
    from .switches import choice
    return choice(NAR_LINEARS_SWITCH, NAR_LINEARS, DEFAULT_NAR_LINEARS)


def _w8a8_runs(dtype: torch.dtype) -> bool:
    """Whether W8A8 products can take a NAR in `dtype`: bf16 activations, and Triton imports."""
    if dtype != torch.bfloat16:
        return False
    from .fast import w8a8
    return w8a8.available()


def w8a8_pays(device: torch.device | str | None = None) -> bool:
    """Whether "auto" takes the W8A8 products on `device` (None: the current CUDA device, if any): a Hopper GPU
    (compute capability 9.x, CUDA not ROCm) — where they were measured faster than the bf16 layers (one H100: a
    song's 32-step solve 3.19–3.21 s against 3.32–3.33, docs/speed.md "The producers write the codes"); other GPUs
    are untried, so they keep the bf16 layers."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    dev = torch.device("cuda") if device is None else torch.device(device)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] == 9


def linears_mode(device: torch.device | str | None = None) -> str:
    """How the int8 file's NAR multiplies on CUDA `device` (YUE2_NAR_LINEARS; None: the current CUDA device):
    "bf16" — its linears dequantized once to bf16 (`float_linears`, 2 bytes a weight); "w8a8" — the int8 codes kept
    and every product (of more than 16 rows: every one of a chunk) int8 × int8 with the activations quantized per
    row as ComfyUI's own `int8_linear` computes them (`int8_linears`, `fast.w8a8`; 1 byte a weight), for a bf16 NAR
    (`prepare_linears`); "auto" resolves to "w8a8" where `w8a8_pays(device)`, else "bf16". Unset: DEFAULT_NAR_LINEARS.
    Returns "bf16" or "w8a8". RequestError for another value."""
    mode = switch_value()
    if mode == "auto":
        return "w8a8" if w8a8_pays(device) else "bf16"
    return mode


def int8_linears(nar: NARModel) -> int:
    """Mark the NAR's int8 ConvRot linears for W8A8 products on CUDA (`quant.ConvRotLinear.w8a8`; inputs of more
    than 16 bf16 rows take `fast.w8a8.linear`, smaller ones and other dtypes the usual paths; adapters' side deltas
    apply on top). The codes stay as they are. Returns how many layers were marked."""
    from .weights.quant import ConvRotLinear
    count = 0
    for module in nar.modules():
        if isinstance(module, ConvRotLinear):
            module.w8a8 = True
            count += 1
    return count


def keeps_w8a8(nar: NARModel) -> bool:
    """Whether any of the NAR's int8 layers is marked for W8A8 products (`int8_linears`; what a song records as
    config.json "weights"."nar_linears": "w8a8")."""
    from .weights.quant import ConvRotLinear
    return any(isinstance(m, ConvRotLinear) and m.w8a8 for m in nar.modules())


def auto_mode() -> bool:
    """Whether YUE2_NAR_LINEARS is "auto" (set so, or unset: DEFAULT_NAR_LINEARS) — the mode in which adapters that
    reach the NAR bring its bf16 layers back (`adapters_want_bf16`)."""
    return switch_value() == "auto"


def adapters_want_bf16(nar: NARModel) -> bool:
    """Whether adapters about to patch `nar` should get its bf16 layers instead of its W8A8 ones: "auto" chose W8A8
    (`keeps_w8a8`). With W8A8 layers each adapted product would add an fp32 side delta beside its int8 codes and lose
    its producer's codes (`_takes_codes`): for a rank-64 adapter ≈ 22 GFLOP of fp32 a layer and evaluation, ≈ 0.8 s a
    3.6-minute song on an H100 (estimate), where bf16 layers take the delta merged at no cost (README, LoRA table:
    1.00). An explicit YUE2_NAR_LINEARS=w8a8 keeps W8A8 with side deltas."""
    return auto_mode() and keeps_w8a8(nar)


def keeps_int8(dtype: torch.dtype, device: torch.device | str | None = None) -> bool:
    """Whether `prepare_linears` keeps the int8 file's NAR layers int8 (marked for W8A8) for a NAR in `dtype` that
    renders on `device` (None: the current CUDA device): `linears_mode(device)` "w8a8", bf16, and Triton imports."""
    return linears_mode(device) == "w8a8" and _w8a8_runs(dtype)


def may_keep_int8(dtype: torch.dtype) -> bool:
    """`keeps_int8` for a NAR in `dtype` that renders on GPUs this process does not choose (`batch --ray`: Ray gives
    each engine actor its GPU, of any kind, maybe on another node): False only where no GPU keeps the int8 layers —
    YUE2_NAR_LINEARS=bf16, a NAR not in bf16, no Triton; "auto" keeps them on any Hopper GPU among the workers,
    except for adapters, which get the bf16 layers there (`adapters_want_bf16`; callers asking for adapters check
    `auto_mode` first) (review, stop 53: the driver asked its own device, and a driver without a GPU, or of another
    kind than the workers, recorded no YUE2_LORA_INT8 mode for a NAR-only LoRA that went onto the workers' int8
    layers)."""
    return switch_value() != "bf16" and _w8a8_runs(dtype)


def prepare_linears(nar: NARModel, work_device: torch.device | str | None = None, pinned: bool = True,
                    layers: str | None = None) -> int:
    """What a CUDA render does to the int8 file's NAR before its first use, by `linears_mode()`: `float_linears`
    (bf16) or `int8_linears` (w8a8). W8A8 takes bf16 activations and Triton: a NAR in another dtype
    (--dtype fp32, a GPU without bf16) or without Triton gets the float layers as by default — its marked layers
    would otherwise have dequantized the whole weight in every product (stop-48 diff review). `work_device` (None:
    the NAR's own device) is where it will render, which "auto" asks; `layers="bf16"` gives the bf16 layers whatever
    the switch says (the nodes' NAR for adapters, `adapters_want_bf16`). Returns the number of layers changed or
    marked."""
    if layers != "bf16" and keeps_int8(nar.dtype, work_device if work_device is not None else nar.device):
        return int8_linears(nar)
    return float_linears(nar, work_device=work_device, pinned=pinned)


def raw_timesteps(steps: int = 32) -> list[tuple[float, float]]:
    """(raw_t, raw_t_mid) per midpoint step: clamp(logit(t), ±20) in float64 for t = 1 − k/steps and t − 1/(2·steps)
    (runtime.md §5.6; t = 1 gives 20, t = 0 is never evaluated)."""
    check_steps(steps)
    dt = 1.0 / steps
    out = []
    for k in range(steps):
        t = 1.0 - k * dt
        pair = [torch.logit(torch.tensor(x, dtype=torch.float64)).clamp(-RAW_T_CLAMP, RAW_T_CLAMP).item()
                for x in (t, t - dt / 2)]
        out.append((pair[0], pair[1]))
    return out


def check_steps(steps) -> int:
    """`steps` if it is an integer number of ODE steps in [1, MAX_ODE_STEPS] (constants.py; the release renders
    32), else RequestError. Called before any model work: a value the save would refuse (> 1000), or a zero, once
    failed only after the lead sheet and the music tokens had been sampled (break-it finding)."""
    import numbers
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or not 1 <= steps <= MAX_ODE_STEPS:
        raise RequestError(f"steps (ODE steps of the flow-matching render) must be an integer in [1, "
                           f"{MAX_ODE_STEPS}] — the release renders 32 —, got {steps!r}")
    return int(steps)


ODE_METHODS = ("midpoint", "ab2")  # solve(method=…): the release's explicit midpoint (default), opt-in AB2


def check_method(method) -> str:
    """`method` if it names an ODE solver of `solve` (ODE_METHODS), else RequestError naming the accepted values."""
    if not isinstance(method, str) or method not in ODE_METHODS:
        raise RequestError(f"the ODE method must be one of {', '.join(repr(m) for m in ODE_METHODS)} "
                           f"(midpoint is the release's solver), got {method!r}")
    return method


def solve(renderer: ChunkRenderer, noise: torch.Tensor, steps: int = 32,
          on_step: Callable[[int, int], None] | None = None, states: list | None = None, *,
          method: str = "midpoint") -> torch.Tensor:
    """Integrate the flow from t = 1 (noise) to 0 in `steps` steps of dt = 1/steps. noise [n, 64] fp32 → latents
    [n, 64] fp32 on CPU. `states` (optional list) receives each step's start state and the final one.

    method "midpoint" (the release's, runtime.md §5.6; 2 evaluations per step): mid = x − v(x, t)·dt/2,
    x ← x − v(mid, t − dt/2)·dt, all in the model dtype.
    method "ab2" (opt-in, 1 evaluation per step): second-order Adams–Bashforth on the velocities at the step starts,
    x ← x − dt·(3/2·v_k − 1/2·v_{k−1}); the first step is an explicit Euler step x ← x − dt·v_0 (so exactly `steps`
    evaluations; one first-order step keeps the global error O(dt²)). Its state stays in fp32 through the solve
    (rounded to the model dtype only as the model's input): in bf16 a step's increment v·dt is a small fraction of
    the state and bf16 rounding would drop a good part of it — the midpoint keeps the release's bf16 state. Same
    timesteps t_k = 1 − k/steps as the midpoint's step starts (`raw_timesteps`).

    Raises RequestError for an unknown `method` (check_method), NumericalError (a FloatingPointError) on a
    non-finite result."""
    check_method(method)
    nar = renderer.nar
    state = noise.to(device=nar.device, dtype=nar.dtype if method == "midpoint" else torch.float32)
    dt = 1.0 / steps
    previous = None  # AB2: v_{k−1} in fp32
    for k, (raw, raw_mid) in enumerate(raw_timesteps(steps)):
        if states is not None:
            states.append(state.float().cpu())
        if method == "midpoint":
            mid = state - renderer.velocity(state, raw) * (dt / 2)
            state = state - renderer.velocity(mid, raw_mid) * dt
        else:
            v = renderer.velocity(state.to(nar.dtype), raw).float()
            slope = v if previous is None else 1.5 * v - 0.5 * previous
            state = state - dt * slope
            previous = v
        if on_step is not None:
            on_step(k + 1, steps)
    result = state.float().cpu()
    if states is not None:
        states.append(result)
    if not torch.isfinite(result).all():
        from .errors import NumericalError
        from .weights.own import blame
        raise NumericalError(blame("flow matching produced non-finite latents (NaN/inf): the NAR weights look "
                                   "damaged — download the checkpoint again", nar))
    return result


def chunk_ranges(frames: int, prefix_len: int, context: int = CONTEXT) -> list[tuple[int, int]]:
    """Contiguous, non-overlapping frame ranges: size = min((context − P − 3) // 2, context), ranges [a, a+size) over
    N frames (runtime.md §5.1). ValueError (RequestError) when N < 1 or size < 1."""
    size = min((context - prefix_len - 3) // 2, context)
    if frames < 1 or size < 1:
        raise RequestError("Empty codec or prefix leaves no acoustic context")
    return [(a, min(a + size, frames)) for a in range(0, frames, size)]


def song_noise(frames: int, seed: int) -> torch.Tensor:
    """`torch.randn((N, 64))` fp32 from a CPU generator seeded with `seed`, drawn once for the whole song."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn((frames, LATENT_DIM), dtype=torch.float32, device="cpu", generator=g)


def chunk_tokens(prefix: list[int], codes: list[int], a: int, b: int) -> list[int]:
    """AR tokens of chunk [a, b): prefix + (151853 + code) for its codes + MUSIC_END."""
    return list(prefix) + [CODEC_OFFSET + int(c) for c in codes[a:b]] + [MUSIC_END]


@torch.inference_mode()
def render(ar, nar: NARModel, prefix: list[int], codes: list[int], seed: int, steps: int = 32,
           on_step: Callable[[int, int], None] | None = None, noise: torch.Tensor | None = None, *,
           method: str = "midpoint") -> torch.Tensor:
    """Semantic codes [N] (0 … 32767) → latents [N, 64] fp32 (CPU), chunk by chunk. `on_step(done, total)` counts
    ODE steps over all chunks and may raise to cancel; each chunk's AR cache and velocity graph are freed before the
    next. `method`: the ODE solver of `solve` ("midpoint", the default, or "ab2"); RequestError for another."""
    check_method(method)
    if not codes:
        raise RequestError("there are no semantic codes to render")
    if any(not 0 <= int(c) < CODEC_SIZE for c in codes):
        raise RequestError(f"semantic codes must be in [0, {CODEC_SIZE})")
    ranges = chunk_ranges(len(codes), len(prefix))
    noise = song_noise(len(codes), seed) if noise is None else noise
    total = steps * len(ranges)
    out = []
    for j, (a, b) in enumerate(ranges):
        tokens = chunk_tokens(prefix, codes, a, b)
        renderer = ChunkRenderer(nar, ar.layer_kv(tokens, extra=b - a + 2), b - a, ar_len=len(tokens))
        step_cb = None if on_step is None else (lambda k, n, j=j: on_step(j * steps + k, total))
        try:
            out.append(solve(renderer, noise[a:b], steps, step_cb, method=method))
        finally:
            renderer.close()
        del renderer
    return torch.cat(out, dim=0)
