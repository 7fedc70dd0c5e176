"""Synthetic Comfy-Org checkpoints (yue2_core/weights/synthetic.py) against checkpoint_format.md §1, §2.4, §3.3, §4–§6.

The tiny bf16 and int8 files (~215 MB / ~120 MB) are written once per module. Set YUE2_PARITY_DIR to the directory
of tiny_comfy_{bf16,int8}.safetensors (../shared/parity) for the key/dtype comparison with the parity fixture.
"""
from __future__ import annotations

import json
import math
import os
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from tokenizers import Tokenizer, pre_tokenizers

from yue2_core.weights import synthetic, synthetic_tokenizer
from yue2_core.constants import ABC_END, ABC_START, CONVROT_MARKER, EOD
from yue2_core.weights.quant import dequantize, quantize

AR, NAR, VAE = "text_encoders.", "model.diffusion_model.", "vae."
TOKENIZER_KEY = "text_encoders.yue2_tokenizer_json"
L = 2  # layers of the tiny profile
ABC_SAMPLE = 'X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=120\nV: Vocal clef=treble name="Vocal Melody" snm="Vocal"\n|"C" G8 A8 B8 c8|'


# ---------------------------------------------------------------------------------------------------------------------
# fixtures

@pytest.fixture(scope="module")
def written(tmp_path_factory, request):
    """The tiny files of seed 0: {"bf16": (path, report), "int8": (path, report)}; removed after the module's tests
    when they passed (≈ 0.33 GB; tests/synthetic_cache.py `removed_when_passed`)."""
    from synthetic_cache import removed_when_passed
    with removed_when_passed(request, tmp_path_factory.mktemp("synthetic")) as root:
        out = {}
        for fmt in ("bf16", "int8"):
            path = root / f"tiny_{fmt}.safetensors"
            out[fmt] = (path, synthetic.write_synthetic_checkpoint(str(path), "tiny", fmt, seed=0))
        yield out


@pytest.fixture(scope="module")
def bf16(written):
    return load_file(written["bf16"][0])


@pytest.fixture(scope="module")
def int8(written):
    return load_file(written["int8"][0])


@pytest.fixture(scope="module")
def tokenizer(bf16):
    return Tokenizer.from_str(bytes(bf16[TOKENIZER_KEY].numpy()).decode("utf-8"))


