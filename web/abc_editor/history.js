// The editors' undo histories across a node being re-created. ComfyUI's graph undo (a canvas Ctrl+Z) and a switch
// back to a workflow tab load the graph again: every node is removed and made anew, so an editor's own undo stack
// died with its node. An editor hands its history here when its node is removed, under a key naming the workflow and
// the node (web/yue2_abc_editor.js: workflow path, graph id, node id), and the editor made for the same node takes it
// back when the node is configured. Module-level on purpose: it outlives the nodes; a page reload starts empty.

const KEPT = 64; // histories kept (the oldest go first): deleted nodes that never come back must not pile up

const histories = new Map(); // key -> {text, undo, redo}

/** Keep `history` ({text, undo, redo}: TextEditor.exportHistory) for the editor that will be made for `key`. */
export function keepHistory(key, history) {
    if (!key) return;
    histories.delete(key); // re-inserted: the newest
    histories.set(key, history);
    while (histories.size > KEPT) histories.delete(histories.keys().next().value);
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
