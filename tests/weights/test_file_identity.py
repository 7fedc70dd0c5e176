"""A weights file swapped for another of the same size with its modification time kept is seen (break-it review,
stop 43: the loaders' and hash caches' (size, mtime) keys missed it): `content_sample` and
`file_sha256` key on `stat_identity` (size, mtime, inode, ctime); `file_state` on `file_identity` (a chmod or hard
link, the ctime alone, is no change)."""
import os
import shutil
import time

from yue2_core.weights.checkpoint import content_sample, file_identity, file_state
from yue2_core.weights.lora.record import file_sha256


def _pair(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(1 << 16))
    b.write_bytes(os.urandom(1 << 16))
    st = a.stat()
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    return a, b, st


def test_a_copy_over_the_file_with_its_time_kept_is_a_new_state_and_hash(tmp_path):
    a, b, st = _pair(tmp_path)
    state, sample, digest = file_state(str(a)), content_sample(str(a)), file_sha256(str(a))
    time.sleep(0.05)  # past the file system's timestamp tick
    shutil.copy2(b, a)  # cp -p: same inode, same size, the mtime kept; only the change time moves
    now = a.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert file_state(str(a)) != state
    assert content_sample(str(a)) != sample
    assert file_sha256(str(a)) == file_sha256(str(b)) != digest


def test_a_rename_over_the_file_with_its_time_kept_is_a_new_state(tmp_path):
    a, b, st = _pair(tmp_path)
    state, digest = file_state(str(a)), file_sha256(str(a))
    os.replace(b, a)  # mv: another inode, same size and mtime
    assert a.stat().st_mtime_ns == st.st_mtime_ns and a.stat().st_size == st.st_size
    assert file_state(str(a)) != state and file_sha256(str(a)) != digest


def test_a_folder_state_lists_each_file_identity(tmp_path):
    a, b, _ = _pair(tmp_path)
    state = file_state(str(tmp_path))
    assert state == (("a.bin", *file_identity(str(a))), ("b.bin", *file_identity(str(b))))
    assert file_state(str(tmp_path / "missing")) == ()


def test_a_chmod_or_hard_link_is_no_change_of_the_file(tmp_path):
    """Only the ctime moves (a permissions fix, a backup / sync tool's xattrs, a dedup tool's hard link): the same
    bytes, so no "changed on disk" in the middle of a run (the VAE file's key, the checkpoint's `file_state`)."""
    from yue2_core.weights.vae_files import _file_key
    a, _, st = _pair(tmp_path)
    state, folder, key = file_state(str(a)), file_state(str(tmp_path)), _file_key([str(a)])
    time.sleep(0.05)  # past the file system's timestamp tick
    os.chmod(a, 0o600)
    os.link(a, tmp_path / "a-link.bin")
    assert a.stat().st_ctime_ns != st.st_ctime_ns
    assert file_state(str(a)) == state and _file_key([str(a)]) == key
    assert [e for e in file_state(str(tmp_path)) if e[0] != "a-link.bin"] == list(folder)
