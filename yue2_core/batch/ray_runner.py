"""Scale-out on Ray: `python -m yue2_core batch REQUESTS.jsonl --output DIR --ray auto|ADDRESS` (issue #19 part 5).

The driver (`driver.run_batch`) stays what it is locally — it reads and validates the rows, decides what to resume,
sizes the batch, owns the output folder and batch.json. `RayRunner` replaces only the loop that runs songs:

    driver ──chunks of ≤ max_batch requests──►  SongWorker actor (one per GPU: num_gpus=1; or CPU actors)
           ◄──one (outcome, song files) per song──  runner.iter_songs on the actor's engine (the local one)

- One engine actor per GPU of the cluster (whole GPUs only: a fractional GPU count is refused); `--ray-cpu-workers N`
  asks for N CPU actors instead (tests, dry runs). Each actor loads the engine once and runs the existing batcher
  (`runner.iter_songs`) on each chunk it is given, so a chunk is one AR batch, as in the local run.
- A song's files are serialised on the worker (`artifacts.song_files` / `song_result`: the same bytes `save_song`
  writes) and sent back through Ray's object store as the worker finishes each song (a streaming generator); the
  DRIVER writes the folder (`artifacts.write_song_dir`: hidden temporary sibling, fsync, rename). The song folders and
  batch.json are therefore those of the local run, and no worker ever writes into the output folder.
- A worker that dies (process killed, node lost, out of host memory) loses only the songs it had not sent yet: they go
  back to the front of the queue and run on the next free worker (`attempts` + 1, `lost_seconds` = the time they had
  run on the dead one); the dead worker's slot gets one replacement actor. A song whose worker died MAX_ATTEMPTS
  times fails with that reason (a song that kills every engine must not kill them all). Songs already received are
  never rerun, so each song completes once; nothing is partial because only the driver writes.
- Ray not installed, an address that does not answer, a cluster without (whole) GPUs or CPUs for the workers, or
  workers that cannot be placed: `RayUnavailable` (a `YuE2Error`: the CLI prints one line and exits 2).

Every worker needs this pack installed and the checkpoint (and any --lora / --vae file) at the same path as on the
driver. YUE2_* environment switches of the driver are passed to the workers, and so is the VAE folder the driver found
for a vendor model folder (`EngineSpec.vendor_vae`, checked by its sample hash on each node).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit

from ..errors import ArtifactError, DiskFullError, YuE2Error, brief
from .runner import SongOutcome, _batch_key

MAX_ATTEMPTS = 3  # a song is tried on at most this many workers that died under it
REPLACEMENTS_PER_SLOT = 1  # a dead worker's GPU / CPU slot gets this many new actors
PLACEMENT_TIMEOUT_S = 120.0  # an actor not placed (no free GPU / CPU) and described by then is given up
CONNECT_TIMEOUT_S = 5.0  # TCP check of an ADDRESS before Ray's own connect (which retries for minutes)
DEFAULT_PORT = 6379  # Ray's GCS port (HOST:PORT of a head node)
CLIENT_PORT = 10001  # Ray client port (ray://HOST)


class RayUnavailable(YuE2Error):
    """The Ray scale-out cannot run: Ray is not installed, the cluster address does not answer, the cluster has no
    (whole) GPU / CPU for an engine actor, or no worker could be placed or load the model. The message says which
    and what to do."""


def require_ray():
    """The `ray` module, or RayUnavailable saying how to install it (the optional extra `ray`)."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(
            f"--ray needs the Ray package, which is not installed here ({brief(exc)}): pip install ray "
            "(from this repository: pip install -e '.[ray]') on this machine and on every node of the cluster") from None
    return ray