def _header(path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def _prefix(key: str) -> str:
    return next(p for p in (AR, NAR, VAE) if key.startswith(p))


def _dtypes(path) -> dict[str, tuple[str, list[int]]]:
    return {k: (v["dtype"], v["shape"]) for k, v in _header(path).items() if k != "__metadata__"}


# ---------------------------------------------------------------------------------------------------------------------
# layout

@pytest.mark.parametrize("fmt, counts, markers, hist", [
    ("bf16", (8 * L + 4, 8 * L + 10, 435), 0, {"BF16": 16 * L + 13, "F32": 435, "U8": 1}),
    ("int8", (8 * L + 4 + 2 * (4 * L + 2), 8 * L + 10 + 2 * (4 * L + 3), 435), 8 * L + 5,
     {"BF16": 8 * L + 8, "F16": 435, "F32": 8 * L + 5, "I8": 8 * L + 5, "U8": 8 * L + 6}),
])
def test_counts_per_prefix_markers_and_dtypes(written, fmt, counts, markers, hist):
    """§6.3 formulas with L = 2: 20/26/435 and 40/48/435, 21 markers."""
    path, report = written[fmt]
    header = _dtypes(path)
    assert Counter(_prefix(k) for k in header) == dict(zip((AR, NAR, VAE), counts))
    assert sum(k.endswith(".comfy_quant") for k in header) == markers
    assert Counter(d for d, _ in header.values()) == hist
    assert report["tensors_per_prefix"] == dict(zip((AR, NAR, VAE), counts))
    assert report["markers"] == markers and report["dtypes"] == hist
    assert report["tokenizer_bytes"] == synthetic.RELEASE_TOKENIZER_BYTES
    assert report["file_bytes"] == os.path.getsize(path)


def test_metadata(written):
    with safe_open(str(written["bf16"][0]), "pt") as f:
        meta = f.metadata()
    assert meta["yue2_format"] == "1" and "quantization" not in meta
    assert meta["yue2_synthetic"] == "random weights, not a trained model"
    with safe_open(str(written["int8"][0]), "pt") as f:
        meta = f.metadata()
    assert (meta["quantization"], meta["vae_dtype"], meta["yue2_format"]) == ("convrot_int8", "fp16", "1")


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_keys_and_dtypes_equal_parity_fixture(written, fmt):
    """Same key set, dtypes and ranks as the parity fixture; same shapes except the vocab rows (1024 there)
    and the tokenizer blob length."""
    parity = os.environ.get("YUE2_PARITY_DIR")
    if not parity:
        pytest.skip("YUE2_PARITY_DIR is not set (point it at ../shared/parity to compare with the fixture)")
    ref = _dtypes(Path(parity) / f"tiny_comfy_{fmt}.safetensors")
    ours = _dtypes(written[fmt][0])
    assert sorted(ours) == sorted(ref)
    vocab_rows = {f"{AR}model.embed_tokens.weight", f"{AR}model.lm_head.weight",
                  f"{AR}model.embed_tokens.weight_scale", f"{AR}model.lm_head.weight_scale"}
    for key, (dtype, shape) in ours.items():
        ref_dtype, ref_shape = ref[key]
        assert (dtype, len(shape)) == (ref_dtype, len(ref_shape)), key
        if key in vocab_rows:
            assert (shape[0], shape[1:]) == (184_704, ref_shape[1:]) and ref_shape[0] == 1024, key
        elif key != TOKENIZER_KEY:
            assert shape == ref_shape, key


def test_micro_profile_matches_parity_shapes_exactly(tmp_path):
    """The micro profile (vocab 1024, a labelled deviation) has the fixture's exact shapes but the tokenizer."""
    parity = os.environ.get("YUE2_PARITY_DIR")
    if not parity:
        pytest.skip("YUE2_PARITY_DIR is not set (point it at ../shared/parity to compare with the fixture)")
    for fmt in ("bf16", "int8"):
        path = tmp_path / f"micro_{fmt}.safetensors"
        report = synthetic.write_synthetic_checkpoint(str(path), "micro", fmt)
        assert report["deviation"]
        ref = _dtypes(Path(parity) / f"tiny_comfy_{fmt}.safetensors")
        ours = _dtypes(path)
        ref.pop(TOKENIZER_KEY), ours.pop(TOKENIZER_KEY)
        assert ours == ref


def test_quantized_set_follows_the_rule(written):
    """Markers exactly on 2-D `.weight`s under the LM prefixes with in % 256 == 0 (§1.5); each marker has an I8
    `.weight` [out, in] and an F32 `.weight_scale` [out, 1]; no `.weight_scale` without a marker."""
    float_header, header = _dtypes(written["bf16"][0]), _dtypes(written["int8"][0])
    expected = {k[: -len("weight")] for k, (_, shape) in float_header.items()
                if k.startswith((AR, NAR)) and k.endswith(".weight") and len(shape) == 2 and shape[1] % 256 == 0}
    assert f"{NAR}vae2llm." not in expected and f"{AR}model.embed_tokens." in expected
    assert f"{AR}model.lm_head." in expected and f"{NAR}llm2vae." in expected
    modules = {k[: -len("comfy_quant")] for k in header if k.endswith(".comfy_quant")}
    assert modules == expected
    assert {k[: -len("weight_scale")] for k in header if k.endswith(".weight_scale")} == expected
    for module in modules:
        shape = float_header[module + "weight"][1]
        assert header[module + "weight"] == ("I8", shape)
        assert header[module + "weight_scale"] == ("F32", [shape[0], 1])
        assert header[module + "comfy_quant"] == ("U8", [72])


def test_vae_structure(bf16):
    """§3.3 spot checks: weight_g/weight_v, transposed-conv g on C_in, bias-free last conv, encoder out 128."""
    assert bf16["vae.encoder.layers.0.weight_v"].shape == (4, 2, 7)
    assert bf16["vae.encoder.layers.8.weight_v"].shape == (128, 8, 3)
    assert bf16["vae.decoder.layers.0.weight_v"].shape == (8, 64, 7)
    assert bf16["vae.decoder.layers.1.layers.1.weight_v"].shape == (8, 4, 12)  # stride 6, [C_in, C_out, 2s]
    assert bf16["vae.decoder.layers.1.layers.1.weight_g"].shape == (8, 1, 1)
    assert bf16["vae.decoder.layers.6.layers.1.weight_v"].shape == (4, 4, 4)  # last transposed conv, stride 2
    assert "vae.decoder.layers.8.bias" not in bf16 and bf16["vae.decoder.layers.8.weight_v"].shape == (2, 4, 7)
    assert all(v.dtype == torch.float32 for k, v in bf16.items() if k.startswith(VAE))


# ---------------------------------------------------------------------------------------------------------------------
# values

def test_markers_codes_scales_and_dequant_error(bf16, int8):
    """Marker bytes exact; codes in ±127; scales > 0 and finite; dequantized weight within 1 % (Frobenius)."""
    assert len(CONVROT_MARKER) == 72
    modules = [k[: -len("comfy_quant")] for k in int8 if k.endswith(".comfy_quant")]
    for module in modules:
        assert bytes(int8[module + "comfy_quant"].numpy()) == CONVROT_MARKER
        codes, scale = int8[module + "weight"], int8[module + "weight_scale"]
        assert codes.abs().max() <= 127
        assert torch.isfinite(scale).all() and (scale > 0).all()
        reference = bf16[module + "weight"].float()
        error = (dequantize(codes, scale) - reference).norm() / reference.norm()
        assert error < 0.01, (module, float(error))


def test_quantization_reproduces_from_the_bf16_weights(bf16, int8):
    """The int8 file is `quant.quantize` of exactly the bf16 file's weights (same seed)."""
    for module in (f"{AR}model.layers.0.self_attn.qkv_proj.", f"{NAR}llm2vae.", f"{NAR}time_embedder.mlp.0."):
        codes, scale = quantize(bf16[module + "weight"])
        assert torch.equal(codes, int8[module + "weight"]) and torch.equal(scale, int8[module + "weight_scale"])


def test_bf16_and_int8_hold_the_same_weights(bf16, int8):
    """§6.4.6: every unquantized LM tensor equal, VAE equal after the F32 → F16 cast, tokenizer identical."""
    for key, value in int8.items():
        if key.startswith(VAE):
            assert value.dtype == torch.float16 and torch.equal(value, bf16[key].to(torch.float16)), key
        elif value.dtype == torch.bfloat16 or key == TOKENIZER_KEY:
            assert torch.equal(value, bf16[key]), key


def test_final_norm_duplicated(bf16, int8):
    for tensors in (bf16, int8):
        ar, nar = tensors[f"{AR}model.norm.weight"], tensors[f"{NAR}model.norm.weight"]
        assert ar.dtype == torch.bfloat16 and torch.equal(ar.view(torch.int16), nar.view(torch.int16))


def test_pe_is_the_interleaved_formula_in_bf16(bf16):
    """§4: pe[p, 2i] = sin(p·d_i), pe[p, 2i+1] = cos(p·d_i), d_i = exp(−2i·ln 10000 / H), rounded to BF16."""
    pe = bf16[f"{NAR}latent_pos_embed.pe"]
    assert pe.dtype == torch.bfloat16 and pe.shape == (24_576, 256)
    pos = np.arange(24_576, dtype=np.float64)[:, None]
    d = np.exp(-np.arange(0, 256, 2, dtype=np.float64) * math.log(10000.0) / 256)
    formula = np.empty((24_576, 256))
    formula[:, 0::2], formula[:, 1::2] = np.sin(pos * d), np.cos(pos * d)
    assert np.abs(pe.float().numpy() - formula).max() < 8e-3
    assert torch.equal(pe, torch.from_numpy(formula).to(torch.bfloat16))


def test_value_distributions(bf16):
    """Fill rules of the parity fixture: linears N(0, 0.02), norms ≈ 1 + 0.1·N, weight_g ≈ 0.7, snake 0.1·N."""
    assert abs(bf16[f"{AR}model.embed_tokens.weight"].float().std() - 0.02) < 1e-3
    norm = bf16[f"{AR}model.layers.0.input_layernorm.weight"].float()
    assert abs(norm.mean() - 1) < 0.05 and 0.05 < norm.std() < 0.15
    assert abs(bf16["vae.encoder.layers.1.layers.4.weight_g"].mean() - 0.7) < 0.1
    assert 0.05 < bf16["vae.decoder.layers.1.layers.0.alpha"].std() < 0.2
    assert not torch.equal(bf16[f"{AR}model.layers.0.self_attn.o_proj.weight"],
                           bf16[f"{NAR}model.layers.0.self_attn.o_proj.weight"])


# ---------------------------------------------------------------------------------------------------------------------
# tokenizer

def test_tokenizer_blob(bf16):
    blob = bytes(bf16[TOKENIZER_KEY].numpy())
    assert len(blob) == 8_034_652
    doc = json.loads(blob.decode("utf-8"))  # trailing-space padding is valid JSON
    assert doc["normalizer"]["type"] == "NFC" and doc["decoder"]["type"] == "ByteLevel"
    split, byte_level = doc["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"]["Regex"] == synthetic_tokenizer.QWEN_SPLIT_REGEX and split["behavior"] == "Isolated"
    assert byte_level["type"] == "ByteLevel" and not byte_level["add_prefix_space"] and not byte_level["use_regex"]
    vocab, merges = doc["model"]["vocab"], doc["model"]["merges"]
    assert sorted(vocab.values()) == list(range(EOD)) and len(merges) == EOD - 256
    assert all(a in vocab and b in vocab and a + b in vocab for a, b in merges)
    assert len({a + b for a, b in merges}) == len(merges)


def test_tokenizer_vocab_and_special_ids(tokenizer):
    assert tokenizer.get_vocab_size(with_added_tokens=False) == EOD
    assert sorted(tokenizer.get_vocab(with_added_tokens=False).values()) == list(range(EOD))
    ids = {"<|endoftext|>": EOD, "<|im_start|>": EOD + 1, "<|im_end|>": EOD + 2, "<abc>": ABC_START,
           "</abc>": ABC_END}
    assert {s: tokenizer.token_to_id(s) for s in ids} == ids
    assert synthetic_tokenizer.bytes_to_unicode()[ord(" ")] == "Ġ"
    assert set(synthetic_tokenizer.bytes_to_unicode().values()) == set(pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("text", [
    ABC_SAMPLE,
    "[verse]\nHello world, it's a song\n[chorus]\nLa la la!\n",
    "我们一起唱歌，在夜里等待天亮 — 君の声 사랑해요",
    "emoji 🎵🎶 👩‍👩‍👧 and café naïve ½ ∞ \t tabs\r\nCRLF  double  spaces ",
    "".join(chr(c) for c in range(32, 0x2FF)),
])
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer.encode(text).ids
    assert max(ids) < EOD
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_tokenizer_compresses_abc_and_decodes_every_id(tokenizer):
    assert len(tokenizer.encode(ABC_SAMPLE).ids) < len(ABC_SAMPLE.encode("utf-8"))
    texts = tokenizer.decode_batch([[i] for i in range(EOD)])
    assert all(isinstance(t, str) and t for t in texts)


def test_tokenizer_is_deterministic(bf16):
    vocab, merges = synthetic_tokenizer.build_vocab()
    doc = json.loads(bytes(bf16[TOKENIZER_KEY].numpy()))
    assert doc["model"]["vocab"] == vocab and [tuple(m) for m in doc["model"]["merges"]] == merges


# ---------------------------------------------------------------------------------------------------------------------
# full profile, writer, errors

@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_full_profile_totals_from_the_plan(fmt):
    """§1.2: exact element and byte totals of the release, from the writer's own plan (nothing allocated)."""
    elements, data_bytes = {"bf16": (3_771_337_054, 7_799_871_716), "int8": (3_772_873_990, 3_960_768_200)}[fmt]
    specs = synthetic.plan("full", fmt)
    summary = synthetic.summarize(specs)
    assert summary["elements"] == elements and summary["data_bytes"] == data_bytes
    assert summary["elements_excluding_tokenizer"] == elements - 8_034_652
    assert sum(s.numel for s in specs if s.key.startswith(VAE)) == 132_616_130  # §3.1
    counts = {"bf16": (228, 234, 435), "int8": (456, 464, 435)}[fmt]
    assert summary["tensors_per_prefix"] == dict(zip((AR, NAR, VAE), counts))
    assert summary["markers"] == {"bf16": 0, "int8": 229}[fmt]
    hist = {"bf16": {"BF16": 461, "F32": 435, "U8": 1},
            "int8": {"I8": 229, "F32": 229, "U8": 230, "BF16": 232, "F16": 435}}[fmt]
    assert summary["dtypes"] == hist
    assert synthetic.RELEASE_TOTALS[fmt] == (elements, data_bytes)
    assert [s.shape for s in specs if s.key == f"{NAR}latent_pos_embed.pe"] == [(24_576, 2048)]
    assert [s.shape for s in specs if s.key == f"{AR}model.layers.0.self_attn.qkv_proj.weight"] == [(4096, 2048)]


def test_streaming_writer_reads_back(tmp_path):
    """The streamed file parses with the safetensors library: safe_open == load_file for every tensor, contiguous
    offsets, 8-byte aligned data section; the same seed gives the same bytes, another seed other weights."""
    path, again, other = (tmp_path / n for n in ("a.safetensors", "b.safetensors", "c.safetensors"))
    calls = []
    report = synthetic.write_synthetic_checkpoint(str(path), "micro", "int8", seed=3,
                                                  progress=lambda done, total, key: calls.append((done, total)))
    assert calls[-1][0] == calls[-1][1] == report["data_bytes"] and len(calls) == report["tensors"]
    loaded = load_file(path)
    with safe_open(str(path), "pt") as f:
        assert sorted(f.keys()) == sorted(loaded)
        for key in f.keys():
            assert torch.equal(f.get_tensor(key), loaded[key]), key
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    assert (8 + n) % 8 == 0 and os.path.getsize(path) == 8 + n + report["data_bytes"]
    spans = sorted(v["data_offsets"] for k, v in _header(path).items() if k != "__metadata__")
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    synthetic.write_synthetic_checkpoint(str(again), "micro", "int8", seed=3)
    assert again.read_bytes() == path.read_bytes()
    synthetic.write_synthetic_checkpoint(str(other), "micro", "int8", seed=4)
    key = f"{AR}model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(load_file(other)[key], loaded[key])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "b.safetensors", "c.safetensors"]


def test_writer_is_atomic_on_failure(tmp_path):
    specs = synthetic.plan("micro", "bf16")[:2]
    bad = [torch.zeros(specs[0].shape, dtype=torch.bfloat16), torch.zeros(3)]
    with pytest.raises(RuntimeError, match="header says"):
        synthetic.write_safetensors_stream(str(tmp_path / "x.safetensors"), specs, bad, {})
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown synthetic profile"):
        synthetic.write_synthetic_checkpoint(str(tmp_path / "x"), "huge")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        synthetic.plan("tiny", "fp8")


def test_loading_the_experts_does_not_import_torch_dynamo(written):
    """Building the experts on the meta device must not pull in torch._dynamo (≈ 2 s of every CPU start: an
    nn.Embedding's random init there goes through a PyTorch reference that imports it; `layers.make_embedding`
    leaves the table uninitialised). Checked in a fresh interpreter, both file formats."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar\n"
            "for path in sys.argv[1:]:\n"
            "    info = inspect_checkpoint(path)\n"
            "    ar = load_ar(info)\n"
            "    assert ar.model.embed_tokens.weight.abs().sum() > 0, 'the embedding table was not loaded'\n"
            "    load_nar(info)\n"
            "assert 'torch._dynamo' not in sys.modules, 'loading imported torch._dynamo'\n"
            "print('ok')\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-c", code, written["bf16"][0], written["int8"][0]], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------------
# the test run's own disk use (stop 58): shared synthetic files (tests/synthetic_cache.py), tmp_path retention

@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """tests/synthetic_cache.py with a run folder and a record of handed-out files of this test's own: the files it
    damages are never the run's."""
    import synthetic_cache
    monkeypatch.setenv("YUE2_TEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(synthetic_cache, "_SHARED", {})
    return synthetic_cache


def test_a_link_shares_the_bytes_and_a_write_into_it_is_caught(private_cache, tmp_path, monkeypatch):
    """`synthetic_link` puts the shared file at a test's path as a hard link (no bytes copied; where none can be
    made, a copy); replacing or deleting the link leaves the shared file alone, a write into it changes the shared
    file for every later test, which `check_shared` reports (by size and time; by sampled bytes where the time was
    put back)."""
    cache = private_cache
    shared = cache.cached_checkpoint("micro", "bf16")
    data = Path(shared).read_bytes()
    link = Path(cache.synthetic_link(tmp_path / "mine" / "a.safetensors", "micro", "bf16"))
    assert link.parent.is_dir() and os.path.samefile(link, shared) and os.stat(shared).st_nlink == 2
    assert sorted(p.name for p in link.parent.iterdir()) == ["a.safetensors"]  # no temporary file left
    assert cache.synthetic_link(link, "micro", "bf16") == str(link) and os.path.samefile(link, shared)  # again
    copy = Path(cache.synthetic_copy(tmp_path / "b.safetensors", "micro", "bf16"))
    assert copy.read_bytes() == data and not os.path.samefile(copy, shared)
    with open(copy, "r+b") as f:  # a private copy may be edited
        f.write(b"\0" * 64)
    os.replace(copy, link)  # a link replaced by a rename (as synthetic_copy, write_synthetic_checkpoint do)
    link.unlink()
    cache.check_shared(sample=True)
    assert Path(shared).read_bytes() == data

    link = cache.synthetic_link(tmp_path / "c.safetensors", "micro", "bf16")
    st = os.stat(link)
    with open(link, "r+b") as f:  # what a test that needed synthetic_copy would do
        f.seek(len(data) // 2)
        f.write(b"\xff" * 8)
    os.utime(link, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with its time put back
    cache.check_shared()  # size and time alone: not seen
    with pytest.raises(AssertionError, match=r"shared synthetic checkpoint .*yue2_micro_bf16.safetensors changed .*"
                                             r"a test wrote into it.* needs synthetic_copy"):
        cache.check_shared(sample=True)
    with open(link, "ab") as f:  # a write that moves the size or time: caught at the next call
        f.write(b"x")
    with pytest.raises(AssertionError, match="a test wrote into it"):
        cache.cached_checkpoint("micro", "bf16")

    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")
    monkeypatch.setattr(cache, "_SHARED", {})
    monkeypatch.setenv("YUE2_TEST_CACHE", str(tmp_path / "cache2"))
    monkeypatch.setattr(os, "link", no_link)
    other = Path(cache.synthetic_link(tmp_path / "d.safetensors", "micro", "bf16"))  # another file system: a copy
    assert other.read_bytes() == Path(cache.cached_checkpoint("micro", "bf16")).read_bytes()
    assert os.stat(other).st_nlink == 1


def test_a_passing_tests_tmp_path_is_removed_a_failing_ones_kept(tmp_path):
    """pyproject.toml's tmp_path_retention_policy = "failed": a run of the suite left 10–16 GB in the tests'
    tmp_path folders (stop 58; pytest keeps every one of the last 3 runs by default). Run with the project's pytest
    configuration: a failing test's folder stays to be looked at, a passing test's goes when it ends, and a run
    whose tests all passed leaves no folder."""
    import subprocess
    import sys
    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "test_two.py").write_text("def test_passes(tmp_path):\n"
                                          "    (tmp_path / 'big').write_bytes(bytes(1000))\n\n\n"
                                          "def test_fails(tmp_path):\n"
                                          "    (tmp_path / 'kept').write_bytes(b'x')\n"
                                          "    assert False\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "YUE2_TEST_CACHE"))}
    env["PYTEST_DEBUG_TEMPROOT"] = str(tmp_path / "temp")
    (tmp_path / "temp").mkdir()

    def run(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                               str(repo / "pyproject.toml"), "--rootdir", str(tmp_path), *args,
                               str(tmp_path / "test_two.py")], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=120)

    proc = run()
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout[-2000:]
    (base,) = (tmp_path / "temp").glob("pytest-of-*/pytest-0")
    assert sorted(p.name for p in base.iterdir() if not p.is_symlink()) == ["test_fails0"], proc.stdout[-2000:]
    assert [p.name for p in (base / "test_fails0").iterdir()] == ["kept"]
    proc = run("-k", "passes")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:]
    assert not (base.parent / "pytest-1").exists()  # the whole run's folder removed
    assert (base / "test_fails0" / "kept").is_file()  # the earlier failing run's kept


def test_a_module_fixtures_folder_goes_when_its_tests_passed(tmp_path):
    """`removed_when_passed`: a module fixture's folder of large files (vendor folders, the writer's own files) is
    removed at its teardown unless a test failed meanwhile, as a passing test's tmp_path is; before, every such
    folder stayed to the end of the run (stop 58)."""
    import types

    import synthetic_cache
    session = types.SimpleNamespace(testsfailed=3)  # failures before the fixture count for nothing
    request = types.SimpleNamespace(session=session)
    for fails, kept in ((0, False), (1, True)):
        folder = tmp_path / f"fails{fails}"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "big").write_bytes(bytes(1000))
        with synthetic_cache.removed_when_passed(request, folder) as got:
            assert got == folder and folder.is_dir()
            session.testsfailed += fails  # the module's tests ran
        assert folder.exists() is kept, (fails, kept)
