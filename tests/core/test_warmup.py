"""Cold-start warm-up (yue2_core/warmup.py) on the CPU: when it runs, its switch, the shadow model's module kinds and
shapes against the real loader, Triton's cache directory fallback, cancel and failure leaving the engine usable."""
import os
import threading
import time
import warnings

import pytest
import torch

from yue2_core import warmup
from yue2_core.errors import RequestError


def test_no_op_with_a_reason_on_the_cpu(monkeypatch):
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    reason = warmup.skip_reason("cpu")
    assert reason and "cpu" in reason
    report = warmup.warm_up(warmup.Plan(dims=None, quant_ar={}), "cpu")
    assert report["skipped"] == reason and report["steps"] == 0
    assert warmup.start(warmup.Plan(dims=None, quant_ar={}), "cpu") is None


def test_switch_validated(monkeypatch):
    monkeypatch.setenv("YUE2_WARMUP", "off")
    with pytest.raises(RequestError, match="YUE2_WARMUP"):
        warmup.skip_reason("cpu")
    monkeypatch.setenv("YUE2_WARMUP", "0")
    assert warmup.skip_reason("cuda") == "YUE2_WARMUP=0"


def _kinds(module):
    """{module name with layer 0 only: (class, parameter and buffer shapes and dtypes)}."""
    out = {}
    for name, mod in module.named_modules():
        if ".layers." in f".{name}." and ".layers.0" not in f".{name}":
            continue
        own = [(n, tuple(t.shape), t.dtype) for n, t in list(mod.named_parameters(recurse=False))
               + list(mod.named_buffers(recurse=False))]
        out[name] = (type(mod).__name__, tuple(own))
    return out


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_shadow_matches_the_loader_tiny(tiny_paths, fmt):
    from yue2_core.nar import float_linears
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar, load_vae
    info = inspect_checkpoint(tiny_paths[fmt])
    shadow = warmup.build_shadow(info.dims, info.quant_ar, info.vae, "cpu", torch.bfloat16)
    assert len(shadow.ar.model.layers) == 1 and len(shadow.nar.model.layers) == 1
    ar = load_ar(info, "cpu", torch.bfloat16)
    nar = load_nar(info, "cpu", torch.bfloat16, float_linears=False)
    float_linears(nar)  # what the loader does on GPUs
    assert _kinds(shadow.ar) == _kinds(ar)
    assert _kinds(shadow.nar) == _kinds(nar)
    assert _kinds(shadow.vae) == _kinds(load_vae(info, "cpu"))
    for mod in (shadow.ar, shadow.nar, shadow.vae):  # deterministic finite weights, not uninitialised memory
        for t in list(mod.parameters()) + list(mod.buffers()):
            assert torch.isfinite(t.float()).all()
    w = shadow.ar.model.layers[0].self_attn.qkv_proj.weight
    again = warmup.build_shadow(info.dims, info.quant_ar, info.vae, "cpu", torch.bfloat16, parts=("ar",))
    assert torch.equal(w, again.ar.model.layers[0].self_attn.qkv_proj.weight) and w.float().abs().sum() > 0


def test_shadow_full_size_on_meta(tiny_paths):
    """Full-size dims (the release geometry of the synthetic 'full' profile), int8 map for 28 layers: the shadow
    has layer 0's and the real-size head/embedding modules, nothing allocated."""
    from dataclasses import replace
    from yue2_core.ar import ARModel
    from yue2_core.layers import ModelDims
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.synthetic import PROFILES
    p = PROFILES["full"]
    dims = ModelDims(hidden=p.hidden, layers=p.layers, heads=p.heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                     ffn=p.ffn, vocab=p.vocab)
    tiny = inspect_checkpoint(tiny_paths["int8"]).quant_ar
    quant = {k.replace(".layers.0.", f".layers.{i}."): v for k, v in tiny.items() if ".layers.0." in k
             for i in range(p.layers)}
    quant.update({k: v for k, v in tiny.items() if ".layers." not in k})
    shadow = warmup.build_shadow(dims, quant, None, "meta", parts=("ar", "nar"))
    with torch.device("meta"):
        real = ARModel(dims, quant, torch.bfloat16)
    assert _kinds(shadow.ar) == _kinds(real)
    assert shadow.ar.model.lm_head.weight.shape == (p.vocab, p.hidden) and shadow.ar.model.lm_head.weight.is_meta
    assert type(shadow.ar.model.layers[0].mlp.down_proj).__name__ == "ConvRotLinear"
    assert type(shadow.nar.model.layers[0].mlp.down_proj) is torch.nn.Linear
    bf16 = warmup.build_shadow(dims, quant, None, "meta", parts=("ar",), int8_layers=False)
    assert type(bf16.ar.model.layers[0].mlp.down_proj) is torch.nn.Linear
    assert type(bf16.ar.model.lm_head).__name__ == type(real.model.lm_head).__name__


