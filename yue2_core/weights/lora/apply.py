"""Adding adapters to the engine modules, exactly and at no decode-time cost where the weights allow it.

A "stack" is a list of (Adapter, strength_ar, strength_nar); every patch of an adapter adds `strength · delta` to its
module (weights_and_lora.md §1.2: `delta` already holds the layout's scale). How a module takes its patches depends
on what it stores:

- **Float linears** (nn.Linear, bf16/fp16/fp32: the bf16 file, and the int8 file's NAR on CUDA after
  `nar.float_linears`): the weight is merged once, `W' = round(fp32(W) + Σ strength·delta)` to W's dtype
  (round-to-nearest, the same arithmetic as ComfyUI 0.3.75's `patch_weight_to_device`: fp32 copy, patches added in
  order, cast back). Decoding then runs the unchanged kernels on W' — no cost per token. `merge_into(weight, items)`
  does the arithmetic; the CLI applies it in place (`apply_stack`), the nodes hand it to ComfyUI's ModelPatcher as a
  weight patch so ComfyUI keeps the backup, the unpatching and the memory accounting.
- **int8 ConvRot linears** (`quant.ConvRotLinear`: the int8 file's AR everywhere, its NAR on the CPU): the codes are
  never touched (merge-and-requantize would add a requantization error and move row scales, §3 option M). The
  module gets a `SideDelta` (its `lora_side` attribute), the runtime low-rank path of §3 option R:
  y = base(x) + x·Aᵀ·Bᵀ in fp32 on the unrotated input, every low-rank patch of every adapter concatenated into one
  A [Σr, in] / B [out, Σr] pair (strength and scale folded into B's rows), so any number of LoRAs costs two small
  products. Inside the fused CUDA decode step, where only the rotated activations x̃ = x·H exist, the same delta is
  x̃·Ãᵀ·Bᵀ with Ã = A·blkdiag(H) per 256-group (H is symmetric and orthogonal, so Ã·x̃ = A·x).
  LoKr / `.diff` patches on int8 layers become one dense fp32 ΔW side product; bias diffs an fp32 bias delta;
  replacements (Mothersuperior's `vae2llm` / `llm2vae`) swap the layer's function for F.linear(x, W, b) plus the
  other deltas.

A replacement is applied before the deltas on its module, on both paths, so every delta adds to it — a replacement
no longer erases the deltas before it; the deltas are summed in fp32 in stack order (another order: the same up to
one rounding, which is why a song records its order); two entries replacing one module differently are refused
(`check_replacements`).

Strength 0 on an expert drops every patch of that adapter on that expert (replacements included: the whole adapter
is off, §1.1 F), so outputs are bit-identical to the base.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import AdapterError
from .model import Adapter, BiasDiff, Diff, Kron, LowRank, Patch, Replace

STRENGTH_RANGE = 5.0  # the node's ±5 (issue "bring your own weights": strength_ar / strength_nar range)


@dataclass(frozen=True)
class Applied:
    """One adapter in a stack: the parsed adapter and the user's strength per expert."""
    adapter: Adapter
    strength_ar: float = 1.0
    strength_nar: float = 1.0

    def strength(self, expert: str) -> float:
        return self.strength_ar if expert == "ar" else self.strength_nar


MIN_STRENGTH = 1e-6  # below it a delta disappears under bf16/fp32 rounding of any trained adapter's weights


def check_strength(value, what: str) -> float:
    """A finite float in [−5, 5], 0 or at least MIN_STRENGTH in size; AdapterError otherwise (names `what`)."""
    shown = value if isinstance(value, str) else repr(value)  # the text as typed (--lora X:1e-400)
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise AdapterError(f"{what} must be a number between -{STRENGTH_RANGE:g} and {STRENGTH_RANGE:g}; got "
                           f"{value!r}") from None
    if not (abs(v) <= STRENGTH_RANGE):  # also NaN
        raise AdapterError(f"{what} must be between -{STRENGTH_RANGE:g} and {STRENGTH_RANGE:g}; got {shown}")
    if 0 < abs(v) < MIN_STRENGTH or (v == 0 and _underflowed(value)):  # 1e-320 was recorded as "×9.99989e-321"
        # and changed nothing (break-it, stop 32); "1e-400" became 0 and was said to be "strength 0" (stop 40)
        raise AdapterError(f"{what} {shown} is too small to change any weight (a nonzero strength must be at least "
                           f"{MIN_STRENGTH:g} in size); 0 turns the adapter off")
    return 0.0 if v == 0 else v  # -0.0 is 0


def _underflowed(value) -> bool:
    """True for a number written as text with a nonzero digit before its exponent that float() reads as 0 (1e-400:
    below the smallest double) — a nonzero strength, too small, not the strength 0 that turns an adapter off."""
    if not isinstance(value, str):
        return False
    mantissa = value.strip().lower().partition("e")[0]
    return any(c in "123456789" for c in mantissa)


# the largest |ΔW| a module's merged patches may reach: bf16's largest finite value (fp32's is barely larger). A
# trained adapter stays below it by 30+ orders of magnitude; above it the merged weight is inf and the model NaN.
MAX_DELTA = float(torch.finfo(torch.bfloat16).max)


def _peak(t: torch.Tensor) -> float:
    return float(t.detach().abs().max()) if t.numel() else 0.0


