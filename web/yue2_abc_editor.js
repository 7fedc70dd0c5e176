// The ABC editor widget of the "YuE2 ABC Editor" node (node type YuE2ABCEditor).
//
// ComfyUI draws the node's `abc` input (a multiline STRING) as a plain textarea. This extension swaps that widget for
// a DOM widget of the same name whose value is the text of our editor (web/abc_editor/): the text is saved in the
// workflow, restored on reload and sent to the server in the prompt exactly like the plain widget's, while the
// editor adds the engraved score, issue markers, playback, a structure panel and the score tools.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import { AbcEditor } from "./abc_editor/editor.js";
import { callRoute } from "./abc_editor/server.js";

const NODE_TYPE = "YuE2ABCEditor";
const WIDGET = "abc";
const MIN_WIDGET_HEIGHT = 420;
const MIN_NODE_SIZE = [940, 680];

function addStylesheet() {
    const href = new URL("./abc_editor/editor.css", import.meta.url).href;
    if (document.querySelector(`link[data-yue2-abc-editor]`)) return;
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = href;
    link.dataset.yue2AbcEditor = "1";
    document.head.append(link);
}

// Each open workflow's own name in the history keys: its path changes when it is renamed or saved under another
// name (a temporary workflow's "Save As" renames it), so a history kept under the old path was looked up under the
// new one after a canvas Ctrl+Z and lost (known gap, stop 41). ComfyUI keeps the same workflow object through a
// rename; two tabs of one workflow (a duplicate keeps the graph id and node ids) are two objects, so neither takes
// the other's histories.
const workflowNames = new WeakMap();
let workflowCount = 0;

function workflowName(workflow) {
    if (!workflow || typeof workflow !== "object") return "";
    const raw = workflow.__v_raw ?? workflow; // the store hands out Vue proxies: name the object behind them
    if (!workflowNames.has(raw)) workflowNames.set(raw, `workflow ${++workflowCount}`);
    return workflowNames.get(raw);
}

/**
 * The name of a node's undo history (abc_editor/history.js): the open workflow (by object, not by its path: see
 * workflowName), the node's graph's id and the node's id — all three kept when ComfyUI's undo re-creates the node —
 * or null while the node has no id.
 */
function historyKey(node) {
    if (node.id == null || node.id === -1) return null;
    const workflow = workflowName(app.extensionManager?.workflow?.activeWorkflow);
    return JSON.stringify([workflow, node.graph?.id ?? app.graph?.id ?? "", node.id]);
}

// A graph load (a canvas Ctrl+Z, a tab switch) configures its nodes before it makes its workflow the active one
// (the frontend's afterLoadNewGraph → the workflow store's openWorkflow), so an editor configured then waits for that
// before it reads its history key: on a switch to a duplicate tab (the same graph id and node ids) it would take the
// histories of the tab being left. Without a workflow store to watch, the history is taken at once, as before.
let loads = 0; // graph loads begun (beforeConfigureGraph)
let loading = false;
let watching = null; // whether the store's openWorkflow is watched (null: not tried yet)
const waiting = new Set();

function watchLoads() {
    if (watching === null) {
        const store = app.extensionManager?.workflow;
        watching = typeof store?.$onAction === "function";
        if (watching) store.$onAction(({ name, after }) => name === "openWorkflow" && after(() => loaded()));
    }
    return watching;
}

function loaded() {
    loading = false;
    const restores = [...waiting];
    waiting.clear();
    for (const restore of restores) restore();
}

function afterLoad(restore) {
    if (loading) waiting.add(restore);
    else restore();
}

/** Replace the node's plain `abc` textarea by the editor; returns the editor (or null when there is no such widget). */
function attachEditor(node) {
    const index = node.widgets?.findIndex((w) => w.name === WIDGET) ?? -1;
    if (index < 0) return null;
    const plain = node.widgets[index];
    const initial = typeof plain.value === "string" ? plain.value : "";

    let widget = null;
    // The workflow's change tracker persists the workflow, so edits and node properties survive a page reload
    // (frontends ≥ 1.5x name it captureCanvasState and keep checkState as a deprecated alias).
    const persist = () => {
        const tracker = app.extensionManager?.workflow?.activeWorkflow?.changeTracker;
        (tracker?.captureCanvasState ?? tracker?.checkState)?.call(tracker);
    };
    const editor = new AbcEditor(node, {
        // Our edits must reach ComfyUI like typing in its own textarea does: the widget callback, a redraw, and the
        // change tracker.
        notify: (text) => {
            widget?.callback?.(text);
            node.setDirtyCanvas?.(true, false);
            persist();
        },
        persist,
        historyKey: () => historyKey(node),
        afterLoad,
    });

    // Take the plain widget out (and its textarea out of ComfyUI's DOM widget layer), then add ours in its place.
    node.widgets.splice(index, 1);
    plain.onRemove?.();
    widget = node.addDOMWidget(WIDGET, "YUE2_ABC_EDITOR", editor.element, {
        getValue: () => editor.value,
        setValue: (value) => editor.setValue(value),
        getMinHeight: () => MIN_WIDGET_HEIGHT,
    });
    node.widgets.splice(node.widgets.indexOf(widget), 1);
    node.widgets.splice(index, 0, widget);
    editor.setValue(initial);
    node.yue2AbcEditor = editor; // for the browser tests and for debugging from the console

    node.setSize?.([Math.max(node.size[0], MIN_NODE_SIZE[0]), Math.max(node.size[1], MIN_NODE_SIZE[1])]);
    return editor;
}

