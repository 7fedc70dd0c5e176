"""Stop-48 diff review of the int8 NAR's W8A8 products (`fast.w8a8`, YUE2_NAR_LINEARS=w8a8;
docs/bad_inputs.md §34): groups other than 256 and the ones the quantizer cannot take, 3-D / strided / empty inputs,
the GEMM's autotuning key with and without a bias, what the warm-up tunes, the NAR dtypes W8A8 is kept for, and the
batch command's record of how LoRAs reached a NAR that keeps its int8 layers. The GPU side of the scale's rounding:
tests/core/test_w8a8_gpu.py::test_exact_inputs_bit_equal_to_the_reference."""
from __future__ import annotations

import json

import pytest
import torch

from tests.core.test_fast_path import _run_ok


def test_other_groups_and_shapes_in_interpreter():
    """ConvRot groups of 16 and 64 (the loader accepts any power of 4) give the reference's bits too; a 3-D input
    with strides, and inputs of no rows, keep their shapes; a group of 4 is refused by name (the GPU compiler
    refuses a tensor-core product of side 4: it failed mid-render) and `convrot_linear` never picks W8A8 for it."""
    pytest.importorskip("triton")
    code = (
        "import torch\n"
        "from yue2_core.fast import w8a8, int8_kernels as K\n"
        "from yue2_core.weights.quant import quantize\n"
        "torch.manual_seed(3)\n"
        "# one shape per group (the quantizer's interpreted time goes by 32-row blocks × K): one block of rows and\n"
        "# 32 groups of 16, two blocks (the second of 5 rows) and 4 groups of 64\n"
        "for g, m, k, n in ((16, 9, 512, 48), (64, 37, 256, 32)):\n"
        "    q, s = quantize(torch.randn(n, k), g)\n"
        "    x = (torch.randn(m, k) * 2).to(torch.bfloat16)\n"
        "    b = torch.randn(n).to(torch.bfloat16)\n"
        "    y = w8a8.linear(x, q, s, b, g)\n"
        "    assert torch.equal(y, w8a8.reference(x, q, s, b, g)), (g, m, k, n)\n"
        "q, s = quantize(torch.randn(40, 512))\n"
        "x = torch.randn(3, 20, 1024).to(torch.bfloat16)[:, ::2, ::2]\n"
        "assert not x.is_contiguous()\n"
        "y = w8a8.linear(x, q, s, None, 256)\n"
        "assert y.shape == (3, 10, 40) and torch.equal(y, w8a8.reference(x, q, s, None, 256))\n"
        "assert w8a8.linear(torch.zeros(2, 0, 512, dtype=torch.bfloat16), q, s, None, 256).shape == (2, 0, 40)\n"
        "q4, s4 = quantize(torch.randn(40, 512), 4)\n"
        "try:\n"
        "    w8a8.quantize_rows(torch.zeros(20, 512, dtype=torch.bfloat16), 4)\n"
        "    raise SystemExit('group 4 accepted')\n"
        "except ValueError as e:\n"
        "    assert 'groups of 16 to 256' in str(e) and 'group 4' in str(e), e\n"
        "assert not K._w8a8_ok(512, 4) and K._w8a8_ok(512, 16) and K._w8a8_ok(512, 256) and not K._w8a8_ok(384, 128)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_gemm_bias_pointer_keeps_the_autotuner_key(monkeypatch):
    """Triton's autotuner keys on every tensor argument's dtype: a product without a bias passed the fp32 scales as
    the (unread) bias pointer, so one shape with and without a bias were two keys and the warm-up's tuning of one
    left the other to the song. The pointer is bf16 either way."""
    pytest.importorskip("triton")
    from yue2_core.fast import w8a8
    seen = []

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
            return launch

    kernels = w8a8._kernels()
    monkeypatch.setattr(w8a8, "_kernels", lambda: (kernels[0], None, Launcher(), Launcher(), True))
    codes, q = torch.zeros(40, 256, dtype=torch.int8), torch.zeros(32, 256, dtype=torch.int8)
    scales, s = torch.ones(40), torch.ones(32)
    w8a8.gemm(codes, scales, q, s, None)
    w8a8.gemm(codes, scales, q, s, torch.zeros(32, dtype=torch.bfloat16))
    assert len(seen) == 2 and seen[0] == seen[1], seen
    assert seen[0][4] == torch.bfloat16


def test_warm_covers_both_row_classes_with_and_without_bias(monkeypatch):
    """`w8a8.warm` runs every (N, K, bias) in both size classes of the autotuner's key (≤ LARGE_M rows and more)."""
    pytest.importorskip("triton")
    from yue2_core.fast import w8a8
    calls = []
    monkeypatch.setattr(w8a8, "linear", lambda x, q, s, b, g: calls.append((x.shape[0], q.shape, b is not None)))
    w8a8.warm([(64, 256, True), (768, 256, False)], "cpu")
    classes = {(m > w8a8.LARGE_M, tuple(shape), bias) for m, shape, bias in calls}
    assert classes == {(big, shape, bias) for big in (False, True)
                       for shape, bias in (((64, 256), True), ((768, 256), False))}, calls


def test_warmup_shadow_nar_quantizes_the_nar_only_linears(monkeypatch, tiny_paths):
    """With YUE2_NAR_LINEARS=w8a8 the shadow NAR's llm2vae and time embedder are int8 as the file's are (the AR's
    map, which the plan holds, has none of them), so their biased products of a chunk's rows (the time embedding is
    expanded to every row) compile and tune in the warm-up; `_nar` warms their shapes with their biases.
    A NAR in fp32 keeps float layers (`prepare_linears`), and so does its shadow."""
    from yue2_core import warmup
    from yue2_core.fast import w8a8
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    sh = warmup.build_shadow(info.dims, info.quant_ar, None, "cpu", torch.bfloat16, parts=("ar", "nar"))
    for name in ("llm2vae", "time_embedder.mlp.0", "time_embedder.mlp.2"):
        mod = sh.nar.get_submodule(name)
        assert isinstance(mod, ConvRotLinear) and mod.w8a8, name
        assert name in info.quant_nar  # as in the file
    shapes = []
    monkeypatch.setattr(w8a8, "warm", lambda s, device: shapes.extend(s))
    with torch.inference_mode():  # as `run_plan` runs it
        warmup._nar(sh.ar, sh.nar, lambda: None)
    d = info.dims
    # llm2vae and the time embedder (whose input is expanded to every row of the chunk) with their biases
    assert {s for s in shapes if s[2]} == {(d.latent_dim, d.hidden, True), (d.hidden, d.time_freq, True),
                                          (d.hidden, d.hidden, True)}, shapes
    layer = sh.nar.model.layers[0]
    assert {(m.out_features, m.in_features, False) for m in layer.modules() if isinstance(m, ConvRotLinear)} \
        <= set(shapes), shapes
    sh32 = warmup.build_shadow(info.dims, info.quant_ar, None, "cpu", torch.float32, parts=("nar",))
    assert not any(isinstance(m, ConvRotLinear) for m in sh32.nar.modules())


def test_prepare_linears_keeps_w8a8_for_bf16_only(monkeypatch, tiny_paths):
    """W8A8 takes bf16 activations: a NAR in fp32 (--dtype fp32, a GPU without bf16) marked for it took the
    dequantize path in every product (the whole weight dequantized and rotated per call); it gets the float
    layers as by default."""
    from yue2_core.nar import keeps_int8, prepare_linears
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    assert keeps_int8(torch.bfloat16) and not keeps_int8(torch.float32)
    nar32 = load_nar(info, "cpu", torch.float32)
    count = sum(isinstance(m, ConvRotLinear) for m in nar32.modules())
    assert prepare_linears(nar32) == count > 0
    assert not any(isinstance(m, ConvRotLinear) for m in nar32.modules())
    nar16 = load_nar(info, "cpu", torch.bfloat16)
    assert prepare_linears(nar16) == count
    assert all(m.w8a8 for m in nar16.modules() if isinstance(m, ConvRotLinear))
    monkeypatch.setenv("YUE2_NAR_LINEARS", "bf16")
    assert not keeps_int8(torch.bfloat16)


def test_batch_records_the_lora_mode_for_a_nar_that_keeps_int8_layers(tmp_path, monkeypatch, tiny_paths):
    """`batch --device cuda` with YUE2_NAR_LINEARS=w8a8 keeps the NAR's int8 layers, so a LoRA on the NAR alone
    gets side deltas and each song records "lora_int8"; batch.json recorded none ("the NAR is float on CUDA"), so
    a --resume under the other YUE2_LORA_INT8 was not compared and mixed songs of both modes. The run's record is
    taken here just before the batch starts (no GPU needed)."""
    import yue2_core.__main__ as cli
    import yue2_core.batch as batch
    import yue2_core.candidates as candidates
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora import synthetic as S
    info = inspect_checkpoint(tiny_paths["int8"])
    nar = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", info.dims, rank=2, seed=2)
    runs = []

    def fake_run_batch(options, **kw):
        runs.append(dict(options.run))
        return 0
    monkeypatch.setattr(batch, "run_batch", fake_run_batch)
    monkeypatch.setattr(cli, "_check_device", lambda device: None)
    monkeypatch.setattr(candidates, "device_free_bytes", lambda device: 80 << 30)
    req = tmp_path / "in.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "seed": 3, "cot": "off"}) + "\n", "utf-8")
    argv = ["batch", str(req), "--output", str(tmp_path / "out"), "--checkpoint", tiny_paths["int8"], "--device",
            "cuda", "--steps", "2", "--max-abc-tokens", "8", "--max-seconds", "1", "--lora", str(nar)]
    monkeypatch.delenv("YUE2_LORA_INT8", raising=False)
    for mode, want in (("w8a8", "side"), ("bf16", None)):
        monkeypatch.setenv("YUE2_NAR_LINEARS", mode)
        assert cli.main(argv) == 0
        assert runs[-1]["lora_int8"] == want, (mode, runs[-1])
    monkeypatch.setenv("YUE2_NAR_LINEARS", "w8a8")
    assert cli.main(argv + ["--dtype", "fp32"]) == 0  # an fp32 NAR gets float layers (`prepare_linears`)
    assert runs[-1]["lora_int8"] is None, runs[-1]


def test_adapters_on_an_auto_w8a8_nar_get_its_bf16_layers(tmp_path, monkeypatch, tiny_paths):
    """Stop 53: with YUE2_NAR_LINEARS=auto (the default) on a Hopper GPU the int8 file's NAR is W8A8, where an adapter
    would run as an fp32 side delta beside every product (≈ 0.8 s a song for rank 64) and cost the producers their
    codes. So adapters reaching such a NAR get its bf16 layers back and merge into them (no side delta, no int8 mode
    recorded), as before W8A8 was the default; an explicit YUE2_NAR_LINEARS=w8a8 keeps W8A8 with side deltas; an
    adapter on the AR only leaves the NAR W8A8. `batch` records the NAR as float for adapters under auto."""
    import yue2_core.__main__ as cli
    import yue2_core.batch as batch
    import yue2_core.candidates as candidates
    from yue2_core.nar import int8_linears, keeps_w8a8
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_nar
    from yue2_core.weights.lora import synthetic as S
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.apply import Applied, apply_stack
    from yue2_core.weights.quant import ConvRotLinear
    info = inspect_checkpoint(tiny_paths["int8"])
    path = S.write_adapter("ms-raw-nar", tmp_path / "ms.safetensors", info.dims, rank=2, seed=2)
    adapter = read_adapter(str(path), info.dims)
    monkeypatch.delenv("YUE2_LORA_INT8", raising=False)
    for switch, nar_strength, want_w8a8, want_side in (("", 1.0, False, 0), ("auto", 1.0, False, 0),
                                                       ("w8a8", 1.0, True, 1), ("", 0.0, True, 0)):
        if switch:
            monkeypatch.setenv("YUE2_NAR_LINEARS", switch)
        else:
            monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
        nar = load_nar(info, "cpu", torch.bfloat16)
        assert int8_linears(nar) > 0 and keeps_w8a8(nar)  # what prepare_linears does on a Hopper GPU
        out = apply_stack(nar, [Applied(adapter, 1.0, nar_strength)], "nar")
        assert keeps_w8a8(nar) == want_w8a8, (switch, nar_strength)
        assert (out["side"] > 0) == bool(want_side) and (out["int8_mode"] is None) == (not want_side), (switch, out)
        if not want_w8a8:
            assert not any(isinstance(m, ConvRotLinear) for m in nar.model.layers.modules())
    runs = []
    monkeypatch.setattr(batch, "run_batch", lambda options, **kw: runs.append(dict(options.run)) or 0)
    monkeypatch.setattr(cli, "_check_device", lambda device: None)
    monkeypatch.setattr(candidates, "device_free_bytes", lambda device: 80 << 30)
    from yue2_core import nar as nar_mod
    monkeypatch.setattr(nar_mod, "w8a8_pays", lambda device=None: True)  # a Hopper GPU
    req = tmp_path / "in.jsonl"
    req.write_text(json.dumps({"id": "a", "style": "pop", "lyrics": "la", "seed": 3, "cot": "off"}) + "\n", "utf-8")
    argv = ["batch", str(req), "--output", str(tmp_path / "out"), "--checkpoint", tiny_paths["int8"], "--device",
            "cuda", "--steps", "2", "--max-abc-tokens", "8", "--max-seconds", "1", "--lora", str(path)]
    monkeypatch.delenv("YUE2_NAR_LINEARS", raising=False)
    assert cli.main(argv) == 0 and runs[-1]["lora_int8"] is None, runs[-1]
