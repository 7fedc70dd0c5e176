"""Cold-start warm-up (yue2_core/warmup.py) on the CPU: when it runs, its switch, the shadow model's module kinds and
shapes against the real loader, Triton's cache directory fallback, cancel and failure leaving the engine usable."""
import os
import subprocess
import sys
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


def test_the_fallback_cache_dir_is_removed_when_the_process_exits(tmp_path):
    """Before: one /tmp/yue2-triton-cache-* folder was left behind by every process that needed the fallback."""
    code = ("import os, warnings\n"
            "from yue2_core import warmup\n"
            "warmup.cache_problem = lambda path, min_free=0: 'not writable (simulated)' if path == os.environ["
            "'TRITON_CACHE_DIR'] and 'yue2-triton-cache-' not in path else None\n"
            "warnings.simplefilter('ignore')\n"
            "used = warmup.ensure_cache_dir()\n"
            "open(os.path.join(used, 'kernel.bin'), 'w').write('x')\n"
            "print(used)\n")
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    used = proc.stdout.strip().splitlines()[-1]
    assert os.path.basename(used).startswith("yue2-triton-cache-") and used.startswith(str(tmp_path))
    assert not os.path.exists(used)


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


# -- round 2: every attention variant, the marker, the children (warmup_jobs.py) ------------------------------------
def _decode_attention_sp(length, rows, kv_heads, sms, monkeypatch):
    """The SP `fast.fused.decode_attention` launches with, through fake kernels that record it (no Triton run)."""
    from yue2_core.fast import fused
    seen = {}

    class Fake:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen[self.name] = (grid, kw.get("SP"), args[14] if self.name == "split" else None)
            return launch
    import triton
    monkeypatch.setattr(fused, "_attention_kernels",
                        lambda: (triton, Fake("split"), Fake("merge"), Fake("shared")))
    d, heads = 128, 2 * kv_heads
    q = torch.zeros(rows, heads, d)
    k = torch.zeros(rows, kv_heads, length, d)
    pos = torch.full((rows,), length - 1, dtype=torch.long)
    counters = torch.zeros(rows * kv_heads, dtype=torch.int32)
    fused.decode_attention(q, k, k, pos, length, 0.1, sms=sms, counters=counters)
    splits = seen["split"][2]
    sp = seen["split"][1] if "merge" not in seen else seen["merge"][1]
    return splits, sp


@pytest.mark.parametrize("sms", [132, 108, 84, 46])
def test_attention_lengths_cover_every_split_constexpr(sms, monkeypatch):
    from yue2_core.warmup_jobs import attention_lengths, next_pow2, split_count
    for rows in (1, 2):
        reps = attention_lengths(24576, rows, 8, sms)
        # every length's SP is among the representatives, and each representative gives its SP
        every = {next_pow2(split_count(n, rows, 8, sms)) for n in range(1, 24577)}
        assert set(reps) == every and all(next_pow2(split_count(n, rows, 8, sms)) == sp for sp, n in reps.items())
        assert 1 in reps and min(reps.values()) < 1024  # the short-phase SPs the bucket stepping missed
        # the host formula is decode_attention's own (fake kernels record the launched splits and SP)
        for n in sorted(set(reps.values()) | {1, 65, 300, 999, 1000, 1024, 2256, 5000, 24576}):
            splits, sp = _decode_attention_sp(n, rows, 8, sms, monkeypatch)
            assert splits == split_count(n, rows, 8, sms) and sp == next_pow2(splits), (n, rows, sms)
    assert attention_lengths(24576, 1, 8, 132)[16] == 1024  # H200: the 1,024 bucket's SP, and SPs below it
    with pytest.raises(ValueError, match="positive"):
        attention_lengths(0, 1, 8, 132)


def test_plan_steps_include_the_short_lengths(tiny_paths):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    info = inspect_checkpoint(tiny_paths["int8"])
    plan = warmup.Plan.from_info(info)
    steps = warmup.plan_steps(plan, {"sms": 132, "bl": 64, "per_sm": 2})
    abc = [n for st, v, n in steps if st == "decode_abc" and v == 0]
    assert 64 in abc and max(abc) == 24576 and len(abc) == len(set(abc))
    assert [n for st, v, n in steps if st == "decode_abc" and v == 1] == [1024]
    assert ("nar", 0, warmup.NAR_FRAMES) in steps and sum(st == "vae" for st, _, _ in steps) == 4
    cfg = warmup.plan_steps(warmup.Plan.from_info(info, cfg_pair=True), {"sms": 132, "bl": 64, "per_sm": 2})
    assert {v for st, v, _ in cfg if st == "decode_semantic"} == {0, 1, 2, 3}


