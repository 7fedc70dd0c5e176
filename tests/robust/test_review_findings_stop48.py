"""Findings of the stop-48 break-it review of bad input (docs/bad_inputs.md §32): `make-synthetic --force` replaced a
device node (/dev/null, as root) or a FIFO with a 215 MB regular file, and the synthetic writers gave a traceback for
an output folder that is a file; a vendor config.json whose max_latent_frames or tie_word_embeddings lied was used;
long metadata and config values were echoed whole in messages (hundreds of kilobytes); a folder, FIFO or missing
path given as a batch request file or abc_path read "does not exist or is not a regular file" alike."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from yue2_core.errors import AdapterError, CheckpointError, RequestError

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

LONG = 200_000  # characters of a hostile metadata / config value
SHORT = 600  # a message quoting such a value stays a line or two


def _main_inprocess():
    from test_cli import main_inprocess
    return main_inprocess


# -------------------------------------------------- 1. --force over a device, a FIFO; an output folder that is a file


def test_make_synthetic_never_replaces_a_fifo_even_with_force(tmp_path, capsys):
    """`make-synthetic --output /dev/null --force` (run as root) renamed a 215 MB file over the device node: /dev/null
    became a regular file. A FIFO stands in for the device here (the same rename replaced it); the device itself is
    only looked at (`special_file` reads it with lstat, writes nothing)."""
    from yue2_core.weights.synthetic import refuse_special, special_file

    fifo = tmp_path / "out.safetensors"
    os.mkfifo(fifo)
    rc, err = _main_inprocess()(capsys, "make-synthetic", "--profile", "tiny", "--format", "bf16",
                                "--output", fifo, "--force")
    assert rc == 2 and "Traceback" not in err, err
    assert f"--output {fifo} is a FIFO (named pipe), not a file" in err and "--force replaces only a file" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"], "a temporary file was left"
    if os.path.exists("/dev/null"):
        assert special_file("/dev/null") == "a character device"
        assert "is a character device, not a file" in refuse_special("/dev/null")
    assert special_file(tmp_path) is None and special_file(tmp_path / "missing") is None


@pytest.mark.parametrize("output, phrase", [
    ("", "--output '' names no file (an unset shell variable?)"),
    ("{tmp}/new/", "ends in '/', so it names a folder; give the path of the .safetensors file to write, e.g. "
                   "{tmp}/new/yue2_tiny_bf16.safetensors"),
])
def test_make_synthetic_names_an_empty_output_or_one_ending_in_a_slash(tmp_path, capsys, output, phrase):
    """'' was "--output  is a folder"; `new/` (a folder that does not exist) was "cannot write new/: Not a
    directory"."""
    output, phrase = output.format(tmp=tmp_path), phrase.format(tmp=tmp_path)
    rc, err = _main_inprocess()(capsys, "make-synthetic", "--profile", "tiny", "--format", "bf16", "--output", output)
    assert rc == 2 and phrase in err and "Traceback" not in err, err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("writer", ["lora", "vae", "vendor"])
def test_the_synthetic_writers_refuse_a_fifo_or_a_file_as_their_folder(tmp_path, capsys, writer):
    """The three test-file writers docs/lora.md runs: with --force, a FIFO at one of their file names was replaced;
    an output folder that is a file gave `FileExistsError` as a traceback."""
    from yue2_core.weights import synthetic_vae, synthetic_vendor
    from yue2_core.weights.lora import synthetic as lora_synthetic

    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    folder = tmp_path / "out"
    folder.mkdir()
    name = {"lora": "aitk.safetensors", "vae": "model.safetensors", "vendor": "config.json"}[writer]
    os.mkfifo(folder / name)

    def run(out):
        args = {"lora": [str(out)], "vae": [str(out)], "vendor": ["unused.safetensors", str(out)]}[writer]
        main = {"lora": lora_synthetic.main, "vae": synthetic_vae.main, "vendor": synthetic_vendor.main}[writer]
        return main([*args, "--force"]), capsys.readouterr().err

    rc, err = run(folder)
    assert rc == 1 and f"the output {folder / name} is a FIFO (named pipe), not a file" in err, err
    assert stat.S_ISFIFO(os.lstat(folder / name).st_mode)
    rc, err = run(a_file / "sub")
    assert rc == 1 and f"{a_file} is a file, not a folder" in err and "Traceback" not in err, err
    assert a_file.read_text() == "not a folder"


# ----------------------------------------------------------------------- 2. a vendor config.json that lies


