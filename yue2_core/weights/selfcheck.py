"""Load-time self-checks: the int8 ConvRot weights (refuse a file that would render noise) and the embedded tokenizer.

Users of other YuE2 packs meet broken int8 paths as "the song is noise" with no error (user_reports.md §3.3). This
module turns that into a `CheckpointError` naming the module, at load time, for the price of a few hundred rows:

    check_int8(model_or_info, rows=8, layers=None, tol=0.05) -> dict      int8 weights (raises CheckpointError)
    check_tokenizer(tokenizer_or_info) -> dict                           tokenizer JSON (raises TokenizerError)
    selfcheck(info_or_engine) -> dict                                    both

`check_int8` accepts a loaded `ARModel` / `NARModel` (what `checkpoint.load_ar` / `load_nar` return: call it right
after loading), a `YuE2Engine`, or a `CheckpointInfo` (then the rows are read straight from the file). It looks at
two kinds of evidence:

1. Format invariants of every quantized module (checkpoint_format.md §1.5, §2.2). The stored rule is
   s_n = max|Ŵ[n, :]| / 127 and q = round(Ŵ / s_n), so:
   - `weight_scale` holds one scale per row ([out, 1] or [out]), every scale finite and > 0 (all rows checked);
   - codes lie in [−127, 127] — the code −128 never occurs ("overflow");
   - the largest |code| of every non-zero row is 127 (≥ 126 allowing for a rounded scale): codes that are not
     paired with their scales (shuffled, taken from another tensor, a wrong layout) break this;
   - only a few codes per row sit at ±127 (many saturated codes = clipped rows, scale too small);
   - a module's typical scale is within `MAX_SCALE_RATIO` of the file's typical scale (a scale tensor multiplied by
     1000 renders noise without breaking any other rule).
   Codes are checked on `SAMPLE_ROWS` rows per module (in 8 contiguous blocks); scales on every row.
2. Numerics on `rows` rows of the layers in `layers` (default: first and last, AR and NAR) and of every quantized
   module outside the layers (embed_tokens, lm_head, llm2vae, time_embedder): the module's own forward — the code
   path that renders, e.g. the Triton W8A16 kernel on CUDA — on random inputs (ConvRotLinear) or looked-up rows
   (ConvRotEmbedding), against a float64 reference y = x · ((q·s)·H)ᵀ built here from the raw codes with its own
   Hadamard matrix. Relative error above `tol` (default 5 %; bf16 rounding gives < 1 %, a missing or wrong rotation
   ~100 %) fails.

Cost is independent of the model size apart from reading all row scales (1.5 M floats for the release): well under
a second on a CPU.
"""
from __future__ import annotations

import copy
import functools
import re
import time
import unicodedata

import torch

from ..constants import EOD
from ..errors import CheckpointError, TokenizerError

AR_PREFIX = "text_encoders."
NAR_PREFIX = "model.diffusion_model."
SAMPLE_ROWS = 64  # code rows per module for the format invariants (8 blocks of 8)
MIN_ROW_MAX = 126  # largest |code| of a non-zero row: 127 by construction; 126 tolerates a rounded scale
SATURATION = 1 / 32  # more than this share of a row's codes at ±127 (and more than 8) = clipped row
MAX_SCALE_RATIO = 100.0  # a module's median row scale vs the median over all modules
DEFAULT_TOL = 0.05  # relative Frobenius error of the module forward vs the float64 reference
PROBE_TEXT = ("[Verse]\nHello, world — it's 9:41 AM & the tape rolls (x2)\n"
              "你好，世界！「こんにちは」。ＡＢＣ　１２３\nCafé naïve ①\n")
_R4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.", re.ASCII)


class _Module:
    """One quantized module, from a loaded model or from the file.

    `scale()` → the stored scale tensor (any shape); `rows(a, b)` → int8 codes of rows [a, b) on the CPU;
    `subset(idx)` → (module, ids): for a linear, a ConvRotLinear holding only rows `idx` (ids None); for an
    embedding, a ConvRotEmbedding and the ids that look up rows `idx`. `dtype`/`device`: where inputs go."""

    def __init__(self, key, kind, out_f, in_f, group, layer, scale, rows, subset, dtype, device):
        self.key, self.kind, self.out_f, self.in_f, self.group, self.layer = key, kind, out_f, in_f, group, layer
        self.scale, self.rows, self.subset, self.dtype, self.device = scale, rows, subset, dtype, device


# ------------------------------------------------------------------------------------------------------------------
# Module sources
# ------------------------------------------------------------------------------------------------------------------