def test_procs_switch(monkeypatch):
    from yue2_core import warmup_jobs
    monkeypatch.delenv("YUE2_WARMUP_PROCS", raising=False)
    assert warmup_jobs.procs(16) == 6 and warmup_jobs.procs(2) == 1 and warmup_jobs.procs(1) == 1
    assert warmup_jobs.procs(8) == 4
    for good, n in (("0", 0), ("3", 3), (" 12 ", 12), ("64", 64)):
        monkeypatch.setenv("YUE2_WARMUP_PROCS", good)
        assert warmup_jobs.procs(16) == n
    for bad in ("-1", "two", "1.5", "٣", "65", "1000000000", "9" * 40):  # a process each: at most 64
        monkeypatch.setenv("YUE2_WARMUP_PROCS", bad)
        with pytest.raises(RequestError, match="YUE2_WARMUP_PROCS"):
            warmup_jobs.procs(16)


def test_marker_key_changes_with_each_input(tiny_paths, tmp_path):
    from dataclasses import replace
    from yue2_core import warmup_jobs as jobs
    from yue2_core.pipeline import Budgets
    from yue2_core.protocol import Sampling
    from yue2_core.weights.checkpoint import inspect_checkpoint
    info = inspect_checkpoint(tiny_paths["int8"])
    plan = warmup.Plan.from_info(info)
    dev = {"type": "cuda", "name": "NVIDIA H200", "capability": [9, 0], "sms": 132}
    ver = {"torch": "2.11.0", "triton": "3.6.0"}
    base = jobs.marker_key(jobs.plan_fields(plan), dev, ver, "src", {})
    assert base == jobs.marker_key(jobs.plan_fields(warmup.Plan.from_info(info)), dev, ver, "src", {})
    variants = [
        (jobs.plan_fields(replace(plan, dims=replace(plan.dims, ffn=plan.dims.ffn * 2))), dev, ver, "src", {}),
        (jobs.plan_fields(warmup.Plan.from_info(inspect_checkpoint(tiny_paths["bf16"]))), dev, ver, "src", {}),
        (jobs.plan_fields(replace(plan, dtype=torch.float16)), dev, ver, "src", {}),
        (jobs.plan_fields(replace(plan, parts=("ar",))), dev, ver, "src", {}),
        (jobs.plan_fields(replace(plan, budgets=Budgets(semantic=Sampling(top_k=50)))), dev, ver, "src", {}),
        (jobs.plan_fields(replace(plan, cfg_pair=True)), dev, ver, "src", {}),
        (jobs.plan_fields(replace(plan, int8_layers=False)), dev, ver, "src", {}),
        (jobs.plan_fields(plan), {**dev, "name": "NVIDIA H100"}, ver, "src", {}),
        (jobs.plan_fields(plan), {**dev, "capability": [10, 0]}, ver, "src", {}),
        (jobs.plan_fields(plan), {**dev, "sms": 108}, ver, "src", {}),
        (jobs.plan_fields(plan), dev, {**ver, "triton": "3.5.0"}, "src", {}),
        (jobs.plan_fields(plan), dev, {**ver, "torch": "2.10.0"}, "src", {}),
        (jobs.plan_fields(plan), dev, ver, "other sources", {}),
        (jobs.plan_fields(plan), dev, ver, "src", {"YUE2_FUSED": "0"}),
    ]
    keys = [jobs.marker_key(*v) for v in variants]
    assert base not in keys and len(set(keys)) == len(keys)
    # the source hash follows the files' bytes
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    h = jobs.source_hash([str(f)])
    f.write_text("x = 2\n")
    assert jobs.source_hash([str(f)]) != h and len(jobs.source_hash()) == 64


def test_marker_written_atomically(tmp_path, monkeypatch):
    from yue2_core import warmup_jobs as jobs
    path = jobs.marker_path(str(tmp_path), "k" * 32)
    real = os.replace

    def broken(a, b):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jobs.write_marker(path, {"a": 1})
    assert len(caught) == 1 and "marker" in str(caught[0].message)
    assert not os.path.exists(path) and os.listdir(os.path.dirname(path)) == []  # no partial or temporary file
    monkeypatch.setattr(os, "replace", real)
    jobs.write_marker(path, {"a": 1})
    import json
    assert json.load(open(path)) == {"a": 1} and os.listdir(os.path.dirname(path)) == [os.path.basename(path)]


