"""The warm-up's parallel compile (issue #18 item 1, round 2): which decode-attention lengths the warm-up steps, the
marker that says Triton's disk cache already holds a plan's kernels, and the child processes that compile the kernels
while the parent loads the weights.

Why child processes: with an empty Triton cache one thread compiled ~10 s of kernels serially (an H200: decode_abc
9.65 s, NAR 1.57 s of a 17.8 s warm-up), and its Python (Triton's compiler front end) held the GIL the loader needed
(the load went from 8.3 to 13.0 s). Children compile in other interpreters and write Triton's disk cache (the same
TRITON_CACHE_DIR); the parent's warm-up then runs the same steps on cache hits, which also loads the kernels and warms
cuDNN/cuBLAS in the parent.

How the work is split: every decode step needs the same layer kernels (the GEMVs of every weight shape, the fused
norms/RoPE/SiLU, the sampling tail) — a split by step would leave the first step's job with most of the compile time.
So each of the `k` children runs ALL the warm-up's steps (cheap eager steps) but compiles only its share of the kernel
variants: a kernel variant (Triton's in-memory key: function, specialisation, options) belongs to child
sha256(name, key) mod k; for the others the child's `JITFunction._do_compile` returns None, which makes Triton's
`run` return without compiling or launching (`install_shard`; the contract Triton's `knobs.runtime.jit_cache_hook`
relies on, used where `_do_compile` has another signature). A skipped launch leaves its output buffer
as it was, so later kernels of that child read stale (finite or zero) values — harmless for compiling: Triton
specialises on shapes, dtypes, alignment and integer values, never on tensor contents. The autotuned w8a16 kernel is
never skipped (its benchmark must time real launches). Without either way in (another Triton) one child compiles
everything.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

PROCS_SWITCH = "YUE2_WARMUP_PROCS"
MAX_PROCS = 6  # more children than this compete with the loader and each other for little gain (brief's formula)
PROCS_LIMIT = 64  # YUE2_WARMUP_PROCS above this is refused: each child is a process importing torch on the GPU
# autotuned: its configurations are timed by launching them. (A skipped launch inside an autotuner's benchmark takes
# no time, so Triton's benchmark repeats it ~10⁵ times a configuration — stop 53: the W8A8 GEMM's tuning, 6 children
# × 95 s, 878,766 skipped launches. The W8A8 GEMM is tuned by the child of shard 0 alone, which skips nothing while
# it tunes (`fast.w8a8.TUNE_HERE`, `TUNING`); from its table it is sharded as any kernel.)
NEVER_SKIP = ("w8a16",)
LINE = "YUE2-WARMUP "  # prefix of the children's protocol lines on stdout
MARKER_DIR = "yue2-warmup"
STAGE_TIMEOUT = 120.0  # s the parent waits for the children at one stage before it kills them (a hung child)
CHILD_OVERHEAD = 3 * 2 ** 30  # bytes of a child beyond its shadow's embedding and head: CUDA context, VAE tile, caches
# the environment switches that change which kernels a song compiles (part of the marker key). YUE2_NAR_LINEARS is
# not among them: the key holds the NAR's arithmetic it resolves to on the device (`kernel_switches`,
# `warmup.nar_mode`), so a change of its default or of the auto rule renews the markers (stop-53 review)
KERNEL_SWITCHES = ("YUE2_FAST", "YUE2_FUSED", "YUE2_GEMV", "YUE2_PDL", "YUE2_COMPILE", "YUE2_SHARED_PREFIX",
                   "YUE2_DECODE_ATTN", "YUE2_INT8_ROT", "YUE2_INT8_DOT", "YUE2_ATTN_MERGE", "YUE2_SAMPLER",
                   "YUE2_NAR_ATTN", "YUE2_NAR_GRAPH", "YUE2_GEMV_TABLE", "YUE2_LORA_INT8", "YUE2_LAYER_KERNEL",
                   "YUE2_LAYER_TILES", "YUE2_GEMV_PRE", "YUE2_W8A8_TABLE", "TRITON_INTERPRET")


# -- decode attention: the split constexpr SP per attention length -----------------------------------------------
def split_count(length: int, rows: int, kv_heads: int, sms: int, bl: int = 64, per_sm: int = 2) -> int:
    """Splits of `fast.fused.decode_attention` for an attention length (positions, ≥ 1) without a shared prefix:
    a target of max(1, min(128, per_sm·sms // (rows·kv_heads))) programs per split row, chunks of `bl`-multiples
    (`chunk = max(bl, ⌈⌈length / target⌉ / bl⌉·bl)`), splits = ⌈length / chunk⌉. Mirrors the `plan` closure of
    `decode_attention` (checked against it in tests/core/test_warmup.py); `bl`, `per_sm` from its AttnConfig after
    `fit_attention` (ATTN_CONFIG: 64, 2), `sms` the GPU's multiprocessor count (H200: 132)."""
    target = max(1, min(128, (per_sm * sms) // max(1, rows * kv_heads)))
    chunk = max(bl, -(-(-(-length // target)) // bl) * bl)
    return -(-length // chunk)


def next_pow2(n: int) -> int:
    """The smallest power of two ≥ n (n ≥ 1), as `triton.next_power_of_2`."""
    return 1 << (max(1, n) - 1).bit_length()


@functools.lru_cache(maxsize=64)
def _attention_lengths(context: int, rows: int, kv_heads: int, sms: int, bl: int, per_sm: int) -> tuple:
    out = {}
    for length in range(1, context + 1):
        out[next_pow2(split_count(length, rows, kv_heads, sms, bl, per_sm))] = length
    return tuple(sorted(out.items()))


def attention_lengths(context: int, rows: int, kv_heads: int, sms: int, bl: int = 64, per_sm: int = 2) -> dict:
    """{SP: the longest attention length in [1, context] whose split count has next power of two SP}: one
    representative per variant of the split/merge kernels (their constexpr SP; whether the split kernel merges is a
    function of SP too, SP ≤ fused.MERGE_MAX_SPLITS). Stepping these lengths compiles every variant a phase of any
    length can meet — a short phase's attention length is its capacity (< 1,024), not a `BUCKET` multiple.
    Raises ValueError for context, rows, kv_heads or sms < 1."""
    if min(context, rows, kv_heads, sms, bl, per_sm) < 1:
        raise ValueError(f"attention_lengths needs positive sizes; got context {context}, rows {rows}, kv_heads "
                         f"{kv_heads}, sms {sms}, bl {bl}, per_sm {per_sm}")
    return dict(_attention_lengths(context, rows, kv_heads, sms, bl, per_sm))


# -- how many children ---------------------------------------------------------------------------------------------
def procs(cpu_count: int | None = None) -> int:
    """Children of a warm-up whose plan is not in the cache: $YUE2_WARMUP_PROCS when set (an integer in [0,
    PROCS_LIMIT]; 0 = the in-process warm-up only), else min(MAX_PROCS, max(1, cpus // 2)). RequestError for another
    value."""
    from .switches import integer
    value = integer(PROCS_SWITCH, None, minimum=0, maximum=PROCS_LIMIT)
    if value is not None:
        return value
    cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 2)
    return min(MAX_PROCS, max(1, cpus // 2))


def child_bytes(plan) -> int:
    """GPU memory one child needs, an upper estimate: the shadow's real-size embedding and LM head (vocab × hidden
    in the plan's dtype, each) plus CHILD_OVERHEAD."""
    import torch
    elt = torch.empty((), dtype=plan.dtype).element_size()
    return 2 * plan.dims.vocab * plan.dims.hidden * elt + CHILD_OVERHEAD


def memory_cap(plan, free_bytes: int, model_bytes: int) -> int:
    """How many children fit beside the model being loaded: (free − model − 2 GiB) // `child_bytes`, ≥ 0."""
    return max(0, (free_bytes - model_bytes - 2 * 2 ** 30) // child_bytes(plan))


# -- the marker ----------------------------------------------------------------------------------------------------
def source_hash(files: list[str] | None = None) -> str:
    """sha256 of the kernel sources: yue2_core/fast/*.py, warmup.py and this file (names and bytes)."""
    if files is None:
        here = os.path.dirname(os.path.abspath(__file__))
        fast = os.path.join(here, "fast")
        files = sorted(os.path.join(fast, f) for f in os.listdir(fast) if f.endswith(".py"))
        files += [os.path.join(here, "warmup.py"), os.path.join(here, "warmup_jobs.py")]
    h = hashlib.sha256()
    for f in files:
        h.update(os.path.basename(f).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def plan_fields(plan) -> dict:
    """What of a `warmup.Plan` decides its kernels, JSON-able: dims, the AR's quantization kinds (group sizes, not
    module names), dtype, parts, the budgets' sampling settings, the VAE config, the CFG pair, int8 layers, phases."""
    from dataclasses import asdict, is_dataclass
    budgets = plan.budgets
    if budgets is None:
        from .pipeline import Budgets
        budgets = Budgets()
    kinds = sorted({json.dumps(v, sort_keys=True, default=str) for v in (plan.quant_ar or {}).values()})
    vae = asdict(plan.vae_cfg) if is_dataclass(plan.vae_cfg) else plan.vae_cfg
    return {"dims": asdict(plan.dims) if is_dataclass(plan.dims) else plan.dims, "quant_kinds": kinds,
            "int8_modules": len(plan.quant_ar or {}), "dtype": str(plan.dtype), "parts": list(plan.parts),
            "budgets": budgets_dict(budgets), "vae": vae, "cfg_pair": bool(plan.cfg_pair),
            "int8_layers": bool(plan.int8_layers), "phases": list(plan.phases),
            **({"batch_rows": plan.batch_rows, "batch_refill": bool(plan.batch_refill)} if plan.batch_rows > 1
               else {})}


def device_fields(device) -> dict:
    """GPU name, compute capability and multiprocessor count of a CUDA `device` ({"type": …} otherwise)."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type}
    p = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": p.name, "capability": [p.major, p.minor], "sms": p.multi_processor_count}


def versions() -> dict:
    """Triton's and torch's versions (None where not importable)."""
    import torch
    try:
        import triton
        tv = triton.__version__
    except Exception:  # noqa: BLE001
        tv = None
    return {"torch": torch.__version__, "triton": tv}


def kernel_switches(nar_mode: str) -> dict:
    """The marker key's switches: KERNEL_SWITCHES' values, and the NAR's resolved arithmetic (`warmup.nar_mode`)."""
    return {**{k: os.environ.get(k, "") for k in KERNEL_SWITCHES}, "nar_mode": nar_mode}


def marker_key(plan_f: dict, device_f: dict, versions_f: dict, sources: str, switches: dict) -> str:
    """The marker's name: sha256 (first 32 hex digits) of everything that decides the compiled kernels
    (`warmup.marker_key` gives it a plan's)."""
    blob = json.dumps({"plan": plan_f, "device": device_f, "versions": versions_f, "sources": sources,
                       "switches": switches}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def marker_path(cache_dir: str, key: str) -> str:
    """<cache_dir>/yue2-warmup/<key>.json"""
    return os.path.join(cache_dir, MARKER_DIR, key + ".json")


def write_marker(path: str, content: dict) -> None:
    """Write the marker atomically (a temporary file in the same directory, then os.replace); a failure is one
    warning (the next process compiles again) and leaves no partial file."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            json.dump(content, f, indent=1, default=str)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        warnings.warn(f"the warm-up marker {path} could not be written ({exc}); the next process compiles in "
                      f"child processes again (same results)")
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


# -- plans across processes ----------------------------------------------------------------------------------------
def budgets_dict(budgets) -> dict:
    """A `pipeline.Budgets` as JSON-able dict (`budgets_from`)."""
    from dataclasses import asdict
    return {"max_seconds": budgets.max_seconds, "max_abc_tokens": budgets.max_abc_tokens,
            "abc": asdict(budgets.abc), "semantic": asdict(budgets.semantic)}


def budgets_from(d: dict | None):
    """The `Budgets` a warm-up child receives as a dict (the inverse of `budgets_dict`); None stays None."""
    from .pipeline import Budgets
    from .protocol import Sampling
    if d is None:
        return None
    return Budgets(d["max_seconds"], d["max_abc_tokens"], Sampling(**d["abc"]), Sampling(**d["semantic"]))


def _indexed(device):
    """`device` with its index ("cuda" → "cuda:<current device>"): `torch.cuda.set_device` in a child refuses a
    CUDA device without an index (ValueError "Expected a torch.device with a specified index")."""
    import torch
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def child_spec(plan, device, shard: int, shards: int, test: dict | None = None) -> dict:
    """What a child needs (JSON): the checkpoint (and separate VAE) path from `plan.source`, dtype, parts, budgets,
    int8_layers, nar_linears, cfg_pair, phases, the device and its shard of the kernels."""
    source = plan.source or {}
    return {"path": source.get("path"), "vae": source.get("vae"), "dtype": str(plan.dtype).replace("torch.", ""),
            "parts": list(plan.parts), "budgets": budgets_dict(plan.budgets) if plan.budgets is not None else None,
            "int8_layers": bool(plan.int8_layers), "nar_linears": plan.nar_linears, "cfg_pair": bool(plan.cfg_pair),
            "phases": list(plan.phases), "device": str(_indexed(device)), "shard": shard, "shards": shards,
            "test": test or {},
            "batch_rows": int(plan.batch_rows), "batch_refill": bool(plan.batch_refill)}


def plan_from_spec(spec: dict):
    """The `warmup.Plan` of a child spec (reads the checkpoint's header only)."""
    import torch
    from .warmup import Plan
    from .weights.checkpoint import inspect_checkpoint
    info = inspect_checkpoint(spec["path"], own_vae="skip" if spec.get("vae") else "required")
    vae_cfg = None
    if spec.get("vae"):
        from .weights.vae_files import open_vae
        vae_cfg = open_vae(spec["vae"]).config
    return Plan.from_info(info, getattr(torch, spec["dtype"]), tuple(spec["parts"]), vae_cfg=vae_cfg,
                          budgets=budgets_from(spec.get("budgets")), int8_layers=spec["int8_layers"],
                          nar_linears=spec.get("nar_linears"),
                          cfg_pair=spec["cfg_pair"], phases=tuple(spec["phases"]),
                          batch_rows=int(spec.get("batch_rows", 0)), batch_refill=bool(spec.get("batch_refill")),
                          source={"path": spec["path"], "vae": spec.get("vae")})


# -- the kernel shard of a child -------------------------------------------------------------------------------------
def owner(name: str, key, shards: int) -> int:
    """The child (0 … shards−1) that compiles the kernel variant `name` / Triton key `key`."""
    digest = hashlib.sha256(f"{name}|{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % max(1, shards)


def shard_hook(shard: int, shards: int, skipped: list | None = None, owned: list | None = None):
    """A `triton.knobs.runtime.jit_cache_hook`: True (skip compile and launch) for variants another child owns.
    The names of skipped launches and of the variants this child compiles (or finds in the disk cache) are appended
    to `skipped` / `owned`."""
    from .fast.w8a8 import TUNING

    def hook(*, key=None, fn=None, **_):
        name = getattr(fn, "name", "") or ""
        if shards > 1 and not TUNING[0] and name.rsplit(".", 1)[-1] not in NEVER_SKIP \
                and owner(name, key, shards) != shard:
            if skipped is not None:
                skipped.append(name)
            return True
        if owned is not None:
            owned.append(name)
        return False
    return hook


def install_shard(shard: int, shards: int, skipped: list | None = None, owned: list | None = None) -> str | None:
    """Make this process's Triton compile only the variants `shard_hook` keeps. Preferred: wrap
    `JITFunction._do_compile(key, …)` (Triton 3.4–3.8: a None return makes `run` return without a launch — the
    contract the jit_cache_hook uses too, without serialising every variant's specialisation to JSON first); else
    the `knobs.runtime.jit_cache_hook`. Returns "do_compile", "jit_cache_hook" or None (no sharding)."""
    decide = shard_hook(shard, shards, skipped, owned)
    from .fast import w8a8
    w8a8.TUNE_HERE[0] = shards <= 1 or shard == 0
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # noqa: BLE001 — no Triton: nothing to shard
        return None
    orig = getattr(JITFunction, "_do_compile", None)
    orig = getattr(orig, "_yue2_orig", orig)  # installed before: replace the decision, do not wrap twice
    if orig is not None:
        import inspect
        params = list(inspect.signature(orig).parameters)
        if params[:2] == ["self", "key"]:
            def _do_compile(self, key, *args, **kw):
                info = type("Info", (), {"name": self.fn.__qualname__, "module": self.fn.__module__})
                if decide(key=key, fn=info):
                    return None
                return orig(self, key, *args, **kw)
            _do_compile._yue2_shard = True
            _do_compile._yue2_orig = orig
            JITFunction._do_compile = _do_compile
            return "do_compile"
    try:
        from triton import knobs
        if hasattr(knobs.runtime, "jit_cache_hook"):
            knobs.runtime.jit_cache_hook = decide
            return "jit_cache_hook"
    except Exception:  # noqa: BLE001
        pass
    return None


def sharding_available() -> bool:
    """Whether a child can compile a shard only (`install_shard` has a way in this Triton)."""
    try:
        from triton.runtime.jit import JITFunction
        import inspect
        orig = getattr(JITFunction, "_do_compile", None)
        if orig is not None and list(inspect.signature(orig).parameters)[:2] == ["self", "key"]:
            return True
        from triton import knobs
        return hasattr(knobs.runtime, "jit_cache_hook")
    except Exception:  # noqa: BLE001
        return False


# -- the children, seen from the parent ----------------------------------------------------------------------------
# the child's command line: `python -c _BOOT <folder holding yue2_core>` — a path on sys.path rather than PYTHONPATH,
# which embedded Pythons (ComfyUI's Windows portable build: a ._pth file) ignore
_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from yue2_core.warmup_jobs import child_main; "
         "sys.exit(child_main())")
_LIVE: set = set()
_LIVE_LOCK = threading.Lock()


def _kill_live():  # atexit: no child outlives the parent's interpreter
    with _LIVE_LOCK:
        live = list(_LIVE)
    for p in live:
        _kill(p)


def _kill(p: subprocess.Popen) -> None:
    try:
        if p.poll() is None:
            p.kill()
        p.wait(5)
    except Exception:  # noqa: BLE001
        pass
    try:
        if p.stdin is not None:
            p.stdin.close()
    except Exception:  # noqa: BLE001 — a broken pipe to a dead child
        pass
    with _LIVE_LOCK:
        _LIVE.discard(p)


import atexit  # noqa: E402

atexit.register(_kill_live)


class Children:
    """`k` child processes (`python -c _BOOT`, `child_main`) running a warm-up plan's stages, each compiling its
    shard of the kernels. The parent's warm-up waits for a stage with `wait_stage` (every child reported it, or
    ended). `kill()` ends them (cancel, failure, the parent's warm-up ending); they also exit when their stdin closes
    (the parent process ended, even by SIGKILL) and at the parent's interpreter exit (atexit)."""

    def __init__(self, specs: list[dict], env: dict | None = None):
        self.specs = specs
        self.procs: list[subprocess.Popen] = []
        self.stages: list[set] = [set() for _ in specs]
        self.reports: list[dict | None] = [None] * len(specs)
        self.failures: list[str] = []
        self._quiet: set = set()  # children that passed every stage: ending them is no failure
        self._cond = threading.Condition()
        self._errs: list = []
        self._readers: list[threading.Thread] = []
        self.root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding yue2_core
        self.env = dict(os.environ if env is None else env)
        self.env[PROCS_SWITCH] = "0"
        self.env.setdefault("OMP_NUM_THREADS", "2")
        self.t0 = time.perf_counter()

    def start(self) -> "Children":
        for i, spec in enumerate(self.specs):
            err = tempfile.TemporaryFile()
            p = subprocess.Popen([sys.executable, "-c", _BOOT, self.root], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, env=self.env, text=True, bufsize=1)
            with _LIVE_LOCK:
                _LIVE.add(p)
            self.procs.append(p)
            self._errs.append(err)
            p.stdin.write(json.dumps(spec) + "\n")
            p.stdin.flush()  # stdin stays open: its end tells the child the parent is gone
            reader = threading.Thread(target=self._read, args=(i,), name=f"yue2-warm-up-child-{i}", daemon=True)
            reader.start()
            self._readers.append(reader)
        return self

    def _read(self, i: int) -> None:
        p = self.procs[i]
        try:
            for line in p.stdout:
                if not line.startswith(LINE):
                    continue
                kind, _, rest = line[len(LINE):].strip().partition(" ")
                with self._cond:
                    if kind == "stage":
                        self.stages[i].add(rest)
                    elif kind == "done":
                        self.reports[i] = json.loads(rest)
                    self._cond.notify_all()
        except Exception:  # noqa: BLE001 — a broken pipe: the child is treated as ended
            pass
        p.wait()
        with self._cond:
            if (p.returncode != 0 or self.reports[i] is None) and i not in self._quiet:
                self.failures.append(f"child {i}: exit code {p.returncode}; {self._stderr_tail(i)}")
            self._cond.notify_all()
        with _LIVE_LOCK:
            _LIVE.discard(p)

    def _stderr_tail(self, i: int) -> str:
        try:
            err = self._errs[i]
            err.seek(0)
            lines = [l for l in err.read().decode("utf-8", "replace").strip().splitlines() if l.strip()]
            return lines[-1][-300:] if lines else "no message"
        except Exception:  # noqa: BLE001
            return "no message"

    def _ended(self, i: int) -> bool:
        return self.procs[i].poll() is not None and (self.reports[i] is not None or i in self._quiet or
                                                     any(f.startswith(f"child {i}:") for f in self.failures))

    def finish(self, stages, grace: float = 2.0) -> None:
        """After the parent's last stage: give the children `grace` s to report and exit, then end them; a child
        that reported every one of `stages` has written all its kernels, so ending it is no failure."""
        self.wait(timeout=grace)
        with self._cond:
            for i in range(len(self.procs)):
                if all(st in self.stages[i] for st in stages):
                    self._quiet.add(i)
        self.kill()

    def wait_stage(self, stage: str, stop, timeout: float = STAGE_TIMEOUT) -> None:
        """Block until every child reported `stage` or ended; `stop()` is called every 50 ms (it raises to
        cancel). After `timeout` s the children still short of the stage are killed (they count as failed)."""
        end = time.perf_counter() + timeout
        with self._cond:
            while not all(stage in self.stages[i] or self._ended(i) for i in range(len(self.procs))):
                if time.perf_counter() > end:
                    late = [i for i in range(len(self.procs)) if stage not in self.stages[i] and not self._ended(i)]
                    self.failures += [f"child {i}: no {stage} after {timeout:.0f} s (killed)" for i in late]
                    self._cond.release()
                    try:
                        for i in late:
                            _kill(self.procs[i])
                    finally:
                        self._cond.acquire()
                    return
                self._cond.wait(0.05)
                self._cond.release()
                try:
                    stop()
                finally:
                    self._cond.acquire()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every child to end (each reader thread reaps its child)."""
        end = None if timeout is None else time.perf_counter() + timeout
        with self._cond:
            while not all(self._ended(i) for i in range(len(self.procs))):
                left = None if end is None else end - time.perf_counter()
                if left is not None and left <= 0:
                    return
                self._cond.wait(0.05 if left is None else min(0.05, left))

    def kill(self) -> None:
        """End every child now (SIGKILL), reap it and let its reader record how it ended."""
        for p in self.procs:
            _kill(p)
        for reader in self._readers:
            reader.join(5)
        for err in self._errs:
            try:
                err.close()
            except Exception:  # noqa: BLE001
                pass

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def summary(self) -> dict:
        """{"count", "seconds" (start to now), "failed", "child_seconds" (each child's own time), "variants" (kernel
        variants the children compiled or found cached, each in one child), "skipped_launches"}."""
        reps = [r for r in self.reports if r]
        return {"count": len(self.procs), "seconds": round(time.perf_counter() - self.t0, 3),
                "failed": len(self.failures), "child_seconds": [round(r.get("seconds", 0), 2) for r in reps],
                "variants": sum(r.get("owned", 0) for r in reps),
                "skipped_launches": sum(r.get("skipped", 0) for r in reps)}


# -- the child ---------------------------------------------------------------------------------------------------------
def _emit(kind: str, rest: str = "") -> None:
    sys.stdout.write(f"{LINE}{kind} {rest}\n")
    sys.stdout.flush()


def _watch_parent(stdin) -> None:
    """Exit this process when the parent closes stdin (it ended or killed us)."""
    def run():
        try:
            while stdin.readline():
                pass
        except Exception:  # noqa: BLE001
            pass
        os._exit(3)
    threading.Thread(target=run, name="yue2-warm-up-parent-watch", daemon=True).start()


def child_main(stdin=None) -> int:
    """A child's work: read the spec (one JSON line on stdin), run the plan's stages with this shard of the kernels,
    print `LINE stage <name>` after each and `LINE done <report>` at the end. Test hooks in spec["test"]: "sleep"
    (seconds, nothing else), "fail" (exit 2 at once), "allow_cpu" (run on a CPU device)."""
    stdin = stdin or sys.stdin
    spec = json.loads(stdin.readline())
    _watch_parent(stdin)
    test = spec.get("test") or {}
    if test.get("sleep"):
        _emit("stage", "sleeping")
        time.sleep(float(test["sleep"]))
        return 0
    if test.get("fail"):
        sys.stderr.write("test hook: this child fails\n")
        return 2
    t0 = time.perf_counter()
    import torch
    from . import warmup
    torch.set_num_threads(2)
    skipped, owned = [], []
    how = install_shard(int(spec["shard"]), int(spec["shards"]), skipped, owned)
    plan = plan_from_spec(spec)
    device = torch.device(spec["device"])
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    report = warmup.run_plan(plan, device, None, after_stage=lambda name: _emit("stage", name),
                             allow_cpu=bool(test.get("allow_cpu")), child=True)
    report["skipped"] = len(skipped)
    report["owned"] = len(owned)
    report["sharding"] = how
    report["seconds"] = time.perf_counter() - t0
    _emit("done", json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
