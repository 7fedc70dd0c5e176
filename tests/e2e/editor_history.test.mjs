// The editor's own undo history survives ComfyUI re-creating the node (known gap, stop 41). A Ctrl+Z on the canvas is
// ComfyUI's graph undo: it loads the previous workflow state, which removes every node and makes it anew — the old
// editor and its undo stack went with it, so ↶ / Ctrl+Z in the box had nothing left to undo. The editor now hands its
// history over (web/abc_editor/history.js, keyed by workflow, graph and node id) and the new one takes it back.
import { withComfy, assert, log } from "./lib.mjs";
import {
    caretAt, corpus, editorState, editorText, setUpGraph, showNode, threeEdits, toolButton, walkHistory,
} from "./editor_lib.mjs";

const song = corpus("song.abc");
const edited = `${song}\n% my edit`;
const button = toolButton;

const walk = walkHistory;

await withComfy("editor-history", async ({ page, pageErrors }) => {
    const { editorId } = await setUpGraph(page, { preferShipped: false });
    await showNode(page, editorId);

    // Three undo steps: the paste, a typed edit, a transposition.
    const { transposed } = await threeEdits(page, song);

    // Ctrl+Z on the canvas (focus outside the box): ComfyUI's graph undo re-creates the node.
    await page.evaluate((id) => { window.__yue2OldEditor = window.app.graph.getNodeById(id).yue2AbcEditor; }, editorId);
    await page.evaluate(() => document.activeElement?.blur?.());
    await page.keyboard.press("Control+z");
    await page.waitForFunction((id) => {
        const editor = window.app.graph.getNodeById(id)?.yue2AbcEditor;
        return editor && editor !== window.__yue2OldEditor && !editor.historyPending; // its history taken back
    }, editorId, { timeout: 15000, polling: 100 });
    log("the canvas Ctrl+Z re-created the editor node");
    await showNode(page, editorId);
    const after = await editorText(page);
    assert(after === transposed || after === edited,
           `the graph undo left a text of the history: ${after.slice(0, 80)}`);
    assert(await button(page, "undo").isEnabled(), "↶ is enabled: the history survived the node being re-created");

    // The whole history is still there: ↶ walks back to the empty box, ↷ forward to the transposition.
    const back = await walk(page, "undo");
    const expected = after === transposed ? [edited, song, ""] : [song, ""];
    assert(JSON.stringify(back) === JSON.stringify(expected),
           `↶ steps back through the edits: ${JSON.stringify(back.map((t) => t.slice(-12)))}`);
    const forward = await walk(page, "redo");
    assert(forward[forward.length - 1] === transposed && forward.includes(edited) && forward[0] === song,
           `↷ steps forward to the transposition: ${JSON.stringify(forward.map((t) => t.slice(-12)))}`);

    // Ctrl+Z typed in the box is still the editor's own undo, on the re-created node.
    await caretAt(page, 0);
    await page.keyboard.press("Control+z");
    assert(await editorText(page) === forward[forward.length - 2], "Ctrl+Z in the box undoes one step");
    const final = await editorState(page);
    log(`history kept across the re-creation (${back.length} steps back, ${forward.length} forward; `
        + `analyzed ${final.analyzed})`);

    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
