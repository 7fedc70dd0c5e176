"""The NAR's ODE solvers (`nar.solve`): the opt-in one-evaluation AB2 against the release's midpoint and Euler on the
tiny model (CPU, fp32), `method` validation, and the YUE2_NAR_GRAPH switch and timestep buffer of the graphed
velocity. (The graph itself on a GPU: tests/core/test_render_gpu.py.)"""
import pytest
import torch

from yue2_core import nar as N
from yue2_core.errors import RequestError

FRAMES = 6


@pytest.fixture(scope="module")
def chunk(tiny_engine_fp32):
    """(renderer, noise, 256-step midpoint latents) of a 6-frame chunk after 12 AR tokens."""
    eng = tiny_engine_fp32
    toks = [151643] + list(range(100, 110)) + [151853 + i for i in range(FRAMES)] + [151852]
    renderer = N.ChunkRenderer(eng.nar, eng.ar.layer_kv(toks), FRAMES)
    noise = N.song_noise(FRAMES, 1)
    return renderer, noise, N.solve(renderer, noise, 256)


def _err(x, ref) -> float:
    return ((x - ref).norm() / ref.norm()).item()


def _euler(renderer, noise, steps):
    state, dt = noise.clone(), 1.0 / steps
    for raw, _ in N.raw_timesteps(steps):
        state = state - renderer.velocity(state, raw) * dt
    return state


def test_ab2_beats_euler_at_the_same_evaluations(chunk):
    """AB2 with n steps makes n evaluations, as Euler with n steps: its error against the 256-step midpoint solution
    is far smaller (measured ~16× at 16 steps), and it is second order (halving dt quarters the error)."""
    renderer, noise, ref = chunk
    calls = []
    velocity = renderer.velocity
    renderer.velocity = lambda *a: calls.append(1) or velocity(*a)
    try:
        ab2_16 = N.solve(renderer, noise, 16, method="ab2")
        assert len(calls) == 16  # one evaluation per step, the first step Euler's
    finally:
        del renderer.velocity
    ab2_32 = N.solve(renderer, noise, 32, method="ab2")
    e_ab2, e_euler = _err(ab2_16, ref), _err(_euler(renderer, noise, 16), ref)
    print(f"rel. L2 vs midpoint-256: AB2-16 {e_ab2:.2e}, Euler-16 {e_euler:.2e}, AB2-32 {_err(ab2_32, ref):.2e}")
    assert e_ab2 < e_euler / 4
    assert 3.0 < e_ab2 / _err(ab2_32, ref) < 5.5


def test_midpoint_is_the_default_and_unchanged(chunk):
    """The default method is the release's midpoint: two evaluations per step, the same bits as method="midpoint",
    and closer to the 256-step solution than AB2 at the same evaluations (16 midpoint steps vs 32 AB2 steps)."""
    renderer, noise, ref = chunk
    a, b = N.solve(renderer, noise, 16), N.solve(renderer, noise, 16, method="midpoint")
    assert torch.equal(a, b)
    assert _err(a, ref) < _err(N.solve(renderer, noise, 32, method="ab2"), ref)


@pytest.mark.parametrize("bad", ["euler", "AB2", "", None, 2])
def test_unknown_method_is_refused_naming_the_accepted_ones(chunk, tiny_engine_fp32, bad):
    renderer, noise, _ = chunk
    with pytest.raises(RequestError, match="'midpoint', 'ab2'"):
        N.solve(renderer, noise, 2, method=bad)
    calls = []
    ar = type("AR", (), {"layer_kv": lambda self, *a, **k: calls.append(1)})()
    with pytest.raises(RequestError, match="'midpoint', 'ab2'"):  # before any AR prefill
        N.render(ar, tiny_engine_fp32.nar, [1, 2], [3, 4], 0, 2, method=bad)
    assert not calls


def test_graph_switch_is_validated(chunk, tiny_engine_fp32, monkeypatch):
    """YUE2_NAR_GRAPH takes 0/1 on every device (a bad value is a RequestError naming it, also on the CPU); 0 or a
    CPU model means no graph."""
    eng = tiny_engine_fp32
    toks = [151643, 100, 101, 151853, 151852]
    monkeypatch.setenv("YUE2_NAR_GRAPH", "off")
    with pytest.raises(RequestError, match="YUE2_NAR_GRAPH"):
        N.ChunkRenderer(eng.nar, eng.ar.layer_kv(toks), 1)
    monkeypatch.setenv("YUE2_NAR_GRAPH", "0")
    assert not N.graph_wanted(torch.device("cuda"))
    monkeypatch.setenv("YUE2_NAR_GRAPH", "1")
    assert N.graph_wanted(torch.device("cuda")) and not N.graph_wanted(torch.device("cpu"))
    monkeypatch.setattr(N, "_GRAPH_FAILED", {"cuda": "an earlier failure"})
    assert not N.graph_wanted(torch.device("cuda"))  # one failure per device and process: eager from then on
    r = N.ChunkRenderer(eng.nar, eng.ar.layer_kv(toks), 1, graph=True)
    assert not r.graphed  # CPU: always eager


def test_timestep_buffer_rounds_like_the_eager_tensor():
    """The graph's timestep is a 0-d bf16 tensor filled with the float before each replay; it must hold the value
    the eager path's torch.tensor(raw_t, dtype=bf16) holds, for every timestep the solvers use and random ones."""
    gen = torch.Generator().manual_seed(0)
    values = [x for steps in (32, 64, 256) for pair in N.raw_timesteps(steps) for x in pair]
    values += (torch.randn(2000, generator=gen, dtype=torch.float64) * 8).tolist()
    buf = torch.zeros((), dtype=torch.bfloat16)
    for v in values:
        buf.fill_(v)
        assert torch.equal(buf, torch.tensor(v, dtype=torch.bfloat16)), v
