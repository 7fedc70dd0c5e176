"""bench/step_floor.py (issue #18): the per-kernel decode step's launches as the decoder makes them, and its
streaming kernel reading exactly the words each launch is given (Triton's CPU interpreter)."""
from __future__ import annotations

import pytest

from tests.core.bench_scripts import load
from tests.core.test_fast_path import _run_ok


def test_step_launches_mirror_the_decoder():
    """254 launches a batch-1 step (9 a layer + final norm + head); the products read their weights (int8: codes +
    fp32 row scales; bf16: 2 bytes an element) with the grids of the decoder's tables (`gemv.choose_q` /
    `gemv.choose`), the attention the bucket's split plan (per_sm·SMs / kv heads ≈ 33 splits → 128-position
    chunks → 18 splits at 2,256) and K/V of the cached positions; the schedules keep the big kernels' bytes."""
    sf = load("step_floor")
    from yue2_core.fast import gemv as G
    steps = sf.step_launches(True, 2121, 2256, 132)
    assert len(steps) == 9 * 28 + 2
    names = [x.name for x in steps[9:18]]
    assert names == ["add+RMSNorm", "qkv", "QK-norm+RoPE", "attention", "o", "add+RMSNorm", "gate_up", "SiLU·up",
                     "down"]
    # layer 0 norms the embedding (no residual delta: 4 warps reading the row); later norms read 8 fp32 partials
    assert steps[0].name == "RMSNorm" and steps[0].warps == 4 and steps[0].nbytes == 8 * 2048 * 2
    assert steps[9].nbytes == 8 * (8 * 2048 * 4 + 2048 * 2) and steps[9].warps == 8
    assert steps[7].programs == 6144 // 256  # SiLU·up rotated for int8: 256-wide blocks
    cfg, _ = G.choose_q(2 * 6144, 2048)
    gu = steps[6]
    assert gu.nbytes == 2 * 6144 * 2048 + 4 * 2 * 6144 and gu.programs == -(-2 * 6144 // cfg.bn) * cfg.split
    att = steps[3]
    assert att.programs == 8 * 18 and att.nbytes == 2122 * 8 * 128 * 4
    big = sum(x.nbytes for x in steps if not x.small)
    weights = 28 * (4096 + 2048 + 12288 + 2048 * 3) * 2048 + 32769 * 2048
    assert big == weights + 4 * (28 * (4096 + 2048 + 12288 + 2048) + 32769) + 28 * att.nbytes
    bf16 = sf.step_launches(False, 2121, 2256, 132)
    assert sum(x.nbytes for x in bf16 if not x.small) == 2 * weights + 28 * att.nbytes
    silu = bf16[7]
    assert silu.name == "SiLU·up" and silu.programs == 6144 // 1024  # unrotated: 1,024-wide blocks
    s_gu = G.choose(2 * 6144, 2048, 1, False).split
    assert silu.nbytes == (s_gu * 2 * 6144 * 4 if s_gu > 1 else 2 * 6144 * 2)  # bf16 output when not split
    with pytest.raises(ValueError, match="bucket"):
        sf.step_launches(True, 2256, 2256, 132)
    for name in sf.SCHEDULES:
        s = sf.schedule(name, steps, 132)
        want = 0 if name == "step-empty" else big
        assert sum(x.nbytes for x in s if not x.small) == want, name
    assert len(sf.schedule("products", steps, 132)) == 5 * 28 + 1
    assert len(sf.schedule("layer", steps, 132)) == 28 + 1
    with pytest.raises(ValueError, match="unknown schedule"):
        sf.schedule("nope", steps, 132)
    with pytest.raises(ValueError, match="the schedule reads"):
        sf.plan(steps, 1000)


def test_step_floor_kernel_reads_each_launch_range_in_interpreter():
    """The streaming kernel XORs exactly the words planned for each launch: every launch's XOR over its programs
    equals torch's XOR of its range (big launches on disjoint consecutive ranges, small ones on the L2 region),
    with uneven shares and empty launches, with and without the first block loaded before the PDL wait (`pre`)."""
    pytest.importorskip("triton")
    code = (
        "import functools, operator, torch\n"
        "import importlib.util, pathlib\n"
        "root = pathlib.Path(__import__('yue2_core').__file__).resolve().parents[1]\n"
        "spec = importlib.util.spec_from_file_location('sf', root / 'bench' / 'step_floor.py')\n"
        "sf = importlib.util.module_from_spec(spec); spec.loader.exec_module(sf)\n"
        "sf.SMALL = 4 * 300\n"
        "torch.manual_seed(0)\n"
        "L = sf.Launch\n"
        "launches = [L('a', 3, 4, 4 * 1000), L('s', 2, 4, 4 * 77, small=True), L('e', 2, 4, 0),\n"
        "            L('b', 5, 4, 4 * 4099)]\n"
        "buf = torch.randint(-2**31, 2**31 - 1, (300 + 1000 + 4099 + 64,), dtype=torch.int32)\n"
        "planned = sf.plan(launches, buf.numel())\n"
        "assert [p[1] for p in planned] == [300, 0, 1300, 1300]\n"
        "def x(t):\n"
        "    return functools.reduce(operator.xor, t.tolist(), 0)\n"
        "for (lau, start, per), pre in [(p, q) for p in planned for q in (False, True)]:\n"
        "    lau = lau._replace(pre=pre)\n"
        "    out = torch.zeros(8, dtype=torch.int32)\n"
        "    sf.launch_all(buf, out, [(lau, start, per)], False, per_thread=1)\n"
        "    want = x(buf[start:start + lau.nbytes // 4])\n"
        "    assert x(out[:lau.programs]) == want, (lau, x(out), want)\n"
        "print('ok')\n")
    _run_ok(code, interpret=True)


def test_split_tables_are_accepted_pair_code_entries(monkeypatch, tmp_path):
    """bench/split_tables.py's files: each is a valid YUE2_GEMV_TABLE whose one pair-code entry `gemv.choose_q`
    returns for its shape (the other shapes keep the built-in table), with fewer K splits than the built-in entry."""
    st = load("split_tables")
    from yue2_core.fast import gemv as G
    monkeypatch.setattr("sys.argv", ["split_tables.py", "--out", str(tmp_path)])
    st.main()
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == len(st.VARIANTS)
    for (name, bn, split, stages, swap) in st.VARIANTS:
        n, k = st.SHAPES[name]
        monkeypatch.setenv("YUE2_GEMV_TABLE", str(tmp_path / f"{name}_bn{bn}_s{split}.json"))
        G._tables_from.cache_clear()
        assert G.choose_q(n, k) == (G.Config(bn=bn, bk=256, split=split, stages=stages), swap)
        assert split < G._Q_TABLE[(n, k)][0].split
        others = [s for s in st.SHAPES.values() if s != (n, k)]
        assert all(G.choose_q(*s) == G._Q_TABLE[s] for s in others)
    # --family pipeline: the built-in blocks, splits and operand order with other stages or warps
    pipe = tmp_path / "pipeline"
    monkeypatch.setattr("sys.argv", ["split_tables.py", "--out", str(pipe), "--family", "pipeline"])
    st.main()
    assert len(list(pipe.glob("*.json"))) == len(st.PIPELINE)
    for (name, bn, split, stages, swap, warps) in st.PIPELINE:
        n, k = st.SHAPES[name]
        monkeypatch.setenv("YUE2_GEMV_TABLE", str(pipe / f"{name}_bn{bn}_s{split}_st{stages}_w{warps}.json"))
        G._tables_from.cache_clear()
        cfg, sw = G.choose_q(n, k)
        base, base_swap = G._Q_TABLE[(n, k)]
        assert (cfg.bn, cfg.split, sw) == (base.bn, base.split, base_swap) and (cfg.stages, cfg.warps) == (
            stages, warps) != (base.stages, base.warps), name
    G._tables_from.cache_clear()


def test_split_tables_refuse_an_unusable_out_in_one_line(monkeypatch, tmp_path):
    """A file (or a path under one) as --out: one line naming --out and why, not a traceback (break-it finding)."""
    st = load("split_tables")
    taken = tmp_path / "taken"
    taken.write_text("x")
    for out in (taken, taken / "below"):
        monkeypatch.setattr("sys.argv", ["split_tables.py", "--out", str(out)])
        with pytest.raises(SystemExit) as e:
            st.main()
        assert "cannot write the tables into --out" in str(e.value) and str(out) in str(e.value), e.value


@pytest.mark.parametrize("script,argv,says", [
    ("attn_plan", ["--budget-s", "nan"], "--budget-s takes a positive, finite number"),
    ("attn_plan", ["--budget-s", "0"], "--budget-s takes a positive, finite number"),
    ("attn_plan", ["--reps", "100001"], "--reps takes 1 to 100,000"),
    ("profile_decode", ["--attn-cfg", "16,64,3,2"], "--attn-cfg takes BL,WARPS,STAGES,PER_SM"),
    ("profile_decode", ["--attn-cfg", "512,2,3,2"], "--attn-cfg takes BL,WARPS,STAGES,PER_SM"),
    ("profile_decode", ["--attn-cfg", "16,1,3"], "--attn-cfg takes BL,WARPS,STAGES,PER_SM"),
    ("profile_decode", ["--rows", "0"], "--rows takes 1 to 64"),
    ("profile_decode", ["--prompt", "30000"], "--prompt takes 2 to 24,000"),
])
def test_attention_bench_options_are_refused_in_one_line(script, argv, says, monkeypatch, capsys):
    """bench/attn_plan.py and bench/profile_decode.py refuse an out-of-range option before any GPU work, in one
    line naming it (break-it findings: a NaN or zero --budget-s measured nothing and exited 0, 64 warps would have
    failed inside Triton after the checkpoint loaded, --rows 0 was taken)."""
    mod = load(script)
    monkeypatch.setattr("sys.argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as e:
        mod.main(argv) if script == "attn_plan" else mod.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and says in err[-1] and "Traceback" not in "\n".join(err), err


def test_capture_cost_needs_a_gpu_and_restores_torch_cuda_graph(monkeypatch):
    """bench/capture_cost.py (stop 38): exits with one line without a GPU (before loading anything), and its
    capture variant B puts `torch.cuda.graph` back however the block ends."""
    import torch
    cc = load("capture_cost")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["capture_cost.py"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        cc.main()
    real = torch.cuda.graph
    with pytest.raises(RuntimeError, match="inside"):
        with cc.light_graph():
            assert torch.cuda.graph is not real
            raise RuntimeError("inside")
    assert torch.cuda.graph is real
