"""The next attention bucket's decode graph captured on a worker thread while the current one replays
(`yue2_core.fast.side_capture`): the same tokens as capturing every bucket in the main thread, side captures used, a
failing side capture falling back to the main-thread capture, a phase ending with a capture pending. Marked gpu;
skipped without CUDA."""
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

from yue2_core.fast import decode as fd  # noqa: E402
from yue2_core.fast import side_capture  # noqa: E402
from yue2_core.protocol import Sampling, SongRequest, semantic_prefix  # noqa: E402

STEPS = 2_300  # from a ~100-token prompt: attention buckets 1,024, 2,048 and 3,072 → the first captured in the main
#               thread, the other two on the worker


@pytest.fixture(scope="module", params=["int8", "bf16"])
def engine(request, tiny_paths):
    from yue2_core.pipeline import YuE2Engine
    eng = YuE2Engine.load(tiny_paths[request.param], device="cuda")
    eng.wait_warm_up()
    return eng


def _decode(eng, monkeypatch, side: str, steps: int = STEPS, seed: int = 7):
    monkeypatch.setenv("YUE2_SIDE_CAPTURE", side)
    req = SongRequest("pop", "la la", cot="full")
    sp = semantic_prefix(req, [], eng.tokenizer.encode)
    s = Sampling(temperature=1.0, min_tokens=steps, max_tokens=steps)
    dec = fd.PhaseDecoder(eng.ar, [sp], s, [seed], "semantic", use_graph=True)
    res = dec.run()[0]
    return res.tokens, res.timing


def test_side_captured_graphs_give_the_same_tokens(engine, monkeypatch):
    base, base_stats = _decode(engine, monkeypatch, "0")
    got, stats = _decode(engine, monkeypatch, "1")
    print(f"main thread: capture {base_stats['graph_capture_seconds']:.3f} s; side: capture on the path "
          f"{stats['graph_capture_seconds']:.3f} s, {stats['side_captures']} side captures "
          f"({stats['side_capture_seconds']:.3f} s on the worker)")
    assert base_stats["execution"] == stats["execution"] == "cuda_graph"
    assert base_stats["side_captures"] == 0
    assert stats["side_captures"] == 2, {k: v for k, v in stats.items() if "capture" in k or "fallback" in k}
    assert "side_capture_fallback_reason" not in stats, stats
    assert len(got) == len(base) == STEPS
    assert got == base


def test_a_failing_side_capture_falls_back_to_the_main_thread(engine, monkeypatch):
    base, _ = _decode(engine, monkeypatch, "0", seed=11)
    real = side_capture.start

    def broken(step, attn_len, device, stream, pool, capture):
        def refuse(graph, pool, stream, fn, mode):
            raise RuntimeError("operation not permitted when stream is capturing (test)")
        return real(step, attn_len, device, stream, pool, refuse)

    monkeypatch.setattr(side_capture, "start", broken)
    got, stats = _decode(engine, monkeypatch, "1", seed=11)
    assert stats["side_captures"] == 0
    assert "not permitted" in stats["side_capture_fallback_reason"]
    assert stats["execution"] == "cuda_graph"
    assert got == base


def test_a_phase_ending_with_a_side_capture_pending(engine, monkeypatch):
    """1,200 steps stay in the first two buckets: the second side-captured; the phase ends in the 2,048 bucket with
    the 3,072 one never started (beyond the budget) — no hang, same tokens."""
    base, _ = _decode(engine, monkeypatch, "0", steps=1_200, seed=3)
    got, stats = _decode(engine, monkeypatch, "1", steps=1_200, seed=3)
    assert stats["side_captures"] == 1, {k: v for k, v in stats.items() if "capture" in k or "fallback" in k}
    assert got == base
