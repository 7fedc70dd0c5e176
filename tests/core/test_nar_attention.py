"""The NAR's unmasked attention (`layers.unmasked_attention`): query heads folded onto their kv head must give the
same result as GQA attention with every backend, an unavailable backend falls back with one warning, and the
YUE2_NAR_ATTN switch is validated. (The CUDA backends themselves: tests/core/test_cuda_fast.py.)"""
import math
import warnings

import pytest
import torch

from yue2_core import layers
from yue2_core.errors import RequestError
from yue2_core.layers import UNMASKED_BACKENDS, unmasked_attention


def _reference(q, k, v):
    """softmax(q·kᵀ/√D)·v in fp64 with the kv heads repeated for their query heads (h reads kv head h // G)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    w = torch.softmax(q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    return w @ v


def _inputs(h=4, kv=2, t=7, s=11, d=16, seed=0, transposed=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, t, h, d, generator=gen).transpose(1, 2) if transposed else torch.randn(1, h, t, d, generator=gen)
    return q, torch.randn(1, kv, s, d, generator=gen), torch.randn(1, kv, s, d, generator=gen)


@pytest.mark.parametrize("backend", UNMASKED_BACKENDS)
@pytest.mark.parametrize("shape", [dict(h=4, kv=2), dict(h=16, kv=8, t=9, s=23, d=32), dict(h=6, kv=2, t=5),
                                   dict(h=4, kv=4), dict(h=4, kv=2, transposed=True)])
def test_folded_heads_equal_gqa_attention(backend, shape):
    """Every backend (CPU; unavailable ones fall back to the GQA call) gives softmax(qkᵀ/√D)v with query head h on
    kv head h // G — the fold stacks head h = kv·G + g at query rows g·T + t of kv head kv — including a query
    tensor that is a transposed view, as the NAR passes it."""
    q, k, v = _inputs(**shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a backend the CPU lacks warns once and falls back
        out = unmasked_attention(q, k, v, backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    err = (out.double() - _reference(q, k, v)).abs().max().item()
    assert err < 1e-5, (backend, err)


def test_fold_is_not_a_no_op():
    """The check above could not tell a wrong head order: a fold pairing query heads with the wrong kv head differs."""
    q, k, v = _inputs(h=4, kv=2)
    wrong = _reference(q[:, [0, 2, 1, 3]], k, v)[:, [0, 2, 1, 3]]
    assert (wrong - _reference(q, k, v)).abs().max() > 1e-2
    assert (unmasked_attention(q, k, v, "math").double() - wrong).abs().max() > 1e-2


def test_unavailable_backend_warns_once_and_falls_back(monkeypatch):
    """A backend refusing the inputs ("No available kernel") is reported once per (backend, device, dtype, head
    size), then the GQA call serves every later such call silently; the result is the reference's. Another dtype
    tries the backend again."""
    monkeypatch.setattr(layers, "_BACKEND_FAILED", {})
    real = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def refusing(q, k, v, *a, **kw):
        if not kw.get("enable_gqa") and q.shape[1] == k.shape[1] and q.shape[2] != 7:  # the folded call
            calls.append(1)
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, *a, **kw)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", refusing)
    q, k, v = _inputs(h=4, kv=2, t=7)
    with pytest.warns(UserWarning, match="'cudnn' unavailable"):
        out = unmasked_attention(q, k, v, "cudnn")
    assert (out.double() - _reference(q, k, v)).abs().max() < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = unmasked_attention(q, k, v, "cudnn")
    assert torch.equal(out, again) and calls == [1]
    assert list(layers._BACKEND_FAILED) == [("cudnn", "cpu", torch.float32, 16)]
    with pytest.warns(UserWarning, match="'cudnn' unavailable"):
        unmasked_attention(q.double(), k.double(), v.double(), "cudnn")
    assert calls == [1, 1]


def test_out_of_memory_is_not_swallowed(monkeypatch):
    monkeypatch.setattr(layers, "_BACKEND_FAILED", {})

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", oom)
    with pytest.raises(torch.OutOfMemoryError):
        unmasked_attention(*_inputs(), "flash")
    assert layers._BACKEND_FAILED == {}


def test_bad_arguments():
    q, k, v = _inputs(h=4, kv=2)
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        unmasked_attention(q, k, v, "fast")
    with pytest.raises(ValueError, match="3 query heads cannot share 2"):
        unmasked_attention(q[:, :3], k, v, "math")


def test_switch(monkeypatch):
    """YUE2_NAR_ATTN: auto → PyTorch's GQA call off Hopper (cuDNN's kernel on an H200 without FlashAttention-3); a
    named backend is used as given, except one of CUDA GPUs only (fa3, cudnn, efficient) for a model on the CPU:
    the GQA call there (the switch check warned before the work); any other value is refused with the accepted
    ones listed."""
    from yue2_core.nar import attention_backend
    monkeypatch.delenv("YUE2_NAR_ATTN", raising=False)
    assert attention_backend() == "gqa" and attention_backend("cpu") == "gqa"
    for cuda_only in ("fa3", "cudnn", "efficient"):
        monkeypatch.setenv("YUE2_NAR_ATTN", cuda_only)
        assert attention_backend("cuda:0") == attention_backend() == cuda_only
        assert attention_backend("cpu") == attention_backend(torch.device("cpu")) == "gqa"
    monkeypatch.setenv("YUE2_NAR_ATTN", "flash")
    assert attention_backend() == attention_backend("cpu") == "flash"
    monkeypatch.setenv("YUE2_NAR_ATTN", "cuDNN")
    with pytest.raises(RequestError, match="YUE2_NAR_ATTN must be 'auto' or 'gqa' or 'fa3' or 'cudnn'"):
        attention_backend()


def test_nar_velocity_same_with_each_backend(tiny_paths, monkeypatch):
    """The NAR velocity of a tiny checkpoint with the folded math backend equals the default one (the fused CUDA path
    passes the same backend: tests/core/test_cuda_fast.py)."""
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
    from yue2_core.nar import ChunkRenderer
    info = inspect_checkpoint(tiny_paths["bf16"])
    ar, nar = load_ar(info, "cpu", torch.float32), load_nar(info, "cpu", torch.float32)
    toks = [151643] + list(range(100, 130)) + [151853 + i for i in range(12)] + [151852]
    state = torch.randn(12, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    for backend in ("gqa", "math"):
        monkeypatch.setenv("YUE2_NAR_ATTN", backend)
        r = ChunkRenderer(nar, ar.layer_kv(toks), 12, fused=False)
        assert r.attention == backend
        out[backend] = r.velocity(state, 0.7)
    assert (out["gqa"] - out["math"]).abs().max() < 1e-4


# -- FlashAttention-3 from an optional package (fast/flash_attn.py) ---------------------------------------------------

def _fake_interface(calls, tuple_out=False):
    """A stand-in FlashAttention module: flash_attn_func(q [B, T, H, D], k/v [B, S, KV, D]) → [B, T, H, D], computed
    with PyTorch's GQA attention; it records the layouts it was given."""
    import types

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        calls.append((tuple(q.shape), tuple(k.shape), q.stride(-1), k.stride(-1)))
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                v.transpose(1, 2), enable_gqa=True).transpose(1, 2)
        return (out, None) if tuple_out else out

    return types.SimpleNamespace(flash_attn_func=flash_attn_func)


