"""The batch command on a GPU (marked gpu; skipped without CUDA). Full-size dims when $YUE2_BENCH_INT8 names a
full-size synthetic int8 file (bench/bench.py writes /tmp/yue2bench/yue2_full_int8.safetensors), else the tiny one.

1. The batched decoder (`fast.decode.PhaseDecoder`, CUDA graphs) gives each row the tokens of the single-song decoder
   run of the same request — rows of DIFFERENT prompts (the protocol's prefixes of different requests, different
   lengths) and seeds, without and with CFG. Asserted for bf16 weights in fp32 compute, where a batch's different
   summation order (the decode attention splits the cache by batch size, cuBLAS picks per row count) moves logits
   by ~1e-7 and cannot reorder the sampler's race in a few hundred steps. Printed, not asserted: the int8 file in
   bf16 (the default), where such a move is a bf16 ulp and a near-tie can pick another token (docs/batch.md). Not
   the int8 file in fp32 either: the W8A16 kernel (`fast.int8_kernels`) feeds its tensor cores bf16 activations
   in any compute dtype, so a 1e-7 move flips a bf16 rounding somewhere every few steps — measured on an H200
   (9c7e492): rows parted after 3–59 tokens without CFG; with the legacy `off` mode's bf16 logits all 256 equal.
2. The overlap (`iter_songs(overlap=True)`: render + decode + deliver on a worker thread and its own stream while
   the next batch's AR phases capture and replay graphs) gives the same songs as without it — tokens, latents,
   audio and the song files — every decode phase ran as a CUDA graph (no capture failed beside the worker), the
   captures made while the worker was alive used capture_error_mode "thread_local", and the worker is gone after.
"""
import os
import threading

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SCORE = ("X:1\nT:\nM:4/4\nL:1/8\nQ:1/4=100\nK:C\n\"C\"c2d2e2f2|\"G\"g4e4|")


@pytest.fixture(scope="module")
def int8_path(request):
    """$YUE2_BENCH_INT8 (full-size synthetic int8 file, bench/bench.py) when set, else the tiny int8 file."""
    return os.environ.get("YUE2_BENCH_INT8") or request.getfixturevalue("tiny_int8_ckpt")


@pytest.fixture(scope="module")
def bf16_path(request):
    """$YUE2_BENCH_BF16 (full-size synthetic bf16 file, bench/bench.py) when set, else the tiny bf16 file."""
    return os.environ.get("YUE2_BENCH_BF16") or request.getfixturevalue("tiny_ckpt")


@pytest.fixture(autouse=True)
def one_thread():  # conftest's one intra-op thread is for the 2-core CPU runner; the GPU host keeps its own
    yield


_AR: dict = {}


def _ar_engine(path, dtype):
    """The AR part of `path` in `dtype`, kept for the module until another (path, dtype) is asked for."""
    from yue2_core.pipeline import YuE2Engine
    if (path, dtype) not in _AR:
        _AR.clear()  # one at a time on the device
        _AR[(path, dtype)] = YuE2Engine.load(path, device="cuda", dtype=dtype, parts=("ar",), warm_up=False)
    return _AR[(path, dtype)]


def _full() -> bool:
    return bool(os.environ.get("YUE2_BENCH_INT8"))


def _requests(cot: str, n: int) -> list:
    from yue2_core.protocol import SongRequest
    styles = ["indie pop, warm female vocals", "hard rock", "lo-fi hip hop, vinyl crackle, mellow keys", "jazz trio"]
    out = []
    for i in range(n):
        lyrics = "\n".join(f"line {j} of song {i}, la la la" for j in range(1 + 3 * i))  # different lengths
        out.append(SongRequest(styles[i % 4], f"[Verse]\n{lyrics}", cot=cot, seed=101 + 7 * i,
                               abc=None if cot == "off" else SCORE * (1 + i), cfg_scale=1.5 if cot == "off" else None,
                               id=f"song{i}"))
    return out


