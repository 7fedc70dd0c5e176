"""ComfyUI entry point of the ComfyUI-YuE2 node pack (V3 registration only).

ComfyUI imports this file from custom_nodes/ComfyUI-YuE2/ and calls `comfy_entrypoint()`; the extension lists the node
classes that `nodes/__init__.py` exports as `NODE_LIST`. There is deliberately no `NODE_CLASS_MAPPINGS`: ComfyUI takes
the V1 path whenever that name exists and then never calls `comfy_entrypoint`.

Loading must never break ComfyUI: if `nodes/` or one of its dependencies cannot be imported, one line starting with
`[ComfyUI-YuE2] not loaded:` says what is missing and how to install it (the traceback goes to the DEBUG log), and the
pack registers no nodes. Imported outside ComfyUI (no `comfy_api`), this file does nothing.
"""
import importlib.util
import logging
import os
import sys

WEB_DIRECTORY = "./web"

_PACK_DIR = os.path.dirname(os.path.abspath(__file__))
_log = logging.getLogger("ComfyUI-YuE2")


def _not_loaded(reason: str) -> None:
    _log.error("[ComfyUI-YuE2] not loaded: %s", reason)
    _log.debug("[ComfyUI-YuE2] import traceback:", exc_info=True)


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _make_engine_importable() -> None:
    # The engine `yue2_core/` sits next to this file. When the pack was cloned into custom_nodes/ rather than
    # pip-installed, make it importable as the top-level package `yue2_core`. Appended, never prepended: this folder
    # also holds `nodes/`, which must not shadow ComfyUI's own `nodes` module.
    own_dir = os.path.join(_PACK_DIR, "yue2_core")
    own_init = os.path.join(own_dir, "__init__.py")
    spec = importlib.util.find_spec("yue2_core") if "yue2_core" not in sys.modules else None
    if "yue2_core" in sys.modules or spec is None or not os.path.isfile(own_init):
        if spec is None and "yue2_core" not in sys.modules and _PACK_DIR not in sys.path:
            sys.path.append(_PACK_DIR)
        return
    found = [os.path.dirname(spec.origin)] if spec.origin else list(spec.submodule_search_locations or [])
    if found and all(_same_folder(f, own_dir) for f in found):
        return
    # Another copy of the engine is installed in this Python (`pip install -e` of another clone, an older `pip
    # install` of the pack): the nodes beside this file were written for the engine beside them, so that one is
    # loaded (new-user review, stop 48: the nodes of a newer clone in custom_nodes/ ran an older clone's installed
    # engine and failed with `ImportError: cannot import name … from 'yue2_core…'` only when a node ran).
    own = importlib.util.spec_from_file_location("yue2_core", own_init, submodule_search_locations=[own_dir])
    module = importlib.util.module_from_spec(own)
    sys.modules["yue2_core"] = module
    try:
        own.loader.exec_module(module)
    except BaseException:
        del sys.modules["yue2_core"]
        raise
    _log.info("[ComfyUI-YuE2] using the engine beside the nodes (%s), not the yue2_core installed at %s",
              own_dir, found[0] if found else "?")


def _import_node_list() -> list:
    """NODE_LIST from nodes/__init__.py, or [] after logging one line that says why."""
    requirements = os.path.join(_PACK_DIR, "requirements.txt")
    pip_hint = f"install the pack's requirements with: {sys.executable} -m pip install -r {requirements}"
    try:
        _make_engine_importable()
        from .nodes import NODE_LIST
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(__name__ + "."):
            missing = e.name[len(__name__) + 1:].replace(".", "/")
            _not_loaded(f"the pack's own module {missing} is missing in {_PACK_DIR} (incomplete checkout?)")
        else:
            _not_loaded(f"missing Python module '{e.name}'; {pip_hint}")
        return []
    except ImportError as e:
        _not_loaded(f"{e}; {pip_hint}")
        return []
    except Exception as e:  # a bug in nodes/: still never take ComfyUI down
        tb = e.__traceback__
        while tb and tb.tb_next:
            tb = tb.tb_next
        where = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else ""
        _not_loaded(f"importing nodes/ raised {type(e).__name__}: {e}{where} (run ComfyUI with --verbose DEBUG for the traceback)")
        return []
    if not isinstance(NODE_LIST, (list, tuple)):
        _not_loaded(f"nodes.NODE_LIST is a {type(NODE_LIST).__name__}, expected a list of node classes")
        return []
    return list(NODE_LIST)


try:
    from comfy_api.latest import ComfyExtension
except ImportError:
    ComfyExtension = None
    if "folder_paths" in sys.modules:  # inside a ComfyUI that predates the V3 API
        _not_loaded("this ComfyUI has no comfy_api.latest (V3 node API); update ComfyUI")

if ComfyExtension is not None:
    _NODE_LIST = _import_node_list()

    class YuE2Extension(ComfyExtension):
        async def get_node_list(self) -> list:
            return list(_NODE_LIST)

    async def comfy_entrypoint() -> ComfyExtension:
        return YuE2Extension()
