"""The user's own weights named where the model produces non-finite numbers (NaN logits, latents or audio).

    mark(module, entries)      an engine module (ARModel / NARModel / VAEDecoder) remembers the own weights it carries:
                               ("lora", path, expert, strength) per applied adapter (`apply.apply_stack`), ("vae",
                               path) for a decoder read from a VAE file (`vae_files.VAEFile.load`)
    blame(message, *modules)   a NumericalError text that ends in "— download the checkpoint again", with the own
                               weights of `modules` named first as the likely cause; unchanged when they carry none
                               (or the text was already rewritten)
"""
from __future__ import annotations

ATTR = "yue2_own_weights"
CHECKPOINT = " — download the checkpoint again"


def mark(module, entries, replace: bool = False) -> None:
    """Add `entries` to what `module` carries (None: nothing to mark); `replace`: what it carries is exactly
    `entries` — the ComfyUI nodes patch a shared module per stage, so each load states its own adapters."""
    if module is None:
        return
    if replace:
        setattr(module, ATTR, tuple(entries))
    elif entries:
        setattr(module, ATTR, tuple(getattr(module, ATTR, ())) + tuple(entries))


def carried(module) -> tuple:
    """The own-weight records (LoRA adapters, VAE file) `module` carries; () for None or a module without any."""
    return tuple(getattr(module, ATTR, ()) or ()) if module is not None else ()


def blame(message: str, *modules) -> str:
    """`message` with " — download the checkpoint again" replaced by the adapters and the VAE file that `modules`
    carry: "— the LoRA a.safetensors (AR ×5) is applied to them: …; if it happens without it, download the checkpoint
    again"."""
    entries = [e for m in modules for e in carried(m)]
    if not entries or CHECKPOINT not in message:
        return message
    loras: dict = {}
    for e in entries:
        if e[0] == "lora":
            loras.setdefault(e[1], []).append(f"{e[2].upper()} ×{e[3]:g}")
    vaes = list(dict.fromkeys(e[1] for e in entries if e[0] == "vae"))
    parts = []
    one = len(loras) == 1
    if loras:
        names = ", ".join(f"{path} ({', '.join(dict.fromkeys(s))})" for path, s in loras.items())
        parts.append(f"the LoRA{'' if one else 's'} {names} {'is' if one else 'are'} applied to them: a damaged "
                     f"adapter or too high a strength gives this — try without {'it' if one else 'them'} or at a "
                     "lower strength")
    if vaes:
        parts.append(f"they come from the VAE file {', '.join(vaes)} (used instead of the checkpoint's): that file "
                     "is damaged or not a YuE2 VAE — try the checkpoint's own VAE")
    tail = f"; if it happens without {'it' if one else 'them'}, download the checkpoint again" if loras else ""
    cut = message.rindex(CHECKPOINT)
    return f"{message[:cut]} — {'; '.join(parts)}{tail}{message[cut + len(CHECKPOINT):]}"