def delta_bound(delta) -> float:
    """An upper bound of max|ΔW| (or of max|Δb|, of a replacement's values) of one patch at strength 1, in float64
    without forming the product: rank·max|B|·max|A|·|scale| for a LoRA, max|w1|·max|w2|·|scale| for LoKr."""
    if isinstance(delta, LowRank):
        return delta.rank * _peak(delta.up) * _peak(delta.down) * abs(delta.scale)
    if isinstance(delta, Kron):
        return _peak(delta.w1) * _peak(delta.w2) * abs(delta.scale)
    if isinstance(delta, (Diff, BiasDiff)):
        return _peak(delta.delta) * abs(delta.scale)
    return max(_peak(delta.weight), 0.0 if delta.bias is None else _peak(delta.bias))


def _name(applied: Applied) -> str:
    return os.path.basename(os.path.normpath(applied.adapter.path)) or applied.adapter.path


def check_magnitude(stack: list[Applied], experts=("ar", "nar")) -> None:
    """AdapterError naming the adapter file(s) and the module when the patches a module gets could add more than
    MAX_DELTA to it (Σ |strength|·`delta_bound` over the stack): each factor finite, their product inf in fp32 /
    bf16 — NaN logits or latents after a whole stage, blamed on the checkpoint."""
    per: dict = {}
    for applied in stack:
        for expert in experts:
            s = applied.strength(expert)
            if s == 0.0:
                continue
            for p in applied.adapter.patches:
                if p.expert == expert:
                    kind = "bias" if isinstance(p.delta, BiasDiff) else "weight"
                    per.setdefault((expert, p.module, kind), []).append((abs(s) * delta_bound(p.delta), applied, p))
    for (expert, module, kind), items in per.items():
        total = sum(b for b, _, _ in items)
        if total <= MAX_DELTA:
            continue
        worst = max(items, key=lambda item: item[0])
        files = list(dict.fromkeys(a.adapter.path for _, a, _ in items))
        strengths = ", ".join(f"{_name(a)} ×{a.strength(expert):g}" for _, a, _ in items)
        raise AdapterError(f"the LoRA {files[0] if len(files) == 1 else ' + '.join(files)} would add up to "
                           f"{total:.3g} to {expert.upper()} {module} ({kind}; {strengths}; largest from "
                           f"{', '.join(worst[2].keys) or 'its factors'}): beyond {MAX_DELTA:.3g}, the largest "
                           "bf16 value, the merged weight is inf and the model computes NaN. The adapter is "
                           "damaged (factors such as 1e30: each finite, their product not) — download or train it "
                           "again")


def _file_identity(path: str) -> tuple[str, str] | None:
    """(resolved path, sha256) of a file; None where there is no file (an in-memory adapter)."""
    from .record import file_sha256
    if not os.path.isfile(path):
        return None
    return os.path.realpath(path), file_sha256(path)


def _identity(applied: Applied) -> tuple[str, str] | None:
    """What makes two stack entries the same adapter: (resolved path, sha256) of its weights file — the file a song
    records (`record._weights_file`; an FL file's companion and adapter_config.json are not part of it). None for an
    in-memory adapter."""
    from .record import _weights_file
    return _file_identity(_weights_file(applied.adapter))


def _sources(applied: Applied, expert: str) -> dict[str, bool]:
    """The files whose patches reach `expert` through this entry → True for a companion (an FL AR file's NAR file,
    `Patch.source`), False for the adapter's own weights file."""
    from .record import _weights_file
    main, out = None, {}
    for p in applied.adapter.patches:
        if p.expert == expert:
            if p.source is None and main is None:
                main = _weights_file(applied.adapter)
            out.setdefault(p.source or main, p.source is not None)
    return out


def _twice(expert: str, items: list) -> str:
    """The refusal of one companion file reaching `expert` through two entries (`check_unique`)."""
    e = expert.upper()
    companion = next(path for _, _, path, via in items if via)
    owner = next(a for a, _, _, via in items if via)
    ways = ", ".join((f"as the companion of {a.adapter.path}" if via else f"as its own LoRA {a.adapter.path}")
                     + f" ×{a.strength(expert):g}" for a, _, _, via in items)
    return (f"the {e} adapter {os.path.basename(companion)} reaches the {e} {len(items)} times ({ways}): its deltas "
            f"would apply twice. {owner.adapter.path} reads it itself (metadata acoustic_adapter): give that file "
            f"alone, with the {e} strength you want (PATH:AR:NAR; node: strength_{expert}), or give all but one of "
            f"these entries {e} strength 0")