/** The editors of the open graph's top level, by node id. */
function editors() {
    const nodes = app.graph?.nodes ?? app.graph?._nodes ?? [];
    return nodes.filter((n) => n.yue2AbcEditor).map((n) => [String(n.id), n.yue2AbcEditor]);
}

/**
 * Results that do not come as the node's own "executed" message (editor review, stop 39):
 * - "yue2.abc_editor.source" (nodes/editor.py): the run stopped on errors in the connected score; an empty or
 *   unedited box shows that score with its marks, where it can be fixed;
 * - "execution_cached": ComfyUI answered the run from its cache without executing the node, so an empty box asks
 *   the server for the score the node last received (/yue2/abc/last_source) — else it stayed empty.
 */
function listen() {
    api.addEventListener("yue2.abc_editor.source", ({ detail }) => {
        if (detail?.workflow && typeof app.graph?.id === "string" && detail.workflow !== app.graph.id) return;
        const found = editors().find(([id]) => id === String(detail?.node));
        if (found && typeof detail.source_abc === "string") found[1].executed({ source_abc: [detail.source_abc] });
    });
    api.addEventListener("execution_cached", async ({ detail }) => {
        const cached = new Set((detail?.nodes ?? []).map(String));
        const workflow = app.graph?.id;
        if (typeof workflow !== "string") return;
        for (const [id, editor] of editors()) {
            if (!cached.has(id) || editor.value.trim()) continue;
            try {
                const answer = await callRoute("last_source", { workflow, node: id });
                // still empty: a cached result ComfyUI sent meanwhile ("executed") wins over the record
                if (typeof answer.source_abc === "string" && !editor.value.trim()) {
                    editor.executed({ source_abc: [answer.source_abc] });
                }
            } catch (error) {
                console.warn("[ComfyUI-YuE2] the editor could not fetch the cached score:", error);
            }
        }
    });
}

app.registerExtension({
    name: "ComfyUI-YuE2.AbcEditor",

    init() {
        addStylesheet();
        listen();
    },

    beforeConfigureGraph() {
        loads += 1;
        loading = watchLoads();
    },

    afterConfigureGraph() {
        // a load that never opens its workflow (it failed, or a newer load replaced it) must not keep editors waiting
        const load = loads;
        if (loading) setTimeout(() => load === loads && loading && loaded(), 3000);
    },

    async beforeRegisterNodeDef(nodeType, nodeData) {
        if (nodeData?.name !== NODE_TYPE) return;

        const onNodeCreated = nodeType.prototype.onNodeCreated;
        nodeType.prototype.onNodeCreated = function () {
            const result = onNodeCreated?.apply(this, arguments);
            try {
                attachEditor(this);
            } catch (error) {
                // The plain textarea stays usable if the editor cannot be built.
                console.error("[ComfyUI-YuE2] the ABC editor could not be attached:", error);
            }
            return result;
        };

        const onConfigure = nodeType.prototype.onConfigure;
        nodeType.prototype.onConfigure = function (info) {
            const result = onConfigure?.apply(this, arguments);
            this.yue2AbcEditor?.restoredSource(this.properties);
            return result;
        };

        // The editor is the `abc` widget: a link dropped on its socket replaced the box's text with the linked one
        // while ComfyUI 0.3.75's frontend still showed the box, editable, and its text was not used (newer frontends
        // hide the whole editor then). Text from another node goes to `abc_text`, which the editor shows and checks.
        const onConnectInput = nodeType.prototype.onConnectInput;
        nodeType.prototype.onConnectInput = function (slot) {
            if (this.inputs?.[slot]?.widget?.name === WIDGET) return false;
            return onConnectInput?.apply(this, arguments) ?? true;
        };

        const onExecuted = nodeType.prototype.onExecuted;
        nodeType.prototype.onExecuted = function (output) {
            const result = onExecuted?.apply(this, arguments);
            this.yue2AbcEditor?.executed(output);
            return result;
        };

        const onRemoved = nodeType.prototype.onRemoved;
        nodeType.prototype.onRemoved = function () {
            this.yue2AbcEditor?.dispose();
            return onRemoved?.apply(this, arguments);
        };
    },
});
