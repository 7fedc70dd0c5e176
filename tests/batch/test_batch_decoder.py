"""The batched path (what runs on CUDA) on the CPU, where the decoder runs eagerly: songs of different prompts,
prompt lengths, seeds and cot modes decode in one `PhaseDecoder` batch per compatible group, and each song equals
the same request run alone through the one-row decoder (`fast.decode.generate`, the decoder `generate` uses on a
GPU) — tokens, latents and audio."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from batch_data import expected, rows  # noqa: E402


def _items():
    """Four of the rows with one semantic preset (the decoder batches rows of one preset); off + CFG is its own
    group."""
    from yue2_core.batch.requests import BatchRequest
    same = []
    for row in rows():
        if row["id"] != "full-file":
            row.pop("abc_sampling", None)
            row["semantic_sampling"] = {"max_tokens": 20, "min_tokens": 5}
            same.append(row)
    return [BatchRequest(i + 1, *expected(row)) for i, row in enumerate(same)]


def test_batched_rows_of_different_prompts_equal_single_decoder_runs(engine, monkeypatch):
    import yue2_core.fast as fast
    from yue2_core.batch.runner import iter_songs
    from yue2_core.fast.decode import generate as one_row_decoder
    items = _items()
    monkeypatch.setattr(fast, "select_generate", lambda ar: one_row_decoder)  # single rows and generate as on a GPU
    songs = {}
    outcomes = list(iter_songs(engine, items, deliver=lambda item, song: songs.setdefault(item.id, song) and item.id,
                               max_batch=4, steps=2, batched=True))
    assert [o.status for o in outcomes] == ["complete"] * 4
    rows_of = {o.id: o.rows for o in outcomes}
    # one batch of 4: the cot off + CFG row decodes on its own, the three others (three prompts, two planned) together
    assert rows_of["off-cfg"] == 1 and rows_of["full-model"] == rows_of["melody-score"] == rows_of["short"] == 3
    for item in items:
        alone = engine.generate(item.request, item.budgets, steps=2)
        song = songs[item.id]
        assert song.score.abc_ids == alone.score.abc_ids, item.id
        assert song.tokens.codes == alone.tokens.codes, item.id
        assert torch.equal(song.latents, alone.latents) and torch.equal(song.audio, alone.audio), item.id


def test_a_failing_row_in_a_batch_fails_alone(engine, monkeypatch):
    """A batched phase that raises is re-run row by row: only the row that fails alone is reported."""
    import yue2_core.fast.decode as decode
    from yue2_core.batch.runner import iter_songs
    from yue2_core.errors import NumericalError
    import yue2_core.fast as fast
    items = [i for i in _items() if i.id != "off-cfg"]
    monkeypatch.setattr(fast, "select_generate", lambda ar: decode.generate)  # single rows as on a GPU
    real_run = decode.PhaseDecoder.run

    def run(self, on_token=None):
        if any(seed == items[1].request.seed for seed in self.seeds):
            raise NumericalError("the model produced NaN logits (test)")
        return real_run(self, on_token)
    monkeypatch.setattr(decode.PhaseDecoder, "run", run)
    outcomes = list(iter_songs(engine, items, deliver=lambda item, song: item.id, max_batch=3, steps=2,
                               batched=True))
    status = {o.id: (o.status, o.stage, o.error) for o in outcomes}
    assert status[items[0].id][0] == status[items[2].id][0] == "complete"
    assert status[items[1].id][0] == "failed" and "NaN logits" in status[items[1].id][2]
    assert status[items[1].id][1] in ("plan", "semantic")


def test_cpu_products_here_do_not_depend_on_the_row_count():
    """What the bit-for-bit batch tests above rely on: a row of a batched bf16 product equals that row alone. On
    AVX-512 CPUs oneDNN's bf16 kernels block by the row count and break this (stop 57: an LM-head row of a 3-row
    product differed in the last bit); tests/conftest.py sets ONEDNN_MAX_CPU_ISA=AVX2 before any product runs."""
    import os
    gen = torch.Generator().manual_seed(0)
    assert os.environ.get("ONEDNN_MAX_CPU_ISA"), "tests/conftest.py sets it"
    for k, n in ((256, 384), (256, 512), (256, 32769), (256, 184704)):
        w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
        full = torch.nn.functional.linear(x, w)
        for r in (1, 2):
            assert torch.equal(full[:r], torch.nn.functional.linear(x[:r], w)), (k, n, r)