def check_unique(stack: list[Applied], experts=("ar", "nar")) -> None:
    """AdapterError when one adapter file reaches an expert through several entries whose strengths add up past
    ±STRENGTH_RANGE (strengths of the same patch add, so repeating a file multiplies its effect past the limit), and
    whenever a companion file reaches it through another entry too — an FL AR file, which reads its NAR file
    itself, given with that NAR file as a second LoRA (or two AR files naming one companion): its deltas would apply
    twice (break-it review, stop 40). Entries at strength 0 for an expert, or whose adapter has no patch for it, do
    not count; the same file within the limit is allowed (songs made that way re-render as they were made)."""
    if len(stack) < 2:
        return  # nothing to compare: no file is hashed
    mains = [_identity(a) for a in stack]
    for expert in experts:
        groups: dict = {}
        for a, main in zip(stack, mains):
            if a.strength(expert) == 0.0:
                continue
            for path, via in _sources(a, expert).items():
                ident = _file_identity(path) if via else main
                if ident is None:
                    continue
                key = next((k for k in groups if k[0] == ident[0] or k[1] == ident[1]), ident)
                groups.setdefault(key, []).append((a, main, path, via))
        for items in groups.values():
            if len(items) > 1 and any(via for *_, via in items) and \
                    len({None if m is None else m[1] for _, m, _, _ in items}) > 1:  # not one file given twice
                raise AdapterError(_twice(expert, items))
            total = sum(a.strength(expert) for a, *_ in items)
            if len(items) > 1 and abs(total) > STRENGTH_RANGE:
                parts = [f"{a.adapter.path} ×{a.strength(expert):g}" for a, *_ in items]
                if len(parts) > 6:  # 501 entries made one 15 KB line (break-it, stop 40)
                    parts = parts[:3] + [f"… {len(parts) - 4} more …"] + parts[-1:]
                listed = " + ".join(parts)
                raise AdapterError(
                    f"the LoRA {items[0][0].adapter.path} reaches the {expert.upper()} {len(items)} times ({listed}: "
                    f"the same weights file); strengths of the same file add up to {total:g}, beyond the "
                    f"{STRENGTH_RANGE:g} limit of one entry — give it once with a strength between "
                    f"-{STRENGTH_RANGE:g} and {STRENGTH_RANGE:g}")


def _same_replacement(a: Replace, b: Replace) -> bool:
    def same(x, y):
        return (x is None and y is None) or (x is not None and y is not None and x.shape == y.shape
                                             and torch.equal(x.float(), y.float()))
    return same(a.weight, b.weight) and same(a.bias, b.bias)


def check_replacements(stack: list[Applied], experts=("ar", "nar")) -> None:
    """AdapterError naming both entries, their keys and the module when two entries replace one module with
    different weights (Mothersuperior's `vae2llm` / `llm2vae` from two NAR adapters): a module takes one
    replacement, and whichever came last would erase the other, so the order of the LoRAs would decide the song
    (break-it review, stop 40). The same replacement twice (one file given twice) is allowed; entries at strength 0
    for the expert do not count."""
    for expert in experts:
        first: dict = {}
        for a in stack:
            if a.strength(expert) == 0.0:
                continue
            for p in a.adapter.patches:
                if p.expert != expert or not isinstance(p.delta, Replace):
                    continue
                if p.module not in first:
                    first[p.module] = (a, p)
                    continue
                b, q = first[p.module]
                if not _same_replacement(q.delta, p.delta):
                    e = expert.upper()
                    raise AdapterError(
                        f"the LoRAs {b.adapter.path} and {a.adapter.path} both replace {e} {p.module} "
                        f"({', '.join(q.keys) or 'no key'}; {', '.join(p.keys) or 'no key'}) with different weights: "
                        f"a module takes one replacement, and the later would erase the earlier — give one of them "
                        f"{e} strength 0 (PATH:AR:NAR; node: strength_{expert}), or leave it out")


def repeat_notes(stack: list[Applied]) -> list[str]:
    """One note per adapter file given more than once — the same path, or files of the same content (copies, hard
    links: `_identity`'s sha256, as `check_unique` groups them): allowed within ±STRENGTH_RANGE, its strengths add —
    said, so a doubled effect is not a surprise (new-user finding: it stacked in silence; break-it: a copy under
    another name stacked in silence too)."""
    if len(stack) < 2:
        return []  # nothing to compare: no file is hashed
    groups: list[tuple[list, list[Applied]]] = []  # ([(realpath, sha256), …], entries)
    for a in stack:
        try:
            ident = _identity(a)
        except (OSError, TypeError, AttributeError):  # an in-memory adapter: no file to compare
            continue
        if ident is None:
            continue
        group = next((g for g in groups if any(i[0] == ident[0] or i[1] == ident[1] for i in g[0])), None)
        if group is None:
            groups.append(([ident], [a]))
        else:
            group[0].append(ident)
            group[1].append(a)
    notes = []
    for idents, items in groups:
        if len(items) < 2:
            continue
        others = sorted({a.adapter.path for a, i in zip(items, idents) if i[0] != idents[0][0]})
        also = (f" (also as {', '.join(others)}: the same weights under other names)" if others else "")
        if len({(a.adapter.scale_rule, tuple(a.adapter.scales)) for a in items}) > 1:
            notes.append(f"the LoRA {items[0].adapter.path} is given {len(items)} times{also}, "
                         + _scales_differ(items))
            continue
        notes.append(f"the LoRA {items[0].adapter.path} is given {len(items)} times{also}: its strengths add up (AR "
                     f"×{sum(a.strength('ar') for a in items):g}, NAR ×{sum(a.strength('nar') for a in items):g})")
    return notes


