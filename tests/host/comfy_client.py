"""Stdlib-only access to a real ComfyUI host: the HTTP client, the UI→API workflow converter, and the server process
the test fixtures start (tests/conftest.py).

    client = ComfyClient(server.url)
    prompt = ui_to_api(json.load(open("workflow.json")), client.object_info())
    entry = client.wait(client.queue(prompt), timeout=60)      # raises on node_errors / execution errors / timeout
    entry["outputs"]["7"]                                       # the ui dict node 7 returned

Endpoints and behaviours follow shared/reference/comfyui_host.md §6.1 (ComfyUI 0.3.75).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

PACK_NAME = "ComfyUI-YuE2"
NOT_LOADED_MARK = f"[{PACK_NAME}] not loaded:"  # the one line the pack's __init__.py logs when it registers nothing


class ComfyError(Exception):
    """An HTTP call to ComfyUI failed, or a prompt was rejected / failed. `body` holds ComfyUI's JSON answer."""

    def __init__(self, message: str, *, status: int | None = None, body=None):
        super().__init__(message)
        self.status = status
        self.body = body


# ---------------------------------------------------------------------------------------------------------------------
# HTTP client
# ---------------------------------------------------------------------------------------------------------------------
class ComfyClient:
    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.client_id = uuid.uuid4().hex

    # --- raw access ---
    def request(self, method: str, path: str, body=None, *, timeout: float | None = None) -> tuple[int, bytes]:
        """(status, raw body) for any status; raises ComfyError only when the server cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise ComfyError(f"{method} {self.url}{path}: {e}") from e

    def get_bytes(self, path: str) -> bytes:
        status, raw = self.request("GET", path)
        if status != 200:
            raise ComfyError(f"GET {path} -> HTTP {status}: {raw[:300]!r}", status=status, body=raw)
        return raw

    def get_json(self, path: str):
        return json.loads(self.get_bytes(path))

    def post_json(self, path: str, body):
        status, raw = self.request("POST", path, body)
        parsed = _maybe_json(raw)
        if status != 200:
            raise ComfyError(f"POST {path} -> HTTP {status}: {raw[:500]!r}", status=status, body=parsed)
        return parsed

    # --- endpoints ---
    def system_stats(self) -> dict:
        return self.get_json("/system_stats")

    def object_info(self, node_class: str | None = None) -> dict:
        if node_class:
            return self.get_json("/object_info/" + urllib.parse.quote(node_class))[node_class]
        return self.get_json("/object_info")

    def queue(self, prompt: dict, *, extra_data: dict | None = None) -> str:
        """POST /prompt; returns the prompt_id. Raises ComfyError (with `.body` = ComfyUI's error JSON) when the prompt
        is rejected (HTTP 400) *or* accepted with node_errors (ComfyUI answers 200 when another output stays valid)."""
        body = {"prompt": prompt, "client_id": self.client_id}
        if extra_data:
            body["extra_data"] = extra_data
        status, raw = self.request("POST", "/prompt", body)
        answer = _maybe_json(raw)
        if status != 200 or not isinstance(answer, dict) or answer.get("node_errors") or "prompt_id" not in answer:
            raise ComfyError(f"prompt rejected (HTTP {status}): {json.dumps(answer, indent=1)[:4000]}",
                             status=status, body=answer)
        return answer["prompt_id"]

    def history(self, prompt_id: str | None = None) -> dict:
        return self.get_json("/history" + (f"/{prompt_id}" if prompt_id else ""))

    def queue_state(self) -> dict:
        return self.get_json("/queue")

    def wait(self, prompt_id: str, timeout: float = 120.0, *, poll: float = 0.1, check: bool = True) -> dict:
        """Poll /history/<id> until the prompt finished; returns its history entry (`outputs`, `status`, `prompt`).
        With check=True an execution error raises ComfyError carrying ComfyUI's error message and traceback."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.history(prompt_id).get(prompt_id)
            if entry and (entry.get("status", {}).get("completed") or entry.get("status", {}).get("status_str")):
                break
            if time.monotonic() > deadline:
                raise ComfyError(f"prompt {prompt_id} did not finish within {timeout} s; queue: {self.queue_state()}")
            time.sleep(poll)
        status = entry.get("status", {})
        if check and status.get("status_str") != "success":
            errors = [m[1] for m in status.get("messages", []) if m and m[0] in ("execution_error", "execution_interrupted")]
            detail = "\n".join(f"{e.get('node_type')} #{e.get('node_id')}: {e.get('exception_type')}: "
                               f"{e.get('exception_message')}\n{''.join(e.get('traceback', []))}" for e in errors)
            raise ComfyError(f"prompt {prompt_id} ended with {status.get('status_str')}:\n{detail or status}", body=entry)
        return entry

    def run(self, prompt: dict, timeout: float = 120.0) -> dict:
        """queue + wait."""
        return self.wait(self.queue(prompt), timeout)

    def interrupt(self) -> None:
        self.post_json("/interrupt", {})

    def free(self, unload_models: bool = True, free_memory: bool = True) -> None:
        self.post_json("/free", {"unload_models": unload_models, "free_memory": free_memory})

    def set_setting(self, setting_id: str, value) -> None:
        self.post_json("/settings/" + urllib.parse.quote(setting_id), value)

    def view(self, filename: str, subfolder: str = "", type: str = "output") -> bytes:
        q = urllib.parse.urlencode({"filename": filename, "subfolder": subfolder, "type": type})
        return self.get_bytes("/view?" + q)


def _maybe_json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------------------------------
# UI workflow -> API prompt
# ---------------------------------------------------------------------------------------------------------------------
UI_ONLY_TYPES = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}  # frontend-only; never sent to /prompt
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
MODE_MUTED, MODE_BYPASS = 2, 4
SUBGRAPH_INPUT_NODE = -10  # origin_id of links that start at a subgraph's inputs