def test_shard_hook_partitions_the_kernels():
    from yue2_core import warmup_jobs as jobs
    keys = [f"[('*bf16', 'D'), ('i32', {i})]" for i in range(200)]
    fn = type("Info", (), {})  # what Triton passes as fn: a JitFunctionInfo (module, name, jit_function)
    owners = []
    for key in keys:
        f = fn()
        f.name, f.module = "_kernels.<locals>.gemv_kernel", "yue2_core.fast.gemv"
        says = [jobs.shard_hook(i, 4)(key=key, fn=f, repr="", compile={}) for i in range(4)]
        assert says.count(False) == 1  # compiled by exactly one child, skipped (True) by the others
        owners.append(says.index(False))
    assert all(owners.count(i) > 20 for i in range(4))  # spread over the children
    w8 = fn()
    w8.name = "_kernel.<locals>.w8a16"
    assert not any(jobs.shard_hook(i, 4)(key="k", fn=w8) for i in range(4))  # autotuned: never skipped
    assert not jobs.shard_hook(0, 1)(key="k", fn=f)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped by anyone counts as gone too
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_cancel_kills_the_children(tiny_paths, monkeypatch, tmp_path):
    """A child that sleeps (test hook); cancelling the warm-up ends it — no orphan."""
    from yue2_core import warmup_jobs as jobs
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    plan = warmup.Plan.from_info(inspect_checkpoint(tiny_paths["bf16"]), parts=("vae",))
    pids = []
    real = jobs.Children.start

    def start(self):
        out = real(self)
        pids.extend(self.pids)
        return out
    monkeypatch.setattr(jobs.Children, "start", start)
    cancel = threading.Event()
    w = warmup.WarmUp(plan, torch.device("cpu"), should_stop=cancel.is_set,
                      work=lambda p, d, s: warmup.warm_up(p, d, s, test={"allow_cpu": True, "procs": 2,
                                                                         "child": {"sleep": 60}}))
    w._thread = threading.Thread(target=w._run, daemon=True)
    w._thread.start()
    t0 = time.time()
    while len(pids) < 2 and time.time() - t0 < 20:
        time.sleep(0.05)
    assert len(pids) == 2 and not any(_gone(p) for p in pids)
    cancel.set()
    w.wait(30)
    assert w.report.get("cancelled"), w.report
    assert all(_gone(p) for p in pids)
    assert not os.path.exists(os.path.join(str(tmp_path / "cache"), jobs.MARKER_DIR)) or \
        os.listdir(os.path.join(str(tmp_path / "cache"), jobs.MARKER_DIR)) == []  # cancelled: no marker