def _iface(module, package="fa3-fwd", majors=(9,), dtypes=(torch.bfloat16,), max_head=256, distributions=()):
    from yue2_core.fast.flash_attn import Interface
    return Interface(module, package, majors, dtypes, max_head, distributions)


@pytest.fixture
def fresh_lookup(monkeypatch):
    from yue2_core.fast import flash_attn
    from yue2_core import nar
    monkeypatch.setattr(flash_attn, "_FOUND", [])
    monkeypatch.setattr(flash_attn, "_WHY_NOT", {})
    monkeypatch.setattr(flash_attn, "_BROKEN", {})
    monkeypatch.setattr(nar, "_FA3_WARNED", [])
    monkeypatch.setattr(layers, "_BACKEND_FAILED", {})
    return flash_attn


def _hopper(monkeypatch, capability=(9, 0)):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)


def test_the_packages_known():
    """The three interfaces, in order, with what each build takes: fa3-fwd's wheel has no fp16 kernels; flash-attn-4
    is looked up by its distribution first (it shares flash-attn 2's `flash_attn` package)."""
    from yue2_core.fast.flash_attn import INTERFACES
    assert [i.module for i in INTERFACES] == ["flash_attn_interface", "fa3_fwd_interface", "flash_attn.cute"]
    fa3_fwd, fa4 = INTERFACES[1], INTERFACES[2]
    assert fa3_fwd.dtypes == (torch.bfloat16,) and fa3_fwd.majors == (9,)
    assert fa4.distributions[0] == "flash-attn-4" and 10 in fa4.majors