def _prefix_of(model) -> str:
    from ..ar import ARModel
    from ..nar import NARModel
    if isinstance(model, ARModel):
        return AR_PREFIX
    if isinstance(model, NARModel):
        return NAR_PREFIX
    return ""


def _layer_of(name: str):
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def _linear_rows(m, idx: torch.Tensor):
    """A copy of ConvRotLinear `m` holding only output rows `idx` (same class, same instance attributes, so its
    forward runs the exact code path of the real module) without touching `m`."""
    sub = copy.copy(m)
    sub._parameters = dict(m._parameters)
    sub._buffers = dict(m._buffers)
    sub._modules = dict(m._modules)
    sub._buffers["weight"] = m.weight.index_select(0, idx.to(m.weight.device))
    scale = m.weight_scale
    if scale.numel() > 1:
        scale = scale.reshape(m.weight.shape[0], -1).index_select(0, idx.to(scale.device))
    sub._buffers["weight_scale"] = scale
    if "bias" in sub._parameters:
        sub._parameters["bias"] = None
    else:
        sub.bias = None
    sub.out_features = int(idx.numel())
    if hasattr(sub, "_cpu_cache"):
        sub._cpu_cache = None
    return sub


def _model_modules(model, prefix: str | None = None) -> list[_Module]:
    """Quantized modules of a loaded model tree. Linear inputs are made in the model's compute dtype (`model.dtype`,
    bf16 when the model has none): the dtype the module sees when rendering. Run this before anything replaces the
    int8 modules (e.g. `nar.float_linears` on GPUs) — it checks the ConvRot modules it finds."""
    from .quant import ConvRotEmbedding, ConvRotLinear
    prefix = _prefix_of(model) if prefix is None else prefix
    dtype = getattr(model, "dtype", None)
    dtype = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16
    out = []
    for name, m in model.named_modules():
        if isinstance(m, ConvRotLinear):
            kind = "linear"
        elif isinstance(m, ConvRotEmbedding):
            kind = "embedding"
        else:
            continue
        if m.weight.ndim != 2:
            raise CheckpointError(f"{prefix + name}: int8 weight has shape {list(m.weight.shape)}, expected "
                                  "[out, in]")

        def rows(a, b, m=m):
            return m.weight[a:b].detach().to("cpu")

        def subset(idx, m=m, kind=kind):
            if kind == "embedding":
                return m, idx.to(m.weight.device)
            return _linear_rows(m, idx), None

        out.append(_Module(prefix + name, kind, m.weight.shape[0], m.weight.shape[1], int(m.group), _layer_of(name),
                           lambda m=m: m.weight_scale.detach(), rows, subset, dtype, m.weight.device))
    return out


def _file_modules(info, handle, dtype=torch.float32) -> list[_Module]:
    """Quantized modules of a CheckpointInfo, read lazily through an open safetensors `handle` (only the rows asked
    for); the CPU path of ConvRotLinear / ConvRotEmbedding runs in `dtype`."""
    from .quant import ConvRotEmbedding, ConvRotLinear
    out = []
    for prefix, quant in ((AR_PREFIX, info.quant_ar), (NAR_PREFIX, info.quant_nar)):
        for name, group in sorted(quant.items()):
            key = prefix + name
            entry = info.entries[key + ".weight"]
            if len(entry.shape) != 2:
                raise CheckpointError(f"{key}: int8 weight has shape {list(entry.shape)}, expected [out, in]")
            out_f, in_f = entry.shape
            kind = "embedding" if name.endswith("embed_tokens") else "linear"

            def scale(key=key):
                return handle.get_tensor(key + ".weight_scale")

            def rows(a, b, key=key):
                return handle.get_slice(key + ".weight")[a:b]

            def subset(idx, key=key, kind=kind, in_f=in_f, group=group):
                q = torch.cat([handle.get_slice(key + ".weight")[int(i):int(i) + 1] for i in idx])
                s = handle.get_tensor(key + ".weight_scale")
                s = s.reshape(-1, 1)[idx] if s.numel() > 1 else s.reshape(1, 1).expand(len(idx), 1)
                if kind == "embedding":
                    module = ConvRotEmbedding(len(idx), in_f, group=group, dtype=dtype)
                else:
                    module = ConvRotLinear(in_f, len(idx), bias=False, group=group, dtype=dtype)
                module.weight.copy_(q)
                module.weight_scale.copy_(s)
                return module, (torch.arange(len(idx)) if kind == "embedding" else None)

            out.append(_Module(key, kind, out_f, in_f, group, _layer_of(name), scale, rows, subset, dtype,
                               torch.device("cpu")))
    return out


