"""W8A8 products of the int8 file's NAR (`fast.w8a8`, YUE2_NAR_LINEARS=w8a8): the Triton quantizer and int8 GEMM in
Triton's CPU interpreter against `w8a8.reference` (comfy-kitchen's eager `int8_linear` arithmetic), bit for bit;
the switch, the marking of the NAR's layers, the warm-up's shadow, and a tiny NAR's velocity through the W8A8 path.
GPU: tests/core/test_w8a8_gpu.py and bench/nar_w8a8.py."""
from __future__ import annotations

import json

import pytest
import torch

from tests.core.test_fast_path import _run_ok


def test_kernels_equal_the_reference_in_interpreter():
    """Codes, row scales and products equal the PyTorch reference exactly (rows and columns not multiples of the
    tiles: 33 and 5 rows of 32-row blocks, 40 columns of 32-column ones; with and without bias, K of 1–3 groups); a
    NaN in a row gives a NaN row and leaves the others; a zero row gives scale 1e-30, codes 0 and the bias; the
    product is within W8A8's error of the float one; the dense and the H16·X·H16 rotations give the same codes, and
    so do the one-program-a-row quantizer and the two passes that rows wider than ROW_KERNEL_MAX_K take.
    (The interpreter spends its time in the quantizer's reduction, element by element over 32-row blocks.)"""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import w8a8\n"
        "from yue2_core.weights.quant import quantize, rotate\n"
        "torch.manual_seed(0)\n"
        "for m, k, n, bias in ((33, 512, 40, True), (5, 768, 96, False)):\n"
        "    w = torch.randn(n, k)\n"
        "    q, s = quantize(w)\n"
        "    x = (torch.randn(m, k) * 3).to(torch.bfloat16)\n"
        "    b = torch.randn(n).to(torch.bfloat16) if bias else None\n"
        "    xr = rotate(x, 256)\n"
        "    a = (xr.abs().amax(-1, keepdim=True).float() / 127).clamp(min=1e-30)\n"
        "    codes, scales = w8a8.quantize_rows(x, 256)\n"
        "    if m < 32:  # the dense rotation (one block of rows is enough: the rows are independent)\n"
        "        dense = w8a8.quantize_rows(x, 256, kron=False)\n"
        "        assert torch.equal(dense[0], codes) and torch.equal(dense[1], scales)\n"
        "        w8a8.ROW_KERNEL_MAX_K = 0  # the two passes of rows wider than the one-program-a-row kernel takes\n"
        "        two = w8a8.quantize_rows(x, 256)\n"
        "        w8a8.ROW_KERNEL_MAX_K = 8192\n"
        "        assert torch.equal(two[0], codes) and torch.equal(two[1], scales)\n"
        "    assert torch.equal(scales, a[:, 0]), (m, k, n)\n"
        "    assert torch.equal(codes, (xr / a.to(xr.dtype)).round().clamp(-128, 127).to(torch.int8)), (m, k, n)\n"
        "    y = w8a8.linear(x, q, s, b, 256)\n"
        "    assert y.dtype == torch.bfloat16 and y.shape == (m, n)\n"
        "    assert torch.equal(y, w8a8.reference(x, q, s, b, 256)), (m, k, n)\n"
        "    f = x.float() @ w.t() + (b.float() if bias else 0)\n"
        "    assert ((y.float() - f).norm() / f.norm()).item() < 3e-2, (m, k, n)\n"
        "x = torch.randn(6, 256).to(torch.bfloat16)\n"
        "x[2, 5] = float('nan')\n"
        "x[4] = 0\n"
        "q, s = quantize(torch.randn(32, 256))\n"
        "b = torch.randn(32).to(torch.bfloat16)\n"
        "y = w8a8.linear(x, q, s, b, 256)\n"
        "codes, scales = w8a8.quantize_rows(x, 256)\n"
        "assert y[2].isnan().all() and scales[2].isnan() and (codes[2] == 0).all()\n"
        "assert y[[0, 1, 3, 5]].isfinite().all()\n"
        "assert scales[4].item() == torch.tensor(1e-30).item() and (codes[4] == 0).all() and torch.equal(y[4], b)\n"
        "ok = torch.ones(3)\n"
        "try:\n"
        "    w8a8.linear(x.float(), q, s, None, 256)\n"
        "    ok = None\n"
        "except ValueError as e:\n"
        "    assert 'bf16' in str(e)\n"
        "assert ok is not None\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_tiny_nar_velocity_through_w8a8_in_interpreter(tiny_paths):
    """The tiny int8 NAR marked by `int8_linears` runs every layer product through `convrot_linear`'s W8A8 path
    (forced on the CPU, whose forward multiplies by a dequantized copy; the automatic choice needs CUDA): the
    velocity stays within W8A8's error of the bf16-layer one
    (`float_linears`), and differs from it (the path was really taken)."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar\n"
        "from yue2_core.nar import ChunkRenderer, float_linears, int8_linears\n"
        "from yue2_core.fast import int8_kernels as K, w8a8\n"
        "from yue2_core.weights.quant import ConvRotLinear\n"
        "calls = []\n"
        "plain = ConvRotLinear._base\n"
        "def base(self, x):\n"  # the CPU forward keeps a dequantized copy; the CUDA one calls convrot_linear
        "    if self.w8a8 and x.reshape(-1, x.shape[-1]).shape[0] > K.MAX_ROWS:\n"
        "        calls.append(tuple(self.weight.shape))\n"
        "        return K.convrot_linear(x, self.weight, self.weight_scale, self.bias, self.group, force='w8a8')\n"
        "    return plain(self, x)\n"
        "ConvRotLinear._base = base\n"
        f"info = inspect_checkpoint({tiny_paths['int8']!r})\n"
        "ar = load_ar(info, 'cpu', torch.bfloat16)\n"
        "a, b = load_nar(info, 'cpu', torch.bfloat16), load_nar(info, 'cpu', torch.bfloat16)\n"
        "n = int8_linears(a)\n"
        "assert n > 0 and float_linears(b) == n, n\n"
        "# 30 frames: 32 rows (the frames and 2 slots) > MAX_ROWS, one block of the quantizer (its time: per block)\n"
        "toks = [151643] + list(range(100, 120)) + [151853 + i for i in range(30)] + [151852]\n"
        "state = torch.randn(30, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)\n"
        "v8 = ChunkRenderer(a, ar.layer_kv(toks), 30, fused=False).velocity(state, 0.5).float()\n"
        "vb = ChunkRenderer(b, ar.layer_kv(toks), 30, fused=False).velocity(state, 0.5).float()\n"
        "layers = a.dims.layers\n"
        "assert len(calls) >= 4 * layers, calls\n"
        "rel = ((v8 - vb).norm() / vb.norm()).item()\n"
        "assert 0 < rel < 5e-2, rel\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_switch_and_marking(monkeypatch, tiny_paths):
    """YUE2_NAR_LINEARS: bf16 (default) or w8a8, anything else a RequestError from the reader and the up-front
    check; on a CPU load the int8 NAR keeps plain ConvRot layers either way (both modes concern CUDA), and
    `prepare_linears` follows the switch; the switch is GPU-only for the CPU-run warning."""
    from yue2_core.errors import RequestError
    from yue2_core.nar import int8_linears, linears_mode, prepare_linears
    from yue2_core.switch_check import GPU_ONLY_SWITCHES, check_environment
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
    assert linears_mode() == "bf16"
    monkeypatch.setenv("YUE2_NAR_LINEARS", "int8")
    for call in (linears_mode, check_environment):
        with pytest.raises(RequestError, match="YUE2_NAR_LINEARS must be 'bf16' or 'w8a8' or 'auto'"):
            call()
    assert "YUE2_NAR_LINEARS" in GPU_ONLY_SWITCHES
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    assert any("YUE2_NAR_LINEARS" in w for w in check_environment("cpu"))
    info = inspect_checkpoint(tiny_paths["int8"])
    nar = load_nar(info, "cpu", torch.bfloat16)  # W8A8 is for a bf16 NAR (an fp32 one: tests/core/test_w8a8_review.py)
    mods = [m for m in nar.modules() if isinstance(m, ConvRotLinear)]
    assert mods and not any(m.w8a8 for m in mods)  # a CPU load changes nothing
    assert prepare_linears(nar) == len(mods) and all(m.w8a8 for m in mods)
    other = load_nar(info, "cpu", torch.bfloat16)
    monkeypatch.setenv("YUE2_NAR_LINEARS", "bf16")
    assert prepare_linears(other) == len(mods)
    assert not any(isinstance(m, ConvRotLinear) for m in other.modules())
    assert int8_linears(other) == 0


def test_auto_takes_w8a8_on_hopper_only(monkeypatch, tiny_paths):
    """YUE2_NAR_LINEARS=auto: W8A8 on a Hopper GPU (compute capability 9.x), the bf16 layers on any other GPU, on
    ROCm and without CUDA; `prepare_linears` asks the device it will render on (`work_device`, else the NAR's),
    and the warm-up's shadow NAR gets the int8 map exactly where the render keeps its codes."""
    from yue2_core import nar as nar_mod
    from yue2_core.nar import keeps_int8, linears_mode, prepare_linears
    from yue2_core.warmup import _nar_quant
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    from yue2_core.fast import w8a8
    monkeypatch.setenv("YUE2_NAR_LINEARS", "auto")
    monkeypatch.setattr(w8a8, "available", lambda: True)
    caps = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: caps["cap"])
    monkeypatch.setattr(torch.version, "hip", None)
    for cap, want in (((9, 0), "w8a8"), ((8, 9), "bf16"), ((8, 0), "bf16"), ((10, 0), "bf16"), ((12, 0), "bf16")):
        caps["cap"] = cap
        assert linears_mode("cuda:0") == want and linears_mode() == want, cap
        assert linears_mode("cpu") == "bf16"
        assert keeps_int8(torch.bfloat16, "cuda") == (want == "w8a8") and not keeps_int8(torch.float32, "cuda")
    caps["cap"] = (9, 0)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert linears_mode("cuda") == "bf16"  # ROCm: never measured
    monkeypatch.setattr(torch.version, "hip", None)
    info = inspect_checkpoint(tiny_paths["int8"])
    quant = {k: v for k, v in info.quant_ar.items()}
    assert _nar_quant(quant, info.dims, torch.bfloat16, "cuda") and not _nar_quant(quant, info.dims, torch.bfloat16,
                                                                                    "cpu")
    nar = load_nar(info, "cpu", torch.bfloat16)
    mods = [m for m in nar.modules() if isinstance(m, ConvRotLinear)]
    assert prepare_linears(nar, work_device="cuda") == len(mods) and all(m.w8a8 for m in mods)
    other = load_nar(info, "cpu", torch.bfloat16)
    prepare_linears(other)  # the NAR's own device, the CPU: bf16 layers
    assert not any(isinstance(m, ConvRotLinear) for m in other.modules())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert linears_mode() == "bf16" and linears_mode("cuda") == "bf16"
    monkeypatch.setattr(nar_mod, "DEFAULT_NAR_LINEARS", "auto")
    monkeypatch.delenv("YUE2_NAR_LINEARS")
    assert linears_mode() == "bf16"


