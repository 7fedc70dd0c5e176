"""Continuous batching (`fast.refill.RefillDecoder`, `iter_songs(continuous=True)`, `batch --continuous`) on the CPU:
a finished song's row takes the next song between blocks, and every song equals the same song decoded alone.

To make songs end at different steps (the case refill exists for), the end token's logit is raised by a constant
in every decoder of a test alike (`fast.decode.head_rows` wrapped): random tiny weights otherwise run every song to
its budget. The songs decoded alone get the same raised logit, so "equal" still means equal.
"""
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import ABC_CAP, expected, rows, write_requests  # noqa: E402

from tests.core.test_fast_path import _run_ok  # noqa: E402

STEPS = 2


@pytest.fixture(scope="module")
def fp32(tiny_ckpt):
    """The tiny model in fp32: batched rows equal single rows there (in bf16 the CPU's products for 2 rows and for
    1 row differ in the last bits, and a sampled token flips after some tens of steps, static batches alike)."""
    from yue2_core.pipeline import YuE2Engine
    return YuE2Engine.load(tiny_ckpt, device="cpu", dtype=torch.float32)


def _raise_end(monkeypatch, boost: float) -> None:
    from yue2_core.fast import decode as fd
    real = fd.head_rows

    def head_rows(*args, **kw):
        head = real(*args, **kw)

        def raised(x):
            y = head(x).clone()
            y[..., 0] += boost  # column 0 of the semantic slice: MUSIC_END
            return y
        return raised
    monkeypatch.setattr(fd, "head_rows", head_rows)


def _queue(engine, n: int, cfg: bool):
    from yue2_core.fast.refill import QueuedSong
    from yue2_core.protocol import SongRequest, negative_prefix, semantic_prefix
    tok, out = engine.tokenizer, []
    for i in range(n):
        req = SongRequest("pop " * (1 + i % 3), "la " * (1 + 5 * i), cot="off", seed=100 + i,
                          cfg_scale=1.5 if cfg else None)
        out.append(QueuedSong(i, semantic_prefix(req, [], tok.encode), req.seed,
                              negative_prefix(req, [], tok.encode) if cfg else None))
    return out


BOOST = {False: 1.5, True: 3.5}  # the end token's raise: songs of 5 to 40 tokens with these seeds