def _scales_differ(items: list[Applied]) -> str:
    """The end of the repeat note for entries of one weights file read at different scales — a PEFT folder (its
    adapter_config.json lora_alpha / r) and a renamed copy of its adapter_model.safetensors (no config: scale 1).
    Their strengths do not simply add (leftover of the stop-54 review: the note said they did): each entry adds
    strength × its scale times the file's B·A, said per entry and, where each has one scale, summed per expert."""
    def at(a: Applied) -> str:
        values, rule = ", ".join(f"{v:g}" for v in a.adapter.scales) or "-", a.adapter.scale_rule
        shown = rule if len(a.adapter.scales) == 1 and rule.startswith(values + " (") else f"{values} ({rule})"
        return f"{a.adapter.path} at scale{'s' if len(a.adapter.scales) > 1 else ''} {shown}"
    text = "read at different scales: " + ", ".join(at(a) for a in items)
    if all(len(a.adapter.scales) == 1 for a in items):
        sums = []
        for expert in ("ar", "nar"):
            terms = [(a.strength(expert), a.adapter.scales[0]) for a in items]
            sums.append(f"{expert.upper()} ×{sum(st * sc for st, sc in terms):g} ("
                        + " + ".join(f"{st:g}·{sc:g}" for st, sc in terms) + ")")
        return text + f" — its B·A adds up to {', '.join(sums)} (strength · scale of each entry)"
    return text + " — on each module its B·A adds up to the sum of strength · scale of the entries"


def replace_notes(stack: list[Applied]) -> list[str]:
    """One note per module that one entry replaces and other entries' deltas reach: those deltas are added to the
    replacement (replacements apply first, wherever they are in the stack) — said, since each adapter
    was trained against another weight of that module."""
    notes = []
    for expert in ("ar", "nar"):
        owners: dict = {}
        adders: dict = {}
        for a in stack:
            if a.strength(expert) == 0.0:
                continue
            for p in a.adapter.patches:
                if p.expert == expert:
                    bucket = owners if isinstance(p.delta, Replace) else adders
                    if not any(x is a for x in bucket.setdefault(p.module, [])):
                        bucket[p.module].append(a)
        for module, who in owners.items():
            others = [a for a in adders.get(module, []) if not any(a is o for o in who)]
            if others:
                notes.append(f"the LoRA {who[0].adapter.path} replaces {expert.upper()} {module}; the deltas of "
                             f"{', '.join(a.adapter.path for a in others)} on it are added to that replacement "
                             "(replacements apply first, wherever they are in the stack)")
    return notes


def idle_notes(stack: list[Applied]) -> list[str]:
    """One note per entry that patches nothing: every expert its adapter holds patches for has strength 0 (an
    NAR-only file given as PATH:1:0, an AR-only one as PATH:0:1, or strength 0 on both) — what the file holds and
    which strength is 0, since the song is then made as without it (break-it review, stop 40: said nothing)."""
    notes = []
    for a in stack:
        held = [e for e in ("ar", "nar") if any(p.expert == e for p in a.adapter.patches)]
        if any(a.strength(e) != 0.0 for e in held):
            continue
        if a.strength_ar == 0.0 and a.strength_nar == 0.0:
            notes.append(f"the LoRA {a.adapter.path} has strength 0 on both experts: nothing to patch, this entry "
                         "changes nothing")
            continue
        (e,) = held  # one expert held, at strength 0; the other strength is not 0
        other = "nar" if e == "ar" else "ar"
        modules = len({p.module for p in a.adapter.patches})
        notes.append(f"the LoRA {a.adapter.path} holds only {e.upper()} patches ({modules} modules) and its "
                     f"{e.upper()} strength is 0: nothing to patch, this entry changes nothing (its "
                     f"{other.upper()} strength ×{a.strength(other):g} has no {other.upper()} patch to scale)")
    return notes


def stack_notes(stack: list[Applied]) -> list[str]:
    """Every note on a whole stack, for the caller to show: files given more than once (`repeat_notes`), deltas
    added to another entry's replacement (`replace_notes`), entries that patch nothing (`idle_notes`)."""
    return repeat_notes(stack) + replace_notes(stack) + idle_notes(stack)


def check_stack(stack: list[Applied], experts=("ar", "nar")) -> None:
    """The checks of a whole stack before anything is applied: no adapter twice and no companion given again as
    its own entry (`check_unique`), no two different replacements of one module (`check_replacements`), no module
    delta beyond MAX_DELTA (`check_magnitude`). AdapterError otherwise."""
    check_unique(stack, experts)
    check_replacements(stack, experts)
    check_magnitude(stack, experts)


def erased_by_old_rule(stack: list[Applied]) -> list[tuple[str, str, Applied, list[Applied]]]:
    """Where the stacking rule before 2026-12-06 gave other weights than `merge_into` / `SideDelta` give now: each
    patch was applied in stack order, so a replacement erased the deltas the entries before it had put on its module
    (now it applies first and they add to it). (expert, module, the replacing entry, the entries whose deltas on it
    it erased), in stack order; [] when the order never met that case. Entries at strength 0 on an expert do not
    count (their patches were dropped then too)."""
    out = []
    for expert in ("ar", "nar"):
        deltas: dict = {}  # module → entries whose deltas are on it since its last replacement
        for a in stack:
            if a.strength(expert) == 0.0:
                continue
            for p in a.adapter.patches:
                if p.expert != expert:
                    continue
                if isinstance(p.delta, Replace):
                    if deltas.get(p.module):
                        out.append((expert, p.module, a, deltas[p.module]))
                    deltas[p.module] = []
                elif not any(b is a for b in deltas.setdefault(p.module, [])):
                    deltas[p.module].append(a)
    return out