@pytest.mark.parametrize("tuple_out", [False, True])
def test_fa3_gets_token_major_views_and_gives_head_major_result(fresh_lookup, monkeypatch, tuple_out):
    """The kernel is handed q [B, T, H, D] and k/v [B, S, KV, D] (the NAR's [B, KV, S, D] buffers as transposed
    views, last dim contiguous, no copy) and its [B, T, H, D] output comes back as [B, H, T, D] equal to the
    reference — also from an interface returning (out, lse) as flash-attn-4 does. The first importable module wins."""
    import sys
    calls = []
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", _fake_interface(calls, tuple_out))
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("yue2_no_such_module", "x"), _iface("fa3_fwd_interface")))
    found = fresh_lookup.find()
    assert found[0].module == "fa3_fwd_interface" and "yue2_no_such_module" in fresh_lookup.why_not()
    assert fresh_lookup.broken() == ""  # an absent module is not a broken one
    q, k, v = _inputs(h=16, kv=8, t=9, s=23, d=32, transposed=True)
    out = fresh_lookup.attention(q, k, v)
    assert calls == [((1, 9, 16, 32), (1, 23, 8, 32), 1, 1)]
    assert out.shape == q.shape and (out.double() - _reference(q, k, v)).abs().max() < 1e-5


def test_fa3_unusable_reasons(fresh_lookup, monkeypatch):
    """Why the kernel cannot run, in words: no package (naming what to install), not a CUDA tensor, ROCm, a GPU
    generation without kernels, a dtype the build lacks, a head size it lacks."""
    import sys
    q, k, _ = _inputs(h=4, kv=2, d=16)
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("yue2_no_such_module", "x"),))
    assert "pip install fa3-fwd" in fresh_lookup.unusable(q, k)
    fresh_lookup._FOUND.clear()
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", _fake_interface([]))
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("fa3_fwd_interface", max_head=128),))
    assert fresh_lookup.unusable(q, k) == "fa3-fwd needs an NVIDIA CUDA device, not cpu"
    assert "must share a dtype, not torch.float32/torch.float64" in fresh_lookup.unusable(q, k.double())
    _hopper(monkeypatch, (8, 6))
    bf16 = torch.bfloat16
    assert "no kernels for compute capability 8.6" in fresh_lookup.unusable_for("cuda:0", bf16, 128)
    _hopper(monkeypatch)
    assert fresh_lookup.unusable_for("cuda:0", bf16, 128) is None
    assert fresh_lookup.unusable_for("cuda:0", torch.float16, 128) == "fa3-fwd takes bfloat16 q/k/v, not torch.float16"
    assert "not torch.float32" in fresh_lookup.unusable_for("cuda:0", torch.float32, 128)
    assert "multiples of 8 up to 128, not 100" in fresh_lookup.unusable_for("cuda:0", bf16, 100)
    assert "up to 128, not 256" in fresh_lookup.unusable_for("cuda:0", bf16, 256)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "not ROCm" in fresh_lookup.unusable_for("cuda:0", bf16, 128)


