"""YuE2 Regenerate and YuE2 Continue check the room in output/yue2 for the new song before they load the model, as
`generate` does (`artifacts.check_song_room`: the disk's free space, the quota, `ulimit -f`) — and refuse where
generate warns (API break-it review, stop 53; docs/bad_inputs.md §46: on a full disk they computed the music, then the
save failed and the music was lost). Run in the installed host's python with the pack loaded as ComfyUI loads it, no
server (the free-space query, the quota probe and the file-size limit are replaced in the harness's own process)."""
from __future__ import annotations

import errno

SETUP = r'''
import shutil
from collections import namedtuple
from pathlib import Path
from yue2_core import artifacts
from yue2_nodes import edit_nodes, songs
from yue2_nodes.composer import YuE2Composer
from yue2_nodes.loader import YuE2CheckpointLoader
from yue2_nodes.render import YuE2Renderer, YuE2VAEDecode
work = Path(ckpts).parent
folder_paths.set_output_directory(str(work / "output"))
model = YuE2CheckpointLoader.execute("tiny.safetensors").args[0]
tokens = YuE2Composer.execute(model, "pop", "la", "off", 1, 0.4).args[1]  # 10 music tokens (synthetic: no end)
latent = YuE2Renderer.execute(model, tokens, 2, 1).args[0]
songs.YuE2SaveSong.execute(tokens, "parent", latent=latent, audio=YuE2VAEDecode.execute(model, latent).args[0])
song = songs.YuE2LoadSong.execute(model, "parent_00001").args[3]
root = songs.songs_root()
loads = []
real_parts = edit_nodes._parts
edit_nodes._parts = lambda m, need: loads.append(need) or real_parts(m, need)
usage = namedtuple("usage", "total used free")
real = shutil.disk_usage, artifacts.probe_room, artifacts.file_size_limit
out = {"frames": len(song.tokens.codes), "root": str(root)}
calls = {"regenerate": lambda: edit_nodes.YuE2Regenerate.execute(model, song, "token 4", 3, 0.0, ""),
         "continue": lambda: edit_nodes.YuE2Continue.execute(model, song, 1.0, 3, 0.0, "")}
'''
HARNESS = SETUP + r'''

def attempt(label, call):
    before = sorted(p.name for p in root.iterdir())
    try:
        call()
        said = "ran"
    except Exception as exc:
        said = f"{type(exc).__name__}: {exc}"
    out[label] = {"said": said, "loads": len(loads), "new": sorted(set(p.name for p in root.iterdir()) - set(before))}
    loads.clear()

for case, free in (("full", 100_000), ("quota", 10 ** 12)):
    shutil.disk_usage = lambda path: usage(10 ** 12, 10 ** 12 - free, free)
    artifacts.probe_room = lambda folder, nbytes: artifacts.RoomProbe(QUOTA, nbytes // 2)
    for node, call in calls.items():
        attempt(f"{node} {case}", call)
shutil.disk_usage, artifacts.probe_room = real[:2]
limit = artifacts.song_bytes_bound(out["frames"] + 10)[0] + 2000  # room for the parent and 0.4 s more
artifacts.file_size_limit = lambda: limit
attempt("continue ulimit", calls["continue"])
artifacts.file_size_limit = real[2]
for node, call in calls.items():  # the same inputs where there is room: both run and save
    attempt(f"{node} room", call)
print("RESULT " + json.dumps(out))
'''


def test_regenerate_and_continue_check_the_room_before_they_compute(in_host, tmp_path):
    """A full disk (100 kB free), a quota that gives no room while the disk has plenty, and a `ulimit -f` below the
    song's audio.flac: each node refuses before the model is loaded, naming the folder, what the song may take and
    what is free or what to lower; nothing is written. Before: both loaded the model, computed and saved (these
    checks were made only by `generate` and `render`), and a really full disk then failed the save, the music
    lost. The same inputs where there is room run and save (the refusals were the room's, not the inputs')."""
    from synthetic_cache import synthetic_link
    from yue2_core.artifacts import song_bytes_bound
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    synthetic_link(str(ckpts / "tiny.safetensors"), "tiny", "bf16")
    out = in_host(HARNESS.replace("QUOTA", str(errno.EDQUOT)), ckpts)
    frames = out["frames"]
    assert frames == 10, out
    needs = {"regenerate": song_bytes_bound(frames)[1], "continue": song_bytes_bound(frames + 25)[1]}
    for node, shown, lower in (("regenerate", "YuE2 Regenerate", "max_seconds"),
                               ("continue", "YuE2 Continue", "extra_seconds")):
        full, quota = out[f"{node} full"], out[f"{node} quota"]
        assert full["said"].startswith(f"ValueError: {shown} did not start, nothing was computed: {out['root']} has "
                                       f"0.1 MB free, and the song may take up to {needs[node] / 1e6:,.1f} MB"), full
        assert full["said"].endswith(f"free space first, or make shorter songs (here: a lower {lower})"), full
        assert "your disk quota there gave no room for" in quota["said"], quota
        assert f"{needs[node] / 1e6:,.1f} MB" in quota["said"] and "`quota -s`" in quota["said"], quota
        for refused in (full, quota):
            assert refused["loads"] == 0 and refused["new"] == [], refused
        ran = out[f"{node} room"]
        assert ran["said"] == "ran" and ran["loads"] == 1 and len(ran["new"]) == 1, ran
    ulimit = out["continue ulimit"]
    assert ulimit["said"].startswith("ValueError: this process's file-size limit (`ulimit -f`"), ulimit
    assert "or lower extra_seconds to at most 0.4 s" in ulimit["said"], ulimit  # the 10 tokens past the original
    assert ulimit["loads"] == 0 and ulimit["new"] == [], ulimit


