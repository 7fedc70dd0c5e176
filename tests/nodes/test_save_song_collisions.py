"""YuE2 Save Song (and Regenerate / Continue's save) while another writer saves into the same output folder — two
ComfyUI servers, one per GPU, sharing output/ (never-lose-work review, stop 52; docs/bad_inputs.md §43). Run in the
installed host's python with the pack loaded as ComfyUI loads it, no server (the output folder is the test's own)."""
from __future__ import annotations

HARNESS = r'''
import contextlib
from pathlib import Path
sys.path.insert(0, os.path.join(repo, "tests", "robust"))
from robust_helpers import make_song, snapshot
from yue2_core.artifacts import load_song, rename_gate, save_song
from yue2_nodes import edit_nodes, songs
work = Path(ckpts).parent
folder_paths.set_output_directory(str(work / "output"))
root = songs.songs_root()
root.mkdir(parents=True)
out = {"theirs": []}

collide = {"prefix": None, "left": 0, "busy": False}

@contextlib.contextmanager
def another_server_saves_first():
    # entered right before every rename on this thread: for up to three of the node's renames, another server's
    # save takes the number the node chose (that nested save passes through here too, and is let through)
    if collide["left"] and not collide["busy"]:
        collide["left"] -= 1
        collide["busy"] = True
        try:
            path = save_song(make_song(seed=100 + len(out["theirs"])), songs.next_song_dir(root, collide["prefix"]))
            out["theirs"].append(path.name)
        finally:
            collide["busy"] = False
    yield

def run(call):
    try:
        return ["ran", call()]
    except Exception as exc:
        return [f"{type(exc).__name__}: {exc}", None]

song = make_song(seed=7)
collide.update(prefix="song", left=3)
with rename_gate(another_server_saves_first):
    status, result = run(lambda: songs.YuE2SaveSong.execute(song.tokens, "song"))
out["save"] = status
before = {name: snapshot(root / name) for name in out["theirs"]}
collide.update(prefix="take", left=3)
with rename_gate(another_server_saves_first):
    status, path = run(lambda: edit_nodes._save(make_song(seed=8), {"parent": "x"}, "take"))
out["take"] = [status, path.name if path is not None else None]
out["theirs untouched"] = all(snapshot(root / name) == before[name] for name in before)
out["folders"] = sorted(p.name for p in root.iterdir())
out["seeds"] = {p.name: load_song(p).tokens.seed for p in root.iterdir() if not p.name.startswith(".")}
print("RESULT " + json.dumps(out))
'''


def test_save_song_moves_to_the_next_number_another_server_did_not_take(in_host, tmp_path):
    """Before: Save Song wrote the song, found its number taken at the rename, wrote it again under the next one, and
    after the third collision failed with "could not find a free song folder for 'song'" — the song computed in
    that prompt was lost (4 writers saving 8 songs each into one folder: 13 of 32 lost; 2 writers: 2 of 16). Now the
    finished song is renamed to the next free number: saved, and every other server's song untouched. Regenerate /
    Continue's save (`edit_nodes._save`) likewise."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    out = in_host(HARNESS, ckpts)
    assert out["save"] == "ran", out
    assert out["take"][0] == "ran", out
    assert out["theirs"] == ["song_00001", "take_00001"], out  # one collision each, both survived
    assert out["theirs untouched"] is True
    assert out["folders"] == ["song_00001", "song_00002", "take_00001", "take_00002"], out
    assert out["seeds"] == {"song_00001": 100, "song_00002": 7, "take_00001": 101, "take_00002": 8}