def parse_address(address: str) -> tuple[str, int] | None:
    """(host, port) of `--ray ADDRESS`: HOST:PORT, HOST (port 6379) or ray://HOST[:PORT] (port 10001); None for
    "auto". RayUnavailable for anything else (an empty host, a port that is not a number in 1–65535)."""
    if address == "auto":
        return None
    text = address.strip()
    client = text.startswith("ray://")
    rest = text[len("ray://"):] if client else text
    try:
        parts = urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or parts.path not in ("", "/") or parts.query or parts.username:
        raise RayUnavailable(f"--ray {address!r} is not a Ray address: give auto, HOST:PORT of the head node "
                             "(e.g. 10.0.0.5:6379) or ray://HOST:PORT (Ray client, port 10001)")
    return host, port or (CLIENT_PORT if client else DEFAULT_PORT)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """A TCP connection to ADDRESS within `timeout` seconds, else RayUnavailable — Ray's own connect retries an
    address that does not answer for minutes, printing a warning every few seconds."""
    hp = parse_address(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailable(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}, within {timeout:g} s): start it with "
            f"`ray start --head --port={hp[1]}` on the head node, check the address and the firewall, or use --ray "
            "auto for a Ray instance on this machine") from None


def check_options(address: str, cpu_workers: int | None, device: str) -> None:
    """The --ray options before any work: Ray importable, a parseable address, --ray-cpu-workers ≥ 1, and a
    --device the actors can honour (auto, cuda — one GPU per actor, chosen by Ray — or cpu with
    --ray-cpu-workers). RayUnavailable / YuE2Error naming the option."""
    require_ray()
    parse_address(address)
    if cpu_workers is not None and (type(cpu_workers) is not int or cpu_workers < 1):
        raise YuE2Error(f"--ray-cpu-workers must be a positive number of CPU engine actors, got {cpu_workers!r}")
    if device not in ("auto", "cuda", "cpu"):
        raise YuE2Error(f"--device {device} with --ray: Ray gives each engine actor its GPU; use --device auto (or "
                        "cuda), or cpu with --ray-cpu-workers N")
    if device == "cpu" and cpu_workers is None:
        raise YuE2Error("--device cpu with --ray needs --ray-cpu-workers N (how many CPU engine actors)")
    if device == "cuda" and cpu_workers is not None:
        raise YuE2Error("--ray-cpu-workers runs CPU engine actors; it cannot be combined with --device cuda")


@dataclass(frozen=True)
class EngineSpec:
    """What a worker loads: the checkpoint path (the same on every node), the AR/NAR compute dtype ("bf16" /
    "fp32"), the adapters as (path, strength_ar, strength_nar) and a VAE file; `env` the YUE2_* switches;
    `vendor_vae` the VAE folder the driver resolved for a vendor model folder (`driver.vendor_vae_record`: path and
    sample hash; None for an all-in-one file or --vae), which the worker decodes with instead of choosing its own
    (review, stop 41: the workers ran `find_vae_folder` themselves, while batch.json recorded the driver's)."""

    checkpoint: str
    dtype: str = "bf16"
    loras: tuple = ()
    vae: str | None = None
    env: dict = field(default_factory=dict)
    vendor_vae: dict | None = None

    def vendor_vae_folder(self) -> str | None:
        """The driver's VAE folder, checked on this node: CheckpointError when its weights here are not those the
        driver found (its sample hash, `vendor.vae_folder_sample`) — every node needs the same folder at the same
        path, as for the checkpoint."""
        if not self.vendor_vae:
            return None
        from ..errors import CheckpointError
        from ..weights.vendor import vae_folder_sample
        folder, want = self.vendor_vae.get("path"), self.vendor_vae.get("sample_sha256")
        if want is not None:
            got = vae_folder_sample(folder)
            if got != want:
                raise CheckpointError(
                    f"the VAE folder {folder} {'holds other weights' if got else 'is missing or unreadable'} on this "
                    f"node than on the driver (sample sha256 {(got or 'none')[:12]}… against {want[:12]}…): every "
                    "node needs the same VAE folder at the same path as the driver")
        return folder

    def load(self, device: str):
        """`YuE2Engine.load` on `device` (what `python -m yue2_core` loads for the same options), decoding with the
        driver's vendor VAE folder (`vendor_vae_folder`)."""
        import torch
        from ..pipeline import YuE2Engine
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[self.dtype]
        return YuE2Engine.load(self.checkpoint, device=device, dtype=dtype, loras=list(self.loras), vae=self.vae,
                               vendor_vae=self.vendor_vae_folder())


