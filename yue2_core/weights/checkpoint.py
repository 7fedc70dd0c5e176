"""Reading YuE2 checkpoints: the Comfy-Org all-in-one safetensors files (checkpoint_format.md §1), and — through
`vendor.py` — the vendor's split folder (m-a-p/YuE2-3B + m-a-p/YuE2-Vae, weights_and_lora.md §4–§5).

`inspect_checkpoint(path)` reads only headers: it identifies the format by tensor names and dtypes (never by file
name or metadata), derives every dimension from tensor shapes and checks that all YuE2 tensor groups are present
with consistent shapes. Whatever the layout, the result names every tensor by its Comfy key (`entries`); a
`TensorSource` says where each one's data lie (one file under the same name, or rows of vendor tensors to
concatenate). `load_ar/load_nar/load_vae` then stream the tensors of each part (AR expert under `text_encoders.`, NAR
expert under `model.diffusion_model.`, VAE decoder under `vae.decoder.`) from that source straight into modules
built on the meta device, so the weights are never held twice. Only safetensors are ever read (no pickle).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch

from ..ar import ARModel
from ..constants import CONTEXT, CONVROT_GROUP, HOP, LATENT_DIM, VAE_LENGTH_TRIM
from ..errors import CheckpointError, DamagedWeightsError, DuplicateJSONKey, json_number_too_long, unique_keys
from ..layers import ModelDims
from ..nar import NARModel
from .quant import MAX_GROUP, parse_marker
from .tokenizer import YuE2Tokenizer
from ..vae import VAEConfig, VAEDecoder, length_trim

AR = "text_encoders."
NAR = "model.diffusion_model."
VAE = "vae."
TOKENIZER_KEY = "text_encoders.yue2_tokenizer_json"
LAYER_LEAVES = ("input_layernorm.weight", "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
                "self_attn.q_norm.weight", "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                "mlp.gate_up_proj.weight", "mlp.down_proj.weight")
GROUPS = {  # what a YuE2 all-in-one file must hold (checkpoint_format.md §1.3–§1.8)
    "AR expert (text_encoders.model.*)": [AR + "model.embed_tokens.weight", AR + "model.norm.weight",
                                          AR + "model.lm_head.weight", AR + "model.layers.0.self_attn.qkv_proj.weight"],
    "NAR expert (model.diffusion_model.*)": [NAR + "vae2llm.weight", NAR + "llm2vae.weight",
                                             NAR + "latent_pos_embed.pe", NAR + "time_embedder.mlp.0.weight",
                                             NAR + "time_embedder.mlp.2.weight", NAR + "model.norm.weight",
                                             NAR + "model.layers.0.self_attn.qkv_proj.weight"],
    "VAE decoder (vae.decoder.*)": [VAE + "decoder.layers.0.weight_v", VAE + "decoder.layers.6.layers.1.weight_v",
                                    VAE + "decoder.layers.8.weight_v"],
    "embedded tokenizer (text_encoders.yue2_tokenizer_json)": [TOKENIZER_KEY],
}
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "BOOL": torch.bool}
_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1,
          "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple
    start: int
    end: int


class FileSource:
    """Tensor source of a Comfy-Org all-in-one file: Comfy key `k` is the file's tensor `k`."""

    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def open(self, device: str = "cpu"):
        """Yields `get(comfy_key) -> torch.Tensor` (on `device`, stored dtype). CheckpointError on read failures."""
        with open_tensors(self.path, device) as f:
            yield f.get_tensor


class SplitSource:
    """Tensor source of a split checkpoint (the vendor folder): Comfy key `k` is the row-concatenation (dim 0) of
    `parts[k]` = ((file, key), …) — one pair for a renamed tensor, several for a fused one (q‖k‖v, gate‖up).
    `before_read(file)` runs once per file before its first tensor is read (the vendor's manifest hash check)."""

    def __init__(self, parts: dict, before_read=None):
        self.parts, self.before_read = parts, before_read

    def files(self, keys=None) -> list[str]:
        """The files holding `keys` (default: every key), in first-use order."""
        out = {}
        for key in (self.parts if keys is None else keys):
            for file, _ in self.parts.get(key, ()):
                out[file] = None
        return list(out)

    @contextlib.contextmanager
    def open(self, device: str = "cpu"):
        """Yields `get(comfy_key) -> torch.Tensor`; each file is opened (and checked) on first use, closed on exit.
        KeyError for a key the source does not hold (as safetensors' own handle)."""
        with contextlib.ExitStack() as stack:
            handles = {}

            def read(file: str, key: str) -> torch.Tensor:
                if file not in handles:
                    if self.before_read is not None:
                        self.before_read(file)
                    handles[file] = stack.enter_context(open_tensors(file, device))
                return handles[file].get_tensor(key)

            def get(comfy_key: str) -> torch.Tensor:
                pieces = [read(file, key) for file, key in self.parts[comfy_key]]
                return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)

            yield get


@dataclass
class CheckpointInfo:
    """What `inspect_checkpoint` found. `format` is "bf16" (plain float weights) or "int8" (ConvRot markers);
    `quant` maps module names of each part (relative to its prefix) to the ConvRot group size. `layout` is "comfy"
    (one all-in-one file at `path`) or "vendor" (a m-a-p/YuE2-3B folder at `path`, its VAE folder in
    `files["vae"]`). `entries` always uses Comfy key names (a vendor folder's fused tensors are virtual entries);
    `source` reads them (`FileSource` / `SplitSource`)."""

    path: str
    format: str
    dims: ModelDims
    vae: VAEConfig | None  # None: a vendor folder read without its VAE (`vendor.inspect_vendor` own_vae)
    part_dtypes: dict
    tensors: int
    elements: int
    data_bytes: int
    quantized_modules: int
    tokenizer_bytes: int
    metadata: dict
    quant_ar: dict = field(default_factory=dict)
    quant_nar: dict = field(default_factory=dict)
    entries: dict = field(default_factory=dict, repr=False)
    layout: str = "comfy"
    files: dict = field(default_factory=dict)  # vendor: {"model", "vae", "tokenizer"} paths
    source: object = field(default=None, repr=False)
    # the content samples `to_dict` records, taken once per read: a record made later (a song saved after its
    # render) names the file that was read, not one put at its path since (break-it, stop 41)
    samples: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        if self.source is None:
            self.source = FileSource(self.path)

    def summary(self) -> str:
        d = self.dims
        params = f"{self.elements / 1e9:.2f} B" if self.elements > 1e8 else f"{self.elements / 1e6:.1f} M"
        synth = " — SYNTHETIC random weights" if "yue2_synthetic" in self.metadata else ""
        kind = "all-in-one" if self.layout == "comfy" else "vendor split folder (m-a-p/YuE2-3B layout)"
        tok = (f"tokenizer {self.tokenizer_bytes} bytes" if self.layout == "comfy" else
               f"tokenizer qwen.tiktoken ({self.tokenizer_bytes} bytes)"
               + (f"; VAE {self.files['vae']}" if self.files.get("vae") else ""))
        return (f"YuE2 {self.format} {kind} ({params} elements, {self.tensors} tensors, "
                f"{self.quantized_modules} int8 modules){synth}: hidden {d.hidden}, {d.layers} layers, "
                f"{d.heads}/{d.kv_heads} heads × {d.head_dim}, FFN {d.ffn}, vocab {d.vocab}; "
                f"AR {self.part_dtypes['ar']}, NAR {self.part_dtypes['nar']}, VAE {self.part_dtypes['vae']}; {tok}")

    def to_dict(self) -> dict:
        """JSON-serialisable description (songs record it in config.json). An all-in-one file also records
        `sample_sha256` (`content_sample`), so a later run can tell another file of the same layout at that path; a
        vendor folder records `vae_sample_sha256` (`vendor.vae_folder_sample`) of its VAE folder, so a re-render finds
        that VAE again (`vendor.recorded_vae_folder`) and tells another one at its path. Each sample is taken on the
        first call and kept (`samples`): call it when the file is read (the ComfyUI loader does, before reading a
        part)."""
        out = {"path": os.path.abspath(self.path),  # absolute: a song re-renders from any folder
               "format": self.format, "layout": self.layout, "dims": self.dims.__dict__,
               "part_dtypes": self.part_dtypes, "tensors": self.tensors, "elements": self.elements,
               "data_bytes": self.data_bytes, "quantized_modules": self.quantized_modules,
               "tokenizer_bytes": self.tokenizer_bytes, "synthetic": "yue2_synthetic" in self.metadata}
        if self.vae is not None:  # None: a vendor folder read without its VAE (another one decodes)
            out["vae_blocks"] = [list(b) for b in self.vae.blocks]
        if self.layout != "comfy":
            out["files"] = {k: os.path.abspath(v) for k, v in self.files.items()}
            if self.files.get("vae"):
                from .vendor import vae_folder_sample
                if "vae_sample_sha256" not in self.samples:
                    self.samples["vae_sample_sha256"] = vae_folder_sample(self.files["vae"])
                out["vae_sample_sha256"] = self.samples["vae_sample_sha256"]
        else:
            if "sample_sha256" not in self.samples:
                self.samples["sample_sha256"] = content_sample(self.path)
            out["sample_sha256"] = self.samples["sample_sha256"]
        return out


