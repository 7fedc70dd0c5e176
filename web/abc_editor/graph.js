// What the editor reads from the workflow around it: the YuE2 Composer it feeds (or that feeds it) for the song's
// maximum duration and prompt text, and the YuE2 checkpoint loader whose embedded tokenizer counts the score's tokens.

export const COMPOSER = "YuE2Composer";
export const LOADER = "YuE2CheckpointLoader";

function link(graph, id) {
    if (id == null) return null;
    return graph.getLink?.(id) ?? graph.links?.get?.(id) ?? graph.links?.[id] ?? null;
}

function nodeAt(graph, id) {
    return id == null ? null : graph.getNodeById(id);
}

function typeOf(node) {
    return node?.comfyClass || node?.type;
}

/**
 * Nodes directly linked to `node`: [{node, downstream}] (downstream = fed by `node`). Asked through the node's
 * getInputNode/getOutputNodes (frontend 1.32 has them too): frontend 1.58 deprecates reading the slots' `link` and
 * `links` (console: "input.link is deprecated", "output.links is deprecated"). The slots are read only for a node
 * without them.
 */
function neighbours(graph, node) {
    const out = [];
    (node.inputs || []).forEach((input, slot) => {
        const source = typeof node.getInputNode === "function" ? node.getInputNode(slot)
            : nodeAt(graph, link(graph, input.link)?.origin_id);
        if (source) out.push({ node: source, downstream: false });
    });
    (node.outputs || []).forEach((output, slot) => {
        const targets = typeof node.getOutputNodes === "function" ? node.getOutputNodes(slot)
            : (output.links || []).map((id) => nodeAt(graph, link(graph, id)?.target_id));
        for (const target of targets || []) if (target) out.push({ node: target, downstream: true });
    });
    return out;
}

/**
 * Breadth-first search from `start` following links in one direction (downstream or upstream) for the nearest node
 * of `type`; Reroutes and other pass-through nodes are walked through. Returns the node or null.
 */
function nearest(graph, start, type, downstream) {
    const seen = new Set([start.id]);
    let frontier = [start];
    for (let depth = 0; depth < 64 && frontier.length; depth++) {
        const next = [];
        for (const node of frontier) {
            for (const n of neighbours(graph, node)) {
                if (n.downstream !== downstream || seen.has(n.node.id)) continue;
                if (typeOf(n.node) === type) return n.node;
                seen.add(n.node.id);
                next.push(n.node);
            }
        }
        frontier = next;
    }
    return null;
}

function widgetValue(node, name) {
    return node?.widgets?.find((w) => w.name === name)?.value;
}

/** The composer that renders this editor's score (downstream) or, failing that, the one that wrote it (upstream). */
export function findComposer(editor) {
    const graph = editor.graph;
    if (!graph) return null;
    return nearest(graph, editor, COMPOSER, true) || nearest(graph, editor, COMPOSER, false);
}

/** The checkpoint loader feeding the composer (or any in the same graph). */
export function findLoader(editor, composer) {
    const graph = editor.graph;
    if (!graph) return null;
    const linked = (composer && nearest(graph, composer, LOADER, false)) || nearest(graph, editor, LOADER, false);
    if (linked) return linked;
    return (graph.nodes || graph._nodes || []).find((n) => typeOf(n) === LOADER) || null;
}

/**
 * Everything the editor uses from the graph, as plain values:
 * {maxSeconds, style, lyrics, cot, instrumental, ckptName, composerId, loaderId}; a field is null when unknown.
 */
export function graphContext(editor) {
    const composer = findComposer(editor);
    const loader = findLoader(editor, composer);
    const seconds = Number(widgetValue(composer, "max_seconds"));
    const text = (name) => {
        const value = widgetValue(composer, name);
        return typeof value === "string" ? value : null;
    };
    const cot = widgetValue(composer, "cot");
    const ckpt = widgetValue(loader, "ckpt_name");
    return {
        composerId: composer?.id ?? null,
        loaderId: loader?.id ?? null,
        maxSeconds: Number.isFinite(seconds) && seconds > 0 ? seconds : null,
        style: text("style") ?? text("tags"),
        lyrics: text("lyrics"),
        cot: cot === "melody" ? "melody" : "full",
        instrumental: widgetValue(composer, "instrumental") === true,
        ckptName: typeof ckpt === "string" && ckpt ? ckpt : null,
    };
}
