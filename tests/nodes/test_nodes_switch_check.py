"""The nodes check the YUE2_* environment switches before their work, as the command line does (break-it finding: with
YUE2_NAR_ATTN=fast the Composer decoded a whole song and only the Renderer refused it; YUE2_L2_PREFETCH=bogus was
never refused). Run in the installed host's python with the pack loaded as ComfyUI loads it, no server: the server of
the session has one environment for all tests."""
from __future__ import annotations

HARNESS = r'''
import logging
from yue2_nodes.loader import YuE2CheckpointLoader
from yue2_nodes.composer import YuE2Composer
logged = []
logging.getLogger("ComfyUI-YuE2").addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: logged.append(r.getMessage())})())
model = YuE2CheckpointLoader.execute("micro.safetensors").args[0]
out = {}
for name, value in (("YUE2_NAR_ATTN", "fast"), ("YUE2_L2_PREFETCH", "bogus"), ("YUE2_LAYER_TILES", "[" * 100000)):
    os.environ[name] = value
    for label, call in (("loader", lambda: YuE2CheckpointLoader.execute("micro.safetensors")),
                        ("composer", lambda: YuE2Composer.execute(model, "pop", "la", "off", 1, 0.2))):
        try:
            call()
            out[f"{name} {label}"] = "ran"
        except Exception as exc:
            out[f"{name} {label}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    del os.environ[name]
os.environ["YUE2_L2_PREFETCH"] = "qkv:o"  # a GPU-only switch on this CPU model: logged once, the work runs
YuE2CheckpointLoader.execute("micro.safetensors")
YuE2CheckpointLoader.execute("micro.safetensors")
out["logged"] = logged
print("RESULT " + json.dumps(out))
'''


def test_nodes_refuse_a_bad_switch_before_work(in_host, tmp_path):
    from synthetic_cache import synthetic_link
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    synthetic_link(str(ckpts / "micro.safetensors"), "micro", "bf16")
    out = in_host(HARNESS, ckpts)
    for label in ("loader", "composer"):
        assert out[f"YUE2_NAR_ATTN {label}"].startswith("ValueError: the environment variable YUE2_NAR_ATTN"), out
        assert out[f"YUE2_L2_PREFETCH {label}"].startswith(
            "ValueError: the environment variable YUE2_L2_PREFETCH must be off, or POINT"), out
        assert "'bogus' is not POINT:WEIGHTS" in out[f"YUE2_L2_PREFETCH {label}"], out
        assert "nested too deeply" in out[f"YUE2_LAYER_TILES {label}"], out
    gpu_only = [m for m in out["logged"] if m.startswith("YUE2_L2_PREFETCH=qkv:o changes only the CUDA")]
    assert len(gpu_only) == 1, out["logged"]