def test_read_only_cache_dir_one_warning_and_a_writable_fallback(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(ro))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    if os.geteuid() == 0:  # root writes anywhere: simulate the read-only directory through the probe
        real = warmup.cache_problem
        monkeypatch.setattr(warmup, "cache_problem",
                            lambda path, min_free=warmup.MIN_FREE_BYTES: "not writable (simulated)"
                            if path == str(ro) else real(path, min_free))
    else:
        assert warmup.cache_problem(str(ro)) is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        used = warmup.ensure_cache_dir()
        assert warmup.ensure_cache_dir() == used  # checked once
    assert len(caught) == 1 and str(ro) in str(caught[0].message)
    assert used != str(ro) and os.environ["TRITON_CACHE_DIR"] == used and warmup.cache_problem(used) is None
    assert warmup.cache_problem(str(tmp_path), min_free=2 ** 62).startswith("full")


def _fake(stop_after=None, fail=False):
    started = threading.Event()

    def work(plan, device, should_stop):
        started.set()
        for i in range(400):
            if should_stop():
                raise warmup.Cancelled()
            if fail and i == 3:
                raise RuntimeError("a kernel did not compile")
            time.sleep(0.005)
        return {"seconds": 2.0, "steps": 400, "stages": {}, "skipped": None}
    return work, started


def test_cancel_and_failure_leave_the_engine_usable(tiny_paths):
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(tiny_paths["bf16"], device="cpu", parts=("ar",))
    assert eng.warm is None and eng.wait_warm_up() == {}
    work, started = _fake()
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"), work=work)
    w._thread = threading.Thread(target=w._run, daemon=True)
    w._thread.start()
    assert w._thread.daemon
    started.wait(5)
    eng.warm = w
    eng.cancel_warm_up()
    assert w.report.get("cancelled") and not w.running and eng.warm is None
    assert eng.ar is not None and eng.ar.dims.layers == 2  # usable after the cancel
    work, _ = _fake(fail=True)
    w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"), work=work)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w._run()
    assert w.error and "did not compile" in w.error and len(caught) == 1
    eng.warm = w
    ar = eng.ar  # the parts wait for the warm-up (here already ended) and are handed out
    assert ar is not None and eng.warm is None and "error" in eng.wait_warm_up()


def test_should_stop_callback_cancels_and_an_exception_counts_as_cancel():
    """The nodes pass ComfyUI's interrupt test (which may raise): either way the warm-up stops."""
    for stop in (lambda: True, lambda: (_ for _ in ()).throw(KeyboardInterrupt())):
        work, _ = _fake()

        def checked(plan, device, should_stop, work=work, stop=stop):
            def poll():
                try:
                    return stop()
                except BaseException:
                    return True
            return work(plan, device, poll)
        w = warmup.WarmUp(warmup.Plan(None, {}), torch.device("cpu"), should_stop=stop, work=checked)
        w._run()
        assert w.report.get("cancelled")


def test_node_helper_starts_nothing_on_the_cpu(tiny_paths, monkeypatch):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.delenv("YUE2_WARMUP", raising=False)
    info = inspect_checkpoint(tiny_paths["int8"])
    assert warmup.start_for_checkpoint(info, torch.device("cpu")) is None
    plan = warmup.Plan.from_info(info)
    assert plan.dims == info.dims and plan.vae_cfg == info.vae and plan.phases == ("abc", "semantic")
