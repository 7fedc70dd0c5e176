"""The command line's check of YUE2_* environment switches (`yue2_core.__main__._check_switches`): every switch
switches.py documents is known (no "not a switch" warning), a bad value is refused by name, an unknown name warned."""
import pytest

from yue2_core.__main__ import _check_switches
from yue2_core.errors import RequestError
from yue2_core import switches


def _documented() -> list[str]:
    import re
    return sorted(set(re.findall(r"^\s+(YUE2_[A-Z0-9_]+)", switches.__doc__ or "", re.M)))


def test_every_documented_switch_is_known(monkeypatch, capsys):
    names = _documented()
    assert {"YUE2_WARMUP", "YUE2_WARMUP_PROCS", "YUE2_NAR_GRAPH", "YUE2_SAMPLER"} <= set(names), names
    for name in [n for n in __import__("os").environ if n.startswith("YUE2_")]:
        monkeypatch.delenv(name)
    for name in names:
        monkeypatch.setenv(name, "")  # empty = unset for every switch
    _check_switches()
    err = capsys.readouterr().err
    assert "not a switch" not in err, err


@pytest.mark.parametrize("name,value,words", [("YUE2_WARMUP", "maybe", "0 or 1"),
                                              ("YUE2_SIDE_CAPTURE", "on", "0 or 1"),
                                              ("YUE2_GEMV_PRE", "yes", "0 or 1"),
                                              ("YUE2_WARMUP_PROCS", "-1", "integer"),
                                              ("YUE2_WARMUP_PROCS", "two", "integer"),
                                              ("YUE2_LAYER_KERNEL", "on", "grid"),
                                              ("YUE2_LAYER_TILES", "{", "JSON"),
                                              ("YUE2_LAYER_TILES", '{"bn_o": 0}', "power of two"),
                                              ("YUE2_GEMV_TABLE", "/nonexistent/t.json", "not a file"),
                                              ("YUE2_L2_PREFETCH", "qkv:gate", "one of"),
                                              ("YUE2_L2_PREFETCH_GRID", "8", "BLOCKS:PIECE_KB"),
                                              ("YUE2_LAYER_TILES", "[" * 100_000, "nested too deeply")])
def test_bad_values_are_refused_by_name(monkeypatch, name, value, words):
    monkeypatch.setenv(name, value)
    with pytest.raises(RequestError) as e:
        _check_switches()
    assert name in str(e.value) and words in str(e.value)


def test_unknown_name_is_warned(monkeypatch, capsys):
    monkeypatch.setenv("YUE2_WARMUPS", "0")
    _check_switches()
    assert "YUE2_WARMUPS is not a switch" in capsys.readouterr().err


def test_gemv_table_contents_are_checked_before_work(monkeypatch, tmp_path):
    """A YUE2_GEMV_TABLE file that exists but holds a bad entry is refused at the switch check, not at the first
    GPU decode."""
    table = tmp_path / "t.json"
    table.write_text('{"configs": [{"n": 2048, "k": 2048, "int8": true, "m": 0, '
                     '"cfg": {"bn": 24, "bk": 64, "split": 2, "warps": 4, "stages": 2, "dot": false}}]}')
    monkeypatch.setenv("YUE2_GEMV_TABLE", str(table))
    with pytest.raises(RequestError) as e:
        _check_switches()
    assert "YUE2_GEMV_TABLE" in str(e.value) and "entry 0" in str(e.value)
    table.write_text('{"configs": []}')
    _check_switches()  # an empty table is fine


@pytest.mark.parametrize("name,value,warned", [("YUE2_LAYER_KERNEL", "cuda", True), ("YUE2_LAYER_KERNEL", "off", False),
                                               ("YUE2_GEMV", "0", True), ("YUE2_GEMV", "1", False),
                                               ("YUE2_RENDER_SMS", "8", True), ("YUE2_RENDER_SMS", "auto", False),
                                               ("YUE2_WARMUP", "0", False), ("YUE2_L2_PREFETCH", "qkv:o", True),
                                               ("YUE2_L2_PREFETCH", "0", False), ("YUE2_L2_PREFETCH", "off", False),
                                               ("YUE2_L2_PREFETCH_GRID", "8:64", False),
                                               ("YUE2_L2_PREFETCH_GRID", "16:64", True),
                                               ("YUE2_GEMV_PRE", "1", True), ("YUE2_GEMV_PRE", "0", False),
                                               ("YUE2_INT8_DOT", "convert", True), ("YUE2_INT8_DOT", "int8", False),
                                               # break-it review 53b: torch.compile and the fused kernels are CUDA's
                                               ("YUE2_COMPILE", "1", True), ("YUE2_COMPILE", "0", False),
                                               ("YUE2_FUSED", "0", True), ("YUE2_FUSED", "1", False)])