def test_cpu_inputs_never_take_w8a8(tiny_paths):
    """A marked layer on the CPU multiplies as before (its dequantized copy), and `convrot_linear` asked for W8A8
    with CPU inputs takes the portable path: W8A8 is a CUDA path."""
    from yue2_core.fast.int8_kernels import convrot_linear
    from yue2_core.nar import int8_linears
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    nar = load_nar(inspect_checkpoint(tiny_paths["int8"]), "cpu", torch.float32)
    layer = next(m for m in nar.modules() if isinstance(m, ConvRotLinear))
    x = torch.randn(40, layer.in_features)
    before = layer(x)
    int8_linears(nar)
    assert torch.equal(layer(x), before)
    xb = x.to(torch.bfloat16)
    args = (xb, layer.weight, layer.weight_scale, layer.bias, layer.group)
    assert torch.equal(convrot_linear(*args, w8a8=True), convrot_linear(*args, force="portable"))


def test_warmup_shadow_nar_follows_the_switch(monkeypatch, tiny_paths):
    """The warm-up's one-layer NAR has int8 layers marked for W8A8 when the switch asks (so its kernels compile and
    tune before the song), bf16 layers otherwise."""
    from yue2_core.warmup import build_shadow
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    sh = build_shadow(info.dims, info.quant_ar, None, "cpu", torch.bfloat16, parts=("nar",))
    marked = [m for m in sh.nar.modules() if isinstance(m, ConvRotLinear)]
    assert marked and all(m.w8a8 for m in marked)
    monkeypatch.setenv("YUE2_NAR_LINEARS", "bf16")
    sh = build_shadow(info.dims, info.quant_ar, None, "cpu", torch.bfloat16, parts=("nar",))
    assert not any(isinstance(m, ConvRotLinear) for m in sh.nar.modules())


