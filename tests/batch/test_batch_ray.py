"""`python -m yue2_core batch --ray`: a local Ray instance (2 CPUs) with two CPU engine actors and the tiny model.

- the song folders equal the single-process run's (bytes; timings aside) and the work is shared by both workers;
- one worker killed (SIGKILL) while it holds songs: every song still completes exactly once (one folder write per
  id), the killed worker's songs are rerun on another worker (attempts 2, their lost time recorded) and equal the
  single-process songs, no partial folder is left;
- bad inputs: Ray not installed, an address that does not answer, a malformed address, options that do not go
  together, more CPU workers than the cluster has, a fractional GPU count — one message, exit 2, no traceback.

Ray is in the `test` extra (pyproject.toml), so in CI (CI=true) a missing Ray fails; elsewhere the Ray tests skip
with the reason, as they do when a local instance cannot start (pytest -ra lists it).
"""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, rows, write_requests  # noqa: E402

STEPS = "2"
TIMING_FILES = ("result.json", "plan.json", "plan_manifest.json")


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance with 2 CPUs for this module (the runner reuses an initialized session)."""
    try:
        import ray
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"ray is not installed ({exc}); scripts/test.sh installs it with .[test]")
        pytest.skip(f"ray is not installed ({exc}): pip install -e .[test]")
    import logging
    try:
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, object_store_memory=200 * 2 ** 20)
    except Exception as exc:  # noqa: BLE001 - say exactly why Ray cannot run here
        pytest.skip(f"a local Ray instance could not start here: {type(exc).__name__}: {exc}")
    yield ray
    ray.shutdown()


def _args(req, out, ckpt, *extra):
    return ["batch", str(req), "--output", str(out), "--checkpoint", ckpt, "--device", "cpu", "--steps", STEPS,
            "--max-abc-tokens", str(ABC_CAP), *extra]


def _song(folder: Path) -> dict:
    """A song folder's bytes with the timings taken out (they differ between any two runs)."""
    files = {}
    for p in sorted(folder.iterdir()):
        if p.name in TIMING_FILES:
            obj = json.loads(p.read_bytes())
            for part in (obj, obj.get("score") or {}, obj.get("semantic") or {}):
                part.pop("timing", None)
            obj.pop("result_sha256", None)
            obj.pop("artifacts", None) if p.name == "result.json" else None
            obj.pop("plan.json", None)  # plan_manifest.json: the hash of plan.json, which holds timings
            files[p.name] = obj
        else:
            files[p.name] = p.read_bytes()
    return files


def _rows(out: Path) -> dict:
    return {r["id"]: r for r in json.loads((out / "batch.json").read_text("utf-8"))["results"]}


SAME = ("status", "stage", "error", "audio_seconds", "semantic_tokens", "abc_tokens", "truncated", "rows")


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_ckpt):
    """The single-process batch of the five requests (the reference)."""
    import torch
    from yue2_core.__main__ import main
    root = tmp_path_factory.mktemp("local")
    req = write_requests(root / "in")
    out = root / "out"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each CPU actor (one CPU each): the fp32 VAE's sums depend on the thread count
    try:
        assert main(_args(req, out, tiny_ckpt)) == 0
    finally:
        torch.set_num_threads(threads)
    return req, out


def test_ray_batch_equals_single_process(tmp_path, tiny_ckpt, ray_session, local_run, capsys):
    from yue2_core.__main__ import main
    req, local = local_run
    out = tmp_path / "ray"
    assert main(_args(req, out, tiny_ckpt, "--ray", "auto", "--ray-cpu-workers", "2")) == 0
    err = capsys.readouterr().err
    assert "ray: worker 0 pid" in err and "ray: worker 1 pid" in err and "5 of 5 complete" in err
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json", *(r["id"] for r in rows())])
    mine, theirs = _rows(out), _rows(local)
    for row in rows():
        i = row["id"]
        assert _song(out / i) == _song(local / i), i
        assert {k: mine[i][k] for k in SAME} == {k: theirs[i][k] for k in SAME}, i
        assert mine[i]["attempts"] == 1 and mine[i]["lost_seconds"] == 0.0
    assert {r["worker"]["index"] for r in mine.values()} == {0, 1}  # the queue was shared
    ray = json.loads((out / "batch.json").read_text("utf-8"))["settings"]["ray"]
    assert ray["address"] == "auto" and len(ray["workers"]) == 2 and ray["deaths"] == []