def _first_difference(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("weights,dtype", [("bf16", torch.float32), ("int8", torch.bfloat16)],
                         ids=["bf16-weights-fp32", "int8-weights-bf16"])
@pytest.mark.parametrize("cfg", [False, True], ids=["no-cfg", "cfg"])
def test_batched_rows_equal_single_decoder_runs(int8_path, bf16_path, weights, dtype, cfg):
    from yue2_core.fast.decode import PhaseDecoder, generate
    from yue2_core.protocol import Sampling, negative_prefix, semantic_prefix
    path = bf16_path if weights == "bf16" else int8_path
    eng = _ar_engine(path, dtype)
    tok, n = eng.tokenizer, 200 if _full() else 256
    requests = _requests("off" if cfg else "full", 4)
    prefixes, negatives = [], []
    for r in requests:
        ids = [] if r.cot == "off" else tok.encode(r.abc)
        prefixes.append(semantic_prefix(r, ids, tok.encode))
        negatives.append(negative_prefix(r, ids, tok.encode))
    assert len({len(p) for p in prefixes}) == 4  # four prompt lengths
    sampling = Sampling(min_tokens=n, max_tokens=n)
    seeds = [r.seed for r in requests]
    scale = requests[0].guidance
    kw = dict(cfg_scale=scale, legacy_off=cfg)
    batch = PhaseDecoder(eng.ar, prefixes, sampling, seeds, "semantic", negatives=negatives if cfg else None,
                         **kw).run()
    singles = [generate(eng.ar, p, sampling, s, "semantic", negative=neg if cfg else None, **kw)
               for p, s, neg in zip(prefixes, seeds, negatives)]
    first = [_first_difference(b.tokens, s.tokens) for b, s in zip(batch, singles)]
    print(f"{os.path.basename(path)} {dtype} cfg={cfg}: prompts {[len(p) for p in prefixes]}, {n} tokens; "
          f"batched = single for the first {first} tokens; {batch[0].timing['execution']}, "
          f"{batch[0].timing['decode_tokens_per_second']:.0f} steps/s batched")
    assert all(r.timing["execution"] == "cuda_graph" and r.timing["batch"] == 4 for r in batch)
    assert all(len(b.tokens) == n for b in batch)
    assert len({tuple(b.tokens) for b in batch}) == 4  # the rows are different songs
    if dtype == torch.float32:
        assert first == [n] * 4, first


def test_overlap_gives_the_same_songs_on_cuda(int8_path, monkeypatch):
    import warnings
    from yue2_core.artifacts import song_files
    from yue2_core.batch.requests import BatchRequest
    from yue2_core.batch.runner import iter_songs
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import Sampling
    _AR.clear()
    eng = YuE2Engine.load(int8_path, device="cuda", warm_up=False)
    n = 250 if _full() else 120
    items = [BatchRequest(i + 1, r, Budgets(semantic=Sampling(min_tokens=n, max_tokens=n)))
             for i, r in enumerate(_requests("full", 3))]
    modes, real_graph = [], torch.cuda.graph

    class Recording(real_graph):
        def __init__(self, *args, **kw):
            modes.append((kw.get("capture_error_mode", "global"),
                          any(t.name == "yue2-render" and t.is_alive() for t in threading.enumerate())))
            super().__init__(*args, **kw)
    monkeypatch.setattr(torch.cuda, "graph", Recording)
    from yue2_core.fast import decode as fd
    real_beside = fd._capture_beside_worker  # the AR's captures beside the worker: no device-wide sync, thread_local

    def beside_spy(*args, **kw):  # the worker's own NAR captures go through it too, marked "(render)"
        who = " (render)" if threading.current_thread().name == "yue2-render" else ""
        modes.append(("thread_local, no device sync" + who,
                      any(t.name == "yue2-render" and t.is_alive() for t in threading.enumerate())))
        return real_beside(*args, **kw)
    monkeypatch.setattr(fd, "_capture_beside_worker", beside_spy)
    runs = {}
    for overlap in (False, True):
        songs, where = {}, {}

        def deliver(item, song, songs=songs, where=where):
            songs[item.id], where[item.id] = song, threading.current_thread().name
            return item.id
        modes.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcomes = list(iter_songs(eng, items, deliver=deliver, max_batch=1, steps=32, overlap=overlap))
        runs[overlap] = songs
        assert [o.status for o in outcomes] == ["complete"] * 3, [o.error for o in outcomes]
        assert not [w for w in caught if "unavailable" in str(w.message)], [str(w.message) for w in caught]
        for song in songs.values():
            assert song.tokens.timing["execution"] == "cuda_graph", song.tokens.timing
            assert "graph_fallback_reason" not in song.tokens.timing
        assert set(where.values()) == ({"yue2-save"} if overlap else {"MainThread"})  # the render worker's writer
        beside = [mode for mode, alive in modes if alive]
        print(f"overlap={overlap}: {len(modes)} captures, {len(beside)} while the worker was alive: {set(beside)}")
        if overlap:  # the NAR's captures (worker) and the AR's (main thread): thread_local, without a device sync
            assert {"thread_local, no device sync", "thread_local, no device sync (render)"} <= set(beside), beside
            assert set(beside) <= {"thread_local", "thread_local, no device sync",
                                   "thread_local, no device sync (render)"}, set(beside)
        else:  # main-thread captures (AR buckets not side-captured, NAR) in global mode; none beside a worker
            assert {mode for mode, _ in modes} <= {"global"}
        for song in songs.values():  # the AR's side captures (fast/side_capture.py) did not fail
            for timing in (song.score.timing, song.tokens.timing):
                assert "side_capture_fallback_reason" not in (timing or {}), timing
    assert not any(t.name in ("yue2-render", "yue2-save") and t.is_alive() for t in threading.enumerate())
    try:
        import soundfile  # noqa: F401 - FLAC bytes need it (the GPU image may lack it)
        names = None
    except ImportError:
        names = ("audio.flac",)
    for song_id, plain in runs[False].items():
        over = runs[True][song_id]
        assert plain.tokens.codes == over.tokens.codes, song_id
        assert torch.equal(plain.latents, over.latents) and torch.equal(plain.audio, over.audio), song_id
        if names is None:
            a, b = song_files(plain), song_files(over)
        else:  # everything but the FLAC; the audio tensors are compared above
            import yue2_core.artifacts as artifacts
            monkeypatch.setattr(artifacts, "flac_bytes", lambda audio, rate: b"")
            a, b = song_files(plain), song_files(over)
        for name in a:
            if name not in ("plan.json", "plan_manifest.json"):  # these hold timings
                assert a[name] == b[name], (song_id, name)


@pytest.mark.parametrize("cfg", [False, True], ids=["no-cfg", "cfg"])
def test_refilled_rows_equal_single_decoder_runs(bf16_path, cfg):
    """Continuous batching (`fast.refill.RefillDecoder`, CUDA graphs replayed between eager row refills): six songs
    of different prompts and budgets on four rows — two refills, rows frozen after their song, graphs captured per
    bucket while rows change — give each song the single decoder's tokens (bf16 weights, fp32 compute, as in 1.)."""
    from dataclasses import replace
    from yue2_core.fast.decode import generate
    from yue2_core.fast.refill import QueuedSong, RefillDecoder
    from yue2_core.protocol import Sampling, negative_prefix, semantic_prefix
    eng = _ar_engine(bf16_path, torch.float32)
    tok, top = eng.tokenizer, 200 if _full() else 256
    requests = _requests("off" if cfg else "full", 6)
    budgets = [top, top // 4, top // 2, top - 37, top // 3, 40]
    queue = []
    for i, (r, n) in enumerate(zip(requests, budgets)):
        ids = [] if r.cot == "off" else tok.encode(r.abc)
        queue.append(QueuedSong(i, semantic_prefix(r, ids, tok.encode), r.seed,
                                negative_prefix(r, ids, tok.encode) if cfg else None, n, n))
    sampling = Sampling(min_tokens=top, max_tokens=top)
    kw = dict(cfg_scale=requests[0].guidance, legacy_off=cfg)
    dec = RefillDecoder(eng.ar, queue, 4, sampling, "semantic", **kw)
    got = dict(dec.iter_queue())
    assert dec.totals["refills"] == 2 and dec.totals["execution"] == "cuda_graph", dec.totals
    for q in queue:
        one = generate(eng.ar, q.prefix, replace(sampling, min_tokens=q.min_tokens, max_tokens=q.max_tokens),
                       q.seed, "semantic", negative=q.negative, **kw)
        print(f"song {q.key}: {len(got[q.key].tokens)} tokens, first difference at "
              f"{_first_difference(got[q.key].tokens, one.tokens)}")
        assert got[q.key].tokens == one.tokens and len(one.tokens) == q.max_tokens, q.key