def test_render_notes_another_nar_arithmetic(capsys):
    """A re-render whose NAR multiplies otherwise than the song's did says so (and how to render it as made); the
    same arithmetic, or the default on both sides, says nothing; a garbled record is named, not trusted."""
    from yue2_core.cli.song_weights import _say_nar_linears
    _say_nar_linears({"loras": [], "nar_linears": "w8a8"}, None)
    err = capsys.readouterr().err
    assert "W8A8 products (YUE2_NAR_LINEARS: w8a8, or auto on a Hopper GPU)" in err and \
        "set YUE2_NAR_LINEARS=w8a8" in err and "YUE2_NAR_LINEARS=auto, the default, takes it on Hopper GPUs only" in err
    _say_nar_linears({"loras": []}, "w8a8")
    err = capsys.readouterr().err
    assert "bf16 layers" in err and "set YUE2_NAR_LINEARS=bf16" in err
    for weights, used in (({"loras": []}, None), (None, None), ({"nar_linears": "w8a8"}, "w8a8")):
        _say_nar_linears(weights, used)
        assert capsys.readouterr().err == ""
    _say_nar_linears({"nar_linears": "x" * 500}, None)
    err = capsys.readouterr().err
    assert "an unknown setting" in err and len(err) < 400


def test_engine_records_w8a8_only_when_it_took_effect(tiny_paths, monkeypatch):
    """`YuE2Engine.load` records weights["nar_linears"] = "w8a8" when the NAR keeps int8 layers for W8A8 (CUDA,
    bf16), nothing otherwise: a CPU load under the switch records nothing (its NAR multiplies as by default)."""
    from yue2_core import nar as nar_mod
    from yue2_core.pipeline import YuE2Engine
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    eng = YuE2Engine.load(tiny_paths["int8"], device="cpu", parts=("ar", "nar"), warm_up=False)
    assert "nar_linears" not in eng.weights and not nar_mod.keeps_w8a8(eng.nar)
    nar_mod.int8_linears(eng.nar)
    assert nar_mod.keeps_w8a8(eng.nar)
    monkeypatch.setattr(nar_mod, "keeps_w8a8", lambda nar: True)
    eng = YuE2Engine.load(tiny_paths["int8"], device="cpu", parts=("ar", "nar"), warm_up=False)
    assert eng.weights["nar_linears"] == "w8a8"


