"""The decode kernels' programmatic-dependent-launch prologue (`fast._decode_triton.pdl_prologue`), checked in the PTX
Triton emits for an H200 (sm_90), compiled on the CPU (no GPU needed): no global load — plain or asynchronous — may
come before `griddepcontrol.wait` (it would read what the previous kernel has not written yet; Triton also merges an
early load of an address with a later one across the wait, so even a load meant only to prepare an L2 prefetch feeds
stale data to the maths — seen while trying one), and the next grid is released (`launch_dependents`) after it."""
import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from yue2_core.fast._decode_triton import gdc_launch_dependents, gdc_wait  # noqa: E402


@triton.jit
def _early_load(x_ptr, y_ptr):  # what the check must catch: a load above the wait
    v = tl.load(x_ptr)
    gdc_wait()
    gdc_launch_dependents()
    tl.store(y_ptr, v + tl.load(x_ptr + 1))


def _compiled(fn, types: dict, consts: dict, cap: int = 90, aligned: tuple = (), **opts):
    """fn compiled for sm_`cap` with these argument types and constants. `aligned`: arguments specialised as the
    runtime does for 16-byte-aligned pointers and integers divisible by 16 (vector loads, cp.async pipelines)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    consts = {**{p.name: p.default for p in fn.params if (p.is_constexpr or p.name not in types)
                 and p.name not in consts}, **consts}  # defaults: constexprs, and pointers left as None
    sig = {name: ("constexpr" if name in consts else types[name]) for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned if sig.get(a, "constexpr")
             != "constexpr"}
    src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cap, 32),
                          options={**({"launch_pdl": True} if cap >= 90 else {}), **opts})


def _ptx(fn, types: dict, consts: dict, **opts) -> str:
    return _compiled(fn, types, consts, **opts).asm["ptx"]


def _order(ptx: str) -> dict:
    lines = ptx.splitlines()

    def first(pred):
        return next((i for i, line in enumerate(lines) if pred(line.strip())), None)

    return {"wait": first(lambda s: s.startswith("griddepcontrol.wait")),
            "launch": first(lambda s: s.startswith("griddepcontrol.launch_dependents")),
            "load": first(lambda s: ("ld.global" in s or "cp.async" in s) and not s.startswith("//")),
            "store": first(lambda s: any(op in s for op in ("st.global", "atom.global", "red.global"))
                           and not s.startswith("//"))}


def _kernels():
    from yue2_core.fast import _decode_triton as k
    from yue2_core.fast import _sample_triton as sk
    from yue2_core.fast import fused
    _, split_k, merge_k, shared_k = fused._attention_kernels()
    gemv_types = dict(x_ptr="*bf16", w_ptr="*bf16", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32", K="i32",
                      KS="i32", stride_xm="i32")
    attn = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", pos_ptr="*i64", m_ptr="*fp32", l_ptr="*fp32",
                o_ptr="*fp32", cache_row="i32", cache_head="i32", scale="fp32", CHUNK="i32", L="i32", START="i32",
                SP0="i32", splits="i32", P="i32", R="i32")
    gemv_c = dict(BM=16, BN=64, BK=256, INT8=False, PARTIAL=True)
    e = dict(PDL=True)
    out = [
        ("gemv bf16 partial sums", k.gemv_kernel, gemv_types, {**gemv_c, **e}, {}),
        ("gemv int8 partial sums", k.gemv_kernel, {**gemv_types, "w_ptr": "*i8"}, {**gemv_c, **e, "INT8": True}, {}),
        ("gemv int8", k.gemv_kernel, {**gemv_types, "w_ptr": "*i8", "out_ptr": "*bf16"},
         {**gemv_c, **e, "INT8": True, "PARTIAL": False}, {}),
        ("attention split", split_k, attn, dict(NKV=8, G=2, GP=16, D=128, BL=64, IEEE=False, **e),
         dict(num_warps=2, num_stages=3)),
        ("attention split, merged by its last program (rotated)", split_k,
         {**attn, "cnt_ptr": "*i32", "out_ptr": "*bf16"},
         dict(NKV=8, G=2, GP=16, D=128, BL=64, IEEE=False, MERGE=True, SP=32, ROT=True, FENCE=True, **e),
         dict(num_warps=2, num_stages=3)),
        ("attention shared prefix", shared_k, attn, dict(NKV=8, G=2, QP=64, D=128, BL=64, IEEE=False, **e),
         dict(num_warps=8, num_stages=3)),
        ("attention merge (rotated)", merge_k, dict(m_ptr="*fp32", l_ptr="*fp32", o_ptr="*fp32", out_ptr="*bf16",
                                                    splits="i32"),
         dict(NKV=8, G=2, D=128, SP=32, HG=2, ROT=True, **e), {}),
        ("attention merge", merge_k, dict(m_ptr="*fp32", l_ptr="*fp32", o_ptr="*fp32", out_ptr="*bf16", splits="i32"),
         dict(NKV=8, G=2, D=128, SP=32, **e), {}),
        ("add+RMSNorm (rotated)", k.add_rmsnorm_kernel,
         dict(x_ptr="*bf16", d_ptr="*fp32", w_ptr="*bf16", xo_ptr="*bf16", y_ptr="*bf16", N="i32", PS="i32",
              eps="fp32"), dict(HAS_D=True, S=4, BLOCK=2048, ROT=True, **e), {}),
        ("add+RMSNorm", k.add_rmsnorm_kernel,
         dict(x_ptr="*bf16", d_ptr="*fp32", w_ptr="*bf16", xo_ptr="*bf16", y_ptr="*bf16", N="i32", PS="i32",
              eps="fp32"), dict(HAS_D=True, S=2, BLOCK=2048, ROT=False, **e), {}),
        ("RMSNorm (no residual)", k.add_rmsnorm_kernel,
         dict(x_ptr="*bf16", d_ptr="*bf16", w_ptr="*bf16", xo_ptr="*bf16", y_ptr="*bf16", N="i32", PS="i32",
              eps="fp32"), dict(HAS_D=False, S=1, BLOCK=2048, ROT=False, **e), {}),
        ("QK-norm + RoPE + KV store", k.qk_rope_kernel,
         dict(qkv_ptr="*fp32", qn_ptr="*bf16", kn_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", pos_ptr="*i64",
              q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", row_stride="i32", cache_row="i32", cache_head="i32",
              PS="i32", R="i32", eps="fp32"), dict(NH=16, NKV=8, D=128, S=2, **e), {}),
        ("QK-norm + RoPE + KV store, a block of rows (the NAR)", k.qk_rope_kernel,
         dict(qkv_ptr="*bf16", qn_ptr="*bf16", kn_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", pos_ptr="*i64",
              q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", row_stride="i32", cache_row="i32", cache_head="i32",
              PS="i32", R="i32", eps="fp32"), dict(NH=16, NKV=8, D=128, S=1, BR=16, **e), {}),
        ("SiLU·up (rotated)", k.silu_mul_kernel, dict(gu_ptr="*fp32", out_ptr="*bf16", F="i32", PS="i32"),
         dict(S=2, BLOCK=256, ROT=True, **e), {}),
        ("SiLU·up", k.silu_mul_kernel, dict(gu_ptr="*fp32", out_ptr="*bf16", F="i32", PS="i32"),
         dict(S=2, BLOCK=1024, ROT=False, **e), {}),
        ("rotate", k.rotate_kernel, dict(x_ptr="*bf16", y_ptr="*bf16", K="i32"), dict(BK=256, **e), {}),
        ("gemv bf16, CUDA cores, 1 row", k.gemv_kernel, gemv_types, {**gemv_c, **e, "BM": 1, "BN": 16, "DOT": False},
         {}),
        ("gemv int8, CUDA cores, 2 rows", k.gemv_kernel, {**gemv_types, "w_ptr": "*i8"},
         {**gemv_c, **e, "BM": 2, "BN": 16, "BK": 128, "INT8": True, "DOT": False}, {}),
        # YUE2_INT8_DOT=int8: the int8 × int8 products on pair codes and the producers writing them
        ("gemv int8 × int8 pair codes, partial sums", k.gemv_q_kernel,
         dict(q_ptr="*i8", xs_ptr="*fp32", w_ptr="*i8", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32", K="i32",
              KS="i32"), dict(BN=64, PARTIAL=True, **e), dict(num_stages=3)),
        ("gemv int8 × int8 pair codes, weights on the left", k.gemv_q_kernel,
         dict(q_ptr="*i8", xs_ptr="*fp32", w_ptr="*i8", s_ptr="*fp32", out_ptr="*bf16", M="i32", N="i32", K="i32",
              KS="i32"), dict(BN=64, PARTIAL=False, SWAP=True, **e), dict(num_stages=3)),
        ("add+RMSNorm (rotated, pair codes)", k.add_rmsnorm_kernel,
         dict(x_ptr="*bf16", d_ptr="*fp32", w_ptr="*bf16", xo_ptr="*bf16", y_ptr="*bf16", N="i32", PS="i32",
              eps="fp32", q_ptr="*i8", qs_ptr="*fp32"), dict(HAS_D=True, S=4, BLOCK=2048, ROT=True, QUANT=True, **e),
         {}),
        ("SiLU·up (rotated, pair codes)", k.silu_mul_kernel,
         dict(gu_ptr="*fp32", out_ptr="*bf16", F="i32", PS="i32", q_ptr="*i8", qs_ptr="*fp32"),
         dict(S=2, BLOCK=256, ROT=True, QUANT=True, **e), {}),
        ("rotate (pair codes)", k.rotate_kernel, dict(x_ptr="*bf16", y_ptr="*bf16", K="i32", q_ptr="*i8",
                                                      s_ptr="*fp32"), dict(BK=256, QUANT=True, **e), {}),
        ("attention merge (rotated, pair codes)", merge_k,
         dict(m_ptr="*fp32", l_ptr="*fp32", o_ptr="*fp32", out_ptr="*bf16", splits="i32", q8_ptr="*i8",
              qs_ptr="*fp32"), dict(NKV=8, G=2, D=128, SP=32, HG=2, ROT=True, QUANT=True, **e), {}),
        ("attention split, merged by the last (rotated, pair codes)", split_k,
         {**attn, "cnt_ptr": "*i32", "out_ptr": "*bf16", "q8_ptr": "*i8", "qs_ptr": "*fp32"},
         dict(NKV=8, G=2, GP=16, D=128, BL=64, IEEE=False, MERGE=True, SP=32, ROT=True, FENCE=True, QUANT=True,
              **e), dict(num_warps=2, num_stages=3)),
        ("sampling scores (CFG, penalty, temperature)", sk.scores_kernel,
         dict(logits_ptr="*bf16", lrow="i32", mask_ptr="*fp32", scores_ptr="*fp32", step_ptr="*i64",
              ring_ptr="*i64", ringw_ptr="*fp32", alpha_ptr="*fp32", budget_ptr="*i64", W="i32", G="i32", P="i32",
              cfg="fp32",
              min_tokens="i32", end_col="i32", temp="fp32"),
         dict(CFG=True, PENALTY=True, SCALE=True, RECIP=True, BLOCK=1024, LIBDEVICE=True, **e), {}),
        ("sampling finish (top-p, race, state)", sk.finish_kernel,
         dict(val_ptr="*fp32", col_ptr="*i64", noise_ptr="*fp32", step_ptr="*i64", forced_ptr="*i64",
              out_ptr="*i64", orow="i32", ring_ptr="*i64", ringw_ptr="*fp32", done_ptr="*i1", tok_ptr="*i64",
              budget_ptr="*i64", K="i32", k="i32",
              G="i32", R="i32", P="i32", top_p="fp32", max_tokens="i32", end_col="i32", start="i32"),
         dict(TOPP=True, KP=512, LIBDEVICE=True, **e), {}),
    ]
    # continuous batching (fast.refill): the same two kernels reading a step and a budget per row
    out += [(name + ", a step per row", fn, types, {**consts, "ROWS": True}, opts)
            for name, fn, types, consts, opts in out if fn in (sk.scores_kernel, sk.finish_kernel)]
    return out


def _pointers(types: dict) -> tuple:
    return tuple(name for name, t in types.items() if t.startswith("*"))


@pytest.mark.parametrize("aligned", [False, True], ids=["generic", "aligned"])
def test_no_global_load_before_the_pdl_wait(aligned):
    """Generic: no alignment known (scalar loads); aligned: 16-byte-aligned pointers as the runtime specialises them
    for torch's allocations (vector loads, cp.async pipelines) — what really runs."""
    from yue2_core.fast import triton_modules
    if triton_modules() is None:
        pytest.fail("Triton imports in the test environment but fast.triton_modules() found none")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    for name, fn, types, consts, opts in _kernels():
        o = _order(_compiled(fn, types, consts, aligned=_pointers(types) if aligned else (), **opts).asm["ptx"])
        assert o["wait"] is not None and o["launch"] is not None, (name, o)
        assert o["load"] is not None and o["load"] > o["wait"], (name, "a global load before the PDL wait", o)
        assert o["store"] is not None and o["store"] > o["wait"], (name, "a global store before the PDL wait", o)
        assert o["launch"] > o["wait"], (name, "the next grid released before the wait", o)