@pytest.mark.parametrize("cfg", [False, True], ids=["no-cfg", "cfg"])
def test_refilled_rows_equal_single_runs_and_take_fewer_steps(fp32, monkeypatch, cfg):
    engine = fp32
    from yue2_core.fast import decode as fd
    from yue2_core.fast.refill import RefillDecoder
    from yue2_core.protocol import Sampling
    _raise_end(monkeypatch, BOOST[cfg])
    queue, s = _queue(engine, 6, cfg), Sampling(min_tokens=3, max_tokens=40)
    kw = dict(cfg_scale=1.5, legacy_off=True) if cfg else {}
    dec = RefillDecoder(engine.ar, queue, 2, s, "semantic", block=4, **kw)
    got = dict(dec.iter_queue())
    assert sorted(got) == list(range(6)) and dec.totals["refills"] == 4
    lengths = []
    for q in queue:
        alone = fd.generate(engine.ar, q.prefix, s, q.seed, "semantic", negative=q.negative, **kw)
        assert got[q.key].tokens == alone.tokens and got[q.key].ended == alone.ended, q.key
        lengths.append(len(alone.tokens) + int(alone.ended))
    assert len(set(lengths)) >= 3, lengths  # songs of different lengths: rows were refilled mid-run
    # static batches of 2 last as long as their longer song (in blocks of 4); refilled rows do not wait
    static = sum(4 * -(-max(lengths[i:i + 2]) // 4) for i in range(0, 6, 2))
    assert dec.totals["decoded_steps"] < static, (dec.totals, lengths)


def test_songs_of_different_budgets_share_a_decoder(fp32):
    """Each song its own (min_tokens, max_tokens): a row ends at its own budget, and every song equals a single run
    given that budget (its draws are its own budget's worth, as a single run draws them)."""
    from dataclasses import replace
    from yue2_core.fast import decode as fd
    from yue2_core.fast.refill import RefillDecoder
    from yue2_core.protocol import Sampling
    engine = fp32
    budgets = [(3, 9), (0, 30), (12, 17), (5, 25), (2, 6)]
    queue = [replace(q, min_tokens=lo, max_tokens=hi) for q, (lo, hi) in zip(_queue(engine, 5, False), budgets)]
    s = Sampling(min_tokens=3, max_tokens=40)
    dec = RefillDecoder(engine.ar, queue, 2, s, "semantic", block=4)
    got = dict(dec.iter_queue())
    for q, (lo, hi) in zip(queue, budgets):
        alone = fd.generate(engine.ar, q.prefix, replace(s, min_tokens=lo, max_tokens=hi), q.seed, "semantic")
        assert got[q.key].tokens == alone.tokens and len(alone.tokens) == hi and not alone.ended, q.key
    # in blocks of 4: row A songs 0 (9 → step 12), 2 (17 → 32), 3 (25 → 60); row B songs 1 (30 → 32), 4 (6 → 40);
    # static batches of two would take 32 + 28 + 8 = 68 steps
    assert dec.totals["decoded_steps"] == 60 and dec.totals["refills"] == 3


def test_a_song_with_nan_logits_fails_alone_and_its_row_is_refilled(fp32, monkeypatch):
    engine = fp32
    from yue2_core.errors import NumericalError
    from yue2_core.fast import decode as fd
    from yue2_core.fast.refill import RefillDecoder
    from yue2_core.protocol import Sampling
    queue, s = _queue(engine, 4, False), Sampling(min_tokens=8, max_tokens=8)
    real_refill = RefillDecoder._refill

    def refill(self, g, index):
        real_refill(self, g, index)
        if self.queue[index].key == 2:  # damaged K/V of that row only: its attention, and so its logits, become NaN
            for k in self.k:
                k[g].fill_(float("nan"))
    monkeypatch.setattr(RefillDecoder, "_refill", refill)
    from yue2_core.weights import own
    own.mark(engine.ar, [("lora", "/loras/hot.safetensors", "ar", 3.0)], replace=True)  # as apply_stack marks it
    try:
        dec = RefillDecoder(engine.ar, queue, 2, s, "semantic", block=4)
        got = dict(dec.iter_queue())
    finally:
        own.mark(engine.ar, [], replace=True)
    assert isinstance(got[2], NumericalError) and "NaN" in str(got[2])
    assert "hot.safetensors" in str(got[2]) and "AR ×3" in str(got[2])  # the applied adapter is named as the cause
    for q in queue:
        if q.key != 2:
            alone = fd.generate(engine.ar, q.prefix, s, q.seed, "semantic")
            assert got[q.key].tokens == alone.tokens, q.key


def test_bad_queues_are_refused(engine):
    from yue2_core.errors import BudgetError, RequestError
    from yue2_core.fast.refill import QueuedSong, RefillDecoder
    from yue2_core.protocol import Sampling
    s = Sampling(min_tokens=1, max_tokens=100)
    with pytest.raises(RequestError, match="at least one"):
        RefillDecoder(engine.ar, [], 2, s, "semantic")
    with pytest.raises(RequestError, match="positive integer"):
        RefillDecoder(engine.ar, [QueuedSong(0, [1, 2], 1)], 0, s, "semantic")
    with pytest.raises(RequestError, match="negative prefix"):
        RefillDecoder(engine.ar, [QueuedSong(0, [1, 2], 1)], 1, s, "semantic", cfg_scale=2.0)
    with pytest.raises(RequestError, match="queued song 'b': .*min_tokens must be in"):  # a song's own budget
        RefillDecoder(engine.ar, [QueuedSong("a", [1, 2], 1), QueuedSong("b", [1, 2], 1, None, 50, 20)], 1, s,
                      "semantic")
    # a long prompt with a short budget beside a short prompt with a long one: each fits, so the queue does
    long_prompt, short_prompt = QueuedSong(0, [1] * 20000, 1, None, 0, 1000), QueuedSong(1, [1] * 10, 2, None, 0, 9000)
    dec = RefillDecoder(engine.ar, [long_prompt, short_prompt], 2, s, "semantic")
    assert dec._capacity() == 21001 and dec.s.max_tokens == 9000
    with pytest.raises(BudgetError, match="at most"):  # the last song of the queue, not only the first rows
        RefillDecoder(engine.ar, [QueuedSong(0, [1, 2], 1), QueuedSong(1, [1] * 24600, 2)], 1, s, "semantic")


def test_fused_kernels_with_refilled_rows_in_the_interpreter(tiny_ckpt):
    """The fused step's Triton kernels (add+RMSNorm, QK-norm+RoPE+KV store at each row's position, the split
    attention, the sampling-tail kernels reading a step and a budget per row) in Triton's CPU interpreter, fp32:
    three songs of different budgets on two rows, ending at different steps, equal the fused one-row decoder's
    songs."""
    pytest.importorskip("triton")
    code = ("import os\n"
            "os.environ['YUE2_GEMV'] = '0'\n"
            "from yue2_core.fast import sample_kernels as _sk\n"
            "_sk.BLOCK = 65536  # one program per row for all its columns: the interpreter's time is per program\n"
            "import torch\n"
            "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_tokenizer\n"
            "from yue2_core.fast import decode as fd\n"
            "from yue2_core.fast.refill import RefillDecoder, QueuedSong\n"
            "from yue2_core.protocol import Sampling, SongRequest, semantic_prefix\n"
            f"info = inspect_checkpoint({tiny_ckpt!r})\n"
            "ar, tok = load_ar(info, 'cpu', torch.float32), load_tokenizer(info)\n"
            "real = fd.head_rows\n"
            "def raised(*a, **kw):\n"
            "    h = real(*a, **kw)\n"
            "    def f(x):\n"
            "        y = h(x).clone(); y[..., 0] += 5.0; return y\n"
            "    return f\n"
            "fd.head_rows = raised\n"
            "ps = [semantic_prefix(SongRequest('pop ' * (1 + i), 'la ' * (1 + 2 * i), cot='off'), [], tok.encode)\n"
            "      for i in range(3)]\n"
            "s = Sampling(min_tokens=2, max_tokens=12)\n"
            "budgets = [(2, 12), (1, 2), (4, 8)]  # (min, max) tokens per song\n"
            "d = RefillDecoder(ar, [QueuedSong(i, p, 11 + i, None, *budgets[i]) for i, p in enumerate(ps)], 2, s,\n"
            "                  'semantic', use_graph=False, fused=True, block=2)\n"
            "got = dict(d.iter_queue())\n"
            "assert d.fused and d.attn_kernel and d.totals['refills'] == 1\n"
            "lengths = set()\n"
            "for i, p in enumerate(ps):\n"
            "    own = Sampling(min_tokens=budgets[i][0], max_tokens=budgets[i][1])\n"
            "    one = fd.PhaseDecoder(ar, [p], own, [11 + i], 'semantic', use_graph=False, fused=True).run()[0]\n"
            "    assert got[i].timing['sampling_tail'] == 'kernels' == one.timing['sampling_tail']\n"
            "    assert got[i].tokens == one.tokens, (i, got[i].tokens, one.tokens)\n"
            "    lengths.add(len(one.tokens))\n"
            "assert len(lengths) > 1, lengths\n"
            "print('ok')\n")
    _run_ok(code, interpret=True)


def _items():
    from yue2_core.batch.requests import BatchRequest
    out = []
    for i, row in enumerate(rows()):
        if row["id"] != "full-file":  # four rows of one semantic preset: one refill decoder of 2 rows
            row.pop("abc_sampling", None)
            row["semantic_sampling"] = {"max_tokens": 20, "min_tokens": 5}
        out.append(BatchRequest(i + 1, *expected(row)))
    return out


@pytest.mark.parametrize("overlap", [False, True], ids=["no-overlap", "overlap"])
def test_continuous_batch_gives_the_songs_generate_gives(engine, monkeypatch, overlap):
    import yue2_core.fast as fast
    from yue2_core.batch.runner import iter_songs
    from yue2_core.fast.decode import generate as one_row_decoder
    monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)  # single rows as on a GPU
    items, songs, threads = _items(), {}, set()

    def deliver(item, song):
        songs[item.id] = song
        threads.add(threading.current_thread().name)
        return item.id
    outcomes = list(iter_songs(engine, items, deliver=deliver, max_batch=2, steps=STEPS, continuous=True,
                               overlap=overlap))
    assert sorted(o.id for o in outcomes) == sorted(i.id for i in items)
    assert all(o.status == "complete" for o in outcomes), [(o.id, o.error) for o in outcomes]
    rows_of = {o.id: o.rows for o in outcomes}
    assert rows_of["full-model"] == rows_of["short"] == rows_of["full-file"] == 2 and rows_of["off-cfg"] == 1
    assert threads == ({"yue2-save"} if overlap else {"MainThread"})  # the render worker's writer
    for item in items:
        alone = engine.generate(item.request, item.budgets, steps=STEPS)
        song = songs[item.id]
        assert song.score.abc_ids == alone.score.abc_ids, item.id
        assert song.tokens.codes == alone.tokens.codes, item.id
        assert torch.equal(song.latents, alone.latents) and torch.equal(song.audio, alone.audio), item.id
    assert not any(t.name in ("yue2-render", "yue2-save") and t.is_alive() for t in threading.enumerate())


def test_ctrl_c_during_continuous_decoding_stops_the_worker_and_keeps_finished_songs(engine, monkeypatch):
    """Ctrl-C in the AR loop (at the semantic decoder's second refill, once the song that left its row first was
    delivered by the render worker): the interrupt propagates, the worker is gone, every delivered song was
    reported complete and the others were not."""
    import time
    import yue2_core.fast as fast
    from yue2_core.batch.runner import iter_songs
    from yue2_core.fast.decode import generate as one_row_decoder
    from yue2_core.fast.refill import RefillDecoder
    monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)
    delivered, refills, real_refill = [], [], RefillDecoder._refill

    def refill(self, g, index):
        refills.append(index)
        if len(refills) == 2:
            end = time.monotonic() + 120
            while not delivered and time.monotonic() < end:
                time.sleep(0.02)
            raise KeyboardInterrupt
        real_refill(self, g, index)
    monkeypatch.setattr(RefillDecoder, "_refill", refill)
    from yue2_core.batch import continuous
    monkeypatch.setattr(continuous, "waves", lambda count, rows: [range(count)])  # one wave: refills in it
    outcomes = []
    with pytest.raises(KeyboardInterrupt):
        for o in iter_songs(engine, _items(), deliver=lambda item, song: delivered.append(item.id) or item.id,
                            max_batch=2, steps=STEPS, continuous=True, overlap=True):
            outcomes.append(o)
    assert not any(t.name in ("yue2-render", "yue2-save") and t.is_alive() for t in threading.enumerate())
    assert delivered and set(delivered) == {o.id for o in outcomes if o.status == "complete"}
    assert len(outcomes) < 5


