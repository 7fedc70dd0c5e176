"""The nodes read the later stages' parts in the background (`nodes.model.YuE2Model.prefetch`), in the installed host's
python with the pack loaded as ComfyUI loads it, no server.

On a GPU the Composer's `load(("ar",))` starts a thread that builds the NAR's and the VAE's patchers (the file read,
checked, the NAR's int8 linears turned into bf16) while the music decodes, so the first Renderer and VAE Decode do
not read the file themselves (an H100 measured the first song's render 7.86 s against 3.54 s for the second, the
first VAE Decode 0.88 against 0.61 s; tests/nodes/gpu_nodes_cold.py). This host has no GPU: the harness answers
`reads_ahead` with True for the CPU device (the only change) and checks which thread built each part, that a stage
waits for a part being built instead of reading it again, and that a failure of the background read reaches the
stage that needs the part as that stage's own error."""
from __future__ import annotations

from nodes_testlib import TINY

HARNESS = r'''
import threading, time
import torch
from yue2_core.errors import CheckpointError
from yue2_nodes import loader
from yue2_nodes import model as ym
out = {}
built = []  # (part, thread name) per read of a part from the file
real = {"nar": ym.load_nar, "vae": ym.load_vae, "ar": ym.load_ar}
gate = threading.Event()
fail = {"nar": False}


def watch(part):
    def read(*args, **kwargs):
        built.append((part, threading.current_thread().name))
        if part == "nar":
            gate.wait(30)  # the background read of the NAR holds here until the main thread asked for it
            if fail["nar"]:
                raise CheckpointError("the NAR could not be read (test)")
        return real[part](*args, **kwargs)
    return read


ym.load_ar, ym.load_nar, ym.load_vae = watch("ar"), watch("nar"), watch("vae")
ym.reads_ahead = lambda device: True
name = os.listdir(ckpts)[0]

# 1. the Composer's load of the AR starts the background read of the NAR and the VAE; the Renderer's patcher waits
model = loader.YuE2CheckpointLoader.execute(name).args[0]
model.load(("ar",), 0)
thread = model.root._prefetch_thread
out["thread"] = None if thread is None else thread.name
until = time.monotonic() + 30
while ("nar", "yue2-prefetch") not in built and time.monotonic() < until:  # the background thread enters load_nar,
    time.sleep(0.01)  # where the gate holds it
waited = {}


def ask():
    t = time.perf_counter()
    waited["patcher"] = model.patcher("nar")
    waited["seconds"] = time.perf_counter() - t


asker = threading.Thread(target=ask)
asker.start()
time.sleep(0.3)
out["asker_blocked"] = asker.is_alive()
gate.set()
asker.join(30)
thread.join(30)
out["built"] = built[:]
out["same_patcher"] = waited["patcher"] is model.patcher("nar")
out["waited"] = waited["seconds"]
out["vae_built"] = "vae" in model.root._patchers
model.load(("nar",), 0)  # the Renderer: nothing read again
out["built_after_load"] = built[:]

# 2. a failed background read: the stage that needs the part gets the error itself, then a later try reads it
built.clear()
gate.clear()
fail["nar"] = True
other = ym.YuE2Model(model.info, model.tokenizer)  # a new root: nothing read yet
other.prefetch(("nar",))
gate.set()
other._prefetch_thread.join(30)
try:
    other.patcher("nar")
    out["error"] = None
except CheckpointError as exc:
    out["error"] = str(exc)
fail["nar"] = False
out["retried"] = other.patcher("nar") is other.patcher("nar")
out["built_failing"] = built[:]
print("RESULT " + json.dumps(out))
'''