def test_fa3_without_package_warns_once_and_falls_back(fresh_lookup, monkeypatch):
    """YUE2_NAR_ATTN=fa3 where no interface imports (or off Hopper): one warning naming the reason, then PyTorch's
    GQA call, silently for later calls; the result is the reference's."""
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("yue2_no_such_module", "x"),))
    q, k, v = _inputs(h=4, kv=2)
    with pytest.warns(UserWarning, match="'fa3' unavailable .*no FlashAttention-3 interface is installed"):
        out = unmasked_attention(q, k, v, "fa3")
    assert (out.double() - _reference(q, k, v)).abs().max() < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(unmasked_attention(q, k, v, "fa3"), out)


@pytest.mark.parametrize("error", [RuntimeError("FlashAttention only supports Hopper GPUs or newer."),
                                   AssertionError("head_dim must be <= 128"), TypeError("unexpected argument")])
def test_fa3_kernel_error_falls_back(fresh_lookup, monkeypatch, error):
    """Any exception from the third-party kernel (a RuntimeError, flash-attn-4's asserts, its compiler's own
    exception classes) → one warning and the GQA call; an out-of-memory error propagates."""
    monkeypatch.setattr(fresh_lookup, "unusable", lambda q, k: None)

    def broken(q, k, v):
        raise error

    monkeypatch.setattr(fresh_lookup, "attention", broken)
    q, k, v = _inputs(h=4, kv=2)
    with pytest.warns(UserWarning, match=str(error).split(" ")[0]):
        out = unmasked_attention(q, k, v, "fa3")
    assert (out.double() - _reference(q, k, v)).abs().max() < 1e-5

    def oom(q, k, v):
        raise torch.OutOfMemoryError("CUDA out of memory")

    layers._BACKEND_FAILED.clear()
    monkeypatch.setattr(fresh_lookup, "attention", oom)
    with pytest.raises(torch.OutOfMemoryError):
        unmasked_attention(q, k, v, "fa3")


def test_kernel_error_during_a_capture_propagates(fresh_lookup, monkeypatch):
    """While a CUDA graph is being captured, a kernel's error belongs to the capture: it propagates (the renderer
    then runs eagerly) and the backend is not marked failed."""
    monkeypatch.setattr(fresh_lookup, "unusable", lambda q, k: None)
    monkeypatch.setattr(layers, "_capturing", lambda q: True)

    def broken(q, k, v):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fresh_lookup, "attention", broken)
    with pytest.raises(RuntimeError, match="capturing"):
        unmasked_attention(*_inputs(h=4, kv=2), "fa3")
    assert layers._BACKEND_FAILED == {}


@pytest.mark.parametrize("capability,installed,dtype,expected", [
    ((9, 0), True, torch.bfloat16, "fa3"), ((8, 0), True, torch.bfloat16, "gqa"), ((10, 0), True, torch.bfloat16, "gqa"),
    ((9, 0), False, torch.bfloat16, "gqa"), ((9, 0), True, torch.float32, "gqa")])
def test_auto_picks_fa3_on_hopper_when_it_can_run(fresh_lookup, monkeypatch, capability, installed, dtype, expected):
    """auto = fa3 only on a compute-capability-9 GPU (where it was measured faster) with an interface installed
    whose build takes the model's dtype (an fp32 NAR, e.g. ComfyUI's --force-fp32, keeps PyTorch's attention
    without a warning)."""
    import sys
    from yue2_core.nar import attention_backend
    monkeypatch.delenv("YUE2_NAR_ATTN", raising=False)
    _hopper(monkeypatch, capability)
    if installed:
        monkeypatch.setitem(sys.modules, "fa3_fwd_interface", _fake_interface([]))
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("fa3_fwd_interface" if installed else "yue2_no_such_module"),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attention_backend("cuda:0", dtype, 128) == expected
    assert attention_backend("cpu", dtype, 128) == "gqa"