def ui_to_api(workflow: dict, object_info: dict) -> dict:
    """Convert a UI-format workflow (what ComfyUI saves, what `app.loadGraphData` takes) into the API prompt that
    `POST /prompt` takes: {"<id>": {"class_type", "inputs", "_meta"}}.

    - widgets_values map onto the node's widget inputs in /object_info order (required, then optional; socket-typed
      and forceInput inputs take no value); an input with `control_after_generate` is followed by one extra value
      ("fixed"/"randomize"/...) that is skipped; values left over at the end (upload buttons) are ignored;
      a dict-valued widgets_values, or widgets_values_named (newer frontends), is taken by name.
    - a linked input becomes [source_id, slot]; a linked widget ("converted widget") takes the link over its value.
    - Note/MarkdownNote are dropped; Reroute is followed to its source; a PrimitiveNode source gives its value;
      muted nodes (mode 2) are dropped with their links; bypassed nodes (mode 4) pass the first input of the same type.
    - subgraphs (definitions.subgraphs) are flattened with the frontend's ids "<outer>:<inner>".
    Raises ValueError for node types that /object_info does not know (the message lists them).
    """
    subgraphs = {sg["id"]: sg for sg in (workflow.get("definitions") or {}).get("subgraphs", [])}
    converter = _Converter(object_info, subgraphs)
    converter.emit(_Scope(workflow, prefix=""))
    if converter.missing:
        raise ValueError(f"node types unknown to this ComfyUI: {sorted(converter.missing)}")
    return converter.prompt


class _Scope:
    """One graph level: the top workflow, or one instance of a subgraph (owner = the instance node)."""

    def __init__(self, graph: dict, prefix: str, owner: dict | None = None, outer: "_Scope | None" = None):
        self.graph, self.prefix, self.owner, self.outer = graph, prefix, owner, outer
        self.nodes = {n["id"]: n for n in graph.get("nodes", [])}
        self.links = {}
        for link in graph.get("links", []):
            if isinstance(link, dict):
                self.links[link["id"]] = (link["origin_id"], link["origin_slot"])
            elif link:
                self.links[link[0]] = (link[1], link[2])