def test_later_parts_are_read_in_the_background_and_waited_for(in_host, tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "int8")
    out = in_host(HARNESS, ckpts)
    assert out["thread"] == "yue2-prefetch", out
    # the AR by the stage itself, the NAR and the VAE once each, by the background thread
    assert out["built"] == [["ar", "MainThread"], ["nar", "yue2-prefetch"], ["vae", "yue2-prefetch"]], out
    assert out["asker_blocked"] and out["same_patcher"] and out["vae_built"], out
    assert out["built_after_load"] == out["built"], "the Renderer's load read the NAR again"
    # the failing background read, then the stage's own read: the stage raised the error, a later call read it
    assert out["error"] == "the NAR could not be read (test)", out
    assert out["built_failing"] == [["nar", "yue2-prefetch"], ["nar", "MainThread"], ["nar", "MainThread"]], out
    assert out["retried"], out


FREED = r'''
import gc, weakref
from yue2_nodes import loader
from yue2_nodes import model as ym
ym.reads_ahead = lambda device: True
gc.disable()  # no cyclic collection: a root must be freed by reference counting alone
name = os.listdir(ckpts)[0]
refs = []
for i in range(2):
    m = loader.YuE2CheckpointLoader.execute(name).args[0]
    lora_free = m.derive()  # a derived model holds its root; both go together
    m.load(("ar",), 0)
    m.root._prefetch_thread.join()
    m.load(("nar",), 0)
    m.root._prefetch_thread.join()
    refs.append((weakref.ref(m.root), weakref.ref(m.patcher("nar"))))
    del m, lora_free
print("RESULT " + json.dumps({"alive": [[r() is not None for r in pair] for pair in refs]}))
'''


