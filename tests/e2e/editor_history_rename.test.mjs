// The editor's undo history survives a canvas Ctrl+Z after the workflow was renamed (known gap, stop 41): the
// history was kept under the workflow's path as the node last read it and looked up under the new path, so a
// rename (or a temporary workflow's "Save As", which renames it) before the graph undo lost it. The key now names
// the workflow object, which a rename keeps. Two tabs of one workflow (a duplicate: the same graph id and node ids)
// still keep their own histories: the copy starts with none, and the original gets its own back.
import { withComfy, assert, log } from "./lib.mjs";
import {
    corpus, editorText, setUpGraph, showNode, threeEdits, toolButton, walkHistory,
} from "./editor_lib.mjs";

const song = corpus("song.abc");
const edited = `${song}\n% my edit`;
const button = toolButton;

const walk = walkHistory;

/** Run `action` in the page (a graph load) and wait for the editor node made anew, its history taken back. */
async function reloaded(page, editorId, action, arg) {
    await page.evaluate((id) => { window.__yue2OldEditor = window.app.graph.getNodeById(id).yue2AbcEditor; }, editorId);
    await action(arg);
    await page.waitForFunction((id) => {
        const editor = window.app.graph.getNodeById(id)?.yue2AbcEditor;
        return editor && editor !== window.__yue2OldEditor && !editor.historyPending;
    }, editorId, { timeout: 15000, polling: 100 });
    await showNode(page, editorId);
}

const canStep = async (page) => await button(page, "undo").isEnabled() || await button(page, "redo").isEnabled();
const active = (page) => page.evaluate(() => ({
    path: window.app.extensionManager.workflow.activeWorkflow?.path, graph: window.app.graph.id,
}));

await withComfy("editor-history-rename", async ({ page, pageErrors }) => {
    const { editorId } = await setUpGraph(page, { preferShipped: false });
    await showNode(page, editorId);

    // Three undo steps: the paste, a typed edit, a transposition.
    const { transposed } = await threeEdits(page, song);

    // Rename the open workflow through the frontend's workflow store (the sidebar's rename; "Save As" of a
    // temporary workflow does the same), then Ctrl+Z on the canvas: ComfyUI's graph undo re-creates the node.
    const before = await active(page);
    const renamed = await page.evaluate(async () => {
        const store = window.app.extensionManager.workflow;
        const workflow = store.activeWorkflow;
        await store.renameWorkflow(workflow, `${workflow.directory}/yue2 history renamed ${Date.now()}.json`);
        return { path: store.activeWorkflow.path, temporary: workflow.isTemporary };
    });
    assert(renamed.path !== before.path && renamed.path.includes("yue2 history renamed"),
           `the workflow was renamed: ${before.path} → ${renamed.path}`);
    log(`renamed ${before.path} → ${renamed.path} (temporary: ${renamed.temporary})`);
    await reloaded(page, editorId, async () => {
        await page.evaluate(() => document.activeElement?.blur?.());
        await page.keyboard.press("Control+z");
    });
    log("the canvas Ctrl+Z re-created the editor node");
    const after = await editorText(page);
    assert(after === transposed || after === edited, `the graph undo left a text of the history: ${after.slice(-40)}`);
    assert(await canStep(page), "↶ / ↷ enabled: the history survived the rename and the node being re-created");
    const back = await walk(page, "undo");
    assert((back.length ? back[back.length - 1] : after) === "", "↶ steps back to the empty box");
    const forward = await walk(page, "redo");
    assert(forward[forward.length - 1] === transposed && forward.includes(edited) && forward[0] === song,
           `↷ steps forward to the transposition: ${JSON.stringify(forward.map((t) => t.slice(-12)))}`);

    // A second tab of the same workflow (as the sidebar's Duplicate: its state, the same graph id and node ids).
    const original = await active(page);
    await reloaded(page, editorId, () => page.evaluate(async () => {
        const workflow = window.app.extensionManager.workflow.activeWorkflow;
        window.__yue2Original = workflow;
        const copy = JSON.parse(JSON.stringify(workflow.activeState));
        await window.app.loadGraphData(copy, true, true, "yue2 history copy",
                                       { showMissingModelsDialog: false, showMissingNodesDialog: false });
    }));
    const copy = await active(page);
    assert(copy.path !== original.path && copy.graph === original.graph,
           `a second tab with the same graph id: ${JSON.stringify([original, copy])}`);
    assert(await editorText(page) === transposed, "the copy has the text");
    assert(!await canStep(page), "the copy does not take the original tab's history");

    // Back to the original tab (as a click on it: the frontend's openWorkflow loads its state): its history is back.
    await reloaded(page, editorId, () => page.evaluate(async () => {
        const workflow = window.__yue2Original;
        await window.app.loadGraphData(workflow.activeState, true, true, workflow,
                                       { showMissingModelsDialog: false, showMissingNodesDialog: false });
    }));
    assert((await active(page)).path === original.path, "the original tab is active again");
    assert(await editorText(page) === transposed, "the original has its text");
    const again = await walk(page, "undo");
    const tails = JSON.stringify(again.map((t) => t.slice(-12)));
    assert(JSON.stringify(again) === JSON.stringify([edited, song, ""]), `the original tab walks its edits: ${tails}`);
    log(`history kept across the rename (${back.length} back, ${forward.length} forward) and per tab`);

    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