RUN = r'''
import pathlib
real_save, real_iterdir = edit_nodes.save_song, pathlib.Path.iterdir

def run(label, call, save=real_save, iterdir=real_iterdir):  # one node run: what it said, loaded and saved
    before = sorted(p.name for p in root.iterdir())
    edit_nodes.save_song, pathlib.Path.iterdir = save, iterdir
    try:
        result = call()
        said, report = "ran", result.args[5]
    except Exception as exc:
        said, report = f"{type(exc).__name__}: {exc}", None
    finally:
        edit_nodes.save_song, pathlib.Path.iterdir = real_save, real_iterdir
    new = sorted(set(p.name for p in root.iterdir()) - set(before))
    codes = [list(artifacts.load_song(root / n).tokens.codes) for n in new]
    out[label] = {"said": said, "report": report, "loads": len(loads), "new": new, "codes": codes}
    loads.clear()
'''
KEPT = SETUP + RUN + r'''
import errno
given = []

def full_disk(child, out, **kwargs):  # the disk filled while the song was computed, after the room check
    given.append(list(child.tokens.codes))
    raise artifacts.write_error(OSError(errno.ENOSPC, "No space left on device"),
                                f"could not save the song to {out}", " (nothing was written)")

regen = lambda seed: lambda: edit_nodes.YuE2Regenerate.execute(model, song, "token 4", seed, 0.0, "")
run("regen full", regen(3), full_disk)
run("regen still full", regen(3), full_disk)
run("regen room", regen(3))
run("regen seed 4 full", regen(4), full_disk)
run("regen seed 3 again", regen(3))
run("regen seed 4 again", regen(4))
run("continue full", calls["continue"], full_disk)
run("continue room", calls["continue"])
out["given"] = given
print("RESULT " + json.dumps(out))
'''


def test_regenerate_and_continue_keep_music_whose_save_failed(in_host, tmp_path):
    """API break-it review, stop 53: the disk filling while Regenerate or Continue computes (after their room check)
    failed the save and lost the music — unlike a failed YuE2 Save Song, whose inputs ComfyUI's cache keeps, these
    nodes compute and save in one step, so ComfyUI has nothing of theirs to keep. Now the node keeps the computed
    song and says so; the same inputs again save it without loading the model or computing (still full: kept again),
    the very music the failed save was given; other inputs (another seed) compute anew and drop what was kept."""
    from synthetic_cache import synthetic_link
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    synthetic_link(str(ckpts / "tiny.safetensors"), "tiny", "bf16")
    out = in_host(KEPT, ckpts)
    for node, label in (("YuE2 Regenerate", "regen"), ("YuE2 Continue", "continue")):
        full = out[f"{label} full"]
        assert full["said"].startswith("ValueError: could not save the song to ") and (
            "No space left on device (nothing was written) — the music computed is kept in memory: once the folder "
            f"can take it, queue the same prompt again and {node} saves it without computing it again") in \
            full["said"], full
        assert "include seed 3, which a seed control other than 'fixed' has changed" in full["said"], full
        assert full["loads"] == 1 and full["new"] == [], full
        room = out[f"{label} room"]
        assert room["said"] == "ran" and room["loads"] == 0 and len(room["new"]) == 1, room
        assert room["codes"] == [out["given"][0 if label == "regen" else -1]], room  # the music computed first
        assert "not computed again" in room["report"], room["report"]
    still = out["regen still full"]
    assert still["loads"] == 0 and still["new"] == [] and "is kept in memory" in still["said"], still
    assert out["given"][0] == out["given"][1]  # the same music offered to the second failed save
    for label in ("regen seed 4 full", "regen seed 3 again", "regen seed 4 again"):  # computed: nothing kept matches
        assert out[label]["loads"] == 1, (label, out[label])
    for label in ("regen seed 3 again", "regen seed 4 again"):
        assert out[label]["said"] == "ran" and "not computed again" not in out[label]["report"], out[label]
    assert out["regen seed 3 again"]["codes"] == out["regen room"]["codes"]  # seed 3's music, computed anew


