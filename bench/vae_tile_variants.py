"""Which of the warm-up's 16 short VAE tiles (`warmup.VAE_SHORT_FRAMES`, 33–48 latent frames: every residue mod 16)
meet distinct variants of the fused snake kernel — a lead for the kept-cache first song (docs/speed.md, "The
kept-cache first song on an H100": the warm-up's VAE stage ended after the load). Runs on the CPU in seconds:

    python bench/vae_tile_variants.py [--checkpoint FILE]   # default: a tiny synthetic file (the release's strides)

For each tile length it decodes zeros through the decoder's portable path and records every snake call's channels C,
length T, which of bias / residual / keep it carries and the input's storage offset mod 4 elements (16 bytes: the
pointer alignment Triton specialises on), then groups the lengths by the pattern Triton's JIT specialises on (each of
C and T: divisible by 16, equal to 1). Stop 54: 3 groups — F ≡ 0, F ≡ 8 and the other 14 residues mod 16 (T = F, 6F,
30F − 1, …: only the first two stages' lengths depend on the residue). Since stop 55 the warm-up decodes one tile
per group (`warmup.vae_short_tiles`, computed from `vae.snake_lengths` without running the decoder); this script
prints that choice beside the recorded groups and exits 1 if they disagree."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def patterns(cfg, lengths) -> dict:
    """{pattern: [tile lengths]} for the decoder of `cfg` (a `VAEConfig`)."""
    import torch
    from yue2_core import vae as V
    dec = V.VAEDecoder(cfg).eval()
    calls = []
    folded, forward = V.SnakeBeta.folded, V.SnakeBeta.forward

    def rec_folded(self, x, bias=None, residual=None, keep=False, kernel=False):
        calls.append((x.shape[1], x.shape[2], bias is not None, residual is not None, keep, x.storage_offset() % 4))
        return folded(self, x, bias, residual, keep, False)

    def rec_forward(self, x):
        calls.append((x.shape[1], x.shape[2], False, False, False, x.storage_offset() % 4))
        return forward(self, x)
    V.SnakeBeta.folded, V.SnakeBeta.forward = rec_folded, rec_forward
    out: dict = {}
    try:
        with torch.inference_mode():
            for frames in lengths:
                calls.clear()
                dec.decode(torch.zeros(1, cfg.latent_dim, frames))
                key = tuple((c % 16 == 0, c == 1, t % 16 == 0, t == 1, b, r, k, off) for c, t, b, r, k, off in calls)
                out.setdefault(key, []).append(frames)
    finally:
        V.SnakeBeta.folded, V.SnakeBeta.forward = folded, forward
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="")
    a = ap.parse_args()
    from yue2_core.warmup import VAE_SHORT_FRAMES
    from yue2_core.weights.checkpoint import inspect_checkpoint
    path = a.checkpoint
    if not path:
        from yue2_core.weights.synthetic import write_synthetic_checkpoint
        path = os.path.join(tempfile.mkdtemp(prefix="yue2-vae-tiles-"), "tiny.safetensors")
        write_synthetic_checkpoint(path, profile="tiny", fmt="bf16", seed=0)
    cfg = inspect_checkpoint(path).vae
    groups = patterns(cfg, VAE_SHORT_FRAMES)
    print(f"decoder strides {[s for _, _, s in cfg.blocks]}: {len(VAE_SHORT_FRAMES)} short tiles, "
          f"{len(groups)} distinct snake-kernel patterns")
    for i, frames in enumerate(groups.values()):
        print(f"  pattern {i + 1}: tile lengths {frames}")
    from yue2_core.warmup import vae_short_tiles
    chosen = vae_short_tiles(cfg)
    agree = sorted(chosen) == sorted(f[0] for f in groups.values())
    print(f"warm-up's short tiles (warmup.vae_short_tiles): {list(chosen)} — "
          f"{'one per pattern' if agree else 'DISAGREE with the recorded patterns'}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