def old_rule_summary(stack: list[Applied]) -> list[dict]:
    """`erased_by_old_rule` by pair of entries, without the tensors (what an engine keeps for a re-render's note):
    {"expert", "replacer": index in `stack`, "erased": index of the entry whose deltas it erased, "modules": sorted
    names, "whole": every patch of that entry on the expert was erased — then giving it strength 0 on that expert
    gives the old weights}."""
    pairs: dict = {}
    for expert, module, rep, before in erased_by_old_rule(stack):
        i = next(k for k, a in enumerate(stack) if a is rep)
        for b in before:
            j = next(k for k, a in enumerate(stack) if a is b)
            pairs.setdefault((expert, i, j), set()).add(module)
    out = []
    for (expert, i, j), modules in pairs.items():
        held = {p.module for p in stack[j].adapter.patches if p.expert == expert}
        erased = set().union(*(m for (e, _, k), m in pairs.items() if e == expert and k == j))
        out.append({"expert": expert, "replacer": i, "erased": j, "modules": sorted(modules),
                    "whole": held <= erased})
    return out


def module_items(stack: list[Applied], expert: str) -> dict[str, list[tuple[float, Patch]]]:
    """module name → [(strength, patch)] of `expert`, in stack order; patches at strength 0 are left out."""
    out: dict[str, list[tuple[float, Patch]]] = {}
    for applied in stack:
        s = applied.strength(expert)
        if s == 0.0:
            continue
        for p in applied.adapter.patches:
            if p.expert == expert:
                out.setdefault(p.module, []).append((s, p))
    return out


def _module(root: nn.Module, name: str, expert: str) -> nn.Module:
    try:
        mod = root.get_submodule(name)
    except AttributeError:
        mod = None
    if mod is None or not hasattr(mod, "weight") or getattr(mod, "weight", None) is None or mod.weight.ndim != 2:
        raise AdapterError(f"the adapter patches {expert.upper()} module {name!r}, which this model has no linear "
                           "layer for")
    return mod


def _rows(p: Patch, out_features: int) -> tuple[int, int]:
    start, count = p.rows if p.rows is not None else (0, out_features)
    if start < 0 or count <= 0 or start + count > out_features:
        raise AdapterError(f"{p.expert.upper()} {p.module}: rows {start}…{start + count - 1} do not fit its "
                           f"{out_features} output rows (from {', '.join(p.keys) or 'the adapter'})")
    return start, count


def check_fit(items: list[tuple[float, Patch]], name: str, out_features: int, in_features: int) -> None:
    """Every patch's delta fits the module [out_features, in_features]; AdapterError naming the key otherwise."""
    for _, p in items:
        start, count = _rows(p, out_features)
        d = p.delta
        if isinstance(d, BiasDiff):
            shape, want = tuple(d.delta.shape), (count,)
        elif isinstance(d, Replace):
            shape, want = tuple(d.weight.shape), (out_features, in_features)
            if d.bias is not None and tuple(d.bias.shape) != (out_features,):
                raise AdapterError(f"{p.expert.upper()} {name}: replacement bias {list(d.bias.shape)} does not fit "
                                   f"[{out_features}] ({', '.join(p.keys)})")
        elif isinstance(d, LowRank):
            shape, want = (d.up.shape[0], d.down.shape[1]), (count, in_features)
            if d.up.shape[1] != d.down.shape[0]:
                raise AdapterError(f"{p.expert.upper()} {name}: up {list(d.up.shape)} and down "
                                   f"{list(d.down.shape)} ranks disagree ({', '.join(p.keys)})")
        elif isinstance(d, Kron):
            shape, want = (d.w1.shape[0] * d.w2.shape[0], d.w1.shape[1] * d.w2.shape[1]), (count, in_features)
        else:
            shape, want = tuple(d.delta.shape), (count, in_features)
        if tuple(shape) != tuple(want):
            raise AdapterError(f"{p.expert.upper()} {name}: the adapter's delta is {list(shape)}, the module needs "
                               f"{list(want)} ({', '.join(p.keys) or 'no key'})")


def merge_into(weight: torch.Tensor, items: list[tuple[float, Patch]], bias: bool = False) -> torch.Tensor:
    """Add the patches to `weight` in place (an fp32 tensor [out, in], or [out] with `bias`) and return it.
    A replacement (`Replace`) is applied first, whatever its place in `items`; then low-rank products are formed in
    fp32 (`torch.mm`), scaled by strength·scale and added row slice by row slice, in stack order — so every delta
    adds to the replaced weight wherever the replacement is in the stack (break-it review, stop 40: a replacement
    later in the stack erased the deltas before it). With `bias`, only BiasDiff / Replace biases apply; otherwise
    only weight deltas."""
    items = sorted(items, key=lambda item: not isinstance(item[1].delta, Replace))  # stable: the rest keep order
    for strength, p in items:
        d = p.delta
        start, count = _rows(p, weight.shape[0])
        rows = weight[start:start + count]
        if bias:
            if isinstance(d, BiasDiff):
                rows.add_(d.delta.to(device=weight.device, dtype=torch.float32), alpha=strength * d.scale)
            elif isinstance(d, Replace) and d.bias is not None:
                weight.copy_(d.bias.to(device=weight.device, dtype=torch.float32))
            continue
        if isinstance(d, LowRank):
            up = d.up.to(device=weight.device, dtype=torch.float32)
            down = d.down.to(device=weight.device, dtype=torch.float32)
            rows.add_(torch.mm(up, down), alpha=strength * d.scale)
        elif isinstance(d, Kron):
            rows.add_(torch.kron(d.w1.to(weight.device, torch.float32), d.w2.to(weight.device, torch.float32)),
                      alpha=strength * d.scale)
        elif isinstance(d, Diff):
            rows.add_(d.delta.to(device=weight.device, dtype=torch.float32), alpha=strength * d.scale)
        elif isinstance(d, Replace):
            weight.copy_(d.weight.to(device=weight.device, dtype=torch.float32))
    return weight