@pytest.fixture(scope="module")
def vendor_folder(tmp_path_factory, tiny_paths, request):
    """The tiny bf16 file as a vendor folder; removed after the module's tests when they passed (≈ 0.2 GB;
    tests/synthetic_cache.py `removed_when_passed`)."""
    from synthetic_cache import removed_when_passed
    from yue2_core.weights.synthetic_vendor import write_vendor_folder
    with removed_when_passed(request, tmp_path_factory.mktemp("vendor48")) as root:
        os.environ["XDG_CACHE_HOME"] = str(root / "xdg")
        try:
            write_vendor_folder(tiny_paths["bf16"], str(root / "YuE2-3B"))
        finally:
            del os.environ["XDG_CACHE_HOME"]
        yield root / "YuE2-3B"


def _with_config(vendor_folder, tmp_path, **changes) -> Path:
    """A copy of the vendor folder (weights hard-linked) whose config.json has `changes`."""
    dst = tmp_path / "YuE2-3B"
    shutil.copytree(vendor_folder, dst, copy_function=os.link)
    config_path = dst / "config.json"
    config = json.loads(config_path.read_text())
    config_path.unlink()  # a hard link: write a new file, not through the shared inode
    config_path.write_text(json.dumps({**config, **changes}))
    return dst


@pytest.mark.parametrize("changes, phrase", [
    ({"max_latent_frames": 5}, "says max_latent_frames = 5, the weights have 24576: the config and the weights are "
                               "of different models"),
    ({"max_latent_frames": "24576"}, "max_latent_frames must be a whole number (the weights have 24576), got "
                                     "'24576'"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings is true; this engine implements the release value false"),
    ({"tie_word_embeddings": "x" * LONG}, "tie_word_embeddings is 'xxxxxxxxxxxxxxxxxxx…"),
])
def test_a_vendor_config_whose_positions_or_tied_head_lie_is_refused(vendor_folder, tmp_path, monkeypatch, changes,
                                                                    phrase):
    """Both were ignored: the engine used the file's 24,576 NAR position rows and its own lm_head while the config
    said 5 rows, or an lm_head tied to the input embedding (what the vendor's loader would then compute)."""
    from yue2_core.weights.checkpoint import inspect_checkpoint
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    inspect_checkpoint(str(vendor_folder))  # the synthetic config states both as the weights have them
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(str(_with_config(vendor_folder, tmp_path, **changes)))
    assert phrase in str(err.value) and len(str(err.value)) < SHORT, str(err.value)[:SHORT]


# ------------------------------------------------------------------ 3. long values quoted whole in messages


def _resave(src: Path, out: Path, **meta) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    with safe_open(str(src), "pt") as f:
        md = dict(f.metadata() or {})
    save_file(load_file(str(src)), str(out), metadata={**md, **meta})
    return out


def _adapter_error(path) -> str:
    from yue2_core.weights.lora.layouts import read_adapter
    from yue2_core.weights.lora.synthetic import profile_dims
    with pytest.raises(AdapterError) as err:
        read_adapter(str(path), profile_dims("tiny"))
    return str(err.value)


@pytest.mark.parametrize("layout, key", [("hot-split-ar", "rank"), ("starnodes", "alpha"),
                                         ("ms-raw-ar", "lora_scale"), ("fl", "acoustic_adapter")])
def test_a_long_adapter_metadata_value_is_cut_in_the_message(tmp_path, layout, key):
    """`metadata rank='9999…'` quoted all 200,000 characters (an FL companion name twice: as the value and inside the
    path); the branch keys were already cut (stop 46)."""
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    src = write_adapter(layout, tmp_path / "src" / f"{layout}-ar.safetensors", profile_dims("tiny"))
    msg = _adapter_error(_resave(src, tmp_path / "src" / "long.safetensors", **{key: "9" * LONG}))
    assert f"{key}='99999" in msg and f"({LONG} characters)" in msg and len(msg) < SHORT, msg[:SHORT]


@pytest.mark.parametrize("key, value, phrase", [
    ("peft_type", "x" * LONG, "peft_type 'xxxxxxxxxxxxxxxxxxx…xxxxxxx' (200002 characters) is not a LoRA"),
    ("r", [0] * 50_000, '"r" must be a positive integer; found [0, 0, 0'),
    ("use_rslora", "x" * LONG, '"use_rslora" must be true or false; found \'xxxx'),
])
def test_a_long_peft_config_value_is_cut_in_the_message(tmp_path, key, value, phrase):
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    folder = write_adapter("peft", tmp_path / "peft", profile_dims("tiny"))
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, key: value}))
    msg = _adapter_error(folder)
    assert phrase in msg and len(msg) < SHORT, msg[:SHORT]


