// The editor's undo history survives renaming a workflow that is already saved as a file (the workflows sidebar's
// rename: the workflow store's renameWorkflow on a persisted workflow moves the file under the user's data). The
// rename test (editor_history_rename.test.mjs) renames a temporary workflow, which only changes its path; this one
// saves the workflow first, as the frontend's "Save" of a new workflow does (rename it, then the store's
// saveWorkflow), edits, renames the saved file, and right after it (no key typed in the editor in between: an edit
// would re-read the history key under the new name) a canvas Ctrl+Z re-creates the node; Ctrl+Z in the new editor
// must walk the edits once each, with nothing left over in the history store.
import { withComfy, assert, api, log } from "./lib.mjs";
import {
    corpus, editorText, setUpGraph, showNode, threeEdits, toolButton, walkHistory,
} from "./editor_lib.mjs";

const song = corpus("song.abc");
const edited = `${song}\n% my edit`;
const stamp = Date.now();
const SAVED = `yue2 history saved ${stamp}.json`;
const RENAMED = `yue2 history saved renamed ${stamp}.json`;
const RENAMED_AGAIN = `yue2 history saved renamed again ${stamp}.json`;

/** The workflow files under the user's data (paths relative to workflows/). */
const workflowFiles = async () => api("/api/userdata?dir=workflows&recurse=true&split=false");

/** Histories held by the editor's store (web/abc_editor/history.js, the module instance the extension uses). */
const keptHistories = (page) => page.evaluate(async () => {
    const entry = (await (await fetch("/extensions")).json()).find((p) => p.endsWith("/yue2_abc_editor.js"));
    if (!entry) return null;
    return (await import(new URL("./abc_editor/history.js", new URL(entry, location.href)).href)).keptHistories();
});

/** Run `action` in the page (a graph load) and wait for the editor node made anew, its history taken back. */
async function reloaded(page, editorId, action) {
    await page.evaluate((id) => { window.__yue2OldEditor = window.app.graph.getNodeById(id).yue2AbcEditor; }, editorId);
    await action();
    await page.waitForFunction((id) => {
        const editor = window.app.graph.getNodeById(id)?.yue2AbcEditor;
        return editor && editor !== window.__yue2OldEditor && !editor.historyPending;
    }, editorId, { timeout: 15000, polling: 100 });
    await showNode(page, editorId);
}

/** Ctrl+Z (or Ctrl+Y: `key` "y") typed in the editor's text box; the text it leaves. */
async function keyInEditor(page, key) {
    await page.locator(".yue2-abc-textarea").focus();
    await page.keyboard.press(`Control+${key}`);
    return editorText(page);
}

const workflowInfo = (page) => page.evaluate(() => {
    const workflow = window.app.extensionManager.workflow.activeWorkflow;
    return { path: workflow?.path, temporary: workflow?.isTemporary, persisted: workflow?.isPersisted,
             same: (workflow?.__v_raw ?? workflow) === window.__yue2Saved };
});

await withComfy("editor-history-saved-rename", async ({ page, pageErrors }) => {
    const { editorId } = await setUpGraph(page, { preferShipped: false });
    await showNode(page, editorId);

    // Save the new workflow to a file, as the frontend's Save does for a temporary workflow: name it, then save.
    const saved = await page.evaluate(async (name) => {
        const store = window.app.extensionManager.workflow;
        const workflow = store.activeWorkflow;
        window.__yue2Saved = workflow.__v_raw ?? workflow;
        await store.renameWorkflow(workflow, `${workflow.directory}/${name}`);
        await store.saveWorkflow(workflow);
        return { path: workflow.path, temporary: workflow.isTemporary, persisted: workflow.isPersisted };
    }, SAVED);
    assert(!saved.temporary && saved.persisted && saved.path.endsWith(SAVED), `saved: ${JSON.stringify(saved)}`);
    assert((await workflowFiles()).includes(SAVED), `the file workflows/${SAVED} is on the server`);
    log(`saved as ${saved.path}`);

    // Three undo steps in the editor (the paste, a typed edit, a transposition), then rename the saved workflow.
    const { transposed } = await threeEdits(page, song);
    const rename = async (name) => {
        await page.evaluate(async (name) => {
            const store = window.app.extensionManager.workflow;
            await store.renameWorkflow(store.activeWorkflow, `${store.activeWorkflow.directory}/${name}`);
        }, name);
        const info = await workflowInfo(page);
        assert(info.path.endsWith(name) && info.persisted && !info.temporary && info.same,
               `the saved workflow was renamed in place: ${JSON.stringify(info)}`);
        return info;
    };
    const renamed = await rename(RENAMED);
    const files = await workflowFiles();
    assert(files.includes(RENAMED) && !files.includes(SAVED), `the file moved: ${JSON.stringify(files)}`);
    log(`renamed the saved workflow ${saved.path} → ${renamed.path} (the file moved)`);

    // Straight after the rename (no key typed in the editor since), a canvas Ctrl+Z — ComfyUI's graph undo —
    // re-creates the node: the new editor takes the history back.
    await reloaded(page, editorId, async () => {
        await page.evaluate(() => document.activeElement?.blur?.());
        await page.keyboard.press("Control+z");
    });
    assert((await workflowInfo(page)).same, "the graph undo kept the renamed workflow active");
    const left = await keptHistories(page);
    assert(left === 0, `the new editor took its history: none left over in the store (${left} left)`);
    const after = await editorText(page);
    assert(after === transposed || after === edited, `the graph undo left a text of the history: ${after.slice(-40)}`);
    log(`the canvas Ctrl+Z re-created the editor node (text: ${after === transposed ? "transposed" : "edited"})`);

    // Ctrl+Z in the new editor walks the edits back, each once, to the empty box; ↷ forward to the transposition.
    const back = [];
    for (let i = 0; i < 10 && await toolButton(page, "undo").isEnabled(); i++) back.push(await keyInEditor(page, "z"));
    const expected = after === transposed ? [edited, song, ""] : [song, ""];
    const tails = JSON.stringify(back.map((t) => t.slice(-12)));
    assert(JSON.stringify(back) === JSON.stringify(expected), `Ctrl+Z walks the edits once each: ${tails}`);
    const forward = await walkHistory(page, "redo");
    assert(forward[forward.length - 1] === transposed && forward.includes(edited) && forward[0] === song,
           `↷ steps forward to the transposition: ${JSON.stringify(forward.map((t) => t.slice(-12)))}`);
    log(`history kept across the saved workflow's rename (${back.length} back, ${forward.length} forward)`);

    // Renamed once more, the same editor (not re-created): Ctrl+Z undoes the transposition, Ctrl+Y redoes it.
    await rename(RENAMED_AGAIN);
    assert(await keyInEditor(page, "z") === edited, "Ctrl+Z in the editor undoes the transposition after the rename");
    assert(await keyInEditor(page, "y") === transposed, "Ctrl+Y in the editor redoes it");

    // The store counted above is the editor's own: a node removed with a history leaves it there.
    await page.evaluate((id) => window.app.graph.remove(window.app.graph.getNodeById(id)), editorId);
    assert(await keptHistories(page) === 1, "the removed editor's history is in the store the test reads");

    // Clean up: the next run (or another test on this server) must not list this file.
    await page.evaluate(async () => {
        const store = window.app.extensionManager.workflow;
        await store.deleteWorkflow(store.activeWorkflow);
    }).catch((e) => log(`could not delete the test workflow: ${e}`));

    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