def test_w8a8_table_entries_and_choice(monkeypatch, tmp_path):
    """YUE2_W8A8_TABLE: a JSON list of {"n", "k", "mb", "config"} read into launch configurations, a bad file or
    entry a RequestError naming it (also from the up-front switch check); `config_for` takes the built-in Hopper
    table only on compute capability 9.x and the file's entries over it; a warm-up child's shard hook skips no
    launch while the autotuner tunes (stop 53: skipped launches in the autotuner's benchmark ran 6 children × 95 s)."""
    from yue2_core.errors import RequestError
    from yue2_core.fast import w8a8
    from yue2_core.switch_check import check_environment
    from yue2_core import warmup_jobs
    assert w8a8.TUNE_HERE == [True]  # no warm-up child: this process tunes (a test's install_shard left it so)
    good = tmp_path / "t.json"
    good.write_text(json.dumps([{"n": 4096, "k": 2048, "mb": 1, "config": [128, 256, 128, 8, 3]}]))
    assert w8a8.read_table(str(good)) == {(4096, 2048, 1): (128, 256, 128, 8, 3)}
    every = tmp_path / "every.json"  # the built-in entries and the autotuner's configurations pass the check
    rows = {**w8a8.HOPPER_TABLE, **{(i, 256, 0): c for i, c in enumerate(w8a8.CONFIGS)}}
    every.write_text(json.dumps([{"n": n, "k": k, "mb": mb, "config": list(c)} for (n, k, mb), c in rows.items()]))
    assert w8a8.read_table(str(every)) == rows
    for bad in ("[", json.dumps([{"n": 1, "k": 2, "mb": 2, "config": [16, 16, 32, 4, 2]}]),
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [16, 16, 48, 4, 2]}]),
                json.dumps([{"n": True, "k": 2, "mb": 0, "config": [16, 16, 32, 4, 2]}]),
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [16, 16, 32, 4]}]),
                # not powers of two (tl.arange and num_warps take none; stop-53 review: accepted, then the render's
                # first product failed to compile), a bool
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [48, 16, 32, 4, 2]}]),
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [16, 80, 32, 4, 2]}]),
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [16, 16, 32, 6, 2]}]),
                json.dumps([{"n": 1, "k": 2, "mb": 0, "config": [16, 16, 32, 4, True]}])):
        path = tmp_path / "bad.json"
        path.write_text(bad)
        with pytest.raises(RequestError, match="YUE2_W8A8_TABLE"):
            w8a8.read_table(str(path))
        monkeypatch.setenv("YUE2_W8A8_TABLE", str(path))
        with pytest.raises(RequestError, match="YUE2_W8A8_TABLE"):
            check_environment()
    monkeypatch.setenv("YUE2_W8A8_TABLE", str(tmp_path / "missing.json"))
    with pytest.raises(RequestError, match="not a readable JSON file"):
        check_environment()
    monkeypatch.setattr(w8a8, "HOPPER_TABLE", {(2048, 2048, 0): (64, 128, 128, 4, 4), (4096, 2048, 1): (1, 1, 1, 1, 1)})
    w8a8._table.cache_clear()
    cap = {"v": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cap["v"])
    monkeypatch.setenv("YUE2_W8A8_TABLE", str(good))
    assert w8a8.config_for(2048, 2048, 0, "cuda") == (64, 128, 128, 4, 4)
    assert w8a8.config_for(4096, 2048, 1, "cuda") == (128, 256, 128, 8, 3)  # the file over the built-in entry
    assert w8a8.config_for(2048, 2048, 1, "cuda") is None
    cap["v"] = (8, 9)
    assert w8a8.config_for(2048, 2048, 0, "cuda") is None and w8a8.config_for(4096, 2048, 1, "cuda") is not None
    assert w8a8.config_for(2048, 2048, 0, "cpu") is None
    cap["v"] = (9, 4)  # an MI300 on ROCm: not a Hopper GPU (64 KB of LDS; stop-53 review: took the H100's entries)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert w8a8.config_for(2048, 2048, 0, "cuda") is None and w8a8.config_for(4096, 2048, 1, "cuda") is not None
    monkeypatch.setattr(torch.version, "hip", None)
    assert w8a8.config_for(2048, 2048, 0, "cuda") is not None
    w8a8._table.cache_clear()
    skipped = []
    hook = warmup_jobs.shard_hook(1, 4, skipped)
    info = type("F", (), {"name": "yue2_core.fast._w8a8_triton.gemm_kernel"})
    keys = [k for k in range(64) if warmup_jobs.owner(info.name, k, 4) != 1]
    assert hook(key=keys[0], fn=info) is True
    w8a8.TUNING[0] = True
    try:
        assert hook(key=keys[0], fn=info) is False  # while tuning, nothing is skipped
    finally:
        w8a8.TUNING[0] = False


