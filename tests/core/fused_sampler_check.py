"""Fused sampling tail vs the PyTorch tail (`fast.decode.sample_tail`), run by test_fused_sampler.py in a fresh Python
(Triton's CPU interpreter when TRITON_INTERPRET=1, or a GPU). argv: device. For each case, several steps from the same
state: out, penalty ring, done flags and next input tokens must be equal, and the processed scores the kernel leaves
in its scratch must equal sampler.candidates' bit for bit. Prints one line per case, then ok."""
import sys

import torch

from yue2_core.fast.decode import sample_tail
from yue2_core.fast.fused_sampler import FusedSampler
from yue2_core.fast.sampler import SLICES, TIE_PAD, candidates, static_mask
from yue2_core.protocol import Sampling
from yue2_core.sampling import cfg_combine

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
# Triton's CPU interpreter converts fp32 → bf16 by truncation (GPUs round to nearest): bf16 cases run in fp16 there
BF16 = torch.bfloat16 if dev.type == "cuda" else torch.float16
CASES = [  # (phase, dtype, G, cfg, sampling, forced)
    ("semantic", torch.float16, 1, 1.0, Sampling(max_tokens=40, min_tokens=0), []),
    ("semantic", torch.float16, 3, 2.0, Sampling(temperature=0.85, top_k=40, top_p=0.9, max_tokens=40,
                                                  min_tokens=5), [151853 + 7, 151853 + 7]),
    ("semantic", torch.float32, 2, 1.0, Sampling(temperature=0, repetition_penalty=1.5, penalty_window=7,
                                                  max_tokens=40, min_tokens=0), []),
    ("semantic", BF16, 2, 4.0, Sampling(temperature=1.3, top_k=1, top_p=1.0, repetition_penalty=1.0,
                                                   max_tokens=40, min_tokens=0), []),
    ("semantic", torch.float32, 1, 1.0, Sampling(temperature=1.0, top_k=1700, top_p=0.99, max_tokens=12, min_tokens=0), []),
    ("abc", torch.float16, 2, 1.0, Sampling(temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.1,
                                             max_tokens=40, min_tokens=3), []),
]
STEPS = 6


