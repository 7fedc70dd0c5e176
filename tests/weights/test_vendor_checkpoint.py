"""The vendor's split checkpoint (m-a-p/YuE2-3B + m-a-p/YuE2-Vae folders) as a model source (yue2_core/weights/
vendor.py, synthetic_vendor.py; weights_and_lora.md §4–§5).

One tiny bf16 synthetic all-in-one file is converted once per module into a vendor folder (+ VAE folder) and back
(`comfy_from_vendor`, whose tokenizer JSON is built from qwen.tiktoken). Songs, tokenizer ids, the round trip, the
manifest hashes, the Hugging Face cache lookup, the CLI and each bad folder are checked against it. Hashes are
remembered in a per-test XDG_CACHE_HOME.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import torch

from pack_in_host import PREAMBLE
from yue2_core.errors import CheckpointError, RequestError, TokenizerError
from yue2_core.weights import vendor
from yue2_core.weights.checkpoint import inspect_checkpoint, load_ar, load_nar, load_tokenizer, load_vae
from yue2_core.weights.synthetic_vendor import comfy_from_vendor, write_vendor_folder
from yue2_core.weights.tokenizer import TiktokenTokenizer, YuE2Tokenizer

REPO = Path(__file__).resolve().parents[2]
CORPUS = [
    "Hello world, this is a test.",
    "[verse]\nWe walk along the river while the evening lights come on\n\n[chorus]\nHold on, hold on!",
    "我们一起唱歌，在夜里等待天亮\n你的声音像风，轻轻吹过我的心",
    "君の声が聞こえる、夜空の下で — 사랑해요, 노래해요",
    "mixed 日本語 and English 123 4567 — ünïcödé e\u0301 café 😀🎵",
    'X:1\nT:\nM:4/4\nL:1/32\nQ:1/4=120\nK:C\nV: Vocal clef=treble name="Vocal Melody"\n'
    '|"C" G8 A8 B8 c8|"Am" e16 d8 c8|]\n',
    "Don't you're I'll we've   spaces\tand\ttabs\r\n\n  <|endoftext|> <abc> </abc>",
]


@pytest.fixture(autouse=True)
def _hash_cache(tmp_path, monkeypatch):
    """Each test remembers verified hashes in its own cache dir; no real HF cache is visible."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no_hf_cache"))
    monkeypatch.delenv("YUE2_VERIFY_HASHES", raising=False)
    vendor._VERIFIED.clear()


@pytest.fixture(scope="module")
def made(tmp_path_factory, request):
    """{"comfy": tiny bf16 file, "model": vendor folder, "vae": VAE folder (sibling), "comfy2": comfy_from_vendor};
    the folder (≈ 0.4 GB) removed after the module's tests when they passed (`removed_when_passed`)."""
    from synthetic_cache import cached_checkpoint, removed_when_passed
    with removed_when_passed(request, tmp_path_factory.mktemp("vendor")) as root:
        comfy = Path(cached_checkpoint("tiny", "bf16"))  # the run's shared file (read-only)
        os.environ["XDG_CACHE_HOME"] = str(root / "xdg")
        try:
            write_vendor_folder(str(comfy), str(root / "ckpts" / "YuE2-3B"), str(root / "ckpts" / "YuE2-Vae"))
            comfy_from_vendor(str(root / "ckpts" / "YuE2-3B"), str(root / "comfy2.safetensors"))
        finally:
            del os.environ["XDG_CACHE_HOME"]
        yield {"comfy": comfy, "model": root / "ckpts" / "YuE2-3B", "vae": root / "ckpts" / "YuE2-Vae",
               "comfy2": root / "comfy2.safetensors"}


def _copy_folder(made, tmp_path, with_vae=True, edits=None) -> Path:
    """A private copy of the vendor folder (and its VAE as a sibling) to damage. With `edits` (names of the model
    folder's files the test rewrites), every other file is a hard link to the module's (≈ 0.2 GB not copied again):
    the test may only remove those, never write them."""
    def link_or_copy(src, dst):
        return shutil.copy2(src, dst) if Path(src).name in edits else os.link(src, dst)
    dst = tmp_path / "ckpts" / "YuE2-3B"
    shutil.copytree(made["model"], dst, copy_function=shutil.copy2 if edits is None else link_or_copy)
    if with_vae:
        shutil.copytree(made["vae"], tmp_path / "ckpts" / "YuE2-Vae",
                        copy_function=shutil.copy2 if edits is None else os.link)
    return dst


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# layout and loading