class _Converter:
    def __init__(self, object_info: dict, subgraphs: dict):
        self.object_info, self.subgraphs = object_info, subgraphs
        self.prompt: dict = {}
        self.missing: set = set()

    def emit(self, scope: _Scope) -> None:
        for node in scope.nodes.values():
            kind = node["type"]
            if node.get("mode", 0) in (MODE_MUTED, MODE_BYPASS) or kind in UI_ONLY_TYPES:
                continue
            if kind in self.subgraphs:
                self.emit(_Scope(self.subgraphs[kind], f"{scope.prefix}{node['id']}:", node, scope))
                continue
            info = self.object_info.get(kind)
            if info is None:
                self.missing.add(kind)
                continue
            inputs = widget_inputs(info, node)
            for slot in node.get("inputs", []):
                if slot.get("link") is None:
                    continue
                source = self.source(scope, slot["link"])
                if source is not None:
                    inputs[slot["name"]] = source[1]
            meta = {"title": node.get("title") or info.get("display_name") or kind}
            self.prompt[f"{scope.prefix}{node['id']}"] = {"class_type": kind, "inputs": inputs, "_meta": meta}

    def source(self, scope: _Scope, link_id):
        """What feeds link `link_id`: ("ref", [api_id, slot]), ("value", v), or None (muted/dangling)."""
        if link_id not in scope.links:
            return None
        origin_id, origin_slot = scope.links[link_id]
        if origin_id == SUBGRAPH_INPUT_NODE:
            return self.subgraph_input(scope, origin_slot)
        node = scope.nodes.get(origin_id)
        if node is None or node.get("mode", 0) == MODE_MUTED:
            return None
        kind = node["type"]
        if kind == "Reroute":
            return self.follow(scope, (node.get("inputs") or [{}])[0].get("link"))
        if kind == "PrimitiveNode":
            return ("value", (node.get("widgets_values") or [None])[0])
        if node.get("mode", 0) == MODE_BYPASS:
            out_type = node["outputs"][origin_slot].get("type")
            same = [i for i in node.get("inputs", []) if i.get("type") == out_type and i.get("link") is not None]
            return self.follow(scope, same[0]["link"]) if same else None
        if kind in self.subgraphs:
            inner = _Scope(self.subgraphs[kind], f"{scope.prefix}{node['id']}:", node, scope)
            link_ids = inner.graph["outputs"][origin_slot].get("linkIds") or []
            return self.source(inner, link_ids[0]) if link_ids else None
        return ("ref", [f"{scope.prefix}{origin_id}", origin_slot])

    def follow(self, scope: _Scope, link_id):
        return None if link_id is None else self.source(scope, link_id)

    def subgraph_input(self, scope: _Scope, slot: int):
        """Value or link feeding input `slot` of a subgraph instance (scope.owner)."""
        name = scope.graph["inputs"][slot]["name"]
        owner = scope.owner
        match = [i for i in owner.get("inputs", []) if i.get("name") == name]
        if match and match[0].get("link") is not None:
            return self.source(scope.outer, match[0]["link"])
        named = owner.get("widgets_values_named")
        if isinstance(named, dict) and name in named:
            return ("value", named[name])
        # The instance's widgets_values follow the subgraph's widget-typed inputs in order (shown on the node or not).
        widget_names = [i["name"] for i in scope.graph["inputs"] if i.get("type") in WIDGET_TYPES]
        values = owner.get("widgets_values") or []
        if name in widget_names and widget_names.index(name) < len(values):
            return ("value", values[widget_names.index(name)])
        return None  # unconnected: the inner node keeps its own widget value


def widget_inputs(info: dict, node: dict) -> dict:
    """{input name: value} from a UI node's widgets_values, given its /object_info entry."""
    values = node.get("widgets_values")
    names = widget_names(info, node)
    if isinstance(node.get("widgets_values_named"), dict):  # newer frontends save both; the named form is exact
        values = node["widgets_values_named"]
    if isinstance(values, dict):
        return {name: values[name] for name, _ in names if name in values}
    values = list(values or [])
    out, i = {}, 0
    for name, has_control in names:
        if i >= len(values):
            break
        out[name] = values[i]
        i += 2 if has_control else 1
    return out