def stat_identity(st: os.stat_result) -> tuple:
    """(size, mtime_ns, inode, ctime_ns) of a stat result: what tells one file's bytes from a replacement's. Size and
    modification time alone miss a file swapped for one of the same size whose time was kept (`cp -p`, `rsync -t`,
    `mv` of a copy made with `touch -r`; break-it review, stop 43): the swap by rename has another inode, the copy
    over the old file a new change time (which only the kernel sets)."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def file_identity(path: str, st: os.stat_result | None = None) -> tuple:
    """(size, mtime_ns, inode, `content_sample`) of a file: what tells its bytes from a replacement's without taking
    a change of its metadata alone for one. A copy over the file with its size and time kept (`cp -p`) changes
    the sampled bytes, a rename over it the inode; a chmod, chown, hard link, xattr or ACL (a backup or sync tool, a
    permissions fix) moves only the ctime and is not a change — with the ctime compared, such a file was "changed on
    disk" in the middle of a run, its VAE or NAR refused after the whole AR work. The sample is cached per
    `stat_identity` (taken again, milliseconds, only when the ctime moved)."""
    st = os.stat(path) if st is None else st
    return (st.st_size, st.st_mtime_ns, st.st_ino, content_sample(path))


def file_state(path: str) -> tuple:
    """`file_identity` of a file, or of every file directly in a folder (a vendor model folder), by name; () when
    it cannot be read. What the nodes compare to notice a checkpoint or adapter replaced on disk (ComfyUI reuses a
    cached node output whose inputs, the file name, did not change)."""
    try:
        if os.path.isdir(path):
            return tuple((e.name, *file_identity(e.path, e.stat()))
                         for e in sorted(os.scandir(path), key=lambda e: e.name) if e.is_file())
        return file_identity(path)
    except OSError:
        return ()


def checkpoint_state(info) -> tuple:
    """`file_state` of a checkpoint (`CheckpointInfo`) and of a vendor layout's other folders (its VAE, tokenizer):
    what a loader compares before and after reading parts, so the parts never come from two files."""
    return tuple(file_state(p) for p in (info.path, *sorted(set(info.files.values()) - {info.path})))


SAMPLE_CHUNKS, SAMPLE_BYTES = 64, 4096
_SAMPLES: dict = {}  # (abspath, *stat_identity) → content_sample's digest


def content_sample(path: str) -> str | None:
    """sha256 over the file's size and SAMPLE_CHUNKS reads of SAMPLE_BYTES spread evenly over the whole file
    (256 KiB of a 3.7 GB checkpoint: milliseconds, where a full hash takes seconds). Two files of one layout (same
    header) with other weights — another download, a fine-tune, a re-seeded synthetic file — differ here unless
    they agree on every sampled byte. Cached per (path, `stat_identity`); None when the file cannot be read."""
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), *stat_identity(st))
        if key not in _SAMPLES:
            import hashlib
            digest = hashlib.sha256(str(st.st_size).encode())
            step = max(1, st.st_size // SAMPLE_CHUNKS)
            with open(path, "rb") as f:
                for i in range(SAMPLE_CHUNKS):
                    f.seek(min(i * step, max(0, st.st_size - SAMPLE_BYTES)))
                    digest.update(f.read(SAMPLE_BYTES))
            _SAMPLES[key] = digest.hexdigest()
        return _SAMPLES[key]
    except OSError:
        return None


def read_header(path: str) -> tuple[dict, dict, int]:
    """Parse and check a safetensors header: returns ({name: TensorEntry}, metadata, data start offset).
    Raises CheckpointError for a missing/unreadable file, a non-safetensors file or a truncated one."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{path}: not a safetensors file (header length {n} does not fit a "
                                      f"{size}-byte file)")
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateJSONKey as exc:
        raise CheckpointError(f"{path}: its header names {exc.name!r} twice; the safetensors format disallows a "
                              "name given twice (readers differ in which of the two they take, so the file does not "
                              "say which tensor it holds). The tool that wrote it did not follow the format: save it "
                              "again with safetensors (e.g. safetensors.torch.save_file)") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8 / JSON, a number past Python's digit cap, absurd nesting
        if too_long := json_number_too_long(exc):
            raise CheckpointError(f"{path}: not a safetensors file (its header holds "
                                  f"{too_long})") from None
        raise CheckpointError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (header is not a JSON object)")
    meta = header.pop("__metadata__", None)
    meta = {} if meta is None else meta
    bad = ("is not a JSON object" if not isinstance(meta, dict) else
           next((f"value of {k!r} is {type(v).__name__} {json.dumps(v)[:40]}" for k, v in meta.items()
                 if not isinstance(v, str)), None))
    if bad:  # the safetensors reader refuses such a file: say why, not "download it again"
        raise CheckpointError(f"{path}: its __metadata__ {bad}; the safetensors format allows only text values "
                              "there, and the safetensors reader refuses the file. The tool that wrote it did not "
                              "follow the format: save it again with safetensors (e.g. safetensors.torch.save_file "
                              "with metadata={key: str(value)})")
    entries, data_end = {}, 0
    for name, e in header.items():
        # safetensors entries: {"dtype": str, "shape": [int, ...], "data_offsets": [int, int]} — exact JSON integers
        # (no floats such as 1e999/Infinity, no booleans, no strings)
        if not (isinstance(e, dict) and isinstance(e.get("dtype"), str) and isinstance(e.get("shape"), list)
                and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
                and all(type(v) is int for v in (*e["shape"], *e["data_offsets"]))):
            raise CheckpointError(f"{path}: malformed header entry for tensor {name!r}")
        dtype, shape, (start, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
        if dtype not in _BYTES or any(s < 0 for s in shape) or not 0 <= start <= end:
            raise CheckpointError(f"{path}: malformed header entry for tensor {name!r} ({dtype}, {shape})")
        count = 1
        for s in shape:
            count *= s
        if end - start != count * _BYTES[dtype]:
            raise CheckpointError(f"{path}: tensor {name!r} has {end - start} bytes for {dtype} {list(shape)}")
        entries[name] = TensorEntry(dtype, shape, start, end)
        data_end = max(data_end, end)
    if 8 + n + data_end > size:
        raise CheckpointError(f"{path}: the file is truncated — its header describes {8 + n + data_end:,} bytes, "
                              f"the file has {size:,}. Download it again.")
    return entries, meta, 8 + n


@contextlib.contextmanager
def open_tensors(path: str, device: str = "cpu"):
    """`safetensors.safe_open` whose own refusals (its stricter layout rules, I/O errors while reading) become
    CheckpointError instead of escaping as SafetensorError. It yields a handle (`_ReadTensors`) whose tensors are read
    from the file with ordinary reads into memory they own, never from the reader's memory map: a file cut short or
    rewritten in place while it is read (`cp other.safetensors model.safetensors` over it) gives a CheckpointError
    — with a memory map the read ended the process with SIGBUS, a ComfyUI server and its queue with it (break-it
    review, stop 43)."""
    from safetensors import SafetensorError, safe_open
    fd = None
    try:
        name = os.fspath(path)
        if not _utf8(name):  # the reader takes UTF-8 paths only: open the file and hand it the /proc alias
            fd = os.open(name, os.O_RDONLY)
            name = f"/proc/self/fd/{fd}"
            if not os.path.exists(name):
                raise CheckpointError(f"{path!r}: the path holds bytes that are not UTF-8 and the safetensors reader "
                                      "needs a UTF-8 path: rename the file or its folder")
        with safe_open(name, framework="pt", device=device) as f, open(name, "rb", buffering=0) as raw:
            yield _ReadTensors(f, raw, path, device)
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file — the safetensors reader refuses it "
                              f"({exc}). Download it again.") from None
    finally:
        if fd is not None:
            os.close(fd)