KILL_IDS = ("melody-score", "full-file", "short")  # the kill test's three songs (two to one worker, one to the
# other): whichever worker the kill hits, its songs then run again after the survivor's own — with all five rows the
# survivor ran five songs in a row (CI: 22 s for this test)


def test_worker_killed_mid_batch(tmp_path, tiny_ckpt, engine, ray_session, local_run, monkeypatch):
    from yue2_core import artifacts
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.ray_runner import EngineSpec, RayRunner
    _, local = local_run
    req = write_requests(tmp_path / "in")  # three of the five rows (their scores file too)
    req.write_text("".join(line + "\n" for line in req.read_text("utf-8").splitlines()
                           if json.loads(line)["id"] in KILL_IDS), "utf-8")
    kept = [row for row in rows() if row["id"] in KILL_IDS]
    assert [row["id"] for row in kept] == list(KILL_IDS)
    out = tmp_path / "ray"
    writes, real = [], artifacts.write_song_dir

    def counted(path, files, result):
        writes.append(Path(path).name)
        return real(path, files, result)
    monkeypatch.setattr(artifacts, "write_song_dir", counted)
    killed = {}

    def kill_the_other(runner, outcome):
        if killed:
            return
        busy = {i: ids for i, ids in runner.in_flight().items() if i != outcome.worker["index"] and ids}
        if busy:  # a worker still holding songs (one of them running): SIGKILL, as a crash or the OOM killer
            index, ids = next(iter(busy.items()))
            killed.update(index=index, pid=runner.worker_pid(index), held=ids)
            os.kill(killed["pid"], signal.SIGKILL)
    runner = RayRunner("auto", EngineSpec(tiny_ckpt), cpu_workers=2, on_song=kill_the_other)
    try:
        rc = run_batch(BatchOptions(str(req), str(out), steps=int(STEPS), max_abc_tokens=ABC_CAP),
                       tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=None, runner=runner)
    finally:
        runner.close()
    assert killed, "no worker held songs when the first song came back"
    assert rc == 0
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert (summary["complete"], summary["expected"], summary["failed"]) == (3, 3, 0)
    assert sorted(writes) == sorted(KILL_IDS)  # each song written exactly once
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json", *KILL_IDS])  # no .partial
    deaths = summary["settings"]["ray"]["deaths"]
    assert len(deaths) == 1 and deaths[0]["died"] and deaths[0]["pid"] == killed["pid"]
    rerun = deaths[0]["songs"]
    assert rerun and set(rerun) <= set(killed["held"])
    mine = _rows(out)
    for i in rerun:
        assert mine[i]["attempts"] == 2 and mine[i]["lost_seconds"] > 0, mine[i]
        assert mine[i]["worker"]["pid"] != killed["pid"]
    for row in kept:
        artifacts.load_song(out / row["id"])  # verifies every file against its sha256
        assert _song(out / row["id"]) == _song(local / row["id"]), row["id"]