def test_batch_command_with_continuous(tmp_path, tiny_ckpt, capsys, monkeypatch):
    """`batch --continuous` on the CPU; the engine is loaded once the batch is sized, told its decoder (rows,
    continuous) for the warm-up, and the terminal says which batching runs."""
    import yue2_core.__main__ as cli
    from yue2_core.__main__ import main
    loads, real = [], cli._load_engine

    def load(*args, **kw):
        loads.append(kw)
        return real(*args, **kw)
    monkeypatch.setattr(cli, "_load_engine", load)
    req = write_requests(tmp_path / "in")
    out = tmp_path / "batch"
    rc = main(["batch", str(req), "--output", str(out), "--checkpoint", tiny_ckpt, "--device", "cpu",
               "--steps", str(STEPS), "--max-abc-tokens", str(ABC_CAP), "--max-batch", "2", "--continuous"])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    assert loads == [{"batch_rows": 2, "batch_refill": True, "vendor_vae": None}]  # no vendor folder: no VAE folder
    assert "batching: continuous on 2 rows (a row takes the next song as soon as its song ends)" in err
    assert f"summary: {out / 'batch.json'}" in err
    summary = json.loads((out / "batch.json").read_text("utf-8"))
    assert summary["complete"] == 5 and summary["settings"]["continuous"] is True
    assert sorted(p.name for p in out.iterdir()) == sorted(["batch.json"] + [r["id"] for r in rows()])