def yue2_env() -> dict:
    """The driver's YUE2_* environment switches, passed to every worker."""
    return {k: v for k, v in os.environ.items() if k.startswith("YUE2_")}


class SongWorker:
    """The engine actor's body (`ray.remote` is applied at run time, so importing this module needs no Ray).

    `device` is "cuda" (Ray sets CUDA_VISIBLE_DEVICES to the actor's one GPU) or "cpu". The engine is loaded once,
    by `load()` or the first `run()`."""

    def __init__(self, spec: EngineSpec, device: str, index: int):
        self.spec, self.device, self.index, self.engine = spec, device, index, None
        if device == "cpu":  # as many intra-op threads as CPUs Ray gave this actor (OMP_NUM_THREADS says so too)
            import torch
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS") or 1)))

    def describe(self) -> dict:
        """pid, node address, device, GPU ids and name, and the memory a batch may use (`device_free_bytes`, bytes)."""
        import ray
        import torch
        from ..candidates import device_free_bytes
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        return {"index": self.index, "pid": os.getpid(), "node": ray.util.get_node_ip_address(), "device": self.device,
                "gpu_ids": gpu_ids, "gpu": torch.cuda.get_device_name(0) if self.device == "cuda" else None,
                "free_bytes": device_free_bytes(self.device)}

    def load(self) -> float:
        """Load the engine (once); returns the seconds it took (0 when already loaded)."""
        if self.engine is not None:
            return 0.0
        t = time.perf_counter()
        try:
            self.engine = self.spec.load(self.device)
        except YuE2Error as exc:
            import ray
            raise type(exc)(f"worker {self.index} on {ray.util.get_node_ip_address()}: {exc}") from None
        print(f"worker {self.index}: {self.engine.info.summary()}", file=sys.stderr)
        return time.perf_counter() - t

    def run(self, items: list, max_batch: int, steps: int, batched: bool | None, overlap: bool | None = None,
            method: str = "midpoint"):
        """A generator (Ray streams its items): for each request of `items`, as its song finishes,
        (outcome dict, song files {name: bytes} or None, result.json content or None, finished unix time,
        peak reserved device bytes so far or None)."""
        import torch
        from ..artifacts import song_files, song_result
        from .runner import iter_songs
        from .summary import BatchProgress
        self.load()
        made: dict = {}

        def deliver(item, song):
            made[item.id] = (song_files(song), song_result(song))  # the bytes save_song would write
            return f"worker {self.index}"
        for outcome in iter_songs(self.engine, items, deliver=deliver, max_batch=max_batch, steps=steps,
                                  on_event=BatchProgress(sys.stderr), batched=batched, overlap=overlap,
                                  method=method):
            files, result = made.pop(outcome.id, (None, None))
            peak = torch.cuda.max_memory_reserved() if self.device == "cuda" else None
            yield outcome.to_dict(), files, result, time.time(), peak


@dataclass
class RaySongOutcome(SongOutcome):
    """A `SongOutcome` with where it ran: `worker` {index, pid, node, device, gpu_ids}, `attempts` (workers it was
    given to; > 1 after a worker died under it), `lost_seconds` (time it spent on workers that died), `finished_at`
    (unix time the worker finished it) and `peak_vram_bytes` (the worker's peak reserved CUDA memory by then)."""

    worker: dict | None = None
    attempts: int = 1
    lost_seconds: float = 0.0
    finished_at: float | None = None
    peak_vram_bytes: int | None = None


class _Slot:
    """One engine actor and its state: "starting" (placed, not described yet), "idle", "busy", "dead"."""

    def __init__(self, index: int, actor, ref, deadline: float, generation: int = 0):
        self.index, self.actor, self.ref, self.deadline, self.generation = index, actor, ref, deadline, generation
        self.state, self.info, self.items, self.started = "starting", {}, {}, 0.0


