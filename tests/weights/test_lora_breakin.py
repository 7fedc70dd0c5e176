"""The bugs an adversarial review found in "bring your own weights" (docs/bad_inputs.md, section "Own weights: LoRA,
VAE, vendor folders"), each with a small file built here: safetensors read as .pt, PEFT patterns as regexes, FIFOs
and directories where files belong, rank 0, FP8, a stray adapter_config.json, render not checking companions, PEFT
folders with other weight names, malformed "weights" entries and strengths, FL companions outside the folder, and
the weak spots (norm diffs, alpha ≤ 0, huge scales, contradictory prefixes)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from yue2_core.__main__ import _song_weights, parse_lora
from yue2_core.errors import AdapterError, CheckpointError
from yue2_core.layers import ModelDims
from yue2_core.weights.checkpoint import inspect_checkpoint
from yue2_core.weights.lora import synthetic as syn
from yue2_core.weights.lora.apply import Applied
from yue2_core.weights.lora.layouts import read_adapter
from yue2_core.weights.lora.record import find_recorded, lora_record
from yue2_core.weights.synthetic import get_profile
from yue2_core.weights.vae_files import open_vae

_P = get_profile("tiny")
TINY = ModelDims(hidden=_P.hidden, layers=_P.layers, heads=_P.heads, kv_heads=_P.kv_heads, head_dim=_P.head_dim,
                 ffn=_P.ffn, vocab=_P.vocab)
H, Q = 256, 256  # tiny hidden, q rows (o_proj is [H, Q])
O_PROJ = "diffusion_model.model.layers.0.self_attn.o_proj"


class _Hang(Exception):
    pass


@contextmanager
def no_hang(seconds: int = 10):
    """Fail (instead of blocking the suite) when the body takes longer than `seconds`: opening a FIFO blocks."""
    def alarm(*_):
        raise _Hang(f"hung for {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _pair(gen, prefix=O_PROJ, rank=4, dtype=torch.float32):
    return {f"{prefix}.lora_A.weight": (torch.randn(rank, Q, generator=gen) * 0.05).to(dtype),
            f"{prefix}.lora_B.weight": (torch.randn(H, rank, generator=gen) * 0.05).to(dtype)}


def _write(path, tensors, metadata=None):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return str(path)


def _refused(path, *fragments, dims=TINY):
    with no_hang():
        with pytest.raises(AdapterError) as e:
            read_adapter(str(path), dims)
    for f in fragments:
        assert f in str(e.value), (f, str(e.value))
    return str(e.value)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(7)


# ------------------------------------------------------------------------------------ 1. container by first byte

def test_safetensors_whose_header_length_ends_in_0x80_stays_safetensors(tmp_path, gen):
    t = {"yue2.blk.0.nar_attn_output.lora_A.weight": torch.randn(4, Q, generator=gen) * 0.05,
         "yue2.blk.0.nar_attn_output.lora_B.weight": torch.randn(H, 4, generator=gen) * 0.05}
    path = tmp_path / "hot.safetensors"
    for pad in range(0, 400, 8):
        _write(path, t, {"format": "yue2-nar-lora-v1", "alpha": "8", "note": "x" * pad})
        if path.read_bytes()[:1] == b"\x80":
            break
    raw = path.read_bytes()
    assert raw[:1] == b"\x80" and struct.unpack("<Q", raw[:8])[0] % 256 == 0x80
    a = read_adapter(str(path), TINY)
    assert a.layout == "hot-step-split" and a.scales == [2.0]  # metadata alpha 8 / rank 4, not the .pt path's 1
    assert a.metadata.get("format") == "yue2-nar-lora-v1"
    # a real torch file still opens as one
    torch.save({f"{O_PROJ}.lora_A.weight": t["yue2.blk.0.nar_attn_output.lora_A.weight"],
                f"{O_PROJ}.lora_B.weight": t["yue2.blk.0.nar_attn_output.lora_B.weight"]}, tmp_path / "x.pt")
    assert read_adapter(str(tmp_path / "x.pt"), TINY).layout == "ai-toolkit"


# ------------------------------------------------------------------------------------ 2. PEFT patterns are literal

def _peft(tmp_path, gen, cfg, name="adapter_model.safetensors", folder="peft"):
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    pre = "base_model.model.model.layers.0"
    t = {f"{pre}.nar_self_attn.q_proj.lora_A.weight": torch.randn(4, H, generator=gen) * 0.05,
         f"{pre}.nar_self_attn.q_proj.lora_B.weight": torch.randn(Q, 4, generator=gen) * 0.05,
         f"{pre}.mlp.down_proj.lora_A.weight": torch.randn(4, 512, generator=gen) * 0.05,
         f"{pre}.mlp.down_proj.lora_B.weight": torch.randn(H, 4, generator=gen) * 0.05}
    _write(d / name, t)
    if cfg is not None:
        (d / "adapter_config.json").write_text(json.dumps(cfg))
    return d


CFG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8}


def test_peft_patterns_match_literally_and_regexes_are_refused_fast(tmp_path, gen):
    start = time.monotonic()
    _refused(_peft(tmp_path, gen, {**CFG, "rank_pattern": {"(.*.*.*.*.*.*.*.*.*.*)*!": 4}}), "rank_pattern",
             "not a module name")
    _refused(_peft(tmp_path, gen, {**CFG, "alpha_pattern": {"q_proj[": 2}}), "alpha_pattern", "q_proj[")
    _refused(_peft(tmp_path, gen, {**CFG, "rank_pattern": {"a." * 150 + "q": 4}}), "rank_pattern")
    assert time.monotonic() - start < 10
    a = read_adapter(str(_peft(tmp_path, gen, {**CFG, "alpha_pattern": {"nar_self_attn.q_proj": 16, "proj": 1}})), TINY)
    # dotted suffix matches (16/4); "proj" is no dotted suffix of "…down_proj" (8/4 stays)
    assert {p.module.rsplit(".", 1)[-1]: p.delta.scale for p in a.patches} == {"qkv_proj": 4.0, "down_proj": 2.0}


# ------------------------------------------------------------------------------------ 3, 4. FIFOs and directories

def test_fifos_are_refused_by_name_before_opening(tmp_path, gen):
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    _refused(fifo, "is a FIFO", "not a file")
    folder = tmp_path / "only_fifo"
    folder.mkdir()
    os.mkfifo(folder / "w.safetensors")
    _refused(folder, "w.safetensors", "is a FIFO")
    with no_hang(), pytest.raises(CheckpointError, match="is a FIFO"):
        open_vae(str(fifo))
    with no_hang(), pytest.raises(CheckpointError, match="is a FIFO"):
        inspect_checkpoint(str(fifo))
    with no_hang(), pytest.raises(argparse.ArgumentTypeError, match="is a FIFO"):
        parse_lora(f"{fifo}:0.5")


def test_folder_whose_only_safetensors_is_a_directory(tmp_path):
    folder = tmp_path / "p"
    (folder / "inner.safetensors").mkdir(parents=True)
    _refused(folder, "inner.safetensors", "is a directory, not a file")


# ------------------------------------------------------------------------------------ 5, 6. rank 0, FP8

def test_rank_zero_is_refused_with_or_without_alpha(tmp_path, gen):
    zero = {f"{O_PROJ}.lora_A.weight": torch.zeros(0, Q), f"{O_PROJ}.lora_B.weight": torch.zeros(H, 0)}
    _refused(_write(tmp_path / "a.safetensors", zero), "rank 0", f"{O_PROJ}.lora_A.weight")
    _refused(_write(tmp_path / "b.safetensors", {**zero, f"{O_PROJ}.alpha": torch.tensor(4.0)}), "rank 0")
    _refused(_write(tmp_path / "c.safetensors", zero, {"format": "yue2-nar-lora-v1", "alpha": "4"}), "rank 0")
    lokr = {f"{O_PROJ}.lokr_w1": torch.ones(2, 2), f"{O_PROJ}.lokr_w2_a": torch.zeros(H // 2, 0),
            f"{O_PROJ}.lokr_w2_b": torch.zeros(0, Q // 2), f"{O_PROJ}.alpha": torch.tensor(1.0)}
    _refused(_write(tmp_path / "d.safetensors", lokr), "rank 0", "lokr_w2_a")


def test_fp8_factors_are_read_as_float32(tmp_path, gen):
    t = _pair(gen)
    f8 = {k: v.to(torch.float8_e4m3fn) for k, v in t.items()}
    a = read_adapter(_write(tmp_path / "f8.safetensors", f8), TINY)
    (p,) = a.patches
    assert p.delta.down.dtype == torch.float32
    assert torch.equal(p.delta.down, f8[f"{O_PROJ}.lora_A.weight"].float())
    d = read_adapter(_write(tmp_path / "f8d.safetensors",
                            {f"{O_PROJ}.diff": (torch.randn(H, Q, generator=gen) * .01).to(torch.float8_e4m3fn)}),
                     TINY)
    assert d.patches[0].delta.delta.dtype == torch.float32


# ------------------------------------------------------------------------------------ 7. a stray adapter_config.json

def test_sidecar_read_only_for_peft_file_names_or_folders(tmp_path, gen):
    loose = tmp_path / "loras"
    loose.mkdir()
    aitk = _write(loose / "aitk.safetensors", _pair(gen))
    (loose / "adapter_config.json").write_text(json.dumps({**CFG, "lora_alpha": 64}))
    a = read_adapter(aitk, TINY)
    assert a.layout == "ai-toolkit" and a.scales == [1.0] and len(a.files) == 1
    (loose / "adapter_config.json").write_text("garbage")
    assert read_adapter(aitk, TINY).scales == [1.0]
    d = _peft(tmp_path, gen, CFG)  # adapter_model.safetensors given by name still reads its sidecar
    assert read_adapter(str(d / "adapter_model.safetensors"), TINY).scales == [2.0]
    for what, make in (("a FIFO", os.mkfifo), ("a directory", os.mkdir)):
        bad = _peft(tmp_path, gen, None, folder=f"bad_{what[2:]}")
        make(bad / "adapter_config.json")
        _refused(bad, "adapter_config.json", f"is {what}")


# ------------------------------------------------------------------------------------ 8, 9. records and render

def _record(path, ar=1.0, nar=1.0):
    return lora_record(Applied(read_adapter(str(path), TINY), ar, nar))


def test_a_changed_companion_is_missing_or_changed(tmp_path):
    fl = syn.write_adapter("fl", tmp_path / "fl" / "fl-ar.safetensors", TINY, seed=1)
    rec = _record(fl)
    (comp,) = rec["companions"]
    assert comp["relpath"] == "fl-ar-nar.safetensors" or comp["relpath"].endswith(".safetensors")
    assert find_recorded(rec) == rec["path"]
    nar = fl.parent / comp["relpath"]
    nar.write_bytes(nar.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(AdapterError, match="missing or has changed") as e:
        find_recorded(rec)
    assert comp["file"] in str(e.value)
    peft = syn.write_adapter("peft", tmp_path / "peft", TINY, seed=2)
    rec = _record(peft)
    assert [c["file"] for c in rec["companions"]] == ["adapter_config.json"]
    cfg = json.loads((peft / "adapter_config.json").read_text())
    (peft / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": cfg["lora_alpha"] * 4}))
    with pytest.raises(AdapterError, match="adapter_config.json.*missing or has changed"):
        find_recorded(rec)
    os.remove(peft / "adapter_config.json")
    with pytest.raises(AdapterError, match="adapter_config.json"):
        find_recorded(rec)


def test_a_peft_folder_with_another_weights_name_is_found_again(tmp_path, gen):
    d = _peft(tmp_path, gen, CFG, name="custom.safetensors")
    rec = _record(d)
    assert rec["weights_file"] == "custom.safetensors"
    assert find_recorded(rec) == str(d)
    elsewhere = tmp_path / "models" / "loras"
    elsewhere.mkdir(parents=True)
    shutil.move(str(d), elsewhere / "peft")
    assert find_recorded(rec, [elsewhere]) == str(elsewhere / "peft")


def _song(tmp_path, weights):
    song = tmp_path / "song"
    song.mkdir(exist_ok=True)
    (song / "config.json").write_text(json.dumps({"weights": weights}))
    return SimpleNamespace(song=str(song), lora=[], vae=None)


@pytest.mark.parametrize("weights, message", [
    ("abc", '"weights" must be an object'),
    ({"loras": "abc"}, "`loras` must be a list"),
    ({"loras": {"file": "x"}}, "`loras` must be a list"),
    ({"loras": ["x.safetensors"]}, "loras[0] must be an object"),
    ({"loras": [], "vae": "v"}, "`vae` must be an object"),
])
def test_malformed_weights_entry_is_named(tmp_path, weights, message):
    with pytest.raises(AdapterError) as e:
        _song_weights(_song(tmp_path, weights))
    assert message in str(e.value)
    from yue2_core.weights.lora.record import recorded_weights
    with pytest.raises(AdapterError, match="must be"):
        recorded_weights(weights)


@pytest.mark.parametrize("strength", ["abc", None, 9, True, "1"])  # true / "1": stop 40 break-it
def test_bad_recorded_strength_is_an_adapter_error(tmp_path, gen, strength):
    path = _write(tmp_path / "aitk.safetensors", _pair(gen))
    rec = {**_record(path), "strength_ar": strength}
    with pytest.raises(AdapterError, match="recorded strength_ar"):
        _song_weights(_song(tmp_path, {"loras": [rec]}))
    good = {**rec, "strength_ar": 0.5}
    assert _song_weights(_song(tmp_path, {"loras": [good]}))[0] == [(path, 0.5, 1.0)]


@pytest.mark.parametrize("rules", [3, 1, "2", None, True, 2.0, [2]])
def test_an_unknown_stack_rules_record_is_an_adapter_error(tmp_path, gen, rules):
    """Break-it (stop 41): a song's `weights.stack_rules` was only tested for presence, so 3 (a newer pack's rule),
    "2", null or 1 were all read as today's rule and rendered without a word. Any value but 2 is named, as a bad
    `lora_int8` is; 2 and no key are read as before."""
    from yue2_core.weights.lora.record import recorded_weights
    path = _write(tmp_path / "aitk.safetensors", _pair(gen))
    rec = _record(path)
    with pytest.raises(AdapterError, match=r"`stack_rules` must be 2 \(the LoRA stacking rule .*found "):
        _song_weights(_song(tmp_path, {"loras": [rec], "stack_rules": rules}))
    with pytest.raises(AdapterError, match="stack_rules"):
        recorded_weights({"loras": [], "stack_rules": rules})
    for ok in ({"loras": [rec], "stack_rules": 2}, {"loras": [rec]}):
        assert _song_weights(_song(tmp_path, ok))[0] == [(path, 1.0, 1.0)]


# ------------------------------------------------------------------------------------ 12. FL companion containment

def test_fl_companion_must_stay_in_the_ar_files_folder(tmp_path):
    fl = syn.write_adapter("fl", tmp_path / "fl" / "fl-ar.safetensors", TINY, seed=1)
    from safetensors import safe_open
    with safe_open(str(fl), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    outside = tmp_path / "outside.safetensors"
    shutil.copy(fl.parent / meta["acoustic_adapter"], outside)
    (fl.parent / "sub").mkdir()
    shutil.copy(fl.parent / meta["acoustic_adapter"], fl.parent / "sub" / "nar.safetensors")
    os.symlink(outside, fl.parent / "link.safetensors")
    for rel in ("../outside.safetensors", str(outside), "/proc/self/environ", "link.safetensors"):
        p = _write(fl.parent / "evil.safetensors", tensors, {**meta, "acoustic_adapter": rel})
        _refused(p, "outside the AR file's folder")
    ok = read_adapter(_write(fl.parent / "ok.safetensors", tensors,
                             {**meta, "acoustic_adapter": "sub/nar.safetensors"}), TINY)
    assert {p.expert for p in ok.patches} == {"ar", "nar"}
    _write(fl.parent / "sub" / "another-ar.safetensors", tensors, {k: v for k, v in meta.items()
                                                                    if k != "acoustic_adapter"})
    _refused(_write(fl.parent / "ar-companion.safetensors", tensors,  # an AR file named as the NAR companion
                    {**meta, "acoustic_adapter": "sub/another-ar.safetensors"}), "must be the NAR file")


# ------------------------------------------------------------------------------------ weak spots

def test_weak_spots_norm_diff_alpha_scale_and_prefixes(tmp_path, gen):
    _refused(_write(tmp_path / "n.safetensors",
                    {"diffusion_model.model.layers.0.input_layernorm.diff": torch.zeros(H)}), "norm diffs")
    for i, alpha in enumerate((0.0, -8.0)):
        _refused(_write(tmp_path / f"a{i}.safetensors", {**_pair(gen), f"{O_PROJ}.alpha": torch.tensor(alpha)}),
                 f"{O_PROJ}.alpha", "positive finite")
    _refused(_write(tmp_path / "ab.safetensors", {**_pair(gen), f"{O_PROJ}.alpha": torch.tensor(True)}),
             "torch.bool")
    hot = {"yue2.blk.0.nar_attn_output.lora_A.weight": torch.randn(4, Q, generator=gen),
           "yue2.blk.0.nar_attn_output.lora_B.weight": torch.randn(H, 4, generator=gen)}
    for i, alpha in enumerate(("0", "-4")):
        _refused(_write(tmp_path / f"m{i}.safetensors", hot, {"format": "yue2-nar-lora-v1", "alpha": alpha}),
                 "metadata alpha", "positive finite")
    _refused(_write(tmp_path / "big.safetensors", {**_pair(gen), f"{O_PROJ}.alpha": torch.tensor(1e30)}),
             "out of range", "1e+06")
    for i, prefix in enumerate(("text_encoders.diffusion_model.model.layers.0.self_attn.o_proj",
                                "diffusion_model.text_encoders.model.layers.0.self_attn.o_proj",
                                "text_encoders.model.layers.0.nar_self_attn.o_proj")):
        _refused(_write(tmp_path / f"p{i}.safetensors", _pair(gen, prefix)), prefix, "one expert")


# ------------------------------------------------------------------------------------ sparse / meta .pt factors

@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "meta"])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")  # torch's
def test_pt_factors_that_are_sparse_or_meta_are_refused_by_name(tmp_path, gen, kind):
    """Before: the finiteness check met them deep in torch ("Could not run 'aten::ne.Scalar' … SparseCPU" and a
    hundred lines of dispatcher list, "unsupported tensor layout: SparseCsr", "Tensor.item() cannot be called on
    meta tensors"); a torch file can hold them, safetensors cannot."""
    tensors = _pair(gen)
    key = f"{O_PROJ}.lora_A.weight"
    t = tensors[key]
    tensors[key] = t.to_sparse() if kind == "sparse_coo" else t.to_sparse_csr() if kind == "sparse_csr" else \
        t.to("meta")
    path = tmp_path / "odd.pt"
    torch.save(tensors, path)
    words = "a meta tensor" if kind == "meta" else "a sparse tensor"
    _refused(path, str(path), key, words, "must be dense float tensors")
    torch.save({"state_dict": tensors}, path)  # the same inside a trainer's {"state_dict": …}
    _refused(path, key, words)


# ------------------------------------------------------------------------------------ what the LoRA node fingerprints

def test_read_state_covers_every_file_the_adapter_reads(tmp_path, gen):
    """Review finding (stop 40): the YuE2 LoRA node fingerprinted and cached its adapter by the main file only, so an
    adapter_config.json put beside a PEFT file, another weights file added to a folder adapter or an FL companion
    replaced left the cached adapter in place (and `render` then refused the song). `read_state` — what the node's
    fingerprint and parse cache use — changes with every file `read_adapter` reads; an unrelated file does not."""
    from yue2_core.weights.lora.layouts_io import read_state

    def bump(path):  # another version of the file: new bytes and a later mtime (a copy within the same tick)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    d = _peft(tmp_path, gen, None)
    main = str(d / "adapter_model.safetensors")
    before = read_state(main)
    assert read_state(main) == before  # stable while nothing changes
    (d / "notes.txt").write_text("not read by the adapter")
    assert read_state(main) == before
    (d / "adapter_config.json").write_text(json.dumps(CFG))  # a sidecar added: the adapter's scale changes
    with_sidecar = read_state(main)
    assert with_sidecar != before and len(read_adapter(main, TINY).files) == 2
    (d / "adapter_config.json").write_text(json.dumps({**CFG, "lora_alpha": 16}))
    bump(d / "adapter_config.json")
    assert read_state(main) not in (before, with_sidecar)  # the sidecar changed
    (d / "adapter_config.json").unlink()
    assert read_state(main) == before  # removed again
    loose = _write(tmp_path / "aitk.safetensors", _pair(gen))  # no PEFT name: a sidecar beside it is never read
    alone = read_state(loose)
    (tmp_path / "adapter_config.json").write_text(json.dumps(CFG))
    assert read_state(loose) == alone
    folder = tmp_path / "fold"
    folder.mkdir()
    shutil.copy(loose, folder / "custom.safetensors")
    in_folder = read_state(str(folder))
    shutil.copy(loose, folder / "lora.safetensors")  # read before custom.safetensors
    assert read_state(str(folder)) != in_folder
    fl = syn.write_adapter("fl", tmp_path / "fl" / "fl-ar.safetensors", TINY, seed=1)
    companion = next(f for f in read_adapter(str(fl), TINY).files if os.path.abspath(f) != os.path.abspath(fl))
    fl_before = read_state(str(fl))
    with open(companion, "r+b") as fh:  # the NAR companion replaced, the AR file untouched
        fh.seek(-4, os.SEEK_END)
        fh.write(b"\0\0\0\1")
    bump(companion)
    assert read_state(str(fl)) != fl_before
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "adapter_model.safetensors")
    with no_hang():  # never opens what would block; the read itself names it
        assert read_state(str(fifo / "adapter_model.safetensors"))