def test_continuous_with_ray_or_rows_one_at_a_time_is_refused(tmp_path, engine, monkeypatch):
    from yue2_core.batch.driver import BatchOptions, run_batch
    from yue2_core.batch.runner import iter_songs
    from yue2_core.errors import RequestError
    with pytest.raises(RequestError, match="batched AR phases"):
        next(iter_songs(engine, _items(), deliver=lambda i, s: i.id, continuous=True, batched=False))
    with monkeypatch.context() as m:  # YUE2_FAST=0 on a GPU turns the decoder --continuous needs off: refused
        m.setenv("YUE2_FAST", "0")
        m.setattr(type(engine.ar), "device", property(lambda self: torch.device("cuda")))  # refused before any use
        with pytest.raises(RequestError, match="YUE2_FAST=0"):
            next(iter_songs(engine, _items(), deliver=lambda i, s: i.id, continuous=True))
    req = write_requests(tmp_path / "in")
    opts = BatchOptions(str(req), str(tmp_path / "out"), continuous=True)
    with pytest.raises(RequestError, match="--continuous or --ray"):
        run_batch(opts, tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=lambda: engine,
                  runner=object())
    assert not (tmp_path / "out").exists()


def test_a_song_alone_in_its_group_is_the_song_it_is_in_a_larger_queue(engine):
    """Break-it finding: a group of one left the batch decoder for the portable loop (another sampler on the CPU),
    so a song changed with its neighbours — and a `--resume` that ran it alone gave another song. Now every song of
    a continuous batch goes through the refill decoder, one row or many."""
    from yue2_core.batch.runner import iter_songs
    items = _items()
    songs = {}

    def run(queue, tag):
        for o in iter_songs(engine, queue, deliver=lambda item, song: songs.setdefault((tag, item.id), song)
                            and item.id, max_batch=2, steps=STEPS, continuous=True, overlap=False):
            assert o.status == "complete", o.error
    run(items, "all")
    for item in (items[0], items[2]):  # full-model (planned by the model), off-cfg (its own CFG group)
        run([item], item.id)
        alone, among = songs[(item.id, item.id)], songs[("all", item.id)]
        assert alone.score.abc_ids == among.score.abc_ids and alone.tokens.codes == among.tokens.codes, item.id