def test_auto_stays_off_rocm(fresh_lookup, monkeypatch):
    """A ROCm build reports compute capabilities too (9.x on MI200/MI300): not a Hopper GPU."""
    import sys
    from yue2_core.nar import attention_backend
    monkeypatch.delenv("YUE2_NAR_ATTN", raising=False)
    _hopper(monkeypatch)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", _fake_interface([]))
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("fa3_fwd_interface"),))
    assert attention_backend("cuda:0", torch.bfloat16, 128) == "gqa"


@pytest.mark.parametrize("error", [ImportError("libcudart.so.13: cannot open shared object file"),
                                   ModuleNotFoundError("No module named 'einops'", name="einops"),
                                   ModuleNotFoundError("No module named 'fa3_fwd'", name="fa3_fwd")])
def test_fa3_installed_but_broken_is_named(fresh_lookup, monkeypatch, error):
    """A package that is there but does not import (built for another CUDA, a missing dependency, its own compiled
    part missing: `fa3_fwd` is not `fa3_fwd_interface`) is told apart from one that is absent: YUE2_NAR_ATTN=fa3
    names it with its error, and the automatic choice on a Hopper GPU warns once (then PyTorch's attention)
    instead of silently leaving the speed-up out."""
    import importlib
    from yue2_core.nar import attention_backend
    real = importlib.import_module

    def fake(name, *a, **kw):
        if name == "fa3_fwd_interface":
            raise error
        if name == "yue2_absent":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", fake)
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("yue2_absent", "absent-pkg"), _iface("fa3_fwd_interface")))
    q, k, _ = _inputs(h=4, kv=2)
    reason = fresh_lookup.unusable(q, k)
    assert reason.startswith("installed but not importable: fa3-fwd (") and str(error).split(":")[0] in reason
    assert "absent-pkg" not in reason
    monkeypatch.delenv("YUE2_NAR_ATTN", raising=False)
    _hopper(monkeypatch)
    with pytest.warns(UserWarning, match="FlashAttention-3 is installed but does not import .*fa3-fwd"):
        assert attention_backend("cuda:0", torch.bfloat16, 128) == "gqa"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attention_backend("cuda:0", torch.bfloat16, 128) == "gqa"  # once per process


def test_flash_attn_4_needs_its_distribution(fresh_lookup, monkeypatch):
    """flash-attn-4 shares flash-attn 2's `flash_attn` package: without the flash-attn-4 distribution its module is
    not imported at all (a broken flash-attn 2 `__init__` is not blamed on it, and flash-attn 2's CUDA extension is
    not loaded as a side effect)."""
    import importlib
    imported = []
    real = importlib.import_module

    def spy(name, *a, **kw):
        imported.append(name)
        if name == "flash_attn.cute":
            raise ImportError("flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: undefined symbol")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", spy)
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (
        _iface("flash_attn.cute", "flash-attn-4", distributions=("yue2-no-such-distribution", "yue2-nor-this")),))
    assert fresh_lookup.find() is None and "flash_attn.cute" not in imported
    assert fresh_lookup.broken() == "" and "not installed" in fresh_lookup.why_not()
    # any one of the names installed (pytest stands in for flash-attn-cute, an older name): the module is imported
    fresh_lookup._FOUND.clear()
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (
        _iface("flash_attn.cute", "flash-attn-4", distributions=("yue2-no-such-distribution", "PyTest")),))
    assert fresh_lookup.find() is None and "flash_attn.cute" in imported
    assert "flash_attn_2_cuda" in fresh_lookup.broken()


def test_fa3_absent_is_quiet(fresh_lookup, monkeypatch):
    """Nothing installed: the automatic choice stays PyTorch's attention without a word."""
    from yue2_core.nar import attention_backend
    monkeypatch.setattr(fresh_lookup, "INTERFACES", (_iface("yue2_no_such_module", "x"),))
    monkeypatch.delenv("YUE2_NAR_ATTN", raising=False)
    _hopper(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attention_backend("cuda:0", torch.bfloat16, 128) == "gqa"
    assert fresh_lookup.broken() == ""