def widget_names(info: dict, node: dict) -> list[tuple[str, bool]]:
    """[(input name, followed by a control_after_generate value)] for the inputs the frontend shows as widgets."""
    declared = info.get("input", {})
    order = info.get("input_order") or {section: list(declared.get(section, {})) for section in ("required", "optional")}
    ui_widgets = {i["name"] for i in node.get("inputs", []) if i.get("widget")}
    names = []
    for section in ("required", "optional"):
        for name in order.get(section, []):
            spec = declared.get(section, {}).get(name)
            if not spec:
                continue
            kind, opts = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
            is_widget = (isinstance(kind, list) or kind in WIDGET_TYPES) and not opts.get("forceInput")
            if is_widget or name in ui_widgets:
                names.append((name, bool(opts.get("control_after_generate"))))
    return names


# ---------------------------------------------------------------------------------------------------------------------
# The server process (used by the comfy_server fixture in tests/conftest.py)
# ---------------------------------------------------------------------------------------------------------------------
class ComfyServer:
    """One ComfyUI process on 127.0.0.1 whose writable folders all live under `workdir` (never in the repo):

    workdir/output, temp, input, user (pre-seeded: Comfy.TutorialCompleted), models/<kind> (via an extra model paths
    config with is_default, so `models_dir` = workdir/models/checkpoints is where CheckpointLoaderSimple looks first),
    comfyui.db, server.log.
    """

    MODEL_KINDS = ("checkpoints", "text_encoders", "diffusion_models", "vae", "loras", "audio_encoders")

    def __init__(self, comfy_dir: Path, python: str, workdir: Path, *, extra_args: tuple = ()):
        self.comfy_dir, self.python, self.workdir = Path(comfy_dir), python, Path(workdir)
        self.extra_args = tuple(extra_args)
        self.output_dir = self.workdir / "output"
        self.input_dir = self.workdir / "input"
        self.temp_root = self.workdir / "tmp"  # ComfyUI uses <this>/temp and empties it at start
        self.user_dir = self.workdir / "user"
        self.models_root = self.workdir / "models"
        self.models_dir = self.models_root / "checkpoints"
        self.log_path = self.workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.url: str | None = None

    def _prepare(self) -> Path:
        for d in (self.output_dir, self.input_dir, self.temp_root, self.user_dir / "default"):
            d.mkdir(parents=True, exist_ok=True)
        for kind in self.MODEL_KINDS:
            (self.models_root / kind).mkdir(parents=True, exist_ok=True)
        settings = self.user_dir / "default" / "comfy.settings.json"
        if not settings.exists():  # no first-run Templates dialog over the canvas (comfyui_host.md §6.3)
            settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
        config = self.workdir / "extra_model_paths.yaml"
        lines = ["yue2_tests:", f"  base_path: {json.dumps(str(self.models_root))}", "  is_default: true"]
        lines += [f"  {kind}: {kind}" for kind in self.MODEL_KINDS]
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self, timeout: float = 180.0, attempts: int = 3) -> "ComfyServer":
        config = self._prepare()
        for attempt in range(attempts):
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [self.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
                   "--disable-api-nodes", "--disable-auto-launch",
                   "--output-directory", str(self.output_dir), "--input-directory", str(self.input_dir),
                   "--temp-directory", str(self.temp_root), "--user-directory", str(self.user_dir),
                   "--extra-model-paths-config", str(config),
                   "--database-url", f"sqlite:///{self.workdir / 'comfyui.db'}", *self.extra_args]
            env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
            # glibc otherwise keeps freed multi-MB blocks in its heap at a threshold it raises on its own, so the
            # server's VmRSS after a run moved by ±80 MB between identical runs (seen in CI: 1590 → 1662 MB); a
            # fixed 64 KiB mmap threshold returns every large tensor's pages on free, so the memory tests
            # (tests/nodes/test_nodes_lifecycle.py) measure what is alive (spread ≤ 23 MB over 5 local runs).
            env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
            env.setdefault("MALLOC_TRIM_THRESHOLD_", "65536")
            with open(self.log_path, "ab") as log:
                log.write(f"\n$ {' '.join(cmd)}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(cmd, cwd=self.comfy_dir, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
            try:
                self._wait_ready(timeout)
                break
            except ComfyError:
                self.stop()
                if "address already in use" in self.log_text().lower() and attempt + 1 < attempts:
                    continue
                raise
        problems = self.import_problems()
        if problems:
            self.stop()
            raise ComfyError(f"ComfyUI started but reported import problems (log: {self.log_path}):\n"
                             + "\n".join(problems))
        return self

    def _wait_ready(self, timeout: float) -> None:
        client, deadline, t0 = ComfyClient(self.url, timeout=2), time.monotonic() + timeout, time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise ComfyError(f"ComfyUI exited with code {self.proc.returncode} before it was ready; "
                                 f"last log lines ({self.log_path}):\n{self.log_tail()}")
            try:
                client.system_stats()
                self.ready_after_s = time.monotonic() - t0
                return
            except (ComfyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ComfyError(f"ComfyUI not ready on {self.url} after {timeout} s; last log lines:\n{self.log_tail()}")
            time.sleep(0.25)

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def import_problems(self, pack: str = PACK_NAME) -> list[str]:
        """Lines that say a custom node failed to import: `(IMPORT FAILED)` (ComfyUI logs it and keeps running) and any
        traceback that mentions the pack — in the start-up part of the log, before the server started (ComfyUI's
        `Starting server`, logged after every custom node was imported) or the first prompt ran: a node's error in a
        later prompt, or aiohttp's own traceback after a route answered a broken request (tests provoke both on
        purpose; stop 51: a gzip body that does not decode), is not an import problem."""
        text = re.split(r"(?m)^(?:got prompt|Starting server)", self.log_text())[0]
        problems = [line for line in text.splitlines() if "IMPORT FAILED" in line]
        for block in re.split(r"(?m)^(?=Traceback \(most recent call last\):)", text)[1:]:
            block = block.split("\n\n")[0]
            if pack in block:
                problems.append(block.strip())
        return problems

    @property
    def pack_load_error(self) -> str | None:
        """The pack's own `[ComfyUI-YuE2] not loaded: …` line, if it registered nothing."""
        for line in self.log_text().splitlines():
            if NOT_LOADED_MARK in line:
                return line[line.index(NOT_LOADED_MARK):]
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the test process dies (Linux), so a killed pytest leaves no server behind."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------------------------------------------------------
# Where the host is (scripts/test.sh sets these; defaults match its layout)
# ---------------------------------------------------------------------------------------------------------------------
def find_host(repo: Path) -> tuple[Path, str] | str:
    """(ComfyUI dir, python) when a usable host is installed, else a sentence saying what is missing."""
    comfy_dir = Path(os.environ.get("COMFYUI_DIR") or repo / ".comfyhost" / "comfyui")
    hint = "run `bash scripts/test.sh` to install it"
    if not (comfy_dir / "main.py").is_file():
        return f"ComfyUI host not installed (no {comfy_dir}/main.py); {hint}"
    link = comfy_dir / "custom_nodes" / PACK_NAME
    if not link.exists():
        return f"the pack is not linked into the host ({link} missing); {hint}"
    if link.resolve() != repo.resolve():
        return f"{link} points to {link.resolve()}, not to this checkout {repo}; {hint}"
    python = os.environ.get("YUE2_COMFY_PYTHON")
    if not python:
        venv_python = repo / ".venv" / "bin" / "python"
        python = str(venv_python) if venv_python.exists() else sys.executable
    needed = ("aiohttp", "comfyui_frontend_package", "torch", "torchvision", "torchaudio")
    probe = subprocess.run([python, "-c", "import importlib.util as u, sys\n"
                            f"print(' '.join(m for m in {needed!r} if u.find_spec(m) is None))"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip():
        return f"{python} cannot run ComfyUI (missing: {probe.stdout.strip() or probe.stderr.strip()}); {hint}"
    return comfy_dir, python