def distinct(dtype, count):
    """`count` distinct values of `dtype` in [4, 4·2^octaves): every representable value, octave by octave."""
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 12}[dtype]
    per = 2 ** mant
    octaves = -(-count // per)
    v = torch.cat([4.0 * 2 ** e * (1 + torch.arange(per, dtype=torch.float64) / per) for e in range(octaves)])
    return v[:count].float()


def state(s, phase, G, R, forced, seed):
    sl = SLICES[phase]
    k_cand = 1 if s.temperature == 0 else min(s.top_k + TIE_PAD, sl.width)
    g = torch.Generator().manual_seed(seed)
    noise = None if s.temperature == 0 else torch.empty(s.max_tokens, G, k_cand).exponential_(1.0, generator=g)
    f = torch.full((s.max_tokens,), -1, dtype=torch.long)
    f[:len(forced)] = torch.tensor(forced, dtype=torch.long)
    st = dict(step=torch.zeros(1, dtype=torch.long), ring=torch.zeros(G, s.penalty_window, dtype=torch.long),
              ring_w=torch.zeros(G, s.penalty_window), mask=static_mask(phase, torch.float32, "cpu"), noise=noise,
              forced_t=f, out=torch.full((G, s.max_tokens), -1, dtype=torch.long),
              done=torch.zeros(G, dtype=torch.bool), tokens=torch.zeros(R, dtype=torch.long))
    return {k: (v.to(dev) if v is not None else None) for k, v in st.items()}, k_cand


ORDER = ("step", "ring", "ring_w", "mask", "noise", "forced_t", "out", "done", "tokens")
only = [int(x) for x in sys.argv[2:]]  # case numbers to run (default: all)
for n, (phase, dtype, G, cfg, s, forced) in enumerate(CASES):
    if only and n not in only:
        continue
    s = s.validate(phase)
    sl, R = SLICES[phase], G * (2 if cfg != 1.0 else 1)
    a, k_cand = state(s, phase, G, R, forced, n)
    b, _ = state(s, phase, G, R, forced, n)
    fused = FusedSampler(s, phase, G, k_cand, dev)
    head = distinct(dtype, min(s.top_k, 1000) if s.temperature else 8)
    gen = torch.Generator().manual_seed(100 + n)
    allowed = torch.nonzero(static_mask(phase, torch.float32, "cpu") == 0)[:, 0]
    allowed = allowed[allowed != sl.end_col]  # the head never lands on a masked or blocked column
    for t in range(STEPS):
        logits = torch.randn(R, sl.width, generator=gen).clamp(-3, 3)
        cols = allowed[torch.randperm(allowed.numel(), generator=gen)[:head.numel()]]
        logits[:G, cols] = head  # the candidates: distinct values (ties are ranked in an unspecified order)
        logits[G:, cols] = 0.0  # uncond rows: CFG scales the head exactly (cfg is a power of two)
        if t % 3 == 2:  # the best columns were sampled recently: the penalty decides
            recent = a["ring"][:, :t].reshape(-1)
            logits[:G, recent] = 200.0 + torch.arange(recent.numel(), dtype=torch.float32)
        logits = logits.to(dtype).to(dev)
        combined = logits[:G] if cfg == 1.0 else cfg_combine(logits[:G], logits[G:], cfg)
        every = Sampling(**{**s.__dict__, "top_k": sl.width, "top_p": 1.0, "temperature": s.temperature or 1.0})
        want = candidates(combined, every, phase, a["step"], a["ring"], a["ring_w"], a["mask"], False)
        sample_tail(logits, G, cfg, s, phase, *(a[k] for k in ORDER))
        fused(logits, *(b[k] for k in ORDER), cfg=cfg)
        if s.temperature != 0:
            dense = torch.full((G, sl.width), float("-inf"), device=dev).scatter(1, want[1], want[0])
            assert torch.equal(fused.scratch, dense), (n, t, (fused.scratch - dense).abs().nan_to_num().max())
        for k in ("out", "ring", "ring_w", "done", "tokens"):
            assert torch.equal(a[k], b[k]), (n, t, k, a[k][..., :t + 1], b[k][..., :t + 1])
        for st in (a, b):
            st["step"].add_(1)
    print(phase, dtype, f"G={G} cfg={cfg} T={s.temperature} k={s.top_k} p={s.top_p}: {STEPS} steps equal,",
          f"tokens {a['out'][0, :6].tolist()}")
# review findings: (1) more than K entries tied at the k-th value must not crowd out a better one (column 5000);
# (2) a row without finite scores still yields a column inside the slice (the NaN check then reports it)
s = Sampling(temperature=1.0, top_k=2, top_p=0.1, max_tokens=4, min_tokens=0).validate("semantic")
a, k_cand = state(s, "semantic", 1, 1, [], 7)
logits = torch.zeros(1, SLICES["semantic"].width, dtype=torch.float16)
logits[0, 1:401], logits[0, 5000] = 1.0, 5.0
FusedSampler(s, "semantic", 1, k_cand, dev)(logits.to(dev), *(a[k] for k in ORDER), cfg=1.0)
assert a["out"][0, 0].item() == SLICES["semantic"].start + 5000, a["out"][0, 0]
for t in (0.0, 1.0):
    s = Sampling(temperature=t, max_tokens=4, min_tokens=0).validate("semantic")
    a, k_cand = state(s, "semantic", 1, 1, [], 8)
    nan = torch.full((1, SLICES["semantic"].width), float("nan"), dtype=torch.float16, device=dev)
    FusedSampler(s, "semantic", 1, k_cand, dev)(nan, *(a[k] for k in ORDER), cfg=1.0)
    col = a["out"][0, 0].item() - SLICES["semantic"].start
    assert 0 <= col < SLICES["semantic"].width, (t, col)
print("ok")
