"""Typed errors of the engine. Every error a user can cause is one of these, with a message that says what was
wrong and what is accepted. Callers (the CLI, the ComfyUI nodes) catch `YuE2Error` and show its text."""
import errno
import sys
import traceback

# errnos of a flock that no other holder refused: the file system takes no locks (an NFS mount without its lock
# daemon: ENOLCK; some FUSE / SMB mounts: EOPNOTSUPP, ENOSYS, EINVAL) — `artifacts.reserve_output`,
# `weights.synthetic._lock`
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})


class YuE2Error(Exception):
    """Base class of every error the pack raises on purpose."""


class CheckpointError(YuE2Error):
    """The file is not a readable YuE2 all-in-one checkpoint (not safetensors, truncated, wrong model, bad shapes,
    unknown quantization marker, failed int8 self-check)."""


class DamagedWeightsError(CheckpointError):
    """Weights recognised for what they are (a VAE decoder, a vendor model folder) whose values or config numbers
    cannot be used: NaN/inf tensors, a zero-norm weight_v channel, a config number out of range. `inspect` names the
    kind and the fault instead of "neither a checkpoint, a VAE nor an adapter"."""


class TokenizerError(YuE2Error):
    """The embedded tokenizer blob is missing or is not a valid Hugging Face `tokenizers` JSON."""


class RequestError(YuE2Error, ValueError):
    """A song request or sampling setting is outside what the runtime accepts (runtime.md §2)."""


class BudgetError(RequestError):
    """Prompt + generation budget does not fit the 24,576-token context; the message says how much fits."""


class ScoreError(RequestError):
    """An ABC score is empty, has ids outside [0, 151643), or fails validation."""


class ArtifactError(YuE2Error):
    """A song directory cannot be written or read (exists, unwritable, hash mismatch, unsafe name)."""


class DiskFullError(ArtifactError):
    """A write failed for lack of space on the device (ENOSPC) or of the user's quota (EDQUOT): `batch` stops
    computing songs it could not save (the songs already saved stay; `--resume` continues once there is room)."""


class NumericalError(YuE2Error, FloatingPointError):
    """The model produced non-finite numbers (NaN/inf logits, latents or audio): the weights are damaged or do not
    belong to this model. Raised instead of sampling or saving garbage."""


class Cancelled(YuE2Error):
    """Generation was cancelled by the caller; nothing partial was kept."""


def brief(exc: BaseException) -> str:
    """"Type: first line of the message", at most 200 characters — how a fallback names the failure it recovered
    from (in a warning and in the result's timing)."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def quoted(text, quote: bool = True, limit: int = 120) -> str:
    """`text` (repr'd when `quote`) for a message: a longer one keeps its first and last characters around "…" and
    says its length — the start says where a path is, the end which file (a batch row's abc_path, stop 42;
    --output, stop 46)."""
    shown = repr(text) if quote else str(text)
    if len(shown) <= limit:
        return shown
    size = len(text) if isinstance(text, str) else len(shown)
    return f"{shown[:limit * 2 // 3]}…{shown[-(limit // 3):]} ({size:,} characters)"


def json_too_large(path) -> str | None:
    """"is N bytes: more than a … JSON file can be (at most …)" when the file at `path` is larger than
    constants.MAX_CONFIG_JSON, else None (also when it cannot be stat'ed: the read then says why). Checked before a
    config.json, adapter_config.json, weights manifest or shard index is read whole (break-it review, stop 48)."""
    import os
    from .constants import MAX_CONFIG_JSON
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):
        return None
    if size <= MAX_CONFIG_JSON:
        return None
    return (f"is {size:,} bytes: more than such a JSON file can be (at most {MAX_CONFIG_JSON:,}; the release's are a "
            "few kilobytes) — a damaged file, or another file under this name")


class DuplicateJSONKey(ValueError):
    """Raised by `unique_keys` for a key one JSON object names twice; `name` is that key (long ones shortened)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name if len(name) <= 200 else f"{name[:100]}…{name[-60:]}"


def unique_keys(pairs: list) -> dict:
    """json's object_pairs_hook: a dict, or DuplicateJSONKey for a key given twice in one object. json.loads keeps
    the last silently (so does the safetensors library), so a reader that keeps the first sees another value: a
    safetensors header naming a tensor twice, a shard index listing a tensor twice (break-it review, stop 51)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateJSONKey(key)
        out[key] = value
    return out


def json_number_too_long(exc: BaseException) -> str | None:
    """For an exception json.load / json.loads raised: "a number too long to read: an integer of more than 4,300
    digits" when it is Python's int-string conversion limit (`sys.get_int_max_str_digits()`, 4,300 by default:
    an integer with more digits in valid JSON raises a plain ValueError, "Exceeds the limit … use
    sys.set_int_max_str_digits()"), else None. Callers name it instead of "not valid JSON" (leftover of the stop-45
    break-it reviews)."""
    if type(exc) is not ValueError or "integer string conversion" not in str(exc):  # JSONDecodeError: a subclass
        return None
    return f"a number too long to read: an integer of more than {sys.get_int_max_str_digits():,} digits"


def release_frames(exc: BaseException) -> None:
    """Drop the local variables of the finished frames in `exc`'s traceback and in those of its chained exceptions.

    A host that keeps a failed or cancelled call's exception (ComfyUI keeps it until its next prompt) otherwise pins
    every tensor the engine's frames held: a VAE decode's half-written waveform and tile activations, hundreds of MB,
    on a GPU in VRAM. Cleared frames still format (file, line, function name), so error reports are unchanged. Frames
    still executing (the caller's own) are skipped."""
    seen = set()
    todo = [exc]
    while todo:  # both links: `raise X from Y` inside an `except Z` chains Y as the cause and Z as the context
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        todo += [exc.__cause__, exc.__context__]


class AdapterError(YuE2Error, ValueError):
    """A LoRA/LoKr adapter or an alternate weight file (VAE, vendor folder) cannot be applied: not a YuE2 adapter,
    a layout we do not apply, shapes that do not fit, non-finite values, keys that match nothing."""


class AdapterGeometryError(AdapterError):
    """An adapter made for a model of another geometry: a shape or a layer index that does not fit the checkpoint's
    dims (`inspect` then suggests --model; every other AdapterError is the file's own fault)."""