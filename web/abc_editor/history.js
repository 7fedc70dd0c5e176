// The editors' undo histories across a node being re-created. ComfyUI's graph undo (a canvas Ctrl+Z) and a switch
// back to a workflow tab load the graph again: every node is removed and made anew, so an editor's own undo stack
// died with its node. An editor hands its history here when its node is removed, under a key naming the workflow and
// the node (web/yue2_abc_editor.js: workflow path, graph id, node id), and the editor made for the same node takes it
// back when the node is configured. Module-level on purpose: it outlives the nodes; a page reload starts empty.

const KEPT = 64; // histories kept (the oldest go first): deleted nodes that never come back must not pile up
// ...and their text in all, in UTF-16 code units: up to 200 full-text snapshots of a 90 kB score are ~18 M each,
// so a count alone could keep ~1 GB (break-it, stop 41). The newest history is always kept, however large.
const KEPT_CHARS = 64 * 2 ** 20;

const histories = new Map(); // key -> {text, undo, redo}

function sizeOf(history) {
    let n = (history.text || "").length;
    for (const list of [history.undo, history.redo]) {
        for (const entry of list || []) n += typeof entry === "string" ? entry.length : (entry?.text || "").length;
    }
    return n;
}

/** Keep `history` ({text, undo, redo}: TextEditor.exportHistory) for the editor that will be made for `key`;
 *  `history` null forgets what was kept under `key` (a node removed with nothing to keep must not leave an older
 *  node's history for a new node that gets the same id). */
export function keepHistory(key, history) {
    if (!key) return;
    histories.delete(key); // re-inserted: the newest
    if (!history) return;
    history.size = sizeOf(history);
    histories.set(key, history);
    let total = 0;
    for (const h of histories.values()) total += h.size;
    while (histories.size > 1 && (histories.size > KEPT || total > KEPT_CHARS)) {
        const oldest = histories.keys().next().value;
        total -= histories.get(oldest).size;
        histories.delete(oldest);
    }
}

/** The history kept for `key`, removed from the store (one editor takes it), or null. */
export function takeHistory(key) {
    if (!key || !histories.has(key)) return null;
    const history = histories.get(key);
    histories.delete(key);
    return history;
}

/** How many histories are kept (for the browser tests). */
export const keptHistories = () => histories.size;