def test_fl_companion_check_takes_odd_sha256_records():
    """`record.fl_companion_twice` on hand-edited records: a sha256 that is a list or dict (unhashable) is no match,
    not a TypeError (break-it, stop 41); a real pair is still found."""
    from yue2_core.weights.lora.record import fl_companion_twice
    odd = [({"sha256": "a", "companions": [{"sha256": ["b"]}, {"sha256": {"x": 1}}]}, 1.0, 1.0),
           ({"sha256": ["b"]}, 1.0, 1.0), ({"sha256": {"x": 1}}, 1.0, 1.0)]
    assert fl_companion_twice(odd) is None
    pair = [({"sha256": "a", "companions": [{"sha256": "b"}]}, 1.0, 1.0), ({"sha256": "b"}, 0.0, 1.0)]
    assert fl_companion_twice(pair) == (0, 1)


def test_a_renamed_adapter_or_vae_file_is_found_by_size_and_sha256(tmp_path):
    """ComfyUI-user review (stop 44): a LoRA renamed in the loras folder made Load Song and `render` say "missing";
    a file of the recorded size with the recorded sha256 is the same file. A file of that size with other bytes is
    not taken, and the message says what was searched."""
    loras = tmp_path / "loras"
    loras.mkdir()
    a = syn.write_adapter("aitk", loras / "mine.safetensors", TINY, rank=2, seed=1)
    rec = _record(a)
    other = syn.write_adapter("aitk", loras / "other.safetensors", TINY, rank=2, seed=2)
    assert other.stat().st_size == a.stat().st_size  # same size, other bytes: never taken for it
    renamed = loras / "sub" / "mine v2.safetensors"
    renamed.parent.mkdir()
    shutil.move(str(a), renamed)
    assert find_recorded(rec, [loras]) == str(renamed)
    os.remove(renamed)
    with pytest.raises(AdapterError, match=r"by name, and by size and sha256"):
        find_recorded(rec, [loras])
    vae = tmp_path / "v.safetensors"
    from yue2_core.weights.synthetic_vae import write_vae
    write_vae(str(vae), layout="vendor-file", encoder=False)
    vrec = open_vae(str(vae)).record()
    vaes = tmp_path / "vae"
    vaes.mkdir()
    shutil.move(str(vae), vaes / "decoder.safetensors")
    assert find_recorded(vrec, [vaes], what="VAE") == str(vaes / "decoder.safetensors")