# ------------------------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _hadamard64(group: int) -> torch.Tensor:
    """(R4 ⊗ … ⊗ R4)/√group in float64, built here (independently of quant.hadamard)."""
    if group < 4 or group & (group - 1) or (group.bit_length() - 1) % 2:
        raise CheckpointError(f"convrot_groupsize must be a power of 4; got {group}")
    r4 = torch.tensor(_R4, dtype=torch.float64)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < group:
        h = torch.kron(h, r4)
    return h / group ** 0.5


def _reference_rows(q: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    """W = (q·s)·H per group of columns, float64 [rows, in]."""
    w = q.to(torch.float64) * s.to(torch.float64).reshape(-1, 1)
    n, k = w.shape
    return (w.reshape(n, k // group, group) @ _hadamard64(group)).reshape(n, k)


def _blocks(n: int, count: int, blocks: int = 8) -> list[tuple[int, int]]:
    """`count` rows of [0, n) as up to `blocks` contiguous, evenly spaced ranges (first and last rows included)."""
    if n <= count:
        return [(0, n)]
    size = max(1, count // blocks)
    starts = sorted({round(i * (n - size) / (blocks - 1)) for i in range(blocks)})
    return [(a, a + size) for a in starts]


def _spread(n: int, count: int) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(count, n)).round().long().unique()


def _scale_problem(m: _Module, s: torch.Tensor):
    """(problem text or None, median scale)."""
    shape = tuple(s.shape)
    if shape not in ((m.out_f, 1), (m.out_f,), ()) and not (m.out_f == 1 and s.numel() == 1):
        return (f"weight_scale has shape {list(shape)}; a ConvRot module with weight [{m.out_f}, {m.in_f}] stores "
                f"one scale per row, [{m.out_f}, 1]"), None
    if not s.dtype.is_floating_point:
        return f"weight_scale has dtype {s.dtype}; expected float32", None
    s = s.detach().to("cpu", torch.float64).reshape(-1)
    bad = ~torch.isfinite(s)
    if bad.any():
        row = int(bad.nonzero()[0])
        return (f"{int(bad.sum())} row scale(s) are NaN or infinite (first: row {row} = {s[row].item()}); scales "
                "must be finite"), None
    nonpos = s <= 0
    if nonpos.any():
        row = int(nonpos.nonzero()[0])
        return f"{int(nonpos.sum())} row scale(s) are ≤ 0 (first: row {row} = {s[row].item():.3g})", None
    return None, float(s.median())


def _code_problem(m: _Module, sample_rows: int):
    """Format invariants of the codes on sampled rows (int8, [−127, 127], row max 127, little saturation)."""
    blocks = _blocks(m.out_f, sample_rows)
    parts = [m.rows(a, b) for a, b in blocks]
    if any(q.dtype != torch.int8 for q in parts):
        return f"weight has dtype {parts[0].dtype}; ConvRot codes are int8"
    if m.in_f % m.group:
        return f"in_features {m.in_f} is not a multiple of convrot_groupsize {m.group}"
    row_ids = torch.cat([torch.arange(a, b) for a, b in blocks])
    q = torch.cat(parts)
    if bool((q == -128).any()):
        row = int(row_ids[(q == -128).any(dim=1).nonzero()[0]])
        return (f"code −128 in row {row}: ConvRot codes lie in [−127, 127] (s = row absmax / 127), so the codes "
                "overflowed or are not ConvRot codes")
    mag = q.abs()  # int8 is safe: −128 was ruled out above
    row_max = mag.amax(dim=1)
    weak = (row_max < MIN_ROW_MAX) & (row_max > 0)
    if weak.any():
        i = int(weak.nonzero()[0])
        return (f"row {int(row_ids[i])} has largest |code| {int(row_max[i])}, but every row is scaled so that its "
                "largest code is 127: the codes and scales do not belong together (shuffled or foreign codes, or a "
                "wrong layout)")
    saturated = (mag == 127).sum(dim=1)
    limit = max(8, int(m.in_f * SATURATION))
    over = saturated > limit
    if over.any():
        i = int(over.nonzero()[0])
        return (f"row {int(row_ids[i])} has {int(saturated[i])} of {m.in_f} codes at ±127 (at most {limit} "
                "expected): the row was clipped (scale too small for its weights)")
    return None


def _numeric(m: _Module, rows: int, gen: torch.Generator):
    """(relative error, problem, which path) of the module's int8 paths on `rows` rows against the float64 reference: the
    forward (a linear on random inputs, an embedding lookup) and, for a linear, `dequantized()` (what float paths
    such as the NAR's bf16 linears on GPUs are built from)."""
    idx = _spread(m.out_f, rows)
    q = torch.cat([m.rows(int(i), int(i) + 1) for i in idx])
    w = _reference_rows(q, _scale_rows(m, idx), m.group)
    with torch.inference_mode():
        module, ids = m.subset(idx)
        if m.kind == "embedding":
            outputs = [("forward", module(ids), w)]
        else:
            x = torch.randn(4, m.in_f, generator=gen).to(m.dtype)
            outputs = [("forward", module(x.to(m.device)), x.to(torch.float64) @ w.T),
                       ("dequantized weight", module.dequantized(torch.float32), w)]
    worst, worst_what = 0.0, "forward"
    for what, got, ref in outputs:
        got = got.detach().to("cpu", torch.float64)
        if got.shape != ref.shape:
            return float("inf"), f"its int8 {what} has shape {list(got.shape)}, expected {list(ref.shape)}", what
        if not torch.isfinite(got).all():
            return float("inf"), f"its int8 {what} holds NaN/inf", what
        rel = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
        if rel > worst:
            worst, worst_what = rel, what
    return worst, None, worst_what


def _scale_rows(m: _Module, idx: torch.Tensor) -> torch.Tensor:
    s = m.scale().detach().to("cpu", torch.float64)
    return s.reshape(-1)[idx] if s.numel() > 1 else s.reshape(()).expand(len(idx))


def check_int8(model_or_info, rows: int = 8, layers=None, tol: float = DEFAULT_TOL, *, seed: int = 0,
               sample_rows: int = SAMPLE_ROWS) -> dict:
    """Check the int8 ConvRot weights of a loaded model (ARModel, NARModel, YuE2Engine, any module tree) or of a
    checkpoint (CheckpointInfo). `layers`: layer indices for the numeric check (default first and last; negative
    counts from the end); `rows`: rows per module for it; `tol`: allowed relative error.

    Returns {"ok": True, "quantized_modules", "numeric_modules", "max_rel_error", "worst_module", "typical_scale",
    "layers", "seconds"}; a model without int8 modules returns ok with 0 modules. Raises CheckpointError naming the
    module(s) that fail (`.failures` holds every (module, problem) found)."""
    t0 = time.perf_counter()
    if hasattr(model_or_info, "entries") and hasattr(model_or_info, "quant_ar"):
        from .checkpoint import open_tensors
        with open_tensors(model_or_info.path) as handle:
            return _check(_file_modules(model_or_info, handle), rows, layers, tol, seed, sample_rows, t0)
    if hasattr(model_or_info, "ar") and hasattr(model_or_info, "nar"):
        modules = []
        for part in (model_or_info.ar, model_or_info.nar):
            if part is not None:
                modules += _model_modules(part)
    elif isinstance(model_or_info, torch.nn.Module):
        modules = _model_modules(model_or_info)
    else:
        raise TypeError(f"check_int8 needs a model or a CheckpointInfo, got {type(model_or_info).__name__}")
    return _check(modules, rows, layers, tol, seed, sample_rows, t0)


def _selected_layers(modules: list[_Module], layers) -> dict:
    """{prefix: set of layer indices} to check numerically, per expert."""
    by_prefix: dict[str, set] = {}
    for m in modules:
        if m.layer is not None:
            by_prefix.setdefault(_expert(m.key), set()).add(m.layer)
    chosen = {}
    for prefix, present in by_prefix.items():
        last = max(present)
        want = (0, last) if layers is None else tuple(layers)
        chosen[prefix] = {last + 1 + i if i < 0 else i for i in want} & present
    return chosen


def _expert(key: str) -> str:
    for p in (AR_PREFIX, NAR_PREFIX):
        if key.startswith(p):
            return p
    return ""


def _check(modules, rows, layers, tol, seed, sample_rows, t0) -> dict:
    if not modules:
        return {"ok": True, "quantized_modules": 0, "numeric_modules": 0, "max_rel_error": 0.0, "worst_module": None,
                "typical_scale": None, "layers": {}, "seconds": time.perf_counter() - t0}
    failures: list[tuple[str, str]] = []
    medians = {}
    for m in modules:
        try:
            _hadamard64(m.group)
        except CheckpointError as exc:
            failures.append((m.key, str(exc)))
            continue
        problem, median = _scale_problem(m, m.scale())
        if problem is None:
            problem = _code_problem(m, sample_rows)
        if problem:
            failures.append((m.key, problem))
        else:
            medians[m.key] = median
    typical = None
    if len(medians) >= 3:
        typical = float(torch.tensor(list(medians.values()), dtype=torch.float64).median())
        for key, med in medians.items():
            ratio = med / typical
            if not 1 / MAX_SCALE_RATIO <= ratio <= MAX_SCALE_RATIO:
                failures.append((key, f"its row scales are typically {med:.3g}, {ratio:.3g}× the file's typical "
                                      f"{typical:.3g} (allowed {1 / MAX_SCALE_RATIO:g}…{MAX_SCALE_RATIO:g}×): the "
                                      "scales were altered"))
    chosen = _selected_layers(modules, layers)
    gen = torch.Generator().manual_seed(seed)
    worst, worst_key, numeric = 0.0, None, 0
    bad_keys = {k for k, _ in failures}
    for m in modules:
        if m.key in bad_keys:
            continue
        if m.layer is not None and m.layer not in chosen.get(_expert(m.key), ()):
            continue
        rel, problem, what = _numeric(m, rows, gen)
        numeric += 1
        if problem is None and rel > tol:
            problem = (f"its int8 {what} differs from the dequantized reference by {rel:.1%} (tolerance "
                       f"{tol:.0%}): the ConvRot kernel/rotation on this device is wrong")
        if problem:
            failures.append((m.key, problem))
        if rel > worst or worst_key is None:
            worst, worst_key = rel, m.key
    if failures:
        key, problem = failures[0]
        more = "".join(f"; {k}: {p}" for k, p in failures[1:3])
        extra = f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""
        err = CheckpointError(f"int8 self-check failed for {key}: {problem}{more}{extra}. This int8 checkpoint "
                              "would render noise, so it is refused: download yue2_3b_int8_convrot.safetensors "
                              "again, or use the bf16 file.")
        err.failures = failures
        raise err
    return {"ok": True, "quantized_modules": len(modules), "numeric_modules": numeric, "max_rel_error": worst,
            "worst_module": worst_key, "typical_scale": typical,
            "layers": {p.rstrip(".") or "model": sorted(v) for p, v in chosen.items()},
            "seconds": time.perf_counter() - t0}


def check_tokenizer(tokenizer_or_info, probe: str = PROBE_TEXT) -> dict:
    """Load the embedded tokenizer (from a CheckpointInfo) or take a YuE2Tokenizer, and check that `probe` (ASCII,
    CJK with full-width punctuation, accents) encodes to ordinary text ids (< 151,643) and decodes back to its NFC
    form exactly. Raises TokenizerError (or CheckpointError for an unreadable file)."""
    tok = tokenizer_or_info
    if hasattr(tokenizer_or_info, "entries"):
        from .checkpoint import load_tokenizer
        tok = load_tokenizer(tokenizer_or_info)
    try:
        ids = tok.encode(probe)
        text = tok.decode(ids)
    except TokenizerError:
        raise
    except Exception as exc:  # a tokenizer that loads but fails on text
        raise TokenizerError(f"the embedded tokenizer fails on a probe text: {type(exc).__name__}: {exc}") from None
    if not ids:
        raise TokenizerError(f"the embedded tokenizer encodes the probe text ({len(probe)} characters) to no tokens: "
                             "its vocabulary is empty or damaged, and every prompt would lose its style and lyrics "
                             "— the tokenizer JSON is not the YuE2 tokenizer; download the checkpoint again")
    if any(not 0 <= i < EOD for i in ids):
        bad = [i for i in ids if not 0 <= i < EOD][:3]
        raise TokenizerError(f"the embedded tokenizer maps plain text to ids outside [0, {EOD}) (e.g. {bad}); it is "
                             "not the YuE2 text tokenizer")
    want = unicodedata.normalize("NFC", probe)
    if text != want:
        at = next((i for i, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
        raise TokenizerError(f"the embedded tokenizer does not round-trip text: decode(encode(probe)) differs from "
                             f"the probe at character {at} ({text[at:at + 12]!r} vs {want[at:at + 12]!r}); the "
                             "tokenizer JSON is damaged or not the YuE2 tokenizer")
    return {"ok": True, "vocab": getattr(tok, "vocab_size", None), "probe_chars": len(want), "probe_tokens": len(ids)}


def selfcheck(info_or_engine, **int8_options) -> dict:
    """`check_tokenizer` and `check_int8` together: {"tokenizer": …, "int8": …}."""
    tok = getattr(info_or_engine, "tokenizer", None) or getattr(info_or_engine, "info", None) or info_or_engine
    return {"tokenizer": check_tokenizer(tok), "int8": check_int8(info_or_engine, **int8_options)}


__all__ = ["check_int8", "check_tokenizer", "selfcheck", "PROBE_TEXT"]