class SideDelta:
    """The runtime delta of one int8 ConvRot linear (module docstring). Tensors fp32 on one device:
    `down` [Σr, in] and `up` [out, Σr] (strength·scale in `up`'s rows; zero outside each patch's row slice), `dense`
    [out, in] or None, `bias` [out] or None, `replace` (weight [out, in], bias [out] | None) or None."""

    def __init__(self, down, up, dense, bias, replace):
        self.down, self.up, self.dense, self.bias, self.replace = down, up, dense, bias, replace
        self._rotated: dict = {}

    @classmethod
    def build(cls, items: list[tuple[float, Patch]], out_features: int, in_features: int,
              device=None) -> "SideDelta":
        downs, ups, dense, bias, replace = [], [], None, None, None
        for strength, p in items:
            d = p.delta
            start, count = _rows(p, out_features)
            if isinstance(d, LowRank):
                up = torch.zeros(out_features, d.rank, dtype=torch.float32, device=device)
                up[start:start + count] = d.up.to(device=device, dtype=torch.float32) * (strength * d.scale)
                downs.append(d.down.to(device=device, dtype=torch.float32))
                ups.append(up)
            elif isinstance(d, (Kron, Diff)):
                if dense is None:
                    dense = torch.zeros(out_features, in_features, dtype=torch.float32, device=device)
                merge_into(dense, [(strength, p)])
            elif isinstance(d, BiasDiff):
                if bias is None:
                    bias = torch.zeros(out_features, dtype=torch.float32, device=device)
                merge_into(bias, [(strength, p)], bias=True)
            elif isinstance(d, Replace):
                replace = (d.weight.to(device=device, dtype=torch.float32),
                           None if d.bias is None else d.bias.to(device=device, dtype=torch.float32))
        down = torch.cat(downs) if downs else None
        up = torch.cat(ups, dim=1) if ups else None
        return cls(down, up, dense, bias, replace)

    def to(self, device) -> "SideDelta":
        mv = (lambda t: None if t is None else t.to(device))
        rep = None if self.replace is None else (mv(self.replace[0]), mv(self.replace[1]))
        return SideDelta(mv(self.down), mv(self.up), mv(self.dense), mv(self.bias), rep)

    @property
    def device(self):
        for t in (self.down, self.dense, self.bias, self.replace[0] if self.replace else None):
            if t is not None:
                return t.device
        return torch.device("cpu")

    def nbytes(self) -> int:
        ts = [self.down, self.up, self.dense, self.bias, *(self.replace or ())]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def delta(self, x: torch.Tensor) -> torch.Tensor | None:
        """fp32 [..., out] added to the base output for the UNROTATED input x [..., in] (None: nothing to add)."""
        xf, out = x.float(), None
        if self.down is not None:
            out = (xf @ self.down.t()) @ self.up.t()
        if self.dense is not None:
            d = xf @ self.dense.t()
            out = d if out is None else out + d
        if self.bias is not None:
            out = self.bias if out is None else out + self.bias
        return out

    def rotated_down(self, group: int) -> torch.Tensor | None:
        """Ã = A·blkdiag(H) [Σr, in] fp32 (`quant.rotate` of A's rows), cached: x̃·Ãᵀ = x·Aᵀ for x̃ = x·H."""
        if self.down is None:
            return None
        if group not in self._rotated:
            from ..quant import rotate
            self._rotated[group] = rotate(self.down, group).contiguous()
        return self._rotated[group]

    def delta_rotated(self, xr: torch.Tensor, group: int) -> torch.Tensor | None:
        """The same delta from the ROTATED input x̃ [R, in] (bf16), fp32 [R, out]; used inside the fused decode
        step, which has only x̃. Dense deltas are rotated the same way (ΔW·H) on first use."""
        out = None
        xf = xr.float()
        if self.down is not None:
            out = (xf @ self.rotated_down(group).t()) @ self.up.t()
        if self.dense is not None:
            key = ("dense", group)
            if key not in self._rotated:
                from ..quant import rotate
                self._rotated[key] = rotate(self.dense, group).contiguous()
            d = xf @ self._rotated[key].t()
            out = d if out is None else out + d
        if self.bias is not None:
            out = self.bias if out is None else out + self.bias
        return out

    def add_rotated_(self, xr: torch.Tensor, out: torch.Tensor, group: int) -> torch.Tensor:
        """out [R, N] fp32 += the delta of the ROTATED input x̃ [R, in] — the fused decode step's form (the
        low-rank part is two launches: x̃·Ãᵀ, then one addmm into `out`)."""
        if self.down is not None:
            hilo = self._cuda_hilo(xr, group)
            if hilo is not None:  # CUDA: one bf16 GEMM with fp32 output, one addmm — two launches
                down2, up2 = hilo
                out.addmm_(torch.mm(xr, down2.t(), out_dtype=torch.float32), up2.t())
            else:
                out.addmm_(xr.float() @ self.rotated_down(group).t(), self.up.t())
        if self.dense is not None or self.bias is not None:
            rest = SideDelta(None, None, self.dense, self.bias, None)
            rest._rotated = self._rotated
            out.add_(rest.delta_rotated(xr, group))
        return out

    def _cuda_hilo(self, xr: torch.Tensor, group: int):
        """(Ã as bf16 hi ‖ lo rows [2Σr, in], B ‖ B [out, 2Σr] fp32) for a bf16 CUDA input: Ã = hi + lo to ~2⁻¹⁶
        relative, so x̃·(hi ‖ lo)ᵀ·(B ‖ B)ᵀ = x̃·Ãᵀ·Bᵀ in one bf16 GEMM with fp32 output (`torch.mm(out_dtype=)`)
        and one addmm, without casting x̃. None where that GEMM is not available (CPU, other dtypes)."""
        if not (xr.is_cuda and xr.dtype == torch.bfloat16):
            return None
        key = ("hilo", group)
        if key not in self._rotated:
            a = self.rotated_down(group)
            hi = a.to(torch.bfloat16)
            lo = (a - hi.float()).to(torch.bfloat16)
            pair = (torch.cat([hi, lo]).contiguous(), torch.cat([self.up, self.up], dim=1).contiguous())
            try:
                torch.mm(xr[:1], pair[0].t(), out_dtype=torch.float32)
            except (TypeError, RuntimeError, NotImplementedError):
                pair = None
            self._rotated[key] = pair
        return self._rotated[key]

    def apply(self, x: torch.Tensor, base_out) -> torch.Tensor:
        """The linear's output with the delta: `base_out()` is called unless the layer is replaced; a replaced layer
        computes F.linear(x, W, b) of the replacement plus the other deltas (as `merge_into`: replacement first)."""
        if self.replace is not None:
            w, b = self.replace
            y = F.linear(x.float(), w, b)
            d = self.delta(x)
            return (y if d is None else y + d).to(x.dtype)
        y = base_out()
        d = self.delta(x)
        return y if d is None else (y.float() + d).to(y.dtype)


