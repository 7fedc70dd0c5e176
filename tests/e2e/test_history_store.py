"""The editors' undo-history store (web/abc_editor/history.js) run by node, no browser: a node removed with nothing
to keep forgets what an earlier node of the same id left (break-it, stop 41: a new node reusing a deleted node's id
got its history), and the store is capped by its text size as well as by count (64 histories of up to 200 snapshots
of a 90 kB score would be ~1 GB). Skipped without node (scripts/test.sh installs it; YUE2_REQUIRE_BROWSER=1 fails)."""
import subprocess
from pathlib import Path


STORE = Path(__file__).resolve().parents[2] / "web" / "abc_editor" / "history.js"

SCRIPT = """
import { keepHistory, takeHistory, keptHistories } from %(url)s;
const out = {};
keepHistory("wf/g/7", { text: "old", undo: [{ text: "a" }], redo: [] });
keepHistory("wf/g/7", null);                       // node 7 removed again with nothing to keep
out.stale = takeHistory("wf/g/7");
const big = "x".repeat(1 << 20);                   // 1 M code units a snapshot
for (let i = 0; i < 40; i++) keepHistory(`wf/g/${i}`, { text: big, undo: [{ text: big }], redo: [] });
out.kept = keptHistories();                        // 2 M each: at most 32 fit in 64 M
out.newest = takeHistory("wf/g/39") !== null;
out.oldest = takeHistory("wf/g/0");
keepHistory("wf/g/huge", { text: "y".repeat(70 << 20), undo: [], redo: [] });
out.huge = takeHistory("wf/g/huge") !== null;     // the newest is kept even alone over the cap
console.log(JSON.stringify(out));
"""


def test_history_store_forgets_stale_entries_and_caps_its_size(tmp_path, node_js):
    script = tmp_path / "store.mjs"
    script.write_text(SCRIPT % {"url": repr(STORE.as_uri())}, "utf-8")
    proc = subprocess.run([node_js, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json
    out = json.loads(proc.stdout)
    assert out["stale"] is None, out
    assert out["kept"] <= 32 and out["newest"] and out["oldest"] is None, out
    assert out["huge"], out
