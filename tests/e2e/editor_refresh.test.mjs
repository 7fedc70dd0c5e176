// A new score from upstream (the composer re-ran, e.g. with another seed) reaches the ABC editor through the node's
// execution result, as the frontend delivers it (node.onExecuted(ui), ui as nodes/editor.py builds it):
//   - a text the user has not edited (still the previous score received) is replaced by the new score, as an
//     undoable change, and Revert's target is the new score;
//   - an edited text is kept, a notice says "The composer's score changed — Revert to use it", Revert takes the new
//     score and hides the notice;
//   - both still hold after page reloads (the last score received and the notice are kept in the node's properties).
import path from "node:path";
import { ARTIFACTS, withComfy, assert, log } from "./lib.mjs";
import { caretAt, corpus, editorState, editorText, setUpGraph, shootEditor, showNode, waitAnalyzed } from "./editor_lib.mjs";

const song = corpus("song.abc");
const take = (bpm) => song.replace("Q:1/4=96", `Q:1/4=${bpm}`); // one composer run: the same song at another tempo
const NOTICE = "The composer's score changed — Revert to use it";
const button = (page, tool) => page.locator(`.yue2-abc-toolbar button[data-tool="${tool}"]`);
const noticeShown = (page) => page.locator(".yue2-abc-notice").isVisible();

/** The node ran with `used` in its box (empty: the connected score) and `source` connected: deliver its ui result. */
async function executed(page, editorId, source, used = source) {
    const ui = { text: ["(test)"], abc: [used], source_abc: [source], unchanged: [used === source], issues: [] };
    await page.evaluate(([id, output]) => window.app.graph.getNodeById(id).onExecuted(output), [editorId, ui]);
}

/** Wait until the persisted workflow holds this editor state, reload the page, and come back to the editor. */
async function reload(page, editorId, { text, source, changed }) {
    await page.waitForFunction(({ id, text, source, changed }) => {
        // frontend 1.32 persists under localStorage "workflow"; newer ones under other keys (1.58: draft payloads
        // "Comfy.Workflow.Draft…" whose workflow is a JSON string inside), some in sessionStorage
        const graphs = [];
        const collect = (value, depth) => {
            if (depth > 4 || value == null) return;
            if (typeof value === "string") {
                if (/^\s*[[{]/.test(value)) { try { collect(JSON.parse(value), depth + 1); } catch { /* not JSON */ } }
            } else if (Array.isArray(value?.nodes)) {
                graphs.push(value);
            } else if (typeof value === "object") {
                Object.values(value).forEach((inner) => collect(inner, depth + 1));
            }
        };
        [localStorage, sessionStorage].forEach((store) => Object.keys(store).forEach((key) => collect(store.getItem(key), 0)));
        return graphs.some((graph) => {
            const node = graph?.nodes?.find?.((n) => String(n.id) === String(id)); // 1.58: "1" here, 1 stored
            return node && Object.values(node.widgets_values || {}).includes(text) && node.properties?.yue2_composer_abc === source
                && (node.properties?.yue2_composer_abc_changed === true) === changed;
        });
    }, { id: editorId, text, source, changed }, { timeout: 10000, polling: 100 }).catch(() => {
        // A frontend that wrote its draft only when the page is left would never show it here: reload anyway; the
        // checks after the reload decide whether the edit survived. (1.58 writes it within a second; this wait timed
        // out there only while the node ids were compared as 1 === "1", 10 s per reload.)
        log("the editor state was not found in the page's storage before the reload; reloading anyway");
    });
    await page.reload();
    await page.waitForFunction(() => window.app?.graph?.nodes?.some((n) => n.yue2AbcEditor), null, { timeout: 60000 });
    await showNode(page, editorId);
    await waitAnalyzed(page, 0);
    assert(await editorText(page) === text, "the text survived the reload");
    assert(await noticeShown(page) === changed, `the notice is ${changed ? "shown" : "hidden"} after the reload`);
}

await withComfy("editor-refresh", async ({ page, pageErrors }) => {
    const { editorId } = await setUpGraph(page, { preferShipped: false });

    // 1. First run, empty box: the editor takes the composer's score.
    await executed(page, editorId, take(96));
    await waitAnalyzed(page, 0);
    assert(await editorText(page) === take(96), "the empty editor took the first score");
    assert(!(await noticeShown(page)), "no notice after filling the empty box");

    // 2. The composer re-ran; the box still holds its previous score (the node used that text): replaced, undoably.
    await executed(page, editorId, take(100), take(96));
    assert(await editorText(page) === take(100), "an unedited text is replaced by the new score");
    assert(!(await noticeShown(page)), "no notice when the text was replaced");
    assert(await button(page, "revert").isDisabled(), "Revert has nothing to do: the text is the new score");
    await button(page, "undo").click();
    assert(await editorText(page) === take(96), "↶ brings the previous score back");
    await button(page, "redo").click();
    assert(await editorText(page) === take(100), "↷ takes the new score again");

    // 3. The user edits; the composer re-runs: the edit is kept, the notice appears, Revert now means the new score.
    let state = await editorState(page);
    await caretAt(page, take(100).length);
    await page.keyboard.type("\n% my edit");
    state = await waitAnalyzed(page, Number(state.analyzed));
    const edited = `${take(100)}\n% my edit`;
    assert(await editorText(page) === edited, "typed");
    await executed(page, editorId, take(104), edited);
    assert(await editorText(page) === edited, "an edited text is kept when a new score arrives");
    assert(await noticeShown(page), "the notice is shown");
    assert(await page.locator(".yue2-abc-notice").textContent() === NOTICE, "the notice's words");
    assert((await editorState(page)).sourceChanged === "true", "data-source-changed is set");
    assert(await button(page, "revert").isEnabled(), "Revert is offered");
    await executed(page, editorId, take(104), edited); // the same score again (a cached composer): nothing changes
    assert(await editorText(page) === edited && await noticeShown(page), "the same score again keeps text and notice");
    await shootEditor(page, path.join(ARTIFACTS, "editor-source-changed.png"));

    // 4. Reload: the edit and the notice are back; a newer score keeps the edit again; Revert takes that newer score.
    await reload(page, editorId, { text: edited, source: take(104), changed: true });
    await executed(page, editorId, take(108), edited);
    assert(await editorText(page) === edited && await noticeShown(page), "after a reload an edit is still kept");
    await button(page, "revert").click();
    assert(await editorText(page) === take(108), "Revert takes the newest score");
    assert(!(await noticeShown(page)), "Revert hides the notice");
    await page.locator(".yue2-abc-textarea").focus();
    await page.keyboard.press("Control+z");
    assert(await editorText(page) === edited, "Ctrl+Z undoes the revert");
    await page.keyboard.press("Control+Shift+z");
    assert(await editorText(page) === take(108), "Ctrl+Shift+Z redoes it");

    // 5. Reload: the unedited text follows the next score (the previous score received was kept with the node).
    await reload(page, editorId, { text: take(108), source: take(108), changed: false });
    await executed(page, editorId, take(112), take(108));
    assert(await editorText(page) === take(112), "after a reload an unedited text is replaced");
    assert(!(await noticeShown(page)), "still no notice");
    log("unedited → replaced, edited → kept with the notice, across two reloads");

    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
