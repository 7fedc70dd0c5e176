"""A signal during the FLAC encode (break-it review, stop 39): soundfile writes into memory through Python
callbacks (cffi), and cffi prints and drops an exception raised inside one — a Ctrl+C / SIGTERM whose handler raised
there was lost, and the encode could return broken bytes that were sealed as a complete song. `artifacts.flac_bytes`
now holds the signals during the encode, delivers them after it, and decodes what it wrote once."""
from __future__ import annotations

import io
import os
import signal
import types

import pytest
import torch

from yue2_core import artifacts
from yue2_core.errors import ArtifactError


def _signalling_bytesio(after_calls: int, signum: int):
    """An io namespace whose first BytesIO sends `signum` to this process from inside its `after_calls`-th tell()
    (what libsndfile's virtual-io callbacks call), as a Ctrl+C at that moment would."""
    state = {"calls": 0, "armed": True}

    class Buffer(io.BytesIO):
        def tell(self):
            state["calls"] += 1
            if state["armed"] and state["calls"] == after_calls:
                state["armed"] = False
                os.kill(os.getpid(), signum)
            return super().tell()

    return types.SimpleNamespace(BytesIO=Buffer)


@pytest.mark.parametrize("after_calls", [1, 3, 5])
def test_a_ctrl_c_inside_the_encoder_callbacks_is_delivered_after_it(monkeypatch, after_calls):
    audio = torch.rand(2, 48_000) * 2 - 1
    monkeypatch.setattr(artifacts, "io", _signalling_bytesio(after_calls, signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):  # was swallowed by cffi: flac_bytes returned (possibly broken) bytes
        artifacts.flac_bytes(audio)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the program's handler is back


def test_the_encoded_audio_is_decoded_once_and_a_mismatch_refused(monkeypatch):
    audio = torch.rand(2, 4_800) * 2 - 1
    data = artifacts.flac_bytes(audio)
    import soundfile as sf
    assert sf.read(io.BytesIO(data))[0].shape == (4_800, 2)
    real_write = sf.write
    monkeypatch.setattr(sf, "write", lambda buf, d, *a, **k: real_write(buf, d[:100], *a, **k))  # a short write
    with pytest.raises(ArtifactError, match="wrote 100 frames × 2 channels at 48000 Hz for 4800 × 2"):
        artifacts.flac_bytes(audio)