@pytest.mark.parametrize("kernel", ["pair codes", "pair codes, weights left", "bf16", "int8 W8A16"])
def test_pre_loads_only_the_first_weight_tile_before_the_wait(kernel):
    """YUE2_GEMV_PRE (PRE of gemv_q_kernel and of gemv_kernel's tensor-core path): the program's first weight tile
    [BN, 256] is loaded before the PDL wait — as many 16-byte loads a thread as that tile takes at BN 64 and 4 warps
    (64·256 / (128 · 16) = 8 for int8 codes, 16 for bf16), no more: the activations, scales and row scales (written
    or reusable by earlier kernels) are loaded after it, and nothing is stored or released before it."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    from yue2_core.fast import _decode_triton as k
    if kernel.startswith("pair"):
        fn, loads = k.gemv_q_kernel, 8
        types = dict(q_ptr="*i8", xs_ptr="*fp32", w_ptr="*i8", s_ptr="*fp32", out_ptr="*fp32", M="i32", N="i32",
                     K="i32", KS="i32")
        consts = dict(BN=64, PARTIAL=True, SWAP=kernel.endswith("left"), PDL=True, PRE=True)
    else:
        int8 = kernel.startswith("int8")
        fn, loads = k.gemv_kernel, 8 if int8 else 16
        types = dict(x_ptr="*bf16", w_ptr="*i8" if int8 else "*bf16", s_ptr="*fp32", out_ptr="*fp32", M="i32",
                     N="i32", K="i32", KS="i32", stride_xm="i32")
        consts = dict(BM=16, BN=64, BK=256, INT8=int8, PARTIAL=True, PDL=True, PRE=True)
    lines = [line.strip() for line in _compiled(fn, types, consts, aligned=_pointers(types) + ("N", "K", "KS"),
                                                num_stages=3).asm["ptx"].splitlines()]
    o = _order("\n".join(lines))
    early = [s for s in lines[:o["wait"]] if "ld.global" in s or "cp.async" in s]
    assert len(early) == loads and all(".v4." in s for s in early), early
    assert o["store"] > o["wait"] and o["launch"] > o["wait"], o


def test_pair_codes_keep_nan_in_their_scale():
    """The producers' pair codes (YUE2_INT8_DOT=int8) take each group's max with a NaN-keeping max (`max.NaN` in the
    sm_90 PTX), so a NaN activation makes its group's scale NaN and reaches the logits' NaN check ("the AR weights
    look damaged"): the codes themselves are always finite (the clamp maps NaN to −127) and the plain `max.f32`
    returns the other operand. (The rotation before it already spreads a NaN over its whole group; this keeps the
    guarantee whatever the rotation does.)"""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    quant = [e for e in _kernels() if "pair codes" in e[0] and not e[0].startswith("gemv")]
    assert len(quant) == 5, [e[0] for e in quant]
    for name, fn, types, consts, opts in quant:
        ptx = _compiled(fn, types, consts, aligned=_pointers(types), **opts).asm["ptx"]
        assert "max.NaN.f32" in ptx or "max.NaN.ftz.f32" in ptx, name


@pytest.mark.parametrize("aligned", [False, True], ids=["generic", "aligned"])
def test_merging_program_counts_after_a_gpu_fence(aligned):
    """In the kernel whose last program per group consumes the others' results (the attention merged in its split
    kernel) the group count (atom.global, acq_rel, GPU scope) comes after a fence.acq_rel.gpu
    and a barrier that follow the program's stores, and the consumer reads with .cg loads (not L1), so the
    counting-last program sees every block."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    counted = [e for e in _kernels() if "last program" in e[0]]
    assert len(counted) == 1, [e[0] for e in counted]  # the attention merged in its split kernel
    for name, fn, types, consts, opts in counted:
        kernel = _compiled(fn, types, consts, aligned=_pointers(types) if aligned else (), **opts)
        lines = [line.strip() for line in kernel.asm["ptx"].splitlines()]
        ops = [s.split(" ", 1)[1] if s.startswith("@") else s for s in lines]  # without the predicate
        store = next(i for i, s in enumerate(ops) if s.startswith("st.global"))
        fence = next((i for i, s in enumerate(ops) if s.startswith("fence.acq_rel.gpu")), None)
        atom = next(i for i, s in enumerate(ops) if s.startswith("atom.global"))
        assert fence is not None and store < fence < atom, (name, store, fence, atom)
        assert not any(s.startswith("st.global") for s in ops[fence:atom]), (name, "a store after the fence")
        assert any(s.startswith("bar.sync") for s in ops[fence:atom]), (name, "no barrier between fence and count")
        assert ".gpu." in ops[atom] and ".acq_rel." in ops[atom], (name, ops[atom])
        # the consumer reads the other programs' sums past L1
        loads = [s for s in ops[atom:] if s.startswith("ld.global")]
        assert loads and any(".cg" in s for s in loads), (name, loads[:4])
        # … and not through asynchronous copies, which Triton's pipelining makes of loads in a loop and which
        # cache in L1 (cp.async.ca) whatever the cache modifier
        assert not any(s.startswith("cp.async") for s in ops[atom:]), (name, "cp.async in the consumer")
        # shared memory within what any NVIDIA GPU since Turing gives a block
        assert kernel.metadata.shared <= 64 * 1024, (name, kernel.metadata.shared)


def test_an_early_load_is_caught():
    """The check above can fail: a kernel reading a value before its PDL wait is reported."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this Triton has no CUDA backend to compile for")
    o = _order(_ptx(_early_load, dict(x_ptr="*fp32", y_ptr="*fp32"), {}))
    assert o["load"] is not None and o["load"] < o["wait"], o


def test_unspecialised_arguments_exist():
    """Every name in a decode kernel's do_not_specialize is one of its parameters (Triton ignores a misspelt name
    silently, and the kernel would then compile a variant per prompt length again)."""
    from yue2_core.fast import _decode_triton as k, fused
    kernels = [k.gemv_kernel, k.qk_rope_kernel, *fused._attention_kernels()[1:]]
    marked = 0
    for fn in kernels:
        names = set(fn.arg_names)
        for entry in fn.do_not_specialize:
            assert isinstance(entry, int) or entry in names, (fn.__name__, entry, sorted(names))
            marked += 1
    assert marked >= 12, marked  # M; R; CHUNK, L, START, SP0, splits; splits; CHUNK, P, R, splits
