"""The repo-root __init__.py under ComfyUI's own loader (`nodes.load_custom_node`, in-process, no server): whatever
is wrong with nodes/, the pack still loads, logs exactly one `[ComfyUI-YuE2] not loaded:` line saying why, and
registers nothing; with a good nodes/ its V3 nodes are registered through comfy_entrypoint."""
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from comfy_client import NOT_LOADED_MARK

REPO = Path(__file__).resolve().parents[2]

GOOD_NODES = '''
from comfy_api.latest import io

class Echo(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(node_id="YuE2EntrypointProbe", display_name="probe", category="test",
                         inputs=[io.String.Input("text")], outputs=[io.String.Output()])

    @classmethod
    def execute(cls, text):
        return io.NodeOutput(text)

NODE_LIST = [Echo]
'''

SCENARIOS = {
    "no_nodes_package": None,
    "missing_dependency": "import yue2_no_such_dependency_xyz\nNODE_LIST = []\n",
    "bug_in_nodes": "raise RuntimeError('boom from nodes')\n",
    "node_list_not_a_list": "NODE_LIST = 'oops'\n",
    "good": GOOD_NODES,
}

# Runs inside the host's python: ComfyUI's real loader on each scenario's pack folder; prints one JSON line.
HARNESS = textwrap.dedent('''
    import asyncio, json, logging, os, sys
    comfy_dir, packs = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, comfy_dir)
    os.chdir(comfy_dir)
    import utils.extra_config  # before any comfy.* import (comfyui_host.md 6.2)
    from comfy.cli_args import args
    args.cpu = True
    import nodes
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger().addHandler(Keep())
    logging.getLogger().setLevel(logging.INFO)
    result = {}
    for name, path in packs.items():
        del records[:]
        before = set(nodes.NODE_CLASS_MAPPINGS)
        ok = asyncio.run(nodes.load_custom_node(path))
        module = sys.modules.get(path.replace(".", "_x_"))
        result[name] = {"ok": ok, "log": list(records), "new_nodes": sorted(set(nodes.NODE_CLASS_MAPPINGS) - before),
                        "has_v1_mappings": hasattr(module, "NODE_CLASS_MAPPINGS"),
                        "web": getattr(module, "WEB_DIRECTORY", None)}
    print("RESULT " + json.dumps(result))
''')


@pytest.fixture(scope="module")
def loaded(comfy_host, tmp_path_factory):
    comfy_dir, python = comfy_host
    packs = {}
    for name, nodes_source in SCENARIOS.items():
        pack = tmp_path_factory.mktemp(name) / "ComfyUI-YuE2"
        pack.mkdir()
        shutil.copy(REPO / "__init__.py", pack / "__init__.py")
        shutil.copytree(REPO / "web", pack / "web")
        if nodes_source is not None:
            (pack / "nodes").mkdir()
            (pack / "nodes" / "__init__.py").write_text(nodes_source)
        packs[name] = str(pack)
    proc = subprocess.run([python, "-c", HARNESS, str(comfy_dir), json.dumps(packs)], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"harness failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def pack_lines(result):
    return [line for line in result["log"] if "ComfyUI-YuE2" in line]


@pytest.mark.parametrize("scenario, expected", [
    ("no_nodes_package", "the pack's own module nodes is missing"),
    ("missing_dependency", "missing Python module 'yue2_no_such_dependency_xyz'; install the pack's requirements with:"),
    ("bug_in_nodes", "importing nodes/ raised RuntimeError: boom from nodes"),
    ("node_list_not_a_list", "nodes.NODE_LIST is a str, expected a list of node classes"),
])
def test_broken_nodes_log_one_line_and_register_nothing(loaded, scenario, expected):
    result = loaded[scenario]
    assert result["ok"] is True, "ComfyUI must not report IMPORT FAILED for the pack"
    assert result["new_nodes"] == []
    lines = pack_lines(result)
    assert len(lines) == 1 and NOT_LOADED_MARK in lines[0] and expected in lines[0], lines


def test_good_nodes_register_through_the_v3_entrypoint(loaded):
    result = loaded["good"]
    assert result["ok"] is True and result["new_nodes"] == ["YuE2EntrypointProbe"]
    assert pack_lines(result) == []
    assert result["has_v1_mappings"] is False and result["web"] == "./web"