KEPT_EACH = SETUP + RUN + r"""
import errno, gc, weakref
from comfy_api.latest import io

def full_disk(child, out, **kwargs):
    raise artifacts.write_error(OSError(errno.ENOSPC, "No space left on device"), f"could not save the song to {out}")

def unlistable(self):  # output/yue2 lost its read permission (mode -wx) while the song was computed
    if self == root:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))
    return real_iterdir(self)

def node(uid):  # the class ComfyUI's executor calls, with the node's id among its hidden inputs
    return edit_nodes.YuE2Regenerate.PREPARE_CLASS_CLONE({io.Hidden.unique_id: uid})

# two Regenerate nodes of one graph: node 7's save fails; node 9 (another cut and seed, before 7 in the graph's
# order) runs when the prompt is queued again; node 7 then still saves what it computed
run("7 full", lambda: node("7").execute(model, song, "token 4", 3, 0.0, ""), full_disk)
run("9 other", lambda: node("9").execute(model, song, "token 5", 4, 0.0, ""))
run("7 again", lambda: node("7").execute(model, song, "token 4", 3, 0.0, ""))
# a folder that cannot be listed fails the save as a full disk does: said plainly, the music kept
run("unlistable", lambda: node("7").execute(model, song, "token 4", 5, 0.0, ""), iterdir=unlistable)
run("listable", lambda: node("7").execute(model, song, "token 4", 5, 0.0, ""))
# what a kept song holds goes with the model, song or score it matched (a changed checkpoint: never again matched)
class Stand:
    pass
payload, gone = Stand(), Stand()
seen = weakref.ref(payload)
edit_nodes._UNSAVED[("YuE2 Regenerate", "11")] = edit_nodes._Unsaved((gone, song, None), (1,), (payload,))
del payload, gone
gc.collect()
out["payload freed"] = seen() is None
print("RESULT " + json.dumps(out))
"""


def test_a_kept_song_is_each_nodes_own_and_goes_with_its_inputs(in_host, tmp_path):
    """Review of stop 53's kept songs (`edit_nodes._Unsaved`): they were kept per node type, so a second Regenerate
    of the graph, run before the failed one when the prompt was queued again (its seed control had changed its
    seed), dropped the song; a folder that cannot be listed (PermissionError from `next_song_dir`) failed the save
    with a bare `[Errno 13]` and lost the music; a kept song whose checkpoint, song or score was gone (never to
    match again) still held its audio until that node ran again. Now each node keeps its own (ComfyUI's node id),
    the unlistable folder is a failed save like a full disk, and a kept song is let go with its inputs."""
    from synthetic_cache import synthetic_link
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    synthetic_link(str(ckpts / "tiny.safetensors"), "tiny", "bf16")
    out = in_host(KEPT_EACH, ckpts)
    assert "is kept in memory" in out["7 full"]["said"] and out["7 full"]["new"] == [], out["7 full"]
    assert out["9 other"]["said"] == "ran" and out["9 other"]["loads"] == 1, out["9 other"]
    again = out["7 again"]
    assert again["said"] == "ran" and again["loads"] == 0 and len(again["new"]) == 1, again
    assert "not computed again" in again["report"], again["report"]
    unlistable = out["unlistable"]
    assert unlistable["said"].startswith("ValueError: ") and "Permission denied" in unlistable["said"] and \
        "is kept in memory" in unlistable["said"] and unlistable["loads"] == 1, unlistable
    listable = out["listable"]
    assert listable["said"] == "ran" and listable["loads"] == 0 and len(listable["new"]) == 1, listable
    assert out["payload freed"] is True


def test_a_save_song_that_failed_saves_without_computing_again(comfy, comfy_server, checkpoints):
    """YuE2 Save Song cannot check the room before the music is computed (the Composer and the Renderer, before it,
    know no folder), and needs not: a Save Song that fails leaves the nodes before it in ComfyUI's cache, so the
    same prompt queued again once the folder can take the song runs Save Song alone and saves the music computed
    the first time. Shown with output/yue2 a file (Save Song's own refusal; a full disk fails the same node)."""
    from nodes_testlib import TINY, codes, run, run_error, saved_dirs
    prompt = {"1": {"class_type": "YuE2CheckpointLoader", "inputs": {"ckpt_name": TINY}},
              "2": {"class_type": "YuE2Composer", "inputs": {"model": ["1", 0], "style": "room", "lyrics": "la",
                                                             "cot": "off", "seed": 5309, "max_seconds": 1.0}},
              "3": {"class_type": "YuE2SaveSong", "inputs": {"tokens": ["2", 1], "name": "after_full"}}}
    root = comfy_server.output_dir / "yue2"
    aside = comfy_server.output_dir / "yue2.aside"
    if root.exists():
        root.rename(aside)
    try:
        root.write_text("in the way")
        node, kind, message = run_error(comfy, prompt)
        assert node == "YuE2SaveSong" and "is a file, not a folder" in message, message
        root.unlink()
        entry = run(comfy, prompt)
        cached = {n for k, data in entry["status"]["messages"] if k == "execution_cached" for n in data["nodes"]}
        assert {"1", "2"} <= cached and "3" not in cached, entry["status"]  # the Composer did not run again
        (song_dir,) = saved_dirs(entry, comfy_server.output_dir)
        assert len(codes(song_dir)) == 25
    finally:  # the session's other songs back in place
        if root.is_file():
            root.unlink()
        if aside.exists():
            if root.is_dir():
                for p in root.iterdir():
                    p.rename(aside / p.name)
                root.rmdir()
            aside.rename(root)