def test_batch_on_ray_records_the_lora_mode_where_any_worker_may_keep_int8(tmp_path, monkeypatch, tiny_paths):
    """`batch --ray`: each engine actor renders on a GPU Ray gives it (of any kind, maybe on another node), not on
    the driver's, so with YUE2_NAR_LINEARS=w8a8 a NAR-only LoRA may reach the workers' int8 layers: batch.json
    records the YUE2_LORA_INT8 mode, so a --resume under the other one is compared (stop-53 review: the driver asked
    its own device — here, without a GPU, the CPU — and recorded none). None with auto (the default: adapters get
    the bf16 layers, `nar.adapters_want_bf16`), YUE2_NAR_LINEARS=bf16 or --dtype fp32 (float layers on every GPU);
    CPU actors keep int8 layers always."""
    import yue2_core.__main__ as cli
    import yue2_core.batch as batch
    from yue2_core.batch import ray_runner
    from yue2_core.fast import w8a8
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    info = inspect_checkpoint(tiny_paths["int8"])
    nar = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", info.dims, rank=2, seed=2)
    runs = []

    class Runner:  # no Ray here: the record is taken before the workers start
        def __init__(self, *a, **kw):
            pass

        def close(self):
            pass

    def fake_run_batch(options, **kw):
        runs.append(dict(options.run))
        return 0
    monkeypatch.setattr(batch, "run_batch", fake_run_batch)
    monkeypatch.setattr(ray_runner, "check_options", lambda *a: None)
    monkeypatch.setattr(ray_runner, "RayRunner", Runner)
    monkeypatch.setattr(w8a8, "available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the driver: a head node without a GPU
    req = tmp_path / "in.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "seed": 3, "cot": "off"}) + "\n", "utf-8")
    argv = ["batch", str(req), "--output", str(tmp_path / "out"), "--checkpoint", tiny_paths["int8"], "--ray", "auto",
            "--steps", "2", "--max-abc-tokens", "8", "--max-seconds", "1", "--lora", str(nar)]
    monkeypatch.delenv("YUE2_LORA_INT8", raising=False)
    for mode, extra, want in (("w8a8", [], "side"), ("w8a8", ["--device", "cuda"], "side"), (None, [], None),
                              ("auto", [], None), ("bf16", [], None), ("w8a8", ["--dtype", "fp32"], None),
                              ("bf16", ["--ray-cpu-workers", "1"], "side")):
        if mode is None:
            monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
        else:
            monkeypatch.setenv("YUE2_NAR_LINEARS", mode)
        assert cli.main(argv + extra) == 0
        assert runs[-1]["lora_int8"] == want, (mode, extra, runs[-1])


def test_marker_key_holds_the_resolved_nar_mode(monkeypatch, tiny_paths):
    """The warm-up marker key holds the NAR's arithmetic YUE2_NAR_LINEARS resolves to on the device (`warmup.nar_mode`),
    not the switch's raw value (stop-53 review: unset and "auto" were one key whatever the auto rule or
    `DEFAULT_NAR_LINEARS` said, so a change of either kept the older markers and the children's head start was lost;
    and "w8a8" set explicitly was another key than auto's W8A8, for the same kernels)."""
    from yue2_core import nar as nar_mod
    from yue2_core import warmup
    from yue2_core.weights.checkpoint import inspect_checkpoint
    plan = warmup.Plan.from_info(inspect_checkpoint(tiny_paths["int8"]))
    pays = {"v": True}
    monkeypatch.setattr(nar_mod, "w8a8_pays", lambda device=None: pays["v"])  # True: a Hopper GPU

    def key(switch, hopper):
        pays["v"] = hopper
        if switch is None:
            monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
        else:
            monkeypatch.setenv("YUE2_NAR_LINEARS", switch)
        return warmup.marker_key(plan, "cpu"), warmup.nar_mode(plan, "cpu")
    hopper, other = key(None, True), key(None, False)
    assert hopper[1] == "w8a8" and other[1] == "bf16" and hopper[0] != other[0]
    assert key("auto", True) == hopper and key("w8a8", False) == hopper
    assert key("bf16", True) == other and key("auto", False) == other
    monkeypatch.setattr(nar_mod, "DEFAULT_NAR_LINEARS", "bf16")  # a later default: the older markers renewed
    assert key(None, True) == other
    monkeypatch.setattr(nar_mod, "DEFAULT_NAR_LINEARS", "auto")
    from dataclasses import replace
    assert warmup.nar_mode(replace(plan, nar_linears="bf16"), "cpu") == "bf16"
    assert warmup.nar_mode(replace(plan, nar_linears="layers_bf16"), "cpu") == "w8a8, bf16 layers"
    assert warmup.nar_mode(replace(plan, parts=("ar", "vae")), "cpu") == ""
    assert len({warmup.marker_key(replace(plan, nar_linears=n), "cpu") for n in (None, "bf16", "layers_bf16")}) == 3


def test_engine_warmup_shadow_has_the_layers_adapters_leave(monkeypatch, tmp_path, tiny_paths):
    """`YuE2Engine.load`'s warm-up plan gives the shadow the linears the real model has once its adapters are on
    (stop-53 review): under auto on a Hopper GPU a LoRA reaching the NAR takes its bf16 layers
    (`nar.adapters_want_bf16`), YUE2_LORA_INT8=bf16 with an explicit w8a8 dequantizes its transformer layers only,
    side deltas keep W8A8; the AR's layers go bf16 only where YUE2_LORA_INT8=bf16 adapters reach them (was: the
    shadow NAR stayed W8A8 in the first two, and the shadow AR went bf16 for a NAR-only LoRA). The NAR is prepared as
    `load_nar` prepares it on CUDA; the warm-up itself is not run (no GPU)."""
    from yue2_core import nar as nar_mod
    from yue2_core import pipeline, warmup
    from yue2_core.fast import w8a8
    from yue2_core.weights import checkpoint
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    nar_lora = S.write_adapter("ms-raw-nar", tmp_path / "nar.safetensors", info.dims, rank=2, seed=2)
    ar_lora = S.write_adapter("ms-fused-ar", tmp_path / "ar.safetensors", info.dims, rank=2, seed=3)
    monkeypatch.setattr(nar_mod, "w8a8_pays", lambda device=None: True)  # a Hopper GPU
    monkeypatch.setattr(w8a8, "available", lambda: True)
    plans = []
    monkeypatch.setattr(warmup, "skip_reason", lambda device: None)
    monkeypatch.setattr(warmup, "start", lambda plan, device, should_stop=None: plans.append(plan))
    real_load_nar = checkpoint.load_nar
    monkeypatch.setattr(checkpoint, "load_nar", lambda info, device, dtype: real_load_nar(
        info, device, dtype, float_linears=True))  # prepare_linears, as on CUDA (here for the "Hopper" CPU)

    def int8(model):  # {name: marked for W8A8} of the int8 linears of layer 0 and outside the layers
        return {n: m.w8a8 for n, m in model.named_modules() if isinstance(m, ConvRotLinear)
                and (".layers." not in n or ".layers.0." in n)}
    for nar_linears, lora_int8, lora, strengths, want in (
            (None, None, nar_lora, (1.0, 1.0), "bf16"), ("w8a8", "bf16", nar_lora, (1.0, 1.0), "layers_bf16"),
            ("w8a8", None, nar_lora, (1.0, 1.0), None), (None, None, nar_lora, (1.0, 0.0), None),
            (None, "bf16", ar_lora, (1.0, 1.0), None)):
        for name, value in (("YUE2_NAR_LINEARS", nar_linears), ("YUE2_LORA_INT8", lora_int8)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        eng = pipeline.YuE2Engine.load(tiny_paths["int8"], device="cpu", parts=("ar", "nar"),
                                       loras=[(str(lora), *strengths)])
        plan = plans[-1]
        assert plan.nar_linears == want, (nar_linears, lora_int8, lora.name, strengths)
        assert plan.int8_layers == (lora_int8 != "bf16" or lora != ar_lora)
        shadow = warmup.plan_shadow(plan, "cpu")
        assert int8(shadow.nar) == int8(eng.nar), (nar_linears, lora_int8, lora.name, strengths)
        assert int8(shadow.ar) == int8(eng.ar), (nar_linears, lora_int8, lora.name, strengths)
        assert (want == "bf16") == (not int8(eng.nar))  # each case changes what it claims
        assert (want == "layers_bf16") == (bool(int8(eng.nar)) and not any(".layers." in n for n in int8(eng.nar)))
    from yue2_core import warmup_jobs as jobs  # the warm-up's children build the same shadow
    assert [jobs.plan_from_spec(jobs.child_spec(p, "cpu", 0, 1)).nar_linears for p in plans[:2]] == \
        ["bf16", "layers_bf16"]


def test_batch_records_how_its_nar_multiplies(tmp_path, monkeypatch, tiny_paths):
    """`batch` records in batch.json how its NAR will multiply (`settings.nar_linears`: "w8a8" for the int8 file on a
    Hopper GPU under auto, null for the bf16 layers — another GPU, YUE2_NAR_LINEARS=bf16, a LoRA reaching the NAR
    under auto —), which a --resume notes when it differs (tests/batch/test_batch_bad_input.py::
    test_resume_notes_another_nar_arithmetic); a `--ray` run, whose workers' GPUs decide, records none."""
    import yue2_core.__main__ as cli
    import yue2_core.batch as batch
    import yue2_core.candidates as candidates
    from yue2_core import nar as nar_mod
    from yue2_core.batch import ray_runner
    from yue2_core.fast import w8a8
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    info = inspect_checkpoint(tiny_paths["int8"])
    lora = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", info.dims, rank=2, seed=2)
    runs = []
    monkeypatch.setattr(batch, "run_batch", lambda options, **kw: runs.append(dict(options.run)) or 0)
    monkeypatch.setattr(cli, "_check_device", lambda device: None)
    monkeypatch.setattr(candidates, "device_free_bytes", lambda device: 80 << 30)
    monkeypatch.setattr(w8a8, "available", lambda: True)
    pays = {"v": True}
    monkeypatch.setattr(nar_mod, "w8a8_pays", lambda device=None: pays["v"])
    req = tmp_path / "in.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "seed": 3, "cot": "off"}) + "\n", "utf-8")
    argv = ["batch", str(req), "--output", str(tmp_path / "out"), "--checkpoint", tiny_paths["int8"], "--device",
            "cuda", "--steps", "2", "--max-abc-tokens", "8", "--max-seconds", "1"]
    monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
    for switch, hopper, extra, want in ((None, True, [], "w8a8"), (None, False, [], None), ("bf16", True, [], None),
                                        (None, True, ["--lora", str(lora)], None), ("w8a8", False, [], "w8a8"),
                                        ("w8a8", True, ["--lora", str(lora)], "w8a8"),
                                        (None, True, ["--dtype", "fp32"], None)):
        pays["v"] = hopper
        if switch is None:
            monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
        else:
            monkeypatch.setenv("YUE2_NAR_LINEARS", switch)
        assert cli.main(argv + extra) == 0
        assert runs[-1]["nar_linears"] == want, (switch, hopper, extra, runs[-1])
    monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
    monkeypatch.setattr(ray_runner, "check_options", lambda *a: None)

    class Runner:  # no Ray here: the record is taken before the workers start
        def __init__(self, *a, **kw):
            pass

        def close(self):
            pass
    monkeypatch.setattr(ray_runner, "RayRunner", Runner)
    assert cli.main(argv + ["--ray", "auto"]) == 0 and "nar_linears" not in runs[-1], runs[-1]