def test_vendor_folder_layout(made):
    folder = made["model"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "yue2" and config["num_hidden_layers"] == 2 and config["hidden_size"] == 256
    assert config["num_attention_heads"] == 2 and config["num_key_value_heads"] == 1 and config["head_dim"] == 128
    assert config["vocab_size"] == 184704 and config["latent_type"] == "vae" and "yue2_synthetic" in config
    from yue2_core.weights.checkpoint import read_header
    entries, meta, _ = read_header(str(folder / "model.safetensors"))
    assert meta == {"format": "pt"}
    assert len(entries) == 1 + 2 * 22 + 2 + 9  # 628 at 28 layers (§4 counts)
    assert entries["model.layers.1.self_attn.q_proj.weight"].shape == (256, 256)
    assert entries["model.layers.1.nar_self_attn.k_proj.weight"].shape == (128, 256)
    assert entries["model.layers.0.nar_mlp.up_proj.weight"].shape == (512, 256)
    assert "model.layers.0.nar_pre_mlp_layernorm.weight" in entries and "lm_head.weight" in entries
    assert not any("qkv_proj" in k or "gate_up" in k or k.startswith(("text_encoders.", "vae.")) for k in entries)
    vae_entries, _, _ = read_header(str(made["vae"] / "model.safetensors"))
    assert len(vae_entries) == 435 and {e.dtype for e in vae_entries.values()} == {"F32"}
    assert json.loads((made["vae"] / "config.json").read_text())["model_type"] == "yue2_vae"
    manifest = json.loads((folder / "weights_manifest.json").read_text())["files"]
    assert manifest["model.safetensors"]["sha256"] == _sha(folder / "model.safetensors")
    assert manifest["qwen.tiktoken"]["bytes"] == (folder / "qwen.tiktoken").stat().st_size


def test_inspect_maps_onto_comfy_names(made):
    comfy, ven = inspect_checkpoint(made["comfy"]), inspect_checkpoint(made["model"])
    assert ven.layout == "vendor" and comfy.layout == "comfy" and ven.format == "bf16"
    assert ven.dims == comfy.dims and ven.vae == comfy.vae
    assert set(ven.entries) == set(comfy.entries) - {"text_encoders.yue2_tokenizer_json"}
    for key, e in comfy.entries.items():
        if key in ven.entries:
            assert (ven.entries[key].dtype, ven.entries[key].shape) == (e.dtype, e.shape), key
    assert ven.files["vae"] == str(made["vae"])  # found as the sibling with model_type yue2_vae
    d = json.loads(json.dumps(ven.to_dict()))
    assert d["layout"] == "vendor" and d["synthetic"] is True and d["files"]["tokenizer"].endswith("qwen.tiktoken")
    assert "vendor split folder" in ven.summary()


def test_weights_bit_equal_to_the_comfy_file(made):
    comfy, ven = inspect_checkpoint(made["comfy"]), inspect_checkpoint(made["model"])
    for load in (load_ar, load_nar):
        a, b = load(comfy).state_dict(), load(ven).state_dict()
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    a, b = load_vae(comfy).state_dict(), load_vae(ven).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_song_equals_the_comfy_files(made):
    """Same seed on the CPU: the vendor folder and its Comfy form give identical ABC ids, semantic codes, latents
    and audio."""
    from yue2_core.pipeline import Budgets, YuE2Engine
    from yue2_core.protocol import SongRequest
    request = SongRequest("female vocal, warm piano ballad", "[verse]\nla la la\n我们一起唱歌", cot="melody",
                          seed=7)
    budgets = Budgets(max_seconds=0.2, max_abc_tokens=6)
    songs = [YuE2Engine.load(str(made[k]), device="cpu").generate(request, budgets, steps=2)
             for k in ("model", "comfy2")]
    a, b = songs
    assert a.score.abc_ids == b.score.abc_ids and a.score.abc == b.score.abc
    assert a.tokens.prefix == b.tokens.prefix and a.tokens.codes == b.tokens.codes
    assert len(a.tokens.codes) > 0 and a.audio.numel() > 0
    assert torch.equal(a.latents, b.latents) and torch.equal(a.audio, b.audio)
    assert a.settings["checkpoint"]["layout"] == "vendor" and b.settings["checkpoint"]["layout"] == "comfy"


def test_sharded_folder_loads_the_same_weights(made, tmp_path):
    write_vendor_folder(str(made["comfy"]), str(tmp_path / "sharded"), max_shard_bytes=20_000_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    a = load_nar(inspect_checkpoint(made["model"])).state_dict()
    b = load_nar(inspect_checkpoint(tmp_path / "sharded")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------------------------------
# tokenizer

def test_tokenizer_ids_equal_the_json_tokenizer(made):
    ven = load_tokenizer(inspect_checkpoint(made["model"]))
    json_tok = load_tokenizer(inspect_checkpoint(made["comfy2"]))
    assert isinstance(ven, TiktokenTokenizer) and isinstance(json_tok, YuE2Tokenizer)
    assert ven.vocab_size == json_tok.vocab_size == 151643
    import random
    rng = random.Random(0)
    texts = list(CORPUS) + ["".join(rng.choice("etaoin shrdlu|:/\"'.,-!?\n[]") for _ in range(rng.randint(1, 40)))
                            for _ in range(300)]
    for text in texts:
        ids = ven.encode(text)
        assert ids == json_tok.encode(text), repr(text)
        assert all(0 <= i < 151643 for i in ids)
        assert ven.decode(ids) == json_tok.decode(ids) == unicodedata.normalize("NFC", text)
    special = ven.encode("<|endoftext|>")  # typed specials are plain text, never the EOD id
    assert 151643 not in special and len(special) > 1
    junk = [rng.randrange(0, 151643) for _ in range(200)] + [151643, 151847, 184000, -1]
    assert ven.decode(junk) == json_tok.decode(junk)
    with pytest.raises(RequestError, match="unpaired surrogate"):
        ven.encode("a\ud800b")


def test_tiktoken_rank_count_enforced(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=("qwen.tiktoken", "weights_manifest.json", "config.json"))
    lines = (folder / "qwen.tiktoken").read_text().splitlines(keepends=True)
    (folder / "qwen.tiktoken").write_text("".join(lines[:1000]))
    manifest = json.loads((folder / "weights_manifest.json").read_text())
    manifest["files"]["qwen.tiktoken"] = {"sha256": _sha(folder / "qwen.tiktoken"),
                                          "bytes": (folder / "qwen.tiktoken").stat().st_size}
    (folder / "weights_manifest.json").write_text(json.dumps(manifest))
    assert load_tokenizer(inspect_checkpoint(folder)).vocab_size == 1000  # synthetic: a smaller table is accepted
    config = json.loads((folder / "config.json").read_text())
    del config["yue2_synthetic"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="has 1,000 ranks; the YuE2 tokenizer has exactly 151,643"):
        load_tokenizer(inspect_checkpoint(folder))


# ---------------------------------------------------------------------------------------------------------------------
# round trip

def test_round_trip_is_bit_exact(made, tmp_path):
    """vendor → Comfy names → vendor: every file byte-identical."""
    write_vendor_folder(str(made["comfy2"]), str(tmp_path / "again"), str(tmp_path / "again-vae"))
    for name in ("model.safetensors", "qwen.tiktoken", "config.json", "weights_manifest.json",
                 "generation_config.json", "yue2_generation_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (made["model"] / name).read_bytes(), name
    for name in ("model.safetensors", "config.json", "weights_manifest.json"):
        assert (tmp_path / "again-vae" / name).read_bytes() == (made["vae"] / name).read_bytes(), name
    ours = {k: v for k, v in inspect_checkpoint(made["comfy2"]).metadata.items()}
    assert ours["yue2_synthetic"] and ours["yue2_format"] == "1"


# ---------------------------------------------------------------------------------------------------------------------
# manifest and hashes

def test_hash_checked_once_then_cached(made, tmp_path, monkeypatch):
    calls = []
    real = vendor.sha256_file
    monkeypatch.setattr(vendor, "sha256_file", lambda p, *a: calls.append(os.path.basename(p)) or real(p, *a))
    info = inspect_checkpoint(made["model"])
    load_nar(info)
    assert calls == ["model.safetensors"]
    load_tokenizer(info)
    assert calls == ["model.safetensors", "qwen.tiktoken"]
    vendor._VERIFIED.clear()  # a new process: the cache file remembers
    load_ar(inspect_checkpoint(made["model"]))
    load_vae(inspect_checkpoint(made["model"]))
    assert calls == ["model.safetensors", "qwen.tiktoken", "model.safetensors"]  # only the VAE file was new
    cached = json.loads(vendor.hash_cache_path().read_text())
    assert str((made["model"] / "model.safetensors").resolve()) in cached


def test_manifest_hash_mismatch(made, tmp_path, monkeypatch):
    folder = _copy_folder(made, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    weights.write_bytes(bytes(data))
    info = inspect_checkpoint(folder)  # sizes agree: the header check passes
    with pytest.raises(CheckpointError, match=r"model.safetensors: sha256 [0-9a-f]{64} does not match "
                                              r"weights_manifest.json \(expected [0-9a-f]{64}\)"):
        load_ar(info)
    monkeypatch.setenv("YUE2_VERIFY_HASHES", "0")
    load_ar(info)  # skipped on request
    monkeypatch.setenv("YUE2_VERIFY_HASHES", "no")
    with pytest.raises(RequestError, match="YUE2_VERIFY_HASHES must be 0 or 1"):
        load_ar(info)


def test_manifest_size_mismatch_and_unlisted(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=("qwen.tiktoken", "weights_manifest.json"))
    with open(folder / "qwen.tiktoken", "a") as f:
        f.write("\n")
    size = (folder / "qwen.tiktoken").stat().st_size
    with pytest.raises(CheckpointError, match=f"qwen.tiktoken has {size:,} bytes; weights_manifest.json says "
                                              f"{size - 1:,}"):
        inspect_checkpoint(folder)
    manifest = json.loads((folder / "weights_manifest.json").read_text())
    del manifest["files"]["qwen.tiktoken"]
    (folder / "weights_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="qwen.tiktoken is not listed in .*weights_manifest.json"):
        inspect_checkpoint(folder)


# ---------------------------------------------------------------------------------------------------------------------
# bad folders, each with its own message

def test_folder_without_weights(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=())
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no weights: neither model.safetensors nor "
                                              "model.safetensors.index.json"):
        inspect_checkpoint(folder)


def test_folder_without_tiktoken(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=())
    (folder / "qwen.tiktoken").unlink()
    with pytest.raises(CheckpointError, match="has no qwen.tiktoken"):
        inspect_checkpoint(folder)


def test_index_naming_a_missing_shard(made, tmp_path):
    folder = tmp_path / "sharded"
    write_vendor_folder(str(made["comfy"]), str(folder), max_shard_bytes=20_000_000)
    shard = sorted(folder.glob("model-*-of-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"index.json names the shard {shard.name}, which is not in"):
        inspect_checkpoint(folder)


def test_index_naming_a_tensor_twice(made, tmp_path):
    """An index whose weight_map names a tensor twice (the second entry pointing at another shard): JSON readers keep
    the last, so the first was never checked (stop-51 break-it review, §40b "not fixed"); now refused by name. The
    shards' own headers are checked apart (a key in two headers: §40b)."""
    folder = tmp_path / "sharded"
    write_vendor_folder(str(made["comfy"]), str(folder), max_shard_bytes=20_000_000)
    index = folder / "model.safetensors.index.json"
    text = index.read_text()
    weight_map = json.loads(text)["weight_map"]
    key, shard = next(iter(weight_map.items()))
    other = next(v for v in weight_map.values() if v != shard)
    index.write_text(text.replace('"weight_map": {', f'"weight_map": {{{json.dumps(key)}: {json.dumps(other)}, ', 1))
    assert json.loads(index.read_text())["weight_map"][key] == shard  # the last entry, the right one, wins
    with pytest.raises(CheckpointError, match=f"index.json names '{key}' twice: an index lists each tensor once"):
        inspect_checkpoint(folder)


def test_config_of_another_model(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=("config.json",))
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 256}))
    with pytest.raises(CheckpointError, match="config of another model \\(model_type 'qwen2'\\); a m-a-p/YuE2-3B "
                                              "folder has model_type 'yue2'"):
        inspect_checkpoint(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint not found: .* is a folder without config.json"):
        inspect_checkpoint(folder)


def test_config_disagreeing_with_the_weights(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=("config.json",))
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 28
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="says num_hidden_layers = 28, the weights have 2"):
        inspect_checkpoint(folder)


def test_no_vae_folder(made, tmp_path):
    folder = _copy_folder(made, tmp_path, with_vae=False, edits=())
    with pytest.raises(CheckpointError, match="no VAE folder for the vendor model .*m-a-p/YuE2-Vae in the Hugging "
                                              "Face cache"):
        inspect_checkpoint(folder)
    info = inspect_checkpoint(folder, vae_path=str(made["vae"]))  # explicit
    assert info.files["vae"] == str(made["vae"])
    shutil.copytree(made["vae"], folder / "vae")  # a vae/ subfolder
    assert inspect_checkpoint(folder).files["vae"] == str(folder / "vae")


def test_weights_file_given_instead_of_folder(made):
    with pytest.raises(CheckpointError, match="none of the YuE2 tensor groups, but vendor-named tensors .* pass "
                                              "its FOLDER"):
        inspect_checkpoint(made["model"] / "model.safetensors")


# ---------------------------------------------------------------------------------------------------------------------
# Hugging Face cache, locate, CLI

def _fake_hf_cache(made, root: Path) -> Path:
    """models--m-a-p--YuE2-3B/snapshots/<rev>/… and refs/main, as huggingface-hub lays out its cache."""
    for repo, src in (("m-a-p/YuE2-3B", made["model"]), ("m-a-p/YuE2-Vae", made["vae"])):
        base = root / ("models--" + repo.replace("/", "--"))
        rev = hashlib.sha1(repo.encode()).hexdigest()
        blobs, snap = base / "blobs", base / "snapshots" / rev
        blobs.mkdir(parents=True)
        snap.mkdir(parents=True)
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(rev)
        for f in src.iterdir():
            blob = blobs / _sha(f)
            os.link(f, blob) if not blob.exists() else None
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return root


def test_hf_cache_snapshot_found_without_download(made, tmp_path, monkeypatch):
    from yue2_core.weights import locate
    cache = _fake_hf_cache(made, tmp_path / "hf")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [])

    def no_download(*a, **k):
        raise AssertionError("downloaded")
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    snap = vendor.hf_snapshot("m-a-p/YuE2-3B")
    assert snap is not None and snap.parent.name == "snapshots"
    path, how = locate.find_checkpoint(None, download=True)
    assert Path(path) == snap and "Hugging Face cache" in how
    info = inspect_checkpoint(path)  # its VAE comes from the cached m-a-p/YuE2-Vae snapshot
    assert "models--m-a-p--YuE2-Vae" in info.files["vae"]
    assert load_vae(info) is not None


def test_locate_accepts_folders(made, tmp_path, monkeypatch):
    from yue2_core.weights import locate
    monkeypatch.delenv("YUE2_CHECKPOINT", raising=False)
    assert locate.find_checkpoint(str(made["model"])) == (str(made["model"]), "given path")
    ckpts = tmp_path / "models" / "checkpoints"
    shutil.copytree(made["model"], ckpts / "YuE2-3B", copy_function=os.link)  # read only: hard links
    shutil.copytree(made["vae"], ckpts / "YuE2-Vae", copy_function=os.link)
    monkeypatch.setattr(locate, "comfy_checkpoint_dirs", lambda: [ckpts])
    path, how = locate.find_checkpoint(None, download=False)
    assert path == str(ckpts / "YuE2-3B") and "ComfyUI folder" in how and "holds" not in how
    assert locate.vendor_folders(ckpts) == [ckpts / "YuE2-3B"]
    # several YuE2 checkpoints there: the one taken and the others are named (break-it finding, stop 38)
    from yue2_core.weights.synthetic import write_synthetic_checkpoint
    write_synthetic_checkpoint(str(ckpts / "b_tiny.safetensors"), profile="micro", fmt="bf16", seed=0)
    path, how = locate.find_checkpoint(None, download=False)
    assert path == str(ckpts / "b_tiny.safetensors")
    assert "holds 2 YuE2 checkpoints (b_tiny.safetensors, YuE2-3B): the first taken" in how, how
    assert "--checkpoint picks another" in how


def test_cli_inspect_describes_a_vendor_folder(made, tmp_path, capsys):
    """`python -m yue2_core inspect FOLDER` as a subprocess; the damaged folder in this process (`main`)."""
    from yue2_core.__main__ import main
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "yue2_core", "inspect", str(made["model"])], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["layout"] == "vendor" and report["format"] == "bf16" and report["tokenizer_vocab"] == 151643
    assert report["dims"]["layers"] == 2 and "vendor split folder" in report["summary"]
    bad = tmp_path / "bad"
    shutil.copytree(made["model"], bad, copy_function=os.link)  # hard links: a file is removed, none written
    (bad / "qwen.tiktoken").unlink()
    capsys.readouterr()
    rc = main(["inspect", str(bad)])  # an exception main() does not turn into an exit status fails the test
    err = capsys.readouterr().err
    assert rc != 0 and "has no qwen.tiktoken" in err and "Traceback" not in err, err


# ---------------------------------------------------------------------------------------------------------------------
# ComfyUI Checkpoint Loader (in the installed host's python, no server)

# One run of the host's python for both tests below (importing ComfyUI takes ≈ 8 CPU-s): the loader's listing and
# loading of vendor folders in one checkpoints folder (argv[3]), then a checkpoint replaced after the loader ran in
# another (argv[4], made ComfyUI's only checkpoints folder in between).
HOST_HARNESS = PREAMBLE + r'''
import shutil
from yue2_core.errors import CheckpointError
from yue2_core.weights.synthetic import write_synthetic_checkpoint
from yue2_nodes.loader import HF_ENTRY, YuE2CheckpointLoader, checkpoint_options
out = {"options": checkpoint_options(), "raw": sorted(folder_paths.get_filename_list("checkpoints")),
       "valid": YuE2CheckpointLoader.validate_inputs("YuE2-3B/"),
       "invalid": YuE2CheckpointLoader.validate_inputs("YuE2-Vae/model.safetensors")}
schema = YuE2CheckpointLoader.define_schema()
out["schema_options"] = schema.inputs[0].options
for name in ("YuE2-3B/", HF_ENTRY):
    model, text = YuE2CheckpointLoader.execute(name).args[:2]
    out[name] = {"layout": model.info.layout, "path": model.info.path, "vae": model.info.files["vae"],
                 "vocab": model.tokenizer.vocab_size, "text": text}

ckpts = sys.argv[4]
folder_paths.folder_names_and_paths["checkpoints"] = ([ckpts], folder_paths.supported_pt_extensions)
path = os.path.join(ckpts, "swap.safetensors")
before = YuE2CheckpointLoader.fingerprint_inputs("swap.safetensors")
model = YuE2CheckpointLoader.execute("swap.safetensors").args[0]
model._root_patcher("vae")  # one part read from the file as loaded
st = os.stat(path)
write_synthetic_checkpoint(path, profile="micro", fmt="bf16", seed=9)  # another model, after the loader ran
os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
after = YuE2CheckpointLoader.fingerprint_inputs("swap.safetensors")
try:
    model._root_patcher("ar")
    error = None
except CheckpointError as exc:
    error = str(exc)
print("RESULT " + json.dumps({"loader": out, "swap": {"changed": before != after, "error": error}}))
'''


@pytest.fixture(scope="module")
def in_host(made, tmp_path_factory, comfy_host, request):
    """HOST_HARNESS's results: {"loader": the listing and the two loads, "swap": the fingerprint and the refusal}.
    Its folder (links to `made`'s files, which would keep them on disk) removed with `made`'s."""
    from synthetic_cache import removed_when_passed
    comfy_dir, python = comfy_host
    with removed_when_passed(request, tmp_path_factory.mktemp("in_host")) as root:
        ckpts = root / "checkpoints"
        ckpts.mkdir()
        shutil.copytree(made["model"], ckpts / "YuE2-3B", copy_function=os.link)  # read only: linked, not copied
        shutil.copytree(made["vae"], ckpts / "YuE2-Vae", copy_function=os.link)
        os.link(made["comfy"], ckpts / "tiny.safetensors")
        swap = root / "swap_checkpoints"
        swap.mkdir()
        shutil.copyfile(made["comfy"], swap / "swap.safetensors")
        cache = _fake_hf_cache(made, root / "hf")
        env = {k: v for k, v in os.environ.items() if k != "YUE2_VERIFY_HASHES"}
        env.update(HF_HUB_CACHE=str(cache), XDG_CACHE_HOME=str(root / "xdg"))
        run = subprocess.run([python, "-c", HOST_HARNESS, str(comfy_dir), str(REPO), str(ckpts), str(swap)],
                             capture_output=True, text=True, env=env, timeout=300)
        lines = [l for l in run.stdout.splitlines() if l.startswith("RESULT ")]
        assert run.returncode == 0 and lines, run.stderr[-3000:]
        yield {**json.loads(lines[-1][len("RESULT "):]), "ckpts": ckpts}


def test_comfyui_loader_lists_and_loads_vendor_folders(in_host):
    out, ckpts = in_host["loader"], in_host["ckpts"]
    hf = "[HF cache] m-a-p/YuE2-3B"
    assert out["options"] == ["tiny.safetensors", "YuE2-3B/", hf] == out["schema_options"]
    assert "YuE2-3B/model.safetensors" in out["raw"]  # ComfyUI itself lists the inner files; the loader hides them
    assert out["valid"] is True and "is not in ComfyUI's checkpoints folder" in out["invalid"]
    assert out["YuE2-3B/"]["layout"] == "vendor" and out["YuE2-3B/"]["path"] == str(ckpts / "YuE2-3B")
    assert out["YuE2-3B/"]["vae"] == str(ckpts / "YuE2-Vae") and out["YuE2-3B/"]["vocab"] == 151643
    assert "models--m-a-p--YuE2-3B" in out[hf]["path"] and "models--m-a-p--YuE2-Vae" in out[hf]["vae"]


@pytest.mark.parametrize("field, text, accepted", [
    ("rope_theta", "Infinity", "rope_theta is inf; it must be a finite number from 1 to 1e\\+30"),
    ("rope_theta", "9" * 400, "rope_theta is 9{20}…9{8} \\(400 characters\\); it must be a finite number from 1"),
    ("rope_theta", "1e-300", "rope_theta is 1e-300; it must be a finite number from 1 to"),
    ("rope_theta", "true", "rope_theta is True; it must be a finite number"),
    ("rms_norm_eps", "Infinity", "rms_norm_eps is inf; it must be a finite number from 1e-30 to below 1"),
    ("rms_norm_eps", "NaN", "rms_norm_eps is nan; it must be a finite number"),
    ("rms_norm_eps", "1", "rms_norm_eps is 1; it must be a finite number from 1e-30 to below 1"),
    ("rms_norm_eps", "9" * 400, "rms_norm_eps is 9{20}…9{8} \\(400 characters\\)"),
    ("timestep_shift", "9" * 400, "timestep_shift 9{20}…9{8} \\(400 characters\\); this engine implements"),
    ("timestep_shift", "true", "timestep_shift True; this engine implements the release value 1.0"),
    ("num_hidden_layers", "9" * 400, "says num_hidden_layers = 9{20}…9{8} \\(400 characters\\), the weights have 2"),
    ("num_hidden_layers", "true", "num_hidden_layers must be a whole number \\(the weights have 2\\), got True"),
    ("num_hidden_layers", "NaN", "num_hidden_layers must be a whole number \\(the weights have 2\\), got nan"),
])
def test_config_numbers_checked_at_load(made, tmp_path, field, text, accepted):
    """Every number config.json gives the loader is refused at inspect when it is not finite, out of range or not a
    number — before: inf rope_theta / eps loaded (the song was lost when saving JSON with inf), 1e-300 gave NaN
    logits blamed on the checkpoint, a 400-digit integer raised OverflowError."""
    folder = _copy_folder(made, tmp_path, edits=("config.json",))
    config = json.loads((folder / "config.json").read_text())
    config[field] = "@@"
    (folder / "config.json").write_text(json.dumps(config).replace('"@@"', text))
    with pytest.raises(CheckpointError, match=accepted):
        inspect_checkpoint(folder)


def test_config_numbers_in_range_are_taken(made, tmp_path):
    folder = _copy_folder(made, tmp_path, edits=("config.json",))
    config = json.loads((folder / "config.json").read_text())
    config.update(rope_theta=10000, rms_norm_eps=1e-5, hidden_size=float(config["hidden_size"]))
    (folder / "config.json").write_text(json.dumps(config))
    dims = inspect_checkpoint(folder).dims
    assert (dims.rope_theta, dims.eps) == (10000.0, 1e-5) and type(dims.rope_theta) is float


def test_a_checkpoint_replaced_after_the_loader_ran_is_refused_at_the_next_part(in_host):
    """Break-it finding (stop 38): a checkpoint replaced on disk after the Checkpoint Loader ran had its remaining
    parts read from the new file (a mix of two models). The loader's fingerprint changes with the file, and a part
    first read after the change is refused, naming what to do. (HOST_HARNESS's second half.)"""
    out = in_host["swap"]
    assert out["changed"] is True
    assert out["error"] and "changed on disk since the YuE2 Checkpoint Loader read it" in out["error"], out
    assert "its AR part would come from another file" in out["error"] and "queue the workflow again" in out["error"]


def test_a_fifo_json_file_is_named_not_read(tmp_path):
    """Break-it review (stop 40): a `config.json` FIFO in a folder given as --lora, or among ComfyUI's vae folders,
    hung `generate` / `render` / `inspect` (opening a FIFO blocks until a writer comes)."""
    import os

    from yue2_core.errors import CheckpointError
    from yue2_core.weights.vae_files import _read_json
    from yue2_core.weights.vendor import folder_model_type, read_config, read_manifest
    os.mkfifo(tmp_path / "config.json")
    os.mkfifo(tmp_path / "weights_manifest.json")
    assert folder_model_type(tmp_path) is None  # a folder scan passes it by
    with pytest.raises(CheckpointError, match="config.json is a FIFO \\(named pipe\\), not a file"):
        read_config(tmp_path)
    with pytest.raises(CheckpointError, match="weights_manifest.json is a FIFO \\(named pipe\\), not a file"):
        read_manifest(tmp_path)
    with pytest.raises(CheckpointError, match="is a FIFO \\(named pipe\\), not a file"):
        _read_json(str(tmp_path / "config.json"), "the VAE config")


def test_the_other_yue2_folder_is_named_with_its_option(made, tmp_path):
    """The VAE folder given as the checkpoint, the model folder given as the VAE: the message says which option takes
    it (own-weights review, stop 49: "the config of another model (model_type 'yue2_vae')" only)."""
    from yue2_core.weights.vae_files import open_vae
    folder = _copy_folder(made, tmp_path, edits=())
    vae = tmp_path / "vae_only"
    vae.mkdir()
    (vae / "config.json").write_text(json.dumps({"model_type": "yue2_vae"}))
    with pytest.raises(CheckpointError, match="model_type 'yue2_vae'.*it is a YuE2 VAE folder — give it as --vae"):
        inspect_checkpoint(vae)
    with pytest.raises(CheckpointError, match="model folder — give it as --checkpoint"):
        open_vae(str(folder))


def test_checkpoint_given_as_a_hugging_face_repo_id(made, tmp_path, monkeypatch):
    """`--checkpoint m-a-p/YuE2-3B` reads the vendor snapshot in the Hugging Face cache (own-weights review, stop 58:
    it was "not found" with download advice, while the search without --checkpoint finds that snapshot);
    `--checkpoint Comfy-Org/YuE2` reads the int8 file from the cache, never downloading with --offline; any other
    repo id, or a mistyped relative path, is named as such."""
    from yue2_core.errors import CheckpointError
    from yue2_core.weights import locate
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(locate, "comfy_model_path", lambda *a: None)
    with pytest.raises(CheckpointError, match="no snapshot of the vendor's m-a-p/YuE2-3B in the Hugging Face cache"):
        locate.find_checkpoint("m-a-p/YuE2-3B", download=True)
    cache = _fake_hf_cache(made, tmp_path / "hf")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path, how = locate.find_checkpoint("m-a-p/YuE2-3B", download=False)
    assert Path(path) == vendor.hf_snapshot("m-a-p/YuE2-3B") and "Hugging Face cache of m-a-p/YuE2-3B" in how

    calls = []

    def fake_download(repo, filename, local_files_only=False, **k):
        calls.append(local_files_only)
        if local_files_only:
            raise FileNotFoundError("not cached")
        return str(tmp_path / "downloaded.safetensors")
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    with pytest.raises(CheckpointError, match="not in the Hugging Face cache and downloading is off"):
        locate.find_checkpoint("Comfy-Org/YuE2", download=False)
    assert calls == [True]
    monkeypatch.setattr(locate, "_hub_unreachable", lambda *a, **k: None)
    path, how = locate.find_checkpoint("comfy-org/yue2", download=True)
    assert path.endswith("downloaded.safetensors") and how == f"Hugging Face {locate.HF_REPO}/{locate.HF_FILE}"
    assert calls == [True, True, False]
    with pytest.raises(CheckpointError, match="as a Hugging Face repo id it is not one YuE2 ships in"):
        locate.find_checkpoint("someone/other-model", download=True)
    # a relative path typed wrong stays a path (suffix, or its first folder exists here)
    (tmp_path / "models").mkdir()
    for name in ("nope/yue2.safetensors", "models/yue2"):
        with pytest.raises(CheckpointError, match="checkpoint not found"):
            locate.find_checkpoint(name, download=False)


def test_vae_given_as_its_hugging_face_repo_id(made, tmp_path, monkeypatch, capsys):
    """`--vae m-a-p/YuE2-Vae` reads that repo's snapshot in the Hugging Face cache, as `--checkpoint m-a-p/YuE2-3B`
    does (stop 58); with none cached it says so, before any checkpoint search."""
    import argparse

    from yue2_core.cli.options import parse_vae
    from yue2_core.weights import locate
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(locate, "comfy_model_path", lambda *a: None)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(argparse.ArgumentTypeError, match="no snapshot of m-a-p/YuE2-Vae in the Hugging Face cache"):
        parse_vae("m-a-p/YuE2-Vae")
    cache = _fake_hf_cache(made, tmp_path / "hf")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    got = parse_vae("m-a-p/YuE2-Vae")
    assert Path(got) == vendor.hf_snapshot("m-a-p/YuE2-Vae") and "Hugging Face cache" in capsys.readouterr().err