def test_resume_refuses_another_batching_mode(tmp_path, engine):
    """Break-it finding: --resume --continuous finished a static batch's album (and the reverse) with other songs."""
    from yue2_core.batch.driver import BatchOptions, run_batch
    from yue2_core.errors import RequestError
    req = write_requests(tmp_path / "in")

    def never():
        raise AssertionError("must not load")
    kw = dict(tokenizer=engine.tokenizer, dims=engine.info.dims, engine_factory=never)
    for made, resumed, said in ((None, True, "static batches"), (True, False, "made with --continuous")):
        out = tmp_path / f"out-{resumed}"
        (out / rows()[0]["id"]).mkdir(parents=True)  # a song of the batch is there: its mode matters
        settings = {"steps": 2, "ode_method": "midpoint", **({} if made is None else {"continuous": made})}
        (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": settings}), "utf-8")
        before = (out / "batch.json").read_bytes()
        with pytest.raises(RequestError, match=said):
            run_batch(BatchOptions(str(req), str(out), steps=2, resume=True, continuous=resumed), **kw)
        assert (out / "batch.json").read_bytes() == before


def test_without_the_overlap_songs_are_saved_wave_by_wave(engine, monkeypatch):
    """Break-it finding: without the overlap nothing was saved until the whole queue's AR phases ended. The queue
    now runs in waves of WAVE × max-batch songs, each rendered and saved before the next wave decodes."""
    import yue2_core.fast as fast
    from yue2_core.batch import continuous
    from yue2_core.batch.runner import iter_songs
    from yue2_core.fast.decode import generate as one_row_decoder
    from yue2_core.fast.refill import RefillDecoder
    monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)
    monkeypatch.setattr(continuous, "WAVE", 1)
    events, real = [], RefillDecoder.iter_queue

    def iter_queue(self, on_block=None):
        events.append(("decode", len(self.queue)))
        return real(self, on_block)
    monkeypatch.setattr(RefillDecoder, "iter_queue", iter_queue)
    outcomes = list(iter_songs(engine, _items(), deliver=lambda item, song: events.append(("save", item.id))
                               or item.id, max_batch=2, steps=STEPS, continuous=True, overlap=False))
    assert all(o.status == "complete" for o in outcomes) and len(outcomes) == 5
    saves = [i for i, e in enumerate(events) if e[0] == "save"]
    decodes = [i for i, e in enumerate(events) if e[0] == "decode"]
    assert saves[1] < decodes[-1], events  # the first wave's songs were saved before the last wave decoded