# -- bad inputs ----------------------------------------------------------------------------------------------------
def test_workers_that_cannot_load_the_checkpoint_fail_the_rows_with_the_reason(tmp_path, engine, ray_session):
    """A checkpoint missing on the workers (a cluster node without the file): every row fails naming it, no hang,
    no song folder."""
    from yue2_core.batch import BatchOptions, run_batch
    from yue2_core.batch.ray_runner import EngineSpec, RayRunner
    req = write_requests(tmp_path / "in")
    out = tmp_path / "ray"
    runner = RayRunner("auto", EngineSpec(str(tmp_path / "elsewhere.safetensors")), cpu_workers=2)
    try:
        rc = run_batch(BatchOptions(str(req), str(out), steps=int(STEPS), max_abc_tokens=ABC_CAP),
                       tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=None, runner=runner)
    finally:
        runner.close()
    assert rc == 1
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert (summary["complete"], summary["failed"]) == (0, 5)
    for row in summary["results"]:
        assert "no Ray worker is left" in row["error"] and "could not load the model" in row["error"], row["error"]
        assert "elsewhere.safetensors" in row["error"] and "Traceback" not in row["error"]
    assert [p.name for p in out.iterdir()] == ["batch.json"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_one_message_exit_2(tmp_path, tiny_ckpt):
    """A fresh process (no Ray session): an address nothing listens on is refused within seconds, before the
    output folder is made."""
    req = write_requests(tmp_path / "in")
    out = tmp_path / "out"
    port = _closed_port()
    proc = subprocess.run([sys.executable, "-m", "yue2_core", *_args(req, out, tiny_ckpt, "--ray", f"127.0.0.1:{port}",
                                                                      "--ray-cpu-workers", "1")],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    if "needs the Ray package" in proc.stderr and not os.environ.get("CI"):
        pytest.skip("ray is not installed")
    assert proc.returncode == 2, proc.stderr
    assert f"error: cannot reach the Ray cluster at 127.0.0.1:{port}" in proc.stderr
    assert "ray start --head" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_ray_not_installed(tmp_path, tiny_ckpt, monkeypatch, capsys):
    from yue2_core.__main__ import main
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    req = write_requests(tmp_path / "in")
    assert main(_args(req, tmp_path / "out", tiny_ckpt, "--ray", "auto", "--ray-cpu-workers", "2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ray needs the Ray package" in err and "pip install ray" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--ray", "http://head:6379/x"], "is not a Ray address"),
    (["--ray", "head:99999"], "is not a Ray address"),
    (["--ray-cpu-workers", "2"], "--ray-cpu-workers needs --ray"),
    (["--ray", "auto"], "--device cpu with --ray needs --ray-cpu-workers"),
    (["--ray", "auto", "--ray-cpu-workers", "0"], "--ray-cpu-workers must be a positive number"),
])
def test_bad_ray_options(tmp_path, tiny_ckpt, capsys, extra, message):
    pytest.importorskip("ray", reason="ray is not installed (pip install -e .[test])")
    from yue2_core.__main__ import main
    req = write_requests(tmp_path / "in")
    assert main(_args(req, tmp_path / "out", tiny_ckpt, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_device_index_refused_with_ray(tmp_path, tiny_ckpt, capsys):
    pytest.importorskip("ray", reason="ray is not installed (pip install -e .[test])")
    from yue2_core.__main__ import main
    req = write_requests(tmp_path / "in")
    args = _args(req, tmp_path / "out", tiny_ckpt, "--ray", "auto")
    args[args.index("--device") + 1] = "cuda:1"
    assert main(args) == 2
    assert "Ray gives each engine actor its GPU" in capsys.readouterr().err


def test_more_cpu_workers_than_the_cluster_has(tmp_path, tiny_ckpt, ray_session, capsys):
    from yue2_core.__main__ import main
    req = write_requests(tmp_path / "in")
    assert main(_args(req, tmp_path / "out", tiny_ckpt, "--ray", "auto", "--ray-cpu-workers", "5")) == 2
    err = capsys.readouterr().err
    assert "--ray-cpu-workers 5: the Ray cluster has 2 free CPUs" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


class _Cluster:
    """What `RayRunner._workers_wanted` asks of Ray, for GPU counts this machine does not have."""

    def __init__(self, gpus_per_node, free=None):
        self.gpus, self.free = gpus_per_node, free

    def cluster_resources(self):
        return {"CPU": 8.0, "GPU": float(sum(self.gpus))}

    def available_resources(self):
        return {"CPU": 8.0, "GPU": float(sum(self.gpus) if self.free is None else self.free)}

    def nodes(self):
        return [{"Alive": True, "NodeManagerAddress": f"10.0.0.{i}", "Resources": {"GPU": g}}
                for i, g in enumerate(self.gpus)]


@pytest.mark.parametrize("gpus, free, want", [
    ([4.0], None, 4), ([2.0, 2.0], 3.0, 3), ([0.5], None, "offers 0.5 GPUs, a fraction"),
    ([], None, "has no GPU"), ([2.0], 0.0, "all in use"),
])
def test_one_actor_per_whole_gpu(gpus, free, want):
    from yue2_core.batch.ray_runner import EngineSpec, RayRunner, RayUnavailable
    runner = RayRunner("auto", EngineSpec("x"))
    runner._ray = _Cluster(gpus, free)
    if isinstance(want, int):
        assert runner._workers_wanted() == want
    else:
        with pytest.raises(RayUnavailable, match=want):
            runner._workers_wanted()


@pytest.mark.parametrize("address, parsed", [
    ("auto", None), ("10.0.0.5:6380", ("10.0.0.5", 6380)), ("head", ("head", 6379)),
    ("ray://head", ("head", 10001)), ("ray://head:7000", ("head", 7000)), ("[::1]:6379", ("::1", 6379)),
])
def test_parse_address(address, parsed):
    from yue2_core.batch.ray_runner import parse_address
    assert parse_address(address) == parsed


def test_workers_decode_with_the_drivers_vendor_vae_folder(tmp_path, monkeypatch, capsys):
    """Review (stop 41): with --ray each worker chose the vendor model folder's VAE folder itself
    (`find_vae_folder`), while batch.json recorded the driver's choice — a node where another VAE folder lies beside
    the model (a "standard" one, which it prefers) decoded with that one, and the songs recorded what decoded them,
    not what batch.json says. The driver's folder (path and sample hash) now travels in `EngineSpec.vendor_vae`:
    a worker decodes with it, and refuses it when its weights on that node differ. Tested without a Ray cluster:
    the spec the CLI gives the runner, loaded as a worker loads it."""
    import shutil
    from yue2_core.__main__ import main
    from yue2_core.batch import ray_runner
    from yue2_core.errors import CheckpointError, YuE2Error
    from synthetic_cache import synthetic_link
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    from yue2_core.weights.vendor import find_vae_folder, vae_folder_sample
    comfy = tmp_path / "tiny_bf16.safetensors"
    synthetic_link(str(comfy), "tiny", "bf16", seed=0)
    folder, legacy, standard = tmp_path / "YuE2-3B", tmp_path / "YuE2-Vae-legacy", tmp_path / "YuE2-Vae"
    write_vendor_folder(str(comfy), str(folder), vae_dir=str(legacy))
    config = json.loads((legacy / "config.json").read_text())
    (legacy / "config.json").write_text(json.dumps({**config, "release_variant": "legacy"}))
    specs = []

    class Captured(YuE2Error):
        pass

    class FakeRunner:
        def __init__(self, address, spec, cpu_workers=None):
            specs.append(spec)
            raise Captured("the spec is taken; no cluster in this test")
    monkeypatch.setattr(ray_runner, "check_options", lambda *a: None)
    monkeypatch.setattr(ray_runner, "RayRunner", FakeRunner)
    req = write_requests(tmp_path / "in")
    assert main(_args(req, tmp_path / "out", str(folder), "--ray", "auto", "--ray-cpu-workers", "1")) == 2
    assert "the spec is taken" in capsys.readouterr().err
    (spec,) = specs
    assert spec.vendor_vae == {"path": str(legacy), "sample_sha256": vae_folder_sample(str(legacy))}
    write_vae(str(standard), variant="standard", profile="tiny", seed=1)  # this node now has another folder beside
    assert find_vae_folder(folder) == standard
    assert ray_runner.EngineSpec(str(folder)).load("cpu").info.files["vae"] == str(standard)  # a worker's own pick
    worker = ray_runner.SongWorker(spec, "cpu", 0)
    worker.load()
    assert worker.engine.info.files["vae"] == str(legacy)  # the driver's, as batch.json records
    shutil.rmtree(legacy)
    shutil.copytree(standard, legacy)  # other weights at the driver's path on this node
    with pytest.raises(CheckpointError, match=rf"the VAE folder {legacy} holds other weights on this node than on "
                                              "the driver .*: every node needs the same VAE folder at the same path"):
        spec.load("cpu")
    shutil.rmtree(legacy)
    with pytest.raises(CheckpointError, match="is missing or unreadable on this node"):
        spec.load("cpu")