def test_gpu_only_switch_on_a_cpu_run_is_warned(monkeypatch, capsys, name, value, warned):
    """A switch of the CUDA paths set to something other than its default on a --device cpu run does nothing there,
    and says so (break-it finding: YUE2_LAYER_KERNEL=cuda was silently ignored on the CPU); defaults, CPU-relevant
    switches and runs without a device (the check's other callers) stay quiet."""
    for other in [n for n in __import__("os").environ if n.startswith("YUE2_")]:
        monkeypatch.delenv(other)
    monkeypatch.setenv(name, value)
    _check_switches("cpu")
    err = capsys.readouterr().err
    assert (f"{name}={value} changes only the CUDA" in err and "on cpu, where it has no effect" in err) == warned, err
    _check_switches()
    assert "changes only the CUDA" not in capsys.readouterr().err


def test_a_cuda_attention_backend_on_a_cpu_run_is_warned_once_up_front(monkeypatch, capsys, micro_paths):
    """Stop-53 leftover: YUE2_NAR_ATTN=fa3 on a CPU run was let through the up-front check, then the NAR tried
    FlashAttention-3 on the CPU and Python's warnings printed `layers.py:…: UserWarning: attention backend 'fa3'
    unavailable …` mid-run. The switch is not GPU-only as a whole — gqa, flash and math run on the CPU (flash is
    what PyTorch picks there) — but fa3, cudnn and efficient have no CPU kernel: for those the check says so before
    the work, and the NAR on the CPU takes the GQA call without trying them (one warning, not two)."""
    import warnings
    import torch
    from yue2_core.nar import ChunkRenderer
    from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar
    for other in [n for n in __import__("os").environ if n.startswith("YUE2_")]:
        monkeypatch.delenv(other)
    for value, warned in (("fa3", True), ("cudnn", True), ("efficient", True), ("flash", False), ("math", False),
                          ("gqa", False), ("auto", False)):
        monkeypatch.setenv("YUE2_NAR_ATTN", value)
        _check_switches("cpu")
        err = capsys.readouterr().err
        assert err.count("warning:") == warned, (value, err)
        assert (f"YUE2_NAR_ATTN={value} names an attention backend of CUDA GPUs only (fa3, cudnn, efficient); this "
                "run is on cpu, where the NAR uses PyTorch's own choice (gqa, as unset)" in err) == warned, err
        _check_switches()  # no device: no word
        assert capsys.readouterr().err == ""
    info = inspect_checkpoint(micro_paths["bf16"])
    ar, nar = load_ar(info, "cpu", torch.float32), load_nar(info, "cpu", torch.float32)
    toks = list(range(1, 20))  # any ids of the micro model's 1,024: only the AR's K/V is needed
    state = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    for value in ("fa3", "gqa"):
        monkeypatch.setenv("YUE2_NAR_ATTN", value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no mid-run UserWarning
            renderer = ChunkRenderer(nar, ar.layer_kv(toks), 4, fused=False)
            out[value] = renderer.velocity(state, 0.7)
        assert renderer.attention == "gqa", value
    assert torch.equal(out["fa3"], out["gqa"])


def test_a_gemv_table_nested_past_the_parser_is_refused(monkeypatch, tmp_path):
    """Break-it finding: a YUE2_GEMV_TABLE file of 100,000 '[' raised RecursionError from the JSON parser."""
    table = tmp_path / "t.json"
    table.write_text("[" * 100_000)
    monkeypatch.setenv("YUE2_GEMV_TABLE", str(table))
    with pytest.raises(RequestError, match="nested too deeply"):
        _check_switches()