def test_batching_default_continuous_on_cuda_static_elsewhere_resume_keeps_the_folders(tmp_path, monkeypatch):
    """`batch` without --continuous / --no-continuous: continuous on CUDA with the fast decoder (the H200 measurement
    in docs/batch.md), static on the CPU, with Ray, with YUE2_FAST=0 or rows forced one at a time; a --resume
    continues with the mode its batch.json records, and an explicit other mode is refused."""
    from yue2_core.batch.driver import BatchOptions, _check_resume_settings, choose_batching
    from yue2_core.errors import RequestError
    monkeypatch.delenv("YUE2_FAST", raising=False)
    assert choose_batching(None, on_cuda=True, ray=False) is True
    assert choose_batching(None, on_cuda=False, ray=False) is False
    assert choose_batching(None, on_cuda=True, ray=True) is False
    assert choose_batching(None, on_cuda=True, ray=False, batched=False) is False
    assert choose_batching(False, on_cuda=True, ray=False) is False
    assert choose_batching(True, on_cuda=False, ray=False) is True
    assert choose_batching(None, made=False, on_cuda=True, ray=False) is False
    assert choose_batching(None, made=True, on_cuda=False, ray=False) is True
    monkeypatch.setenv("YUE2_FAST", "0")
    assert choose_batching(None, on_cuda=True, ray=False) is False
    for made in (True, False, None):
        out = tmp_path / f"made-{made}"
        (out / "a").mkdir(parents=True)
        settings = {"steps": 2, "ode_method": "midpoint", **({} if made is None else {"continuous": made})}
        (out / "batch.json").write_text(json.dumps({"complete": 1, "settings": settings}), "utf-8")
        assert _check_resume_settings(out, BatchOptions("r.jsonl", str(out), steps=2), {"a"})[0] is bool(made)
        with pytest.raises(RequestError, match="resume it with the same option"):
            _check_resume_settings(out, BatchOptions("r.jsonl", str(out), steps=2, continuous=not made), {"a"})
        # a folder holding none of this file's songs has nothing to stay consistent with
        assert _check_resume_settings(out, BatchOptions("r.jsonl", str(out), steps=2, continuous=not made),
                                      {"b"}) == (None, None)
    fresh = tmp_path / "fresh"
    assert _check_resume_settings(fresh, BatchOptions("r.jsonl", str(fresh), steps=2), {"a"}) == (None, None)


def test_the_first_wave_is_one_row_batch_then_wave_sized():
    """The render stage starts after one plan round (as with static batches), later waves leave rows to refill."""
    from yue2_core.batch.continuous import WAVE, waves
    parts = waves(45, 4)
    assert [len(p) for p in parts] == [4, 4 * WAVE, 4 * WAVE, 45 - 4 - 8 * WAVE]
    assert [i for p in parts for i in p] == list(range(45))
    assert [len(p) for p in waves(3, 8)] == [3] and waves(0, 8) == []


def test_the_terminal_says_which_batching_runs(monkeypatch):
    """New-user finding: the CPU's default was announced as 'static batches' while its rows run one at a time."""
    from yue2_core.batch.driver import _batching_line
    monkeypatch.delenv("YUE2_FAST", raising=False)
    assert _batching_line(False, 4, False, None, False).startswith("songs one at a time")
    assert _batching_line(False, 4, True, False, False).startswith("songs one at a time")
    assert _batching_line(False, 4, True, None, False).startswith("static batches of up to 4 songs")
    assert _batching_line(True, 8, True, None, False).startswith("continuous on 8 rows")
    assert _batching_line(False, 2, True, None, True).startswith("Ray workers, chunks of 2 songs")
    monkeypatch.setenv("YUE2_FAST", "0")
    assert _batching_line(False, 4, True, None, False).startswith("songs one at a time")
    from yue2_core.batch.driver import _overlap_note  # new-user finding: --overlap on one batch seemed to do nothing
    assert "nothing to overlap" in _overlap_note(True, False, 3, 3, False)
    assert "renders overlap" in _overlap_note(True, False, 1, 3, False) == _overlap_note(True, True, 8, 3, False)
    assert _overlap_note(False, False, 1, 3, False) == _overlap_note(True, False, 1, 3, True) == ""