def test_a_root_nothing_uses_is_freed_at_once(in_host, tmp_path):
    """A root the graph no longer uses (each new Checkpoint Loader run makes one) must free its parts — ComfyUI
    holds them only weakly — as soon as the last reference goes, not at the next full garbage collection: the root
    referred to itself (`root = self`), and once the background read kept roots alive a little longer they reached
    the oldest generation and stayed, their AR and NAR on the GPU (+197 MiB a song, tiny bf16, H100,
    tests/nodes/gpu_nodes_check.py, 2026-12-06)."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    out = in_host(FREED, ckpts)
    assert out["alive"] == [[False, False], [False, False]], out


CAPTURE = r'''
import contextlib, threading, time
import torch
from yue2_core.fast.decode import CAPTURE_LOCK
from yue2_nodes import loader
from yue2_nodes import model as ym
out = {"syncs": [], "reads": []}


class Stream:  # the warm-up's side stream, on this CPU host
    def synchronize(self):
        out["syncs"].append(CAPTURE_LOCK._is_owned())


ym.reads_ahead = lambda device: True
ym.warmup.side_stream = lambda device: Stream()
torch.cuda.stream = lambda stream: contextlib.nullcontext()
real = ym.load_vae


def read(info, device, *args):
    out["reads"].append((str(device), CAPTURE_LOCK._is_owned()))
    return real(info, "cpu", *args)


ym.load_vae = read
name = os.listdir(ckpts)[0]
for offload in ("cpu", "meta"):  # "meta": a VAE read straight onto the device (--gpu-only), as far as the lock goes
    model = loader.YuE2CheckpointLoader.execute(name).args[0]
    model.device, model.vae_offload_device = torch.device("cuda"), torch.device(offload)
    with CAPTURE_LOCK:  # the stage captures a graph meanwhile
        model.prefetch(("vae",))
        time.sleep(0.5)
        out[offload] = {"read_during": len(out["reads"]), "syncs_during": len(out["syncs"])}
    model.root._prefetch_thread.join(30)
    out[offload]["built"] = "vae" in model.root._patchers
    out[offload]["synced_under_lock"] = out["syncs"][:]
    out["reads"].clear()
    out["syncs"].clear()
print("RESULT " + json.dumps(out))
'''


def test_the_background_read_makes_no_device_call_during_a_graph_capture(in_host, tmp_path):
    """Every graph capture holds `fast.decode.CAPTURE_LOCK`; in mode "global" (the Composer's first bucket of each
    phase, the Renderer's NAR captures) another thread's cudaMalloc, copy or sync invalidates it. The background
    read syncs the side stream only under that lock, and reads a part straight onto a device (an offload device
    that is not the CPU) under it; a part read into CPU memory is read meanwhile (review 43)."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    out = in_host(CAPTURE, ckpts)
    done = {"built": True, "synced_under_lock": [True]}
    assert out["cpu"] == {"read_during": 1, "syncs_during": 0, **done}, out
    assert out["meta"] == {"read_during": 0, "syncs_during": 0, **done}, out


TIMERS = r'''
sys.path.insert(0, os.path.join(repo, "tests", "nodes"))
import gpu_nodes_cold
from yue2_nodes import loader
from yue2_nodes import model as ym
timers = gpu_nodes_cold._time_loading()
ym.reads_ahead = lambda device: True
model = loader.YuE2CheckpointLoader.execute(os.listdir(ckpts)[0]).args[0]
model.load(("ar",), 0)
model.root._prefetch_thread.join(30)
print("RESULT " + json.dumps(timers))
'''


def test_cold_script_times_the_background_read_apart_from_the_song(in_host, tmp_path):
    """tests/nodes/gpu_nodes_cold.py splits a song's loading by step; the background read's own `patcher` calls are
    off the song's path and must not count in its `patcher` seconds (a part of `load`), as they did (review 43)."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    out = in_host(TIMERS, ckpts)
    assert "patcher@yue2-prefetch" in out and "load_nar@yue2-prefetch" in out, out
    assert out["patcher"] <= out["load"], out
    assert out["patcher@yue2-prefetch"] >= out["load_nar@yue2-prefetch"], out


CANCEL = r'''
import threading, time
import comfy.model_management as mm
from yue2_nodes import loader
from yue2_nodes import model as ym
out = {}
gate = threading.Event()
reads = []
real = ym.load_nar


def held(*args, **kwargs):
    reads.append(threading.current_thread().name)
    gate.wait(30)  # the background read of the NAR takes long (a large file, a slow disk)
    return real(*args, **kwargs)


ym.load_nar = held
ym.reads_ahead = lambda device: True
name = os.listdir(ckpts)[0]
model = loader.YuE2CheckpointLoader.execute(name).args[0]
model.prefetch(("nar",))
until = time.monotonic() + 30
while not reads and time.monotonic() < until:  # the thread enters load_nar, holding the root's build lock
    time.sleep(0.01)
mm.interrupt_current_processing(True)  # the user presses Cancel while the Renderer waits for the NAR
t = time.perf_counter()
try:
    model.patcher("nar")
    out["raised"] = None
except mm.InterruptProcessingException:
    out["raised"] = "InterruptProcessingException"
out["seconds"] = time.perf_counter() - t
out["flag_cleared"] = not mm.processing_interrupted()
gate.set()
model.root._prefetch_thread.join(30)
out["next_run_same"] = model.patcher("nar") is model.root._patchers["nar"]
out["reads"] = reads
print("RESULT " + json.dumps(out))
'''


def test_cancel_ends_a_stage_waiting_for_the_background_read(in_host, tmp_path):
    """A stage whose part the background thread is still reading waited for it even after Cancel (≤ ≈ 3 s on the
    full-size file; review 43): `patcher` now polls ComfyUI's interrupt flag while it waits, raises
    InterruptProcessingException at once, and the part the thread finishes is there for the next run."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    from synthetic_cache import synthetic_link
    synthetic_link(str(ckpts / TINY), "tiny", "bf16")
    out = in_host(CANCEL, ckpts)
    assert out["raised"] == "InterruptProcessingException", out
    assert out["seconds"] < 5, out  # the held read lasts 30 s: the wait ended by the Cancel, not by the read
    assert out["flag_cleared"] and out["next_run_same"], out
    assert out["reads"] == ["yue2-prefetch"], out  # read once, by the thread; the next run did not read it again
