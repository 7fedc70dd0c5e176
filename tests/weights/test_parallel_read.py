"""`checkpoint.open_tensors` reads a large tensor as several ranges on several threads (`_READERS`, from
`_PARALLEL_BYTES`): the bytes must be the file's, whatever the split, and a file cut short under a range is the same
one-line CheckpointError as for a plain read."""
import threading

import pytest
import torch
from safetensors.torch import save_file

import yue2_core.weights.checkpoint as ck
from yue2_core.errors import CheckpointError


@pytest.fixture
def small_split(monkeypatch):
    monkeypatch.setattr(ck, "_PARALLEL_BYTES", 1000)
    monkeypatch.setattr(ck, "_READERS", 3)
    monkeypatch.setattr(ck, "_READ_CHUNK", 777)  # reads shorter than a range: the loop inside each range too


def test_ranges_read_on_threads_give_the_files_bytes(tmp_path, small_split):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(101, 33, generator=g).to(torch.bfloat16), "b": torch.randn(7, generator=g),
               "c": torch.randint(-127, 128, (257, 19), generator=g, dtype=torch.int8), "d": torch.zeros(0)}
    path = str(tmp_path / "t.safetensors")
    save_file(tensors, path)
    with ck.open_tensors(path) as f:
        for k, t in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k
        assert torch.equal(f.get_slice("a")[3:90], tensors["a"][3:90])
    # nothing left that the command line's exit would wait for: it joins every non-daemon thread (a pool's idle
    # workers hung `generate` at its end, CI stop 43)
    assert not [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon
                and t.name.startswith("yue2")], threading.enumerate()


def test_a_file_cut_short_under_a_range_is_one_error(tmp_path, small_split):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(300, 40)}, str(path))
    with ck.open_tensors(str(path)) as f:
        with open(path, "r+b") as w:
            w.truncate(path.stat().st_size - 5000)  # the last ranges end past the file now
        with pytest.raises(CheckpointError, match="cut short or is being rewritten"):
            f.get_tensor("a")