def _is_int8(mod: nn.Module) -> bool:
    from ..quant import ConvRotLinear
    return isinstance(mod, ConvRotLinear)


def plan_expert(root: nn.Module, stack: list[Applied], expert: str) -> tuple[dict, dict]:
    """Split `expert`'s patches by how each module takes them: (float {module: items}, int8 {module: items}).
    Checks the stack (`check_stack`: no adapter twice, no delta beyond MAX_DELTA), that every target exists and
    every delta fits (AdapterError)."""
    check_stack(stack, (expert,))
    floats, ints = {}, {}
    for name, items in module_items(stack, expert).items():
        mod = _module(root, name, expert)
        out_f, in_f = mod.weight.shape
        check_fit(items, name, out_f, in_f)
        if any(isinstance(p.delta, (BiasDiff,)) or (isinstance(p.delta, Replace) and p.delta.bias is not None)
               for _, p in items) and getattr(mod, "bias", None) is None and not _is_int8(mod):
            raise AdapterError(f"{expert.upper()} {name} has no bias, but the adapter changes one "
                               f"({', '.join(k for _, p in items for k in p.keys)})")
        (ints if _is_int8(mod) else floats)[name] = items
    return floats, ints


def side_deltas(root: nn.Module, ints: dict, device=None) -> dict:
    """module name → SideDelta for the int8 modules of `plan_expert`."""
    out = {}
    for name, items in ints.items():
        mod = root.get_submodule(name)
        out[name] = SideDelta.build(items, mod.weight.shape[0], mod.weight.shape[1], device)
    return out


def set_side(root: nn.Module, sides: dict) -> int:
    """Give every int8 ConvRot linear under `root` its SideDelta from `sides` (moved to the module's device), or
    None when it has none. Returns the number of modules with a delta."""
    from ..quant import ConvRotLinear
    n = 0
    for name, mod in root.named_modules():
        if isinstance(mod, ConvRotLinear):
            side = sides.get(name)
            if side is not None and side.device != mod.weight.device:
                side = side.to(mod.weight.device)
            mod.lora_side = side
            n += side is not None
    return n


def reaches_int8(info, stack: list[Applied], nar_float: bool, experts: tuple = ("ar", "nar")) -> bool:
    """Whether `stack` patches an int8 ConvRot linear of the checkpoint `info` (`CheckpointInfo`) — when
    `YuE2Engine.load` records how it applied them (`weights["lora_int8"]`, `apply_stack`'s `int8_mode`): the AR's
    quantized linears everywhere, the NAR's only where it keeps them (`nar_float`: on CUDA `load_nar` turns them
    into bf16 layers). The experts are built on the meta device from the header's quantization maps: no weight is
    read. Entries at strength 0 on an expert do not count (review, stop 41: `batch` recorded a mode for adapters on
    float layers only, and a --resume under the other YUE2_LORA_INT8 was refused for nothing). `experts`: those
    asked of."""
    if not getattr(info, "quantized_modules", 0):
        return False
    from ...ar import ARModel
    from ...nar import NARModel
    for expert, quant, cls in (("ar", info.quant_ar, ARModel), ("nar", info.quant_nar, NARModel)):
        names = {n for n in module_items(stack, expert) if n in quant}
        if not names or (expert == "nar" and nar_float) or expert not in experts:
            continue
        with torch.device("meta"):
            root = cls(info.dims, quant, torch.bfloat16)
        if any(_is_int8(_module(root, n, expert)) for n in names):
            return True
    return False