@pytest.mark.parametrize("where, key, value", [
    ((), "model_type", "x" * LONG), ((), "sample_rate", "9" * LONG), (("decoder",), "strides", [2] * 50_000),
    (("decoder",), "snake_type", "x" * LONG), ((), "decode_core_frames", "x" * LONG),
])
def test_a_long_vae_config_value_is_cut_in_the_message(tmp_path, where, key, value):
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.vae_files import open_vae
    folder = Path(write_vae(str(tmp_path / "vae"), profile="tiny"))
    config = json.loads((folder / "config.json").read_text())
    (config[where[0]] if where else config)[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        open_vae(str(folder))
    msg = str(err.value)
    assert f"{key} " in msg and "characters)" in msg and len(msg) < SHORT, msg[:SHORT]


def test_a_long_model_type_of_a_vendor_folder_is_cut(tmp_path):
    from yue2_core.weights.vendor import read_config
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "q" * LONG}))
    with pytest.raises(CheckpointError) as err:
        read_config(tmp_path)
    assert "is the config of another model (model_type 'qqqq" in str(err.value) and len(str(err.value)) < SHORT


# ------------------------------------------------------------------- 4. batch: what a path that is not a file is


def test_a_batch_request_file_or_abc_path_says_what_the_path_is(tmp_path):
    """All three read "does not exist or is not a regular file" (the command line's text files say which since
    stop 41)."""
    from yue2_core.batch.requests import read_requests
    (tmp_path / "scores").mkdir()
    os.mkfifo(tmp_path / "pipe.abc")
    rows = [{"id": "a", "style": "pop", "lyrics": "la", "abc_path": "scores"},
            {"id": "b", "style": "pop", "lyrics": "la", "abc_path": "missing.abc"},
            {"id": "c", "style": "pop", "lyrics": "la", "abc_path": "pipe.abc"}]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ok, errors = read_requests(requests)
    said = {e.id: e.message for e in errors}
    assert not ok and set(said) == {"a", "b", "c"}, said
    assert f"{tmp_path / 'scores'} is a directory, not a regular file" in said["a"], said["a"]
    assert f"{tmp_path / 'missing.abc'} does not exist;" in said["b"], said["b"]
    assert f"{tmp_path / 'pipe.abc'} is a FIFO (named pipe), not a regular file" in said["c"], said["c"]
    for path, phrase in ((tmp_path, "is a directory, not a regular file"),
                         (tmp_path / "nope.jsonl", "does not exist; give the path of a JSONL file"),
                         (tmp_path / "pipe.abc", "is a FIFO (named pipe), not a regular file")):
        with pytest.raises(RequestError) as err:
            read_requests(path)
        assert f"request file {path} {phrase}" in str(err.value), str(err.value)


# ------------------------------------------------------------- 5. a JSON file padded to gigabytes is not read whole


def test_a_huge_config_or_sidecar_json_is_refused_before_it_is_read(vendor_folder, tmp_path, monkeypatch):
    """A 3 GB adapter_config.json (its JSON, then zeros: what a crashed copy or a preallocating download leaves) made
    `inspect` hold 6.8 GB for 16 s before "not a readable JSON file"; a larger one ends ComfyUI's process. The files
    here are sparse: one byte over the cap costs no disk."""
    from yue2_core.constants import MAX_CONFIG_JSON
    from yue2_core.weights.checkpoint import inspect_checkpoint
    from yue2_core.weights.lora.synthetic import profile_dims, write_adapter
    from yue2_core.weights.synthetic_vae import write_vae
    from yue2_core.weights.vae_files import open_vae
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = f"is {MAX_CONFIG_JSON + 1:,} bytes: more than such a JSON file can be (at most {MAX_CONFIG_JSON:,}"

    def pad(path: Path) -> None:
        os.truncate(path, MAX_CONFIG_JSON + 1)

    peft = write_adapter("peft", tmp_path / "peft", profile_dims("tiny"))
    pad(peft / "adapter_config.json")
    assert expected in _adapter_error(peft)
    vae = Path(write_vae(str(tmp_path / "vae"), profile="tiny"))
    pad(vae / "config.json")
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        open_vae(str(vae))
    folder = _with_config(vendor_folder, tmp_path)
    pad(folder / "config.json")
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        inspect_checkpoint(str(folder))
    os.truncate(folder / "config.json", MAX_CONFIG_JSON)  # at the cap: read, and refused as JSON, not by size
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(str(folder))
    assert "bytes: more than" not in str(err.value), str(err.value)


def test_a_batch_json_padded_past_any_batch_is_not_read_whole(tmp_path):
    """`batch --resume` read a batch.json padded to 3 GB whole (6.9 GB of memory, 18 s) before finding it
    unreadable and rebuilding it from the songs; past MAX_SUMMARY_BYTES it is now unreadable by its size."""
    from yue2_core.batch.summary import BATCH_FILE, MAX_SUMMARY_BYTES, load_summary
    path = tmp_path / BATCH_FILE
    path.write_text(json.dumps({"complete": 1, "settings": {}}))
    assert load_summary(tmp_path) == {"complete": 1, "settings": {}}
    os.truncate(path, MAX_SUMMARY_BYTES + 1)  # sparse: no disk
    assert load_summary(tmp_path) is None