def test_progress_lines_end_each_stage_and_rate_only_the_ar_stages():
    """New-user finding: static runs never showed a stage's final count, and render lines carried the AR's rate."""
    import io
    from yue2_core.batch.summary import BatchProgress
    out = io.StringIO()
    progress = BatchProgress(out)
    for done in (1, 2, 3, 25):
        progress("a", "semantic", {"done": done, "total": 25, "aggregate_tokens_per_second": 4.0})
    progress("a", "render", {"done": 1, "total": 32, "aggregate_tokens_per_second": 4.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "[a] semantic 1/25 · 4.0 tok/s aggregate"
    assert lines[1] == "[a] semantic 25/25 · 4.0 tok/s aggregate"
    assert lines[2] == "[a] render 1/32" and len(lines) == 3


def test_resume_reads_the_batching_from_a_sound_record_or_from_the_songs(tmp_path, monkeypatch):
    """Break-it findings: a hand-edited `"continuous": "no"` was read as continuous; a damaged, missing or empty
    (complete 0) batch.json made a resume switch modes silently; a continuous folder resumed with --ray or with
    YUE2_FAST=0 on CUDA ran (or would have run) static batches recorded as continuous."""
    from yue2_core.batch.driver import BatchOptions, _check_resume_settings, choose_batching
    from yue2_core.errors import RequestError
    out = tmp_path / "album"
    for song, marked in (("a", True), ("b", True)):
        (out / song).mkdir(parents=True)
        timing = {"semantic": {"continuous_batching": True, "batch": 4}} if marked else {"semantic": {"batch": 4}}
        (out / song / "result.json").write_text(json.dumps({"status": "complete", "timing": timing}), "utf-8")
    opts = BatchOptions("r.jsonl", str(out), steps=2)
    ids = {"a", "b", "c"}
    for bad, said in (('"no"', '"no", not true or false'), ("1", "1, not true or false"), ("null", None)):
        (out / "batch.json").write_text('{"complete": 2, "settings": {"steps": 2, "continuous": %s}}' % bad, "utf-8")
        if said is None:  # null: absent, made before continuous batching existed (static)
            assert _check_resume_settings(out, opts, ids)[0] is False
            continue
        with pytest.raises(RequestError, match=said + ".*batch.json|batch.json.*" + said):
            _check_resume_settings(out, opts, ids)
    (out / "batch.json").write_text('{"complete": 2, "settings": {"steps": "2"}}', "utf-8")
    with pytest.raises(RequestError, match='settings.steps is "2", not an integer'):
        _check_resume_settings(out, opts, ids)
    for text in ("not json", "[1, 2]", '{"complete": 2}', '{"complete": 0, "settings": {"continuous": false}}', None):
        if text is None:
            (out / "batch.json").unlink()
        else:
            (out / "batch.json").write_text(text, "utf-8")
        assert _check_resume_settings(out, opts, ids) == (True, None), text  # the songs say: continuous
        with pytest.raises(RequestError, match="made with --continuous \\(their result.json\\)"):
            _check_resume_settings(out, BatchOptions("r.jsonl", str(out), steps=2, continuous=False), ids)
    (out / "b" / "result.json").write_text(json.dumps({"timing": {"semantic": {"batch": 4}}}), "utf-8")
    with pytest.raises(RequestError, match="both with continuous and with static batches"):
        _check_resume_settings(out, opts, ids)
    with pytest.raises(RequestError, match="resume it without --ray"):
        choose_batching(None, made=True, on_cuda=True, ray=True)
    assert choose_batching(None, made=False, on_cuda=True, ray=True) is False
    monkeypatch.setenv("YUE2_FAST", "0")
    with pytest.raises(RequestError, match="without YUE2_FAST=0"):
        choose_batching(None, made=True, on_cuda=True, ray=False)
    assert choose_batching(None, made=True, on_cuda=False, ray=False) is True


def test_the_aggregate_rate_counts_every_token_sampled_so_far(engine, monkeypatch):
    """New-user finding (stop 32): under continuous batching a song's last line of a phase reported the rate without
    its own tokens nor the other rows' ("plan 8/8 · 0.0 tok/s aggregate" with 8 tokens sampled), so the rate fell and
    jumped between lines. Now each line's rate counts ≥ the tokens that line reports done."""
    import yue2_core.fast as fast
    from yue2_core.batch.runner import iter_songs
    from yue2_core.fast.decode import generate as one_row_decoder
    monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)
    lines = []
    t0 = __import__("time").perf_counter()

    def on_event(song_id, stage, info):
        if stage in ("plan", "semantic") and info.get("done"):
            lines.append((stage, info["done"], info["aggregate_tokens_per_second"],
                          __import__("time").perf_counter() - t0))
    outcomes = list(iter_songs(engine, _items(), deliver=lambda item, song: item.id, max_batch=2, steps=STEPS,
                               continuous=True, overlap=False, on_event=on_event))
    assert all(o.status == "complete" for o in outcomes) and lines
    for stage, done, rate, elapsed in lines:
        assert rate * elapsed >= done * 0.99, (stage, done, rate, elapsed)  # tokens counted ≥ this song's own
