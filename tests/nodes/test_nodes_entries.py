"""Odd entries in ComfyUI's folders and the render records the nodes stamp (break-it and new-user reviews, stop 39),
run in the installed host's python with the pack loaded as ComfyUI loads it, no server (the cases change the
checkpoints, vae and output folders, which the session's server shares with every other test):

- a FIFO or a looping symbolic link listed in the checkpoints folder: the Loader (and the editor's token route) named
  it "not in ComfyUI's checkpoints folder — download 3.7 GB";
- `output/yue2` that is a file: Save Song said "cannot write into …: File exists";
- a song folder symbolically linked into `output/yue2`: listed by Load Song, refused when picked;
- a name whose next free number outgrows the 180-character limit: the generic "name not allowed";
- a VAE folder asked for without its trailing "/" (an API prompt by hand): "put a YuE2 VAE there";
- a LoRA name in no `loras` folder (a shipped workflow's placeholder): the files listed there now are named;
- the records: a latent's samples changed after the render no longer match its record's digest (also through YuE2
  Pick Take); an AUDIO decoded by another checkpoint's VAE is named against the latent's checkpoint."""
from __future__ import annotations


HARNESS = r'''
import torch
from pathlib import Path
from yue2_nodes import loader, lora, records, songs, vae_loader
from yue2_nodes.routes import RequestRefused, _checkpoint_path
work = Path(ckpts).parent
out = {}

def message(call):
    try:
        call()
        return "ran"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

os.mkfifo(os.path.join(ckpts, "fifo.safetensors"))
os.symlink("loop.safetensors", os.path.join(ckpts, "loop.safetensors"))
out["listed"] = [n for n in loader.checkpoint_options() if n in ("fifo.safetensors", "loop.safetensors")]
out["loader fifo"] = message(lambda: loader.YuE2CheckpointLoader.execute("fifo.safetensors"))
out["loader loop"] = message(lambda: loader.YuE2CheckpointLoader.execute("loop.safetensors"))
out["route fifo"] = message(lambda: _checkpoint_path("fifo.safetensors"))
os.mkdir(os.path.join(ckpts, "YuE2"))  # a vendor folder entry that no longer resolves: the folder message, not "a file"
out["vendor folder"] = loader.not_a_file_entry("YuE2/")

folder_paths.set_output_directory(str(work / "output"))
(work / "output").mkdir()
(work / "output" / "yue2").write_text("not a folder")
out["save into a file"] = message(lambda: songs.YuE2SaveSong.execute(None, "x"))
(work / "output" / "yue2").unlink()
root = work / "output" / "yue2"
(root / "mine_00001").mkdir(parents=True)
(root / "mine_00001" / "result.json").write_text("{}")
(work / "elsewhere").mkdir()
(work / "elsewhere" / "result.json").write_text("{}")
os.symlink(work / "elsewhere", root / "linked_00001")
out["songs"] = songs.list_songs()
prefix = "a" * 160
(root / f"{prefix}_9999999999999999999").mkdir()
out["next number"] = message(lambda: songs.next_song_dir(root, prefix))

vaes = work / "vae"
(vaes / "legacy").mkdir(parents=True)
(vaes / "legacy" / "config.json").write_text(json.dumps({"model_type": "yue2_vae"}))
folder_paths.folder_names_and_paths["vae"] = ([str(vaes)], folder_paths.supported_pt_extensions)
out["vae without slash"] = vae_loader.missing_message("legacy")
out["vae unknown"] = vae_loader.missing_message("other")
loras = work / "loras"
(loras / "peft").mkdir(parents=True)
folder_paths.folder_names_and_paths["loras"] = ([str(loras)], folder_paths.supported_pt_extensions)
out["lora none"] = lora.missing_message("my_yue2_lora.safetensors")
(loras / "aitk.safetensors").write_bytes(b"")
(loras / "peft" / "adapter_model.safetensors").write_bytes(b"")
(loras / "nar_lora_joint.pt").write_bytes(b"")
folder_paths.filename_list_cache.pop("loras", None)
out["lora unknown"] = lora.missing_message("my_yue2_lora.safetensors")

samples = torch.randn(1, 64, 7)
record = records.stamp({"steps": 8, "seed": 3, "checkpoint": {"path": "/m/a.safetensors", "sample_sha256": "1"}},
                       samples)
out["record kept"] = records.render_record({"samples": samples.clone(), "yue2_render": record})[0] == record
changed = records.render_record({"samples": samples * 10, "yue2_render": record})
out["record changed"] = [changed[0], changed[1]]
batch = torch.randn(2, 64, 9)
kept = records.restamp({"samples": batch, "yue2_render": records.stamp({"seed": 1}, batch)}, batch[1:, :, :5])
out["pick kept"] = kept["samples_sha256"] == records.samples_digest(batch[1:, :, :5])
moved = records.restamp({"samples": batch * 2, "yue2_render": records.stamp({"seed": 1}, batch)}, batch[1:, :, :5])
out["pick changed"] = moved["samples_sha256"]
other = {"yue2_decoded_by": {"path": "/m/b.safetensors", "sample_sha256": "2"}}
same = {"yue2_decoded_by": {"path": "/elsewhere/a.safetensors", "sample_sha256": "1"}}
out["decoder other"] = records.decoder_warning(record, other)
out["decoder same"] = records.decoder_warning(record, same)
print("RESULT " + json.dumps(out))
'''


