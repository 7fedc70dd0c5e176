"""The load-time value checks' fast path (2026-12-06): `checkpoint.all_finite` / `check_finite` decide with one fp32
sum a tensor and `vae_files.check_values` with one norm a weight-norm channel; only a suspect tensor gets the exact
test. Each must still find what the exact test finds — and must not refuse finite weights whose sum overflows."""
import pytest
import torch

from yue2_core.errors import DamagedWeightsError
from yue2_core.weights.checkpoint import all_finite, check_finite
from yue2_core.weights.vae_files import check_values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_all_finite_agrees_with_the_exact_test(dtype):
    big = torch.finfo(dtype).max
    cases = {
        "plain": torch.randn(1000),
        "one nan": torch.randn(1000).index_fill_(0, torch.tensor([517]), float("nan")),
        "one inf": torch.randn(1000).index_fill_(0, torch.tensor([3]), float("inf")),
        "inf and -inf": torch.tensor([float("inf"), float("-inf"), 1.0]),
        "sum overflows": torch.full((64,), big, dtype=torch.float64),  # finite values, infinite fp32 sum
    }
    for name, t in cases.items():
        t = t.to(dtype)
        assert all_finite(t) == bool(torch.isfinite(t).all()), name


def test_check_finite_names_the_tensor_and_lets_overflowing_sums_pass():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    with torch.no_grad():
        model[0].weight.fill_(3e38)  # finite: its fp32 sum overflows, the exact test settles it
    check_finite(model, "p.", "file", "NAR expert")
    with torch.no_grad():
        model[1].bias[5] = float("nan")
    with pytest.raises(DamagedWeightsError, match=r"p\.1\.bias holds NaN/inf \(1 of its 8 values\)"):
        check_finite(model, "p.", "file", "NAR expert")


def test_vae_weight_norm_check_finds_zero_and_tiny_channels():
    v = torch.randn(4, 3, 5)
    g = torch.rand(4, 1, 1) + 0.5
    names = ["decoder.c.weight_g", "decoder.c.weight_v"]
    check_values(names, {"decoder.c.weight_g": g, "decoder.c.weight_v": v}.__getitem__, "vae.safetensors")
    zero = v.clone()
    zero[2] = 0
    with pytest.raises(DamagedWeightsError, match="all zero for 1 of its 4 channels along dim 0 \\(e.g. channel 2\\)"):
        check_values(names, {"decoder.c.weight_g": g, "decoder.c.weight_v": zero}.__getitem__, "vae.safetensors")
    tiny = v.clone()
    tiny[1] = 1e-30  # a norm near fp32's floor: the whole product is built, and it is finite here only if g/‖v‖ is
    big_g = torch.full((4, 1, 1), 3e38)
    expect_ok = bool(torch.isfinite(torch._weight_norm(tiny, big_g, 0)).all())
    call = lambda: check_values(names, {"decoder.c.weight_g": big_g, "decoder.c.weight_v": tiny}.__getitem__, "x")
    if expect_ok:
        call()
    else:
        with pytest.raises(DamagedWeightsError, match="non-finite"):
            call()


def test_vae_weight_norm_check_refuses_a_factor_that_overflows():
    """The fast path skipped the product when every norm was finite and > 1e-30, but the engine computes
    v·(g/‖v‖) (`torch._weight_norm`): a finite gain over a small finite norm overflows the factor, inf/NaN weights
    (review 43: g 1e25 over ‖v‖ 3.9e-15 passed, the exact test before 2026-12-06 refused it)."""
    names = ["decoder.c.weight_g", "decoder.c.weight_v"]
    v = torch.randn(4, 3, 5)
    g = torch.rand(4, 1, 1) + 0.5
    v[1] = 1e-15
    g[1] = 1e25
    assert not bool(torch.isfinite(torch._weight_norm(v, g, 0)).all())
    with pytest.raises(DamagedWeightsError, match="non-finite"):
        check_values(names, {"decoder.c.weight_g": g, "decoder.c.weight_v": v}.__getitem__, "vae.safetensors")
    ok = torch.full((4, 1, 1), 1e30)  # large finite gains over normal norms: finite weights, still accepted
    check_values(names, {"decoder.c.weight_g": ok, "decoder.c.weight_v": torch.randn(4, 3, 5)}.__getitem__, "x")