_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                 "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                 "BOOL": torch.bool, "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
                 "F8_E5M2": getattr(torch, "float8_e5m2", None)}
_READ_CHUNK = 1 << 30  # bytes per read call (Linux reads at most ~2 GiB at once)
_PARALLEL_BYTES = 64 << 20  # tensors from this size are read by `_READERS` threads
_READERS = max(1, min(4, os.cpu_count() or 1))


def _on_threads(fn, items) -> None:
    """`fn(item)` for each item, each on a daemon thread of its own, joined; the first exception is raised here.
    Threads of a call, not a pool: the command line joins every non-daemon thread before it exits, and a pool's
    idle workers would wait there for ever (CI, stop 43)."""
    errors: list = []

    def run(item):
        try:
            fn(item)
        except BaseException as exc:  # handed to the caller
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(item,), name="yue2-read", daemon=True) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _ReadTensors:
    """What `open_tensors` yields: `get_tensor(key)` and `get_slice(key)[a:b]` (rows of dim 0) as safetensors'
    handle gives them, read with ordinary reads from `raw` (the file opened beside the reader) at the offsets of the
    header read from that same file. A read that comes up short (the file was cut short meanwhile) is a
    CheckpointError. A dtype torch has no type for here is read by the safetensors handle and copied."""

    def __init__(self, handle, raw, path, device):
        self._handle, self._raw, self._path, self._device = handle, raw, path, device
        (n,) = struct.unpack("<Q", self._read_at(0, 8, "the header").numpy().tobytes())
        try:
            if not 2 <= n <= MAX_HEADER:
                raise ValueError(f"header length {n}")
            header = json.loads(self._read_at(8, n, "the header").numpy().tobytes().decode("utf-8"))
            header.pop("__metadata__", None)
        except (ValueError, AttributeError, RecursionError) as exc:  # rewritten since the reader opened it
            raise CheckpointError(f"{path}: its header changed while it was read ({type(exc).__name__}): the file "
                                  "is being rewritten (a copy or download over it?) — run again once it is written, "
                                  "or download it again") from None
        self._base, self._entries = 8 + n, header

    def _read_at(self, offset: int, size: int, what: str) -> torch.Tensor:
        """`size` bytes of the file from `offset`, as a new uint8 tensor; CheckpointError when the file ends
        before them. A large tensor is read as `_READERS` ranges by as many threads (positional reads of one file
        descriptor; the memory copies from the page cache then use several cores, as the map's multi-threaded
        clone did)."""
        buf = torch.empty(size, dtype=torch.uint8)
        view, fd = memoryview(buf.numpy()), self._raw.fileno()
        if size >= _PARALLEL_BYTES and _READERS > 1:
            step = -(-size // _READERS)
            _on_threads(lambda a: self._fill(fd, view, offset, a, min(size, a + step), size, what),
                        range(0, size, step))
        else:
            self._fill(fd, view, offset, 0, size, size, what)
        return buf

    def _fill(self, fd: int, view: memoryview, offset: int, a: int, b: int, size: int, what: str) -> None:
        """Bytes [a, b) of the `size` bytes at `offset` into `view[a:b]`."""
        done = a
        while done < b:
            got = os.preadv(fd, [view[done:min(b, done + _READ_CHUNK)]], offset + done)
            if not got:
                now = os.fstat(fd).st_size
                raise CheckpointError(f"{self._path}: {what} lies at bytes {offset:,}–{offset + size:,}, but the "
                                      f"file is {now:,} bytes now: it was cut short or is being rewritten while it "
                                      "was read (a copy or download over it?) — run again once it is written, or "
                                      "download it again")
            done += got

    def _typed(self, key: str):
        e = self._entries.get(key)
        dtype = _TORCH_DTYPES.get(e.get("dtype")) if isinstance(e, dict) else None
        return e, dtype

    def get_tensor(self, key: str) -> torch.Tensor:
        e, dtype = self._typed(key)
        if dtype is None:  # unknown key (the handle raises as before) or a dtype without a torch type here
            t = self._handle.get_tensor(key)
            return t.clone() if t.device.type == "cpu" else t
        start, end = e["data_offsets"]
        t = self._read_at(self._base + start, end - start, key).view(dtype).reshape(tuple(e["shape"]))
        return t if torch.device(self._device).type == "cpu" else t.to(self._device)

    def get_slice(self, key: str):
        return _Rows(self, key)

    def __getattr__(self, name):  # keys(), metadata(): the safetensors handle's own
        return getattr(self._handle, name)


class _Rows:
    """`get_slice(key)`: `[a:b]` reads rows a..b of dim 0 alone; anything else goes to the safetensors handle."""

    def __init__(self, owner: _ReadTensors, key: str):
        self._owner, self._key = owner, key

    def __getitem__(self, index):
        owner = self._owner
        e, dtype = owner._typed(self._key)
        shape = tuple(e["shape"]) if e is not None else ()
        if dtype is None or not shape or not isinstance(index, slice) or index.step not in (None, 1):
            t = owner._handle.get_slice(self._key)[index]
            return t.clone() if t.device.type == "cpu" else t
        a, b, _ = index.indices(shape[0])
        b = max(a, b)
        start, end = e["data_offsets"]
        row = (end - start) // shape[0] if shape[0] else 0
        t = owner._read_at(owner._base + start + a * row, (b - a) * row, self._key)
        t = t.view(dtype).reshape((b - a, *shape[1:]))
        return t if torch.device(owner._device).type == "cpu" else t.to(owner._device)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:  # undecodable bytes of the file system name, kept as surrogate escapes
        return False


def _shape(entries: dict, key: str, rank: int | None = None) -> tuple:
    e = entries.get(key)
    if e is None:
        raise CheckpointError(f"missing tensor {key}")
    if rank is not None and len(e.shape) != rank:
        raise CheckpointError(f"{key}: expected a rank-{rank} tensor, got shape {list(e.shape)}")
    return e.shape


def _expect(entries: dict, key: str, shape: tuple):
    got = _shape(entries, key)
    if tuple(got) != tuple(shape):
        raise CheckpointError(f"shape mismatch for {key}: expected {list(shape)}, got {list(got)}")


def _quant_map(entries: dict, prefix: str) -> dict:
    """Module names under `prefix` that carry a `.comfy_quant` marker → group size (marker bytes parsed later)."""
    out = {}
    for name in entries:
        if name.startswith(prefix) and name.endswith(".comfy_quant"):
            module = name[len(prefix):-len(".comfy_quant")]
            weight = entries.get(prefix + module + ".weight")
            if weight is not None and len(weight.shape) != 2:  # a norm: 1-D (was "expected [256, 1] … got [256, 1]")
                raise CheckpointError(f"{name}: a quantization marker beside {prefix + module}.weight, which is "
                                      f"{weight.dtype} {list(weight.shape)}: only [out, in] weights of linear and "
                                      "embedding layers are int8 ConvRot codes (never a norm, a bias or the position "
                                      "table) — a damaged or edited file")
            for sib, dtypes in ((".weight", ("I8",)), (".weight_scale", ("F32", "F16", "BF16"))):
                e = entries.get(prefix + module + sib)
                if e is None or e.dtype not in dtypes:
                    raise CheckpointError(f"{prefix + module}: a comfy_quant marker needs {sib} "
                                          f"({'/'.join(dtypes)}); found {e.dtype if e else 'nothing'}")
            w, s = entries[prefix + module + ".weight"].shape, entries[prefix + module + ".weight_scale"].shape
            if tuple(s) not in ((w[0], 1), (w[0],)):
                raise CheckpointError(f"shape mismatch for {prefix + module}.weight_scale: expected [{w[0] if w else '?'}"
                                      f", 1] (one scale per row of the int8 weight {list(w)}), got {list(s)}")
            out[module] = CONVROT_GROUP
    return out


def _vae_config(entries: dict) -> VAEConfig:
    p = VAE + "decoder.layers."
    c0, latent, _ = _shape(entries, p + "0.weight_v", 3)
    blocks, c_in = [], c0
    for b in range(1, 7):
        ci, co, k = _shape(entries, f"{p}{b}.layers.1.weight_v", 3)
        if ci != c_in or k % 2:
            raise CheckpointError(f"{p}{b}.layers.1.weight_v: unexpected shape {[ci, co, k]} for a decoder block "
                                  f"fed with {c_in} channels")
        blocks.append((ci, co, k // 2))
        c_in = co
    out_ch, last, _ = _shape(entries, p + "8.weight_v", 3)
    if last != c_in:
        raise CheckpointError(f"{p}8.weight_v: expects {last} input channels, the last block gives {c_in}")
    if (p + "8.bias") in entries:
        raise CheckpointError(f"{p}8.bias present: the YuE2 decoder's last conv has no bias (another VAE?)")
    return VAEConfig(latent_dim=latent, first_channels=c0, blocks=tuple(blocks), out_channels=out_ch)


def _dims(entries: dict) -> ModelDims:
    vocab, hidden = _shape(entries, AR + "model.embed_tokens.weight", 2)
    layers = 0
    while f"{AR}model.layers.{layers}.input_layernorm.weight" in entries:
        layers += 1
    if layers == 0:
        if any(k.startswith(f"{AR}model.layers.0.") for k in entries):  # layer 0 is there, but not whole
            raise CheckpointError(f"missing tensor {AR}model.layers.0.input_layernorm.weight (layer 0 of the AR "
                                  "expert is incomplete — a damaged or edited file; download it again)")
        raise CheckpointError("the AR expert has no layers (text_encoders.model.layers.0.* missing)")
    beyond = sorted({int(m.group(2)) for k in entries if (m := _LAYER_NO.match(k))} - set(range(layers)))
    if beyond:  # a gap, or one expert deeper than the other: never load a silently smaller model
        raise CheckpointError(f"layers are numbered 0–{layers - 1} and then {beyond[:5]} (text_encoders / "
                              f"model.diffusion_model): layer {layers} of the AR expert is missing, or one expert has "
                              "more layers than the other — a damaged or edited file; download it again")
    (head_dim,) = _shape(entries, AR + "model.layers.0.self_attn.q_norm.weight", 1)
    if head_dim < 2 or head_dim % 2:  # 0 divided the shapes below by zero (stop 44 review); RoPE rotates pairs
        raise CheckpointError(f"{AR}model.layers.0.self_attn.q_norm.weight has {head_dim} values, so head_dim "
                              f"{head_dim}: a head is a positive even number of dimensions (128 in the release) — a "
                              "damaged or edited file")
    qkv_rows, _ = _shape(entries, AR + "model.layers.0.self_attn.qkv_proj.weight", 2)
    _, o_in = _shape(entries, AR + "model.layers.0.self_attn.o_proj.weight", 2)
    _, ffn = _shape(entries, AR + "model.layers.0.mlp.down_proj.weight", 2)
    heads = o_in // head_dim
    kv2 = qkv_rows // head_dim - heads
    if o_in % head_dim or kv2 <= 0 or kv2 % 2 or qkv_rows % head_dim or heads % (kv2 // 2):
        raise CheckpointError(f"inconsistent attention shapes: qkv rows {qkv_rows}, o_proj in {o_in}, "
                              f"head_dim {head_dim}")
    hidden_l, latent = _shape(entries, NAR + "vae2llm.weight", 2)
    freq = _shape(entries, NAR + "time_embedder.mlp.0.weight", 2)[1]
    pe_rows, pe_dim = _shape(entries, NAR + "latent_pos_embed.pe", 2)
    if hidden_l != hidden or pe_dim != hidden:
        raise CheckpointError(f"NAR width {hidden_l}/{pe_dim} differs from the AR width {hidden}")
    if latent != LATENT_DIM:  # the song format and the renderer's noise have 64 channels (runtime.md §4)
        raise CheckpointError(f"{NAR}vae2llm.weight reads {latent} latent channels; YuE2 latents have {LATENT_DIM}")
    if freq < 2 or freq % 2:  # sin ‖ cos halves of the timestep embedding
        raise CheckpointError(f"{NAR}time_embedder.mlp.0.weight reads {freq} frequencies; an even number ≥ 2 "
                              "(256 in the release) is expected")
    if pe_rows < 1:
        raise CheckpointError(f"{NAR}latent_pos_embed.pe has no rows ({CONTEXT:,} in the release)")
    return ModelDims(hidden=hidden, layers=layers, heads=heads, kv_heads=kv2 // 2, head_dim=head_dim, ffn=ffn,
                     vocab=vocab, latent_dim=latent, time_freq=freq, pe_rows=pe_rows)


def _leaf_shapes(d: ModelDims) -> dict:
    """{leaf: shape} of one decoder layer, the same in both experts (checkpoint_format.md §1.3–§1.4)."""
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    return {"input_layernorm.weight": (d.hidden,), "self_attn.qkv_proj.weight": (q + 2 * kv, d.hidden),
            "self_attn.o_proj.weight": (d.hidden, q), "self_attn.q_norm.weight": (d.head_dim,),
            "self_attn.k_norm.weight": (d.head_dim,), "post_attention_layernorm.weight": (d.hidden,),
            "mlp.gate_up_proj.weight": (2 * d.ffn, d.hidden), "mlp.down_proj.weight": (d.hidden, d.ffn)}


def _check_shapes(entries: dict, d: ModelDims):
    leaf_shapes = _leaf_shapes(d)
    for prefix in (AR + "model.layers.", NAR + "model.layers."):
        for i in range(d.layers):
            for leaf, shape in leaf_shapes.items():
                _expect(entries, f"{prefix}{i}.{leaf}", shape)
        if f"{prefix}{d.layers}.input_layernorm.weight" in entries:
            raise CheckpointError(f"the NAR expert has more layers than the AR expert ({prefix}{d.layers}.*)")
    for key, shape in {AR + "model.norm.weight": (d.hidden,), AR + "model.lm_head.weight": (d.vocab, d.hidden),
                       NAR + "model.norm.weight": (d.hidden,), NAR + "vae2llm.bias": (d.hidden,),
                       NAR + "llm2vae.weight": (d.latent_dim, d.hidden), NAR + "llm2vae.bias": (d.latent_dim,),
                       NAR + "time_embedder.mlp.0.bias": (d.hidden,),
                       NAR + "time_embedder.mlp.2.weight": (d.hidden, d.hidden),
                       NAR + "time_embedder.mlp.2.bias": (d.hidden,)}.items():
        _expect(entries, key, shape)


def not_a_file(path: str) -> str | None:
    """What `path` is when it is not a regular file (links followed): "a directory", "a FIFO (named pipe)", "a
    character device", "a block device", "a socket", "a broken symbolic link", "a symbolic-link loop" …; None for a
    regular file or a path that does not exist. Checked before any open: opening a FIFO or a device blocks or reads
    forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else None
    except OSError as exc:
        return "a symbolic-link loop" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def inspect_checkpoint(path: str, vae_path: str | None = None, own_vae: str = "required") -> CheckpointInfo:
    """Identify and check a YuE2 checkpoint from its headers (no tensor data is read except the quantization
    markers): a Comfy-Org all-in-one `.safetensors` file, or a vendor model FOLDER (m-a-p/YuE2-3B layout, see
    `vendor.inspect_vendor`; `vae_path` names its VAE folder when it is not found by itself; `own_vae` "required" |
    "optional" | "skip" says whether its VAE folder is needed — "skip" when another VAE decodes). Raises
    CheckpointError naming what is missing or inconsistent."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")) and \
                os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise CheckpointError(f"{path} is a PEFT LoRA adapter folder (adapter_config.json), not a YuE2 "
                                  f"checkpoint: {LORA_HINT}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise CheckpointError(f"checkpoint not found: {path} is a folder without config.json, neither a "
                                  "checkpoint file nor a vendor model folder (m-a-p/YuE2-3B: config.json with "
                                  "model_type 'yue2', weights, qwen.tiktoken, weights_manifest.json)")
        from .vendor import inspect_vendor
        return inspect_vendor(path, vae_path=vae_path, own_vae=own_vae)
    if vae_path is not None:
        raise CheckpointError(f"vae_path is for a vendor model folder; {path} is an all-in-one file, which holds its "
                              "own VAE")
    kind = not_a_file(path)
    if kind is not None:  # a FIFO / device would block the read below
        raise CheckpointError(f"checkpoint {path} is {kind}, not a file (a checkpoint is a .safetensors file or a "
                              "vendor model folder)")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    entries, meta, _ = read_header(path)
    missing = [group for group, keys in GROUPS.items() if any(k not in entries for k in keys)]
    if missing:
        if len(missing) == len(GROUPS):
            if "lm_head.weight" in entries or "model.layers.0.self_attn.q_proj.weight" in entries:
                raise CheckpointError(f"{os.path.basename(path)} is not a YuE2 all-in-one checkpoint: it has none "
                                      "of the YuE2 tensor groups, but vendor-named tensors (m-a-p/YuE2-3B layout: "
                                      "lm_head.weight, model.layers.N.self_attn.q_proj …): pass its FOLDER (with "
                                      "config.json, qwen.tiktoken and weights_manifest.json), not the weights file")
            layout = lora_layout(entries, meta)
            if layout is not None:  # new-user review, stop 46: "First keys: …lora_A…" did not say what to do
                shown = "" if layout == "unlabelled" else f" ({layout} layout)"
                raise CheckpointError(f"{os.path.basename(path)} is a LoRA adapter{shown}, not a YuE2 checkpoint: "
                                      f"{LORA_HINT}")
            sample = ", ".join(sorted(entries)[:3])
            raise CheckpointError(f"{os.path.basename(path)} is not a YuE2 all-in-one checkpoint: it has none of "
                                  f"the YuE2 tensor groups ({'; '.join(GROUPS)}). First keys: {sample or '(none)'}. "
                                  "Use Comfy-Org/YuE2 checkpoints/yue2_3b_int8_convrot.safetensors or "
                                  "yue2_3b_bf16.safetensors, or the folder of m-a-p/YuE2-3B.")
        raise CheckpointError(f"{os.path.basename(path)} is missing YuE2 tensor groups: {'; '.join(missing)} "
                              "(a split or partial file?). This pack needs the Comfy-Org all-in-one file, or the "
                              "m-a-p/YuE2-3B folder.")
    dims, vae = check_entries(entries)
    _check_no_strangers(entries, dims, os.path.basename(path))
    quant_ar, quant_nar = _quant_map(entries, AR), _quant_map(entries, NAR)
    for key, e in entries.items():  # int8 codes / row scales need their module's marker (else: float layers, noise)
        if key.startswith((AR, NAR)) and ((e.dtype == "I8" and key.endswith(".weight")) or
                                          key.endswith(".weight_scale")):
            module = key.rsplit(".", 1)[0]
            if module + ".comfy_quant" not in entries:
                raise CheckpointError(f"{key} is {'int8 codes' if e.dtype == 'I8' else 'a quantization scale'} but "
                                      f"{module}.comfy_quant (its quantization marker) is missing: a damaged or "
                                      "partially converted int8 file. Download it again.")
    markers = [k for k in entries if k.endswith(".comfy_quant")]
    stray = [k for k in markers if not (k.startswith(AR) or k.startswith(NAR))]
    if stray:
        raise CheckpointError(f"quantization markers outside the LM trees are not supported: {stray[:3]}")
    for k in markers:
        e = entries[k]
        if e.dtype != "U8" or len(e.shape) != 1 or not 0 < e.shape[0] <= 4096:
            raise CheckpointError(f"{k}: a comfy_quant marker is a rank-1 U8 tensor of JSON bytes (72 in the "
                                  f"Comfy-Org file); found {e.dtype} {list(e.shape)}")
    if markers:
        with open_tensors(path) as f:
            groups = {k: parse_marker(f.get_tensor(k), k) for k in markers}
        for k, g in groups.items():
            module = k[:-len(".comfy_quant")]
            columns = entries[module + ".weight"].shape[1]
            if g > MAX_GROUP or columns % g:  # before any Hadamard matrix is built (4^8: 34 GB; stop 44 review)
                raise CheckpointError(f"{k}: convrot_groupsize {g} does not fit {module}.weight, which has {columns} "
                                      f"input columns: a ConvRot group is a power of 4 that divides them (at most "
                                      f"{MAX_GROUP:,}; the Comfy-Org int8 file uses {CONVROT_GROUP}) — a damaged "
                                      "or foreign quantization marker")
            target = quant_ar if module.startswith(AR) else quant_nar
            target[module[len(AR) if module.startswith(AR) else len(NAR):]] = g
        _check_groups_agree(groups, entries)
    info = build_info(path, entries, meta, dims, vae, quant_ar=quant_ar, quant_nar=quant_nar,
                      quantized_modules=len(markers), tokenizer_bytes=entries[TOKENIZER_KEY].shape[0])
    tok = entries[TOKENIZER_KEY]
    if tok.dtype != "U8" or len(tok.shape) != 1:
        raise CheckpointError(f"{TOKENIZER_KEY} must be a rank-1 U8 tensor, got {tok.dtype} {list(tok.shape)}")
    return info


def _check_groups_agree(groups: dict, entries: dict) -> None:
    """CheckpointError for a marker whose ConvRot group differs from the file's usual one on a layer that group fits.

    Codes made in groups of 256 and read in groups of 64 (a marker edited or damaged to say 64) pass every check
    of the codes: the rows still peak at ±127, the scales are unchanged, and the module's forward matches a
    reference built with the same wrong group, so the layer loaded as other weights without a word (break-it review,
    stop 52). Nothing in one module's codes tells the group, but one quantizer uses one group for every layer it
    fits: a marker that disagrees with the file's most common group although that group divides its layer's input
    columns is refused. A smaller group on a layer too narrow for the usual one (64 input columns) is allowed."""
    if len(groups) < 2:
        return
    counts = Counter(groups.values())
    usual, n_usual = counts.most_common(1)[0]
    for k, g in sorted(groups.items()):
        columns = entries[k[:-len(".comfy_quant")] + ".weight"].shape[1]
        if g != usual and columns % usual == 0:
            raise CheckpointError(
                f"{k}: convrot_groupsize {g}, but {n_usual} of the file's {len(groups)} quantization markers say "
                f"{usual}, which fits this layer's {columns} input columns too: one quantizer "
                "rotates every layer in the same groups, and codes read in other groups than they were made in give "
                "other weights that no check of the codes can see — a damaged or edited marker (the Comfy-Org int8 "
                f"file uses {CONVROT_GROUP} throughout)")


LORA_HINT = ("pass it with --lora (or the YuE2 LoRA node in ComfyUI), and the base YuE2 checkpoint with "
             "--checkpoint (the YuE2 Checkpoint Loader)")


def lora_layout(entries: dict, meta: dict) -> str | None:
    """The LoRA layout (`lora.layouts.detect_layout`: "ai-toolkit", "peft", …, "unlabelled") of a safetensors file
    whose header (`entries`, `meta`) holds adapter tensors — LoRA A/B or down/up, LoKr factors, `.diff` — and no
    model weights' names only; None for any other file. Header only: no tensor is read."""
    from .lora.layouts_keys import split_role
    if not any((role := split_role(k)) and role[1] not in ("weight", "bias", "alpha") for k in entries):
        return None
    from ..errors import AdapterError
    from .lora.layouts import detect_layout
    from .lora.layouts_io import Source
    try:
        return detect_layout(Source(path="", tensors=dict.fromkeys(entries), metadata=dict(meta or {}),
                                    container="safetensors"))
    except AdapterError:  # metadata the LoRA reader refuses (an unknown or disagreeing branch, stop 46): still a
        return "unlabelled"  # LoRA here, and a CheckpointError for inspect — a folder scan skips it, not stops


_ADAPTER_WORDS = re.compile(r"lora_|\.lora\.|hada_w|lokr_w|dora_scale")
_LAYER_NO = re.compile(r"^(text_encoders\.|model\.diffusion_model\.)model\.layers\.(\d+)\.",
                       re.ASCII)


def _check_no_strangers(entries: dict, d: ModelDims, name: str) -> None:
    """An all-in-one file holds the AR and NAR trees, the tokenizer and the VAE, and nothing else
    (checkpoint_format.md §1.1: "Nothing else is in either file"); the int8 file adds `.weight_scale` and
    `.comfy_quant` beside quantized weights (§1.5). Raises CheckpointError for adapter tensors (a LoRA file, or
    one merged badly: `lora_A` …) and any other tensor the loaders would silently ignore, naming up to five (layers
    past a gap: `_dims`). The `vae.` tree is checked by the VAE loader."""
    known = {AR + "model.embed_tokens.weight", AR + "model.norm.weight", AR + "model.lm_head.weight", TOKENIZER_KEY,
             NAR + "model.norm.weight", NAR + "latent_pos_embed.pe"}
    known |= {NAR + f"{m}.{p}" for m in ("vae2llm", "llm2vae", "time_embedder.mlp.0", "time_embedder.mlp.2")
              for p in ("weight", "bias")}
    known |= {f"{tree}model.layers.{i}.{leaf}" for tree in (AR, NAR) for i in range(d.layers)
              for leaf in _leaf_shapes(d)}
    known |= {k[:-len("weight")] + extra for k in list(known) if k.endswith(".weight")
              for extra in ("weight_scale", "comfy_quant")}
    strangers = sorted(k for k in entries if not k.startswith(VAE) and k not in known)
    if not strangers:
        return
    adapters = [k for k in strangers if _ADAPTER_WORDS.search(k)]
    if adapters:
        more = " …" if len(adapters) > 3 else ""
        raise CheckpointError(f"{name} holds adapter tensors ({', '.join(adapters[:3])}{more}; {len(adapters)} in "
                              "all): it is a LoRA/LoKr file, or a checkpoint with unmerged adapters. Give the base "
                              "YuE2 checkpoint as the checkpoint and the adapter with --lora (nodes: YuE2 LoRA "
                              "Loader)")
    many = len(strangers) > 1
    raise CheckpointError(f"{name} holds {len(strangers)} tensor{'s that are' if many else ' that is'} not part "
                          f"of a YuE2 checkpoint ({', '.join(strangers[:5])}{' …' if len(strangers) > 5 else ''}); "
                          "an all-in-one file holds only text_encoders.*, model.diffusion_model.* and vae.* "
                          "(checkpoint_format.md §1.1) — a file of another model, or edited")


def check_entries(entries: dict, vae: bool = True) -> tuple[ModelDims, VAEConfig | None]:
    """Dimensions and VAE geometry from the shapes of Comfy-named `entries` ({key: TensorEntry}), every layer's
    shapes checked against them. CheckpointError for a missing tensor or an inconsistent shape. `vae` False: the
    entries hold no VAE (a vendor folder whose VAE another decoder replaces): the geometry returned is None."""
    dims = _dims(entries)
    _check_shapes(entries, dims)
    if not vae:
        return dims, None
    vae = _vae_config(entries)
    if vae.latent_dim != dims.latent_dim:
        raise CheckpointError(f"VAE latent channels {vae.latent_dim} differ from the NAR latent width "
                              f"{dims.latent_dim}")
    trim = length_trim(vae)
    if (vae.hop, trim) != (HOP, VAE_LENGTH_TRIM):
        # stop-54 review: the checkpoint's own decoder was never checked against the song format (--vae files were)
        strides = "·".join(str(s) for _, _, s in vae.blocks)
        raise CheckpointError(f"the VAE decoder's strides {strides} (in decoding order, read from "
                              f"{VAE}decoder.layers.1-6) decode T latent frames to {vae.hop}·T − {trim} samples; "
                              f"YuE2 songs are {HOP}·T − {VAE_LENGTH_TRIM} (strides 6·5·4·4·2·2) — a damaged or "
                              "edited file")
    return dims, vae


def build_info(path: str, entries: dict, meta: dict, dims: ModelDims, vae: VAEConfig, *, quant_ar=None,
               quant_nar=None, quantized_modules: int = 0, tokenizer_bytes: int = 0, layout: str = "comfy",
               files=None, source=None) -> CheckpointInfo:
    """The CheckpointInfo of checked `entries` (Comfy names): dtype checks per part (BF16/F16/F32 floats, int8 only
    with markers), element and byte counts. CheckpointError for an unsupported dtype."""
    quant_ar, quant_nar = quant_ar or {}, quant_nar or {}

    def floats(select):
        return {e.dtype for k, e in entries.items() if select(k) and not k.endswith((".weight_scale", ".comfy_quant"))
                and e.dtype != "I8"}

    ar_float = floats(lambda k: k.startswith(AR + "model."))
    nar_float = floats(lambda k: k.startswith(NAR))
    vae_dt = {e.dtype for k, e in entries.items() if k.startswith(VAE)}
    for label, dts in (("AR", ar_float), ("NAR", nar_float), ("VAE", vae_dt)):
        bad = dts - {"BF16", "F16", "F32"}
        if bad:
            raise CheckpointError(f"{label} tensors have unsupported dtypes {sorted(bad)}")
    # the release stores every LM float tensor as BF16 and the VAE as F32 (bf16 file) or F16 (int8 file)
    # (checkpoint_format.md §1): another dtype means a converted or relabelled file — a BF16 tensor whose header says
    # F16 reads as other numbers — so it is refused rather than rendered
    for prefix, label in ((AR + "model.", "AR"), (NAR, "NAR")):
        odd = next((k for k, e in entries.items() if k.startswith(prefix) and e.dtype in ("F16", "F32")
                    and not k.endswith((".weight_scale", ".comfy_quant"))), None)
        if odd is not None:
            raise CheckpointError(f"{odd} is {entries[odd].dtype}, but the YuE2 release stores every {label} float "
                                  "tensor as BF16: a converted or relabelled file (a BF16 tensor labelled F16 would "
                                  "read as other numbers). Use the Comfy-Org file as published.")

    def describe(dts, quant):
        base = "/".join(sorted(dts))
        return f"int8 ConvRot + {base}" if quant else base

    elements = sum(_count(e.shape) for e in entries.values())
    return CheckpointInfo(
        path=path, format="int8" if quantized_modules else "bf16", dims=dims, vae=vae,
        part_dtypes={"ar": describe(ar_float, quant_ar), "nar": describe(nar_float, quant_nar),
                     "vae": "/".join(sorted(vae_dt))},
        tensors=len(entries), elements=elements, data_bytes=sum(e.end - e.start for e in entries.values()),
        quantized_modules=quantized_modules, tokenizer_bytes=tokenizer_bytes, metadata=dict(meta),
        quant_ar=quant_ar, quant_nar=quant_nar, entries=entries, layout=layout, files=dict(files or {}),
        source=source)


def _count(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def load_tokenizer(info: CheckpointInfo):
    """The text tokenizer: the embedded JSON of an all-in-one file (`YuE2Tokenizer`), or a vendor folder's
    `qwen.tiktoken` (`TiktokenTokenizer`, same interface and ids). TokenizerError / CheckpointError when unusable —
    also when it loads but a probe text does not come back from encode + decode (`selfcheck.check_tokenizer`: a few
    ms): a tokenizer with an empty vocabulary encoded every prompt to no tokens, and songs were made from the
    protocol ids alone, style and lyrics dropped without a word (break-it review, stop 44)."""
    from .selfcheck import check_tokenizer
    if info.layout == "vendor":
        from .vendor import load_vendor_tokenizer
        tok = load_vendor_tokenizer(info)
    else:
        with open_tensors(info.path) as f:
            tok = YuE2Tokenizer.from_tensor(f.get_tensor(TOKENIZER_KEY))
    check_tokenizer(tok)
    return tok


def _materialize(module: torch.nn.Module, info: CheckpointInfo, prefix: str, keys: list[str], device, float_dtype,
                 what: str):
    """Stream `keys` (prefix + module name; Comfy names) from `info.source` into `module` (built on meta), casting
    float tensors to `float_dtype` and leaving int8 codes / fp32 scales as stored."""
    state = {}
    names = dict(module.named_parameters())
    names.update(dict(module.named_buffers()))
    dev = torch.device(device)
    load_dev = str(dev) if dev.type in ("cpu", "cuda") else "cpu"
    with info.source.open(load_dev) as get:
        for key in keys:
            name = key[len(prefix):]
            if name not in names:
                continue
            t = get(key)
            target = names[name]
            if t.dtype.is_floating_point and target.dtype.is_floating_point and name.endswith("weight_scale"):
                t = t.to(torch.float32)
            elif t.dtype.is_floating_point:
                t = t.to(float_dtype)
            if tuple(t.shape) != tuple(target.shape):
                if name.endswith("weight_scale") and t.numel() == target.numel() and t.ndim <= 2 and \
                        (t.ndim < 2 or t.shape[1] == 1):  # [out] → [out, 1]; never reinterpret [a, b]
                    t = t.reshape(target.shape)
                else:
                    raise CheckpointError(f"shape mismatch for {key}: expected {list(target.shape)}, "
                                          f"got {list(t.shape)}")
            # `open_tensors` reads into memory the tensor owns (never a view of the file's memory map), so a file
            # truncated or overwritten in place once the model is loaded cannot reach the model (a SIGBUS would
            # kill the process, ComfyUI too)
            state[name] = t.to(dev)
    missing = [n for n in names if n not in state]
    if missing:
        raise CheckpointError(f"{what}: tensors missing from the file: {[prefix + m for m in missing[:5]]}")
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # e.g. int8 codes where the layer expects float weights
        detail = str(exc).strip().splitlines()[-1].strip()[:300]
        raise CheckpointError(f"{what}: the file's tensors do not fit the model ({detail})") from None
    return module.eval().requires_grad_(False)


def load_ar(info: CheckpointInfo, device="cpu", dtype=torch.bfloat16) -> ARModel:
    """The AR expert with float weights in `dtype` (bf16 by default; fp32 for reference checks)."""
    with torch.device("meta"):
        model = ARModel(info.dims, info.quant_ar, dtype)
    keys = [k for k in info.entries if k.startswith(AR + "model.")]
    model = _materialize(model, info, AR, keys, device, dtype, "AR expert")
    _set_embed_dtype(model, dtype)
    if info.quant_ar:
        from .selfcheck import check_int8
        check_int8(model)  # refuse damaged int8 weights instead of generating noise (raises CheckpointError)
    return model


def load_nar(info: CheckpointInfo, device="cpu", dtype=torch.bfloat16, float_linears: bool | None = None) -> NARModel:
    """The NAR expert (flow-matching renderer) with float weights in `dtype`.

    `float_linears` (default: True when `device` is CUDA) turns the int8 file's NAR linears into bf16 layers after
    the self-check: the NAR's ~5k-row GEMMs are faster in bf16 (performance.md §6.2) at 2 bytes per weight
    (≈ 2.8 GB instead of 1.5 GB) — or, where `nar.linears_mode(device)` is "w8a8" (a Hopper GPU by default,
    YUE2_NAR_LINEARS), keeps the codes for int8 × int8 products (`nar.prepare_linears`). False keeps the int8 codes
    (less memory, each GEMM dequantizes on the fly)."""
    with torch.device("meta"):
        model = NARModel(info.dims, info.quant_nar, dtype)
    keys = [k for k in info.entries if k.startswith(NAR)]
    model = _materialize(model, info, NAR, keys, device, dtype, "NAR expert")
    if info.quant_nar:
        from .selfcheck import check_int8
        check_int8(model)  # first: its message names damaged int8 codes / scales more precisely
    check_finite(model, NAR if info.layout == "comfy" else "(the vendor folder's NAR, as Comfy names it) ", info.path,
                 "NAR expert")
    if info.quant_nar:
        if float_linears if float_linears is not None else torch.device(device).type == "cuda":
            from ..nar import prepare_linears
            prepare_linears(model)  # bf16 layers, or the codes kept for W8A8 products (YUE2_NAR_LINEARS)
    return model


def all_finite(t: torch.Tensor) -> bool:
    """True when every value of the float tensor `t` is finite: one fp32 sum (finite only if every value is: NaN and
    ±inf propagate; ≈ 15× faster than `isfinite(t).all()` on a CPU), and the exact test only when that sum is not
    finite (it may have overflowed from finite values)."""
    return bool(torch.isfinite(t.sum(dtype=torch.float32))) or bool(torch.isfinite(t).all())


def check_finite(model: torch.nn.Module, prefix: str, path: str, what: str) -> None:
    """DamagedWeightsError naming the first float tensor of `model` (`prefix` + its name) that
    holds NaN/inf. Used for the NAR expert at load: its NaN would otherwise surface only as non-finite latents after a
    whole song's lead sheet and music tokens were generated (the AR's own NaN shows in its first step's logits, the
    VAE's in `vae_files.check_values`). One device sync for all tensors (one fp32 sum each, as `all_finite`);
    ≈ 0.2 s a GB of bf16 on a 2-core CPU."""
    items = [(n, t) for n, t in model.state_dict().items() if t.is_floating_point() and t.numel()]
    if not items:
        return
    # one fp32 sum a tensor: finite only if every value is (NaN and ±inf propagate); a sum that overflowed from
    # finite values is settled by the exact test below
    flags = torch.isfinite(torch.stack([t.sum(dtype=torch.float32) for _, t in items])).cpu()
    if bool(flags.all()):
        return
    suspects = [items[int(i)] for i in (~flags).nonzero().flatten()]
    exact = [(n, t) for n, t in suspects if not bool(torch.isfinite(t).all())]
    if not exact:
        return
    name, t = exact[0]
    bad = int((~torch.isfinite(t)).sum())
    raise DamagedWeightsError(f"{what} in {path}: {prefix}{name} holds NaN/inf ({bad:,} of its {t.numel():,} values) "
                              "— the file is damaged (download it again) or was saved from a diverged training run; "
                              "its weights must be finite")


def missing_vae_message(path: str) -> str:
    """What decoding with the vendor model folder `path` says when it has no VAE folder and no other VAE was given
    (`load_vae`, the ComfyUI VAE Decode / edit nodes)."""
    from .vendor import VAE_GIVEN
    return (f"the vendor model folder {path} has no VAE folder, so it cannot decode audio: download m-a-p/YuE2-Vae "
            f"next to it or into its vae/ subfolder, or give a VAE: {VAE_GIVEN}")


def load_vae(info: CheckpointInfo, device="cpu") -> VAEDecoder:
    """The VAE decoder in fp32 (the int8 file's F16 VAE is upcast, runtime.md §6.2). Its values are checked as a
    separate VAE file's are (`vae_files.check_values`): NaN/inf, or a weight-norm `weight_v` with a channel of norm
    0, raises DamagedWeightsError at load — before, a song's lead sheet, music tokens and render all ran first and
    only its audio came out NaN (break-it finding, stop 38)."""
    from .vae_files import check_values
    if info.vae is None:  # a vendor folder inspected without its VAE (`vendor.inspect_vendor` own_vae)
        raise CheckpointError(missing_vae_message(info.path))
    with torch.device("meta"):
        model = VAEDecoder(info.vae)
    keys = [k for k in info.entries if k.startswith(VAE + "decoder.")]
    model = _materialize(model, info, VAE, keys, device, torch.float32, "VAE decoder")
    params = dict(model.named_parameters())
    check_values(params, lambda name: params[name].detach(), info.path, "comfy-prefixed")
    return model


def _set_embed_dtype(model: ARModel, dtype):
    emb = model.model.embed_tokens
    if hasattr(emb, "dtype") and not isinstance(emb, torch.nn.Embedding):
        emb.dtype = dtype


_SYNTH_RE = re.compile(r"synthetic", re.I)


def is_synthetic(info: CheckpointInfo) -> bool:
    """True when the file says it holds random weights (written by `yue2_core.synthetic`)."""
    return any(_SYNTH_RE.search(str(k)) for k in info.metadata)


def dtype_histogram(info: CheckpointInfo) -> dict:
    """How many tensors of each safetensors dtype ("BF16", "I8", "F32", …) the checkpoint holds."""
    return dict(Counter(e.dtype for e in info.entries.values()))