def test_odd_folder_entries_and_render_records(in_host, tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    out = in_host(HARNESS, ckpts)
    assert out["listed"] == ["fifo.safetensors", "loop.safetensors"]  # ComfyUI lists both
    assert out["loader fifo"].startswith(f"ValueError: YuE2 checkpoint 'fifo.safetensors' in {ckpts} is a FIFO "
                                         "(named pipe), not a file"), out["loader fifo"]
    assert "is a symbolic-link loop, not a file" in out["loader loop"] and "Download" not in out["loader loop"]
    assert "is a FIFO (named pipe), not a file" in out["route fifo"] and "RequestRefused" in out["route fifo"]
    assert out["vendor folder"] is None
    assert out["save into a file"] == (f"ValueError: {tmp_path / 'output' / 'yue2'} is a file, not a folder: YuE2 "
                                       "Save Song writes each song as a folder inside it; move or rename that file")
    assert out["songs"] == ["mine_00001"]
    assert out["next number"].startswith("ArtifactError: no free song number for the name 'aaaa") and \
        "the next one, 10000000000000000000, makes the folder name longer than 180 characters" in out["next number"]
    assert out["vae without slash"] == ("VAE 'legacy' is not an entry of the list: the vendor VAE folder is listed as "
                                        "'legacy/' (folders end with '/'); pick that one")
    assert out["vae unknown"].endswith("and refresh (press R). Listed now: 'legacy/'.")
    # the LoRA node names what its list holds, as the VAE and Checkpoint Loaders do (new-user review 52)
    loras = tmp_path / "loras"
    assert out["lora none"] == (f"LoRA 'my_yue2_lora.safetensors' is not in ComfyUI's loras folder ({loras}); put the "
                                "adapter file there and refresh (press R), or pick one that is listed. That folder has "
                                "no adapter files at all.")
    assert out["lora unknown"].endswith("or pick one that is listed. Listed now: 'aitk.safetensors', "
                                        "'nar_lora_joint.pt', 'peft/adapter_model.safetensors'."), out["lora unknown"]
    assert out["record kept"] is True
    assert out["record changed"][0] is None and "the latent was changed after YuE2 rendered it" in \
        out["record changed"][1]
    assert out["pick kept"] is True and out["pick changed"] == "changed after the render"
    assert out["decoder other"].startswith("the audio was decoded by the VAE of /m/b.safetensors, but the latent was "
                                           "rendered with /m/a.safetensors")
    assert out["decoder same"] is None  # the same file by its sample hash, wherever it lies now


EDITOR_HARNESS = r'''
from yue2_nodes import editor, routes
out = {}
score = "X:1\nK:C\n"
sub = {"id": "sg-1", "nodes": [{"id": 3, "type": "YuE2ABCEditor", "properties": {"yue2_composer_abc": score}}]}
workflow = {"id": "wf-1", "nodes": [{"id": 5, "type": "sg-1"}, {"id": 3, "type": "Other", "properties": {}}],
            "definitions": {"subgraphs": [sub]}}
extra = {"workflow": workflow}
out["inner"] = editor._workflow_node(extra, "5:3") is sub["nodes"][0]
out["top"] = editor._workflow_node(extra, "3") is workflow["nodes"][1]
out["missing"] = [editor._workflow_node(extra, uid) for uid in ("7:3", "5:9", "5:3:1")]
out["stale in a subgraph"] = editor._holds_previous_score(score, "X:1\nK:D\n", extra, "5:3")
out["crlf"] = editor._holds_previous_score(score.replace("\n", "\r\n"), "X:1\r\nK:D\r\n",
                                             {"workflow": {"id": "w", "nodes": [{"id": 1, "properties":
                                              {"yue2_composer_abc": score.replace("\n", "\r\n")}}]}}, "1")
out["same modulo line ends"] = editor._holds_previous_score(score, score.replace("\n", "\r\n"), extra, "5:3")
editor.remember_source(extra, "5:3", score)
out["last"] = routes.last_source({"workflow": "wf-1", "node": "5:3"})
out["other workflow"] = routes.last_source({"workflow": "wf-2", "node": "5:3"})
try:
    routes.last_source({"workflow": "", "node": 3})
except routes.RequestRefused as exc:
    out["refused"] = str(exc)
for i in range(70):  # bounded: the oldest entries go
    editor.remember_source({"workflow": {"id": f"w{i}"}}, "1", "x")
out["kept"] = len(editor._LAST_SOURCE)
try:
    editor.YuE2ABCEditor.execute("", None, "X:1\nT:\nM:4/4\nL:1/16\nK:C\nV: Vocal\nc20|\n")
except ValueError as exc:
    out["connected errors"] = str(exc)
print("RESULT " + json.dumps(out))
'''


def test_editor_records_subgraph_nodes_line_ends_and_cached_runs(in_host, tmp_path):
    """The editor's server side (editor review, stop 39): a node inside a subgraph ("5:3") is found through the
    workflow's subgraph definitions, so the run follows the same rule as the widget; line ends do not make an
    unedited box read as edited; the last connected score per (workflow, node) is kept for the widget of a run answered
    from the cache (route /yue2/abc/last_source, bounded); errors in a connected score are said to be there."""
    (tmp_path / "checkpoints").mkdir()
    out = in_host(EDITOR_HARNESS, tmp_path / "checkpoints")
    assert out["inner"] is True and out["top"] is True and out["missing"] == [None, None, None]
    assert out["stale in a subgraph"] is True  # was False: the record was not found, the box kept
    assert out["crlf"] is True and out["same modulo line ends"] is False
    assert out["last"] == {"source_abc": "X:1\nK:C\n"} and out["other workflow"] == {"source_abc": None}
    assert out["refused"].startswith("'workflow' must be a string of 1–200 characters") and "0 characters" in \
        out["refused"]
    assert out["kept"] == 64
    assert out["connected errors"].startswith("the connected score has 5 error(s) (the editor's box shows it when")