def nar_layers_for(info, stack: list[Applied], mode: str | None, dtype, device) -> str | None:
    """What `apply_stack` will make of the linears of the int8 file's NAR prepared for `device` in `dtype`
    (`nar.prepare_linears`) — the warm-up plan's `nar_linears`, so its shadow NAR has the real one's layers: None
    where the NAR keeps no int8 layers (`nar.keeps_int8`) or `stack` reaches none (`reaches_int8`) — as
    YUE2_NAR_LINEARS leaves them —; "bf16" under auto (`nar.adapters_want_bf16`: every linear bf16); "layers_bf16"
    for `mode` (`int8_mode`) "bf16" (`dequantize_layers`: the transformer layers' linears); None for side deltas."""
    from ...nar import auto_mode, keeps_int8
    if not stack or not keeps_int8(dtype, device) or not reaches_int8(info, stack, False, ("nar",)):
        return None
    return "bf16" if auto_mode() else "layers_bf16" if int8_mode(mode) == "bf16" else None


INT8_MODES = ("side", "bf16")  # how adapters apply to int8 ConvRot layers (YUE2_LORA_INT8; songs record it)


def int8_mode(mode: str | None = None) -> str:
    """`mode` ("side" | "bf16") when given, else the switch YUE2_LORA_INT8 (default "side"). RequestError for
    another value of either."""
    from ...switches import choice
    if mode is None:
        return choice("YUE2_LORA_INT8", INT8_MODES, "side")
    if mode not in INT8_MODES:
        from ...errors import RequestError
        raise RequestError(f"the LoRA int8 mode must be {' or '.join(repr(m) for m in INT8_MODES)}, got {mode!r}")
    return mode


@torch.no_grad()
def apply_stack(root: nn.Module, stack: list[Applied], expert: str, mode: str | None = None) -> dict:
    """Apply a stack to one engine module (ARModel / NARModel) in place — the command line's path, where the base
    model is not needed afterwards. Float linears are merged (`merge_into`), int8 ones get side deltas; `root`
    remembers the adapters (`own.mark`). Returns {"merged": n, "side": n, "int8_mode": "side" | "bf16" | None} —
    the mode used when int8 linears were patched, None when none was (what a song records: `pipeline`).

    `mode` "bf16" (default: `int8_mode()`, i.e. `YUE2_LORA_INT8=bf16`, opt-in; else `side`): when int8 layer linears
    would get side deltas, every int8 layer linear of the expert's transformer layers is first dequantized to a bf16
    nn.Linear (as the int8 file's NAR is on CUDA) and the adapters merged into it — the bf16 decode speed, for 2
    bytes per weight instead of 1 and the bf16 rounding of the dequantized weights (the int8 exactness rule no
    longer holds; the default keeps it). RequestError for a mode other than "side" / "bf16"."""
    mode = int8_mode(mode)
    floats, ints = plan_expert(root, stack, expert)
    if ints and expert == "nar":
        from ...nar import adapters_want_bf16, float_linears
        if adapters_want_bf16(root):  # YUE2_NAR_LINEARS=auto chose W8A8: the bf16 layers, the delta merged
            float_linears(root)
            floats, ints = plan_expert(root, stack, expert)
    used = mode if ints else None
    if ints and mode == "bf16":
        dequantize_layers(root)
        floats, ints = plan_expert(root, stack, expert)
    for name, items in floats.items():
        mod = root.get_submodule(name)
        w = merge_into(mod.weight.detach().to(torch.float32).clone(), items)
        mod.weight.data = w.to(mod.weight.dtype)
        if getattr(mod, "bias", None) is not None and any(
                isinstance(p.delta, BiasDiff) or (isinstance(p.delta, Replace) and p.delta.bias is not None)
                for _, p in items):
            b = merge_into(mod.bias.detach().to(torch.float32).clone(), items, bias=True)
            mod.bias.data = b.to(mod.bias.dtype)
    sides = side_deltas(root, ints)
    set_side(root, sides)
    from ..own import mark  # a NaN the model produces later names these adapters (own.blame)
    mark(root, [("lora", a.adapter.path, expert, a.strength(expert)) for a in stack if a.strength(expert) != 0.0
                and any(p.expert == expert for p in a.adapter.patches)])  # only adapters that patch this expert
    return {"merged": len(floats), "side": len(sides), "int8_mode": used}


def dequantize_layers(root: nn.Module, dtype=torch.bfloat16) -> int:
    """Replace every int8 ConvRot linear under `root.model.layers` by a `dtype` nn.Linear holding its dequantized
    weight W = (q·s)·H (computed on the module's device, layer by layer). Returns how many were replaced."""
    from ..quant import ConvRotLinear
    count = 0
    for parent in list(root.model.layers.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ConvRotLinear):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta",
                                dtype=dtype)
                lin.weight = nn.Parameter(child.dequantized(dtype).contiguous(), requires_grad=False)
                if child.bias is not None:
                    lin.bias = nn.Parameter(child.bias.detach().to(dtype).clone(), requires_grad=False)
                setattr(parent, name, lin)
                count += 1
    return count