class RayRunner:
    """Runs the songs of a batch on a Ray cluster (module docstring). Used by `driver.run_batch(runner=…)`:
    `prepare()` connects and places the actors, returning (free bytes per worker, on CUDA) for the batch sizing;
    `songs(...)` yields one `RaySongOutcome` per request after the driver wrote its folder; `close()` kills the
    actors and disconnects. `settings` (recorded in batch.json under settings.ray) holds the address, the workers,
    the deaths and when the engines were loaded. `on_song(runner, outcome)` is called after each song (tests and
    bench/scale_ray.py kill a worker from it)."""

    def __init__(self, address: str, spec: EngineSpec, *, cpu_workers: int | None = None, stream=None,
                 on_song: Callable[["RayRunner", RaySongOutcome], None] | None = None):
        self.address, self.spec, self.cpu_workers = address, spec, cpu_workers
        self.stream = stream or sys.stderr
        self.on_song = on_song
        self.slots: list[_Slot] = []
        self.settings: dict = {"address": address, "workers": [], "deaths": []}
        self._ray = None
        self._owns = False
        self._actor_cls = None
        self.on_cuda = cpu_workers is None

    # -- connection and placement ---------------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        self.stream.write(f"ray: {text}\n")
        self.stream.flush()

    def connect(self):
        """ray.init for `address`: an existing session is used as is; "auto" joins the cluster this machine belongs
        to (RAY_ADDRESS, or one started with `ray start`) or starts a local instance; ADDRESS must answer first."""
        ray = require_ray()
        if ray.is_initialized():
            self._ray = ray
            return ray
        check_reachable(self.address)
        quiet = dict(logging_level=logging.WARNING, include_dashboard=False)
        try:
            if self.address == "auto":
                try:
                    ray.init(address="auto", **quiet)
                except ConnectionError:  # no cluster here: a local instance with this machine's GPUs and CPUs
                    ray.init(**quiet)
            else:
                ray.init(address=self.address, **quiet)
        except Exception as exc:  # noqa: BLE001 - one message, no traceback
            raise RayUnavailable(
                f"cannot connect to the Ray cluster at {self.address}: {brief(exc)}. If it uses token authentication "
                "(Ray ≥ 2.59 turns it on for instances started by ray.init), set RAY_AUTH_MODE=token here, with its "
                "token in RAY_AUTH_TOKEN or ~/.ray/auth_token, as on its nodes") from None
        self._ray, self._owns = ray, True
        return ray

    def _workers_wanted(self) -> int:
        ray = self._ray
        total, free = ray.cluster_resources(), ray.available_resources()
        if self.cpu_workers is not None:
            cpus = int(free.get("CPU", 0))
            deadline = time.monotonic() + 30  # actors of a batch that just ended may still be releasing their CPUs
            while cpus < self.cpu_workers <= int(total.get("CPU", 0)) and time.monotonic() < deadline:
                time.sleep(0.5)
                cpus = int(ray.available_resources().get("CPU", 0))
            if cpus < self.cpu_workers:
                raise RayUnavailable(f"--ray-cpu-workers {self.cpu_workers}: the Ray cluster has {cpus} free CPUs "
                                     f"(of {total.get('CPU', 0):g}); each CPU engine actor takes one")
            return self.cpu_workers
        gpus_total, gpus_free = total.get("GPU", 0.0), free.get("GPU", 0.0)
        for node in ray.nodes():
            n = (node.get("Resources") or {}).get("GPU", 0.0)
            if node.get("Alive") and n != int(n):
                raise RayUnavailable(f"the Ray node {node.get('NodeManagerAddress')} offers {n:g} GPUs, a fraction: "
                                     "one engine actor takes one whole GPU (fractional GPUs are refused — two "
                                     "engines on one GPU would split its memory); start it with whole --num-gpus")
        if gpus_total == 0:
            raise RayUnavailable("the Ray cluster has no GPU: one engine actor runs per GPU; for CPU actors (tests, "
                                 "dry runs) add --ray-cpu-workers N")
        if int(gpus_free) < 1:
            raise RayUnavailable(f"the Ray cluster's {gpus_total:g} GPUs are all in use by other jobs; no engine "
                                 "actor can be placed")
        return int(gpus_free)

    def _spawn(self, index: int, generation: int = 0) -> _Slot:
        ray = self._ray
        if self._actor_cls is None:
            self._actor_cls = ray.remote(SongWorker)
        gpu = self.cpu_workers is None
        opts = dict(num_cpus=1, num_gpus=1 if gpu else 0, max_restarts=0, max_task_retries=0)
        if self.spec.env:
            opts["runtime_env"] = {"env_vars": dict(self.spec.env)}
        actor = self._actor_cls.options(**opts).remote(self.spec, "cuda" if gpu else "cpu", index)
        return _Slot(index, actor, actor.describe.remote(), time.time() + PLACEMENT_TIMEOUT_S, generation)

    def _described(self, slot: _Slot, info: dict) -> None:
        slot.state, slot.info = "idle", info
        self.settings["workers"].append({k: v for k, v in info.items() if k != "free_bytes"})
        gpu = f" GPU {','.join(info['gpu_ids'])} ({info['gpu']})" if info.get("gpu_ids") else ""
        self._say(f"worker {slot.index} pid {info['pid']} node {info['node']} device {info['device']}{gpu}"
                  + (" (replacement)" if slot.generation else ""))

    def prepare(self) -> tuple[int | None, bool]:
        """Connect, place one actor per GPU (or `cpu_workers` CPU actors) and describe them. Returns (the smallest
        free memory of the workers' devices in bytes, or None; whether they run on CUDA) for `memory.size_batch`.
        RayUnavailable when no actor can be placed within PLACEMENT_TIMEOUT_S."""
        ray = self.connect()
        n = self._workers_wanted()
        self.settings["started_at"] = time.time()
        self.slots = [self._spawn(i) for i in range(n)]
        pending = {s.ref: s for s in self.slots}
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=PLACEMENT_TIMEOUT_S)
        errors = []
        for slot in self.slots:
            if slot.ref in ready:
                try:
                    self._described(slot, ray.get(slot.ref))
                    continue
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"worker {slot.index}: {_cause(exc)}")
            else:
                errors.append(f"worker {slot.index} was not placed within {PLACEMENT_TIMEOUT_S:g} s")
            self._kill(slot)
        live = [s for s in self.slots if s.state == "idle"]
        if not live:
            raise RayUnavailable("no Ray engine actor could start: " + "; ".join(errors))
        for e in errors:
            self._say(e)
        frees = [s.info.get("free_bytes") for s in live]
        self.on_cuda = live[0].info["device"] == "cuda"
        return (min(frees) if all(f is not None for f in frees) else None), self.on_cuda

    def _kill(self, slot: _Slot) -> None:
        slot.state = "dead"
        try:
            self._ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self) -> None:
        """Kill the actors; disconnect (and stop a local instance) when `connect` started the session."""
        if self._ray is None:
            return
        for slot in self.slots:
            if slot.state != "dead":
                self._kill(slot)
        if self._owns:
            self._ray.shutdown()
        self._ray, self._owns = None, False

    def in_flight(self) -> dict[int, list[str]]:
        """{worker index: ids of the songs it holds and has not sent back} for the busy workers."""
        return {s.index: list(s.items) for s in self.slots if s.state == "busy"}

    def worker_pid(self, index: int) -> int | None:
        """The process id of the live worker `index` (None when it is dead or not described)."""
        for s in self.slots:
            if s.index == index and s.state in ("idle", "busy"):
                return s.info.get("pid")
        return None

    # -- running songs ------------------------------------------------------------------------------------------
    def _load_all(self) -> str | None:
        """Every worker loads its engine now, in parallel (so the work starts together and the start is timed); a
        worker that fails to load is dropped, with the reason. Returns the last such reason (None: all loaded)."""
        ray = self._ray
        live = [s for s in self.slots if s.state == "idle"]
        refs = {s.actor.load.remote(): s for s in live}
        t, error = time.time(), None
        for ref, slot in refs.items():
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001
                error = f"worker {slot.index} could not load the model: {_cause(exc)}"
                self._say(error)
                self.settings["deaths"].append({"worker": slot.index, "when": "load", "died": False, "songs": [],
                                                "error": _cause(exc)})
                self._kill(slot)
        self.settings["engines_loaded_at"] = time.time()
        n = sum(1 for s in self.slots if s.state == "idle")
        self._say(f"{n} workers loaded the model in {time.time() - t:.1f} s")
        return error

    def songs(self, todo: list, out: Path, *, max_batch: int, steps: int, on_event=None,
              batched: bool | None = None, overlap: bool | None = None,
              method: str = "midpoint", before_save=None) -> Iterator[RaySongOutcome]:
        """Run `todo` (validated `BatchRequest`s) on the workers in chunks of up to `max_batch`; write each song into
        `out/<id>` as it arrives (`artifacts.write_song_dir`) and yield its `RaySongOutcome`. Failed songs are yielded
        with their reason; songs of a dead worker are rerun elsewhere (module docstring). `overlap` is passed to the
        workers' `iter_songs`; a chunk is one AR batch there, so nothing overlaps (the GPUs work in parallel instead).
        `before_save()` runs before each song's write; its ArtifactError fails that song at "save" (the driver's check
        that the batch folder was not moved away, which the write would make again)."""
        from ..artifacts import write_song_dir
        ray = self._ray
        out = Path(out)
        if batched or (batched is None and self.on_cuda):
            todo = sorted(todo, key=_batch_key)  # compatible requests share a chunk, as iter_songs sorts locally
        queue = deque(todo)
        attempts = {item.id: 0 for item in todo}
        lost = {item.id: 0.0 for item in todo}
        t0, tokens = time.time(), 0

        def event(song_id, stage, **info):
            if on_event is not None:
                rate = tokens / max(1e-9, time.time() - t0)
                on_event(song_id, stage, {**info, "aggregate_tokens_per_second": rate})

        def failed(item, why, stage="ray"):
            return RaySongOutcome(id=item.id, line=item.line, status="failed", stage=stage, error=why,
                                  attempts=attempts[item.id], lost_seconds=round(lost[item.id], 3))
        last_error = self._load_all()
        gens: dict = {}  # streaming generator -> slot
        while queue or gens:
            for slot in self.slots:  # give work to idle workers, shared evenly (at most max_batch each)
                if slot.state == "idle" and queue:
                    live = sum(1 for s in self.slots if s.state in ("idle", "busy", "starting"))
                    size = min(max_batch, -(-len(queue) // max(1, live - len(gens))))
                    chunk = [queue.popleft() for _ in range(size)]
                    for item in chunk:
                        attempts[item.id] += 1
                        event(item.id, f"on worker {slot.index}")
                    slot.state, slot.items, slot.started = "busy", {i.id: i for i in chunk}, time.time()
                    gens[slot.actor.run.remote(chunk, len(chunk), steps, batched, overlap, method)] = slot
            starting = {s.ref: s for s in self.slots if s.state == "starting"}
            if not gens and not starting:
                why = f"no Ray worker is left to run it ({last_error})" if last_error else "no Ray worker is left"
                while queue:
                    yield failed(queue.popleft(), why)
                break
            timeout = max(0.1, min((s.deadline for s in starting.values()), default=time.time() + 60) - time.time())
            ready, _ = ray.wait(list(gens) + list(starting), num_returns=1, timeout=timeout)
            now = time.time()
            for ref, slot in starting.items():  # replacement actors
                if ref in ready:
                    try:
                        self._described(slot, ray.get(ref))
                    except Exception as exc:  # noqa: BLE001
                        self._say(f"replacement worker {slot.index} did not start: {_cause(exc)}")
                        self._kill(slot)
                elif now > slot.deadline:
                    self._say(f"replacement worker {slot.index} was not placed within {PLACEMENT_TIMEOUT_S:g} s")
                    self._kill(slot)
            for gen in [g for g in ready if g in gens]:
                slot = gens[gen]
                try:
                    outcome, files, result, finished, peak = ray.get(next(gen))
                except StopIteration:
                    del gens[gen]
                    queue.extendleft(reversed(list(slot.items.values())))  # none: a chunk yields every song
                    slot.state, slot.items = "idle", {}
                    continue
                except Exception as exc:  # noqa: BLE001 - the worker died, or its run raised outside a song
                    del gens[gen]
                    last_error = self._lost(slot, exc, now)
                    for item in reversed(list(slot.items.values())):
                        lost[item.id] += now - slot.started
                        if attempts[item.id] >= MAX_ATTEMPTS:
                            yield failed(item, f"its Ray worker died {attempts[item.id]} times (last: {last_error})")
                        else:
                            queue.appendleft(item)
                            event(item.id, "requeued", error=f"worker {slot.index} lost")
                    slot.items = {}
                    continue
                item = slot.items.pop(outcome["id"])
                result_row = self._store(outcome, files, result, out, write_song_dir, before_save)
                tokens += (result_row.semantic_tokens or 0) + (result_row.abc_tokens or 0)
                result_row.worker = {k: slot.info.get(k) for k in ("index", "pid", "node", "device", "gpu_ids")}
                result_row.attempts, result_row.lost_seconds = attempts[item.id], round(lost[item.id], 3)
                result_row.finished_at, result_row.peak_vram_bytes = round(finished, 3), peak
                event(item.id, result_row.status, error=result_row.error, at=result_row.stage)
                if self.on_song is not None:
                    self.on_song(self, result_row)
                yield result_row

    def _store(self, outcome: dict, files, result, out: Path, write_song_dir, before_save=None) -> RaySongOutcome:
        """The driver's half of `deliver`: write a completed song's folder atomically; a write error (or one of
        `before_save()`) fails the song at stage "save", as locally."""
        row = RaySongOutcome(**outcome)
        if row.status != "complete":
            return row
        try:
            if before_save is not None:
                before_save()
            row.output = str(write_song_dir(out / row.id, files, result))
        except ArtifactError as exc:
            row.status, row.stage, row.error = "failed", "save", str(exc)
            row.output = row.audio_seconds = row.truncated = None
            row.disk_full = isinstance(exc, DiskFullError)  # the driver stops the batch
        return row

    def _lost(self, slot: _Slot, exc: BaseException, now: float) -> str:
        """A worker's chunk ended in an error: record it, drop the actor, start a replacement in its slot when the
        worker died (not when its run raised: that would raise again). Returns the reason in words."""
        ray = self._ray
        died = isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                                ray.exceptions.ObjectLostError))
        why = (f"worker {slot.index} (pid {slot.info.get('pid')}) died" if died
               else f"worker {slot.index} failed: {_cause(exc)}")
        self._say(f"{why}; {len(slot.items)} songs go back to the queue: {', '.join(slot.items) or '-'}")
        self.settings["deaths"].append({"worker": slot.index, "pid": slot.info.get("pid"), "at": round(now, 3),
                                        "died": died, "songs": list(slot.items),
                                        "error": why if died else _cause(exc)})
        self._kill(slot)
        if died and slot.generation < REPLACEMENTS_PER_SLOT:
            self.slots.append(self._spawn(slot.index, slot.generation + 1))
        return why


def _cause(exc: BaseException) -> str:
    """The message of the error behind a Ray error (a task's own exception, else Ray's first line)."""
    cause = getattr(exc, "cause", None)
    inner = cause if isinstance(cause, BaseException) else exc
    return str(inner) if isinstance(inner, YuE2Error) else brief(inner)


__all__ = ["RayRunner", "RaySongOutcome", "EngineSpec", "SongWorker", "RayUnavailable", "require_ray",
           "parse_address", "check_reachable", "check_options", "yue2_env", "MAX_ATTEMPTS"]