def test_failing_child_one_warning_and_the_warm_up_completes(tiny_paths, monkeypatch, tmp_path):
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    plan = warmup.Plan.from_info(inspect_checkpoint(tiny_paths["bf16"]), parts=("ar",), phases=("abc",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = warmup.warm_up(plan, "cpu", test={"allow_cpu": True, "procs": 2, "child": {"fail": True}})
    mine = [c for c in caught if "child" in str(c.message)]
    assert len(mine) == 1 and "test hook" in str(mine[0].message), [str(c.message) for c in caught]
    steps = warmup.plan_steps(plan, warmup.attention_geometry(plan.dims, "cpu"))
    assert report["skipped"] is None and report["stages"].get("decode_abc", 0) > 0 and report["steps"] == len(steps)
    assert report["children"]["count"] == 2 and report["children"]["failed"] == 2
    assert report["marker"] == "miss" and report["marker_written"]  # the in-process steps completed the cache


def test_children_end_to_end_on_the_cpu(tiny_paths, monkeypatch, tmp_path):
    """The child path for real on the tiny file (forced onto the CPU): two children read the header, run the same
    steps as the parent (same step digest) and report every stage; the marker is written, and the next warm-up of
    the same plan finds it and starts no child."""
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(warmup, "_CACHE_CHECKED", {})
    monkeypatch.delenv("YUE2_WARMUP_PROCS", raising=False)
    info = inspect_checkpoint(tiny_paths["int8"])
    # no VAE (18 s on a CPU); the semantic phase: a quarter of the ABC phase's CPU time (32,769 head rows of 151,849)
    plan = warmup.Plan.from_info(info, parts=("ar", "nar"), phases=("semantic",))
    from yue2_core import warmup_jobs as jobs
    seen = {}
    real_wait = jobs.Children.wait

    def wait(self, timeout=None):
        real_wait(self, timeout)
        seen["reports"] = list(self.reports)
        seen["stages"] = [set(s) for s in self.stages]
    monkeypatch.setattr(jobs.Children, "wait", wait)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a failed child would warn
        report = warmup.warm_up(plan, "cpu", test={"allow_cpu": True, "procs": 2, "child": {"allow_cpu": True}})
    assert report["children"]["count"] == 2 and report["children"]["failed"] == 0, report
    assert all(r and r["steps_digest"] == report["steps_digest"] and r["steps"] == report["steps"]
               for r in seen["reports"]), (seen, report)
    assert all(s == {"decode_semantic", "nar"} for s in seen["stages"])
    assert report["marker"] == "miss" and report["marker_written"]
    again = warmup.warm_up(plan, "cpu", test={"allow_cpu": True, "procs": 2})
    assert again["marker"] == "hit" and again["children"] == {"count": 0}


def test_children_end_with_their_parent_process(tmp_path):
    """A parent killed outright (SIGKILL: no atexit, no cancel) leaves no child: their stdin closes and they exit."""
    import signal
    import subprocess
    import sys
    code = ("import sys, time\n"
            "from yue2_core.warmup_jobs import Children\n"
            "c = Children([{'test': {'sleep': 120}}, {'test': {'sleep': 120}}]).start()\n"
            "print(' '.join(map(str, c.pids)), flush=True)\n"
            "time.sleep(120)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root,
                              env=dict(os.environ, PYTHONPATH=root))
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    time.sleep(0.5)
    assert not any(_gone(p) for p in pids)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    t0 = time.time()
    while not all(_gone(p) for p in pids) and time.time() - t0 < 15:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


def test_install_shard_wraps_triton_compile(monkeypatch):
    """The child's way in: Triton's JITFunction._do_compile wrapped so that a variant another child owns returns None
    (Triton's `run` then neither compiles nor launches) and an owned one reaches the real compile."""
    import triton
    from triton.runtime.jit import JITFunction
    from yue2_core import warmup_jobs as jobs
    from yue2_core.fast import w8a8
    # install_shard sets this process's W8A8 tuning (`TUNE_HERE`: shard 0 alone tunes); a list of the test's own,
    # so later tests in this process tune (stop-53 review: shard 2's False stayed, and a GPU W8A8 product of a shape
    # not in the built-in table returned its uninitialised output)
    monkeypatch.setattr(w8a8, "TUNE_HERE", [True])

    @triton.jit
    def gemv_kernel(x_ptr, n):
        pass
    keys = [f"[('*bf16', 'D'), ('i32', {i})]" for i in range(60)]
    owners = {k: [] for k in keys}
    for shard in range(3):
        calls = []

        def orig(self, key, signature, device, constexprs, options, attrs, warmup, calls=calls):
            calls.append(key)
            return "compiled"
        monkeypatch.setattr(JITFunction, "_do_compile", orig)
        skipped, owned = [], []
        assert jobs.install_shard(shard, 3, skipped, owned) == "do_compile"
        assert w8a8.TUNE_HERE == [shard == 0]
        for k in keys:
            got = JITFunction._do_compile(gemv_kernel, k, {}, 0, {}, None, {}, False)
            assert got == ("compiled" if k in calls else None)
            if got:
                owners[k].append(shard)
        assert len(skipped) + len(owned) == len(keys) and len(owned) == len(calls)
        assert jobs.install_shard(shard, 3) == "do_compile" and JITFunction._do_compile._yue2_shard  # not twice
    assert all(len(v) == 1 for v in owners.values())  # every variant compiled by exactly one child
    assert jobs.sharding_available()


def test_the_batch_decoder_is_a_plan_of_its_own(tiny_paths):
    """`batch` tells the warm-up its decoder (rows, continuous or static): plan_steps adds one variant per phase
    stepping the SP lengths of that many rows; the marker key and a child's spec carry it; a plan without it keeps
    the fields (and marker) it had."""
    from yue2_core import warmup_jobs as jobs
    from yue2_core.weights.checkpoint import inspect_checkpoint
    info = inspect_checkpoint(tiny_paths["int8"])
    geometry = {"sms": 132, "bl": 64, "per_sm": 2}
    plain = warmup.Plan.from_info(info)
    batch = warmup.Plan.from_info(info, batch_rows=8, batch_refill=True)
    extra = sorted(set(warmup.plan_steps(batch, geometry)) - set(warmup.plan_steps(plain, geometry)))
    for phase in ("abc", "semantic"):
        k = len(warmup.decode_variants(None, phase, False))
        mine = [n for st, v, n in extra if st == f"decode_{phase}" and v == k]
        capacity = warmup.PREFIX_TOKENS + warmup._phase_samplings(None, phase)[0].max_tokens
        assert mine == sorted(jobs.attention_lengths(min(capacity, 24576), 8, info.dims.kv_heads, 132).values())
        assert [n for st, v, n in extra if st == f"decode_{phase}" and v == k + 1] == [1024]  # the other residue
    assert "batch_rows" not in jobs.plan_fields(plain)
    plans = (plain, batch, warmup.Plan.from_info(info, batch_rows=8),
             warmup.Plan.from_info(info, batch_rows=4, batch_refill=True))
    keys = {jobs.marker_key(jobs.plan_fields(p), {"type": "cuda"}, {}, "s", {}) for p in plans}
    assert len(keys) == 4
    spec = jobs.child_spec(batch, "cpu", 0, 1)
    again = jobs.plan_from_spec(spec)
    assert (again.batch_rows, again.batch_refill) == (8, True)


@pytest.mark.parametrize("refill", [False, True], ids=["static", "continuous"])
def test_the_batch_decoder_warm_up_runs(tiny_paths, refill):
    """The batch decoder's steps run on the shadow (CPU here: the portable paths; on a GPU they compile the rows'
    attention variants and, continuous, the per-row sampling-tail kernels — tests/core/test_warmup_gpu.py)."""
    from yue2_core.weights.checkpoint import inspect_checkpoint
    plan = warmup.Plan.from_info(inspect_checkpoint(tiny_paths["bf16"]), parts=("ar",), phases=("abc",),
                                 batch_rows=3, batch_refill=refill)
    report = warmup.run_plan(plan, "cpu", allow_cpu=True)
    steps = warmup.plan_steps(plan, warmup.attention_geometry(plan.dims, "cpu"))
    assert report["skipped"] is None and report["steps"] == len(steps)
    assert any(v == len(warmup.decode_variants(None, "abc", False)) for _, v, _ in steps)


def test_the_shadow_build_imports_no_sympy(tiny_paths):
    """`build_shadow` materialises its meta modules without `to_empty` (whose torch.empty_like of meta tensors goes
    through torch._refs and imports torch.fx's symbolic shapes and sympy: 1.9 s of the warm-up's build on an H100
    machine without bytecode caches, stop 54, bench/warmup_profile.py). A fresh process: sympy is not imported by
    the build, and the shadow is materialised with the checkpoint's dtypes on the device."""
    code = ("import sys, torch\nfrom yue2_core import warmup\nfrom yue2_core.weights.checkpoint import "
            "inspect_checkpoint\ninfo = inspect_checkpoint(sys.argv[1])\nassert 'sympy' not in sys.modules\n"
            "sh = warmup.build_shadow(info.dims, info.quant_ar, info.vae, 'cpu')\n"
            "ts = [t for m in (sh.ar, sh.nar, sh.vae) for t in list(m.parameters()) + list(m.buffers())]\n"
            "assert all(t.device.type == 'cpu' for t in ts) and any(t.dtype == torch.int8 for t in ts)\n"
            "print('sympy' in sys.modules, len(ts))\n")
    out = subprocess.run([sys.executable, "-c", code, tiny_paths["int8"]], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    imported, count = out.stdout.split()
    assert imported == "False" and int(count) > 10, out.stdout


@pytest.mark.parametrize("strides", [(6, 5, 4, 4, 2, 2), (2, 2, 4, 4, 5, 6), (3, 8, 2, 4, 5, 2)])
def test_the_short_vae_tiles_meet_every_snake_variant_once(strides):
    """`vae_short_tiles` (its lengths from `vae.snake_lengths`) against the snake calls a decode really makes
    (bench/vae_tile_variants.py records them on the CPU): one tile per distinct Triton specialisation pattern of
    the 16 residues, none left out, none twice — for the release's strides and two other orders (other groups)."""
    from tests.core.bench_scripts import load
    from yue2_core.vae import VAEConfig, snake_lengths
    chans = (32, 16, 16, 8, 8, 8, 8)
    cfg = VAEConfig(8, chans[0], tuple((chans[i], chans[i + 1], s) for i, s in enumerate(strides)))
    groups = load("vae_tile_variants").patterns(cfg, warmup.VAE_SHORT_FRAMES)
    tiles = warmup.vae_short_tiles(cfg)
    assert sorted(tiles) == sorted(frames[0] for frames in groups.values())
    for key, frames in groups.items():  # the recorded calls' lengths, in call order, are snake_lengths'
        assert [call[2] for call in key] == [t % 16 == 0 for t in snake_lengths(frames[0], cfg)]
    if strides == (6, 5, 4, 4, 2, 2):
        assert tiles == (33, 40, 48)
