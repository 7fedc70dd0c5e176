// Helpers shared by the ABC editor's browser tests (editor*.test.mjs): put a YuE2 ABC Editor on the canvas, type into
// it, wait for its analyses. The editor exposes its state as data-* attributes on its root element (.yue2-abc):
// analyzed (count of finished analyses), errors, warnings, playing, audioState, position, highlighted.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { api, log, waitForHistory } from "./lib.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, "..", "..");
export const CORPUS = path.join(REPO, "tests", "abc", "corpus");
export const EDITOR = "YuE2ABCEditor";
export const LOADER = "YuE2CheckpointLoader";
export const COMPOSER = "YuE2Composer";
export const CKPT_NAME = process.env.YUE2_EDITOR_CKPT || ""; // set by test_editor_browser.py: a synthetic checkpoint

export const corpus = (name) => fs.readFileSync(path.join(CORPUS, name), "utf8");

/** The shipped edit & re-render workflow (a workflow file holding a YuE2ABCEditor), or null until there is one. */
export function shippedWorkflow() {
    for (const folder of ["example_workflows", "workflows"]) {
        const dir = path.join(REPO, folder);
        if (!fs.existsSync(dir)) continue;
        const files = fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort((a, b) =>
            (b.includes("edit") - a.includes("edit")) || a.localeCompare(b));
        for (const file of files) {
            const workflow = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
            if ((workflow.nodes || []).some((n) => n.type === EDITOR)) return { file: `${folder}/${file}`, workflow };
        }
    }
    return null;
}

/**
 * Load the shipped workflow, or build a stand-in of its middle: YuE2 Checkpoint Loader → YuE2 Composer whose score
 * input comes from a YuE2 ABC Editor; the editor's `abc` output feeds a core "Preview as Text" node. Points every
 * checkpoint loader at `ckptName` and every composer at `maxSeconds`.
 * Returns {editorId, composerId (the composer fed by the editor), previewId (stand-in only), shipped (file or null)}.
 */
export async function setUpGraph(page, { ckptName = CKPT_NAME, preferShipped = true, maxSeconds = 60 } = {}) {
    const shipped = preferShipped ? shippedWorkflow() : null;
    if (shipped) {
        // As lib.mjs's loadWorkflow, without the "missing models" dialog: the test checkpoint has another name.
        await page.evaluate((wf) => window.app.loadGraphData(wf, true, true, null,
            { showMissingModelsDialog: false, showMissingNodesDialog: false }), shipped.workflow);
        log(`loaded the shipped workflow ${shipped.file}`);
    }
    const ids = await page.evaluate(({ shipped, editorType, loaderType, composerType, ckptName, maxSeconds }) => {
        const graph = window.app.graph;
        let previewId = null;
        if (!shipped) {
            graph.clear();
            const add = (type, pos) => {
                const node = window.LiteGraph.createNode(type);
                node.pos = pos;
                graph.add(node);
                return node;
            };
            const editor = add(editorType, [90, 60]);
            const right = editor.pos[0] + editor.size[0] + 40;
            const preview = add("PreviewAny", [right, 60]);
            editor.connect(editor.outputs.findIndex((o) => o.type === "STRING"), preview, 0); // the "abc" output
            previewId = preview.id;
            const loader = add(loaderType, [right, 260]);
            const composer = add(composerType, [right + 320, 60]);
            loader.connect(0, composer, composer.inputs.findIndex((i) => i.name === "model"));
            editor.connect(0, composer, composer.inputs.findIndex((i) => i.name === "score"));
            composer.widgets.find((w) => w.name === "style").value = "pop, female vocal";
            composer.widgets.find((w) => w.name === "lyrics").value = "[verse]\nla la la";
        }
        for (const loader of graph.nodes.filter((n) => n.type === loaderType)) {
            const widget = loader.widgets?.find((w) => w.name === "ckpt_name");
            if (widget && ckptName) widget.value = ckptName;
        }
        for (const composer of graph.nodes.filter((n) => n.type === composerType)) {
            const widget = composer.widgets?.find((w) => w.name === "max_seconds");
            if (widget && maxSeconds) widget.value = maxSeconds;
        }
        const editor = graph.nodes.find((n) => n.type === editorType);
        const fedByEditor = (node) => node.inputs?.some((i) => i.link != null
            && (graph.getLink?.(i.link) ?? graph.links?.get?.(i.link))?.origin_id === editor?.id);
        const composer = graph.nodes.find((n) => n.type === composerType && fedByEditor(n));
        return { editorId: editor?.id ?? null, composerId: composer?.id ?? null, previewId };
    }, { shipped: Boolean(shipped), editorType: EDITOR, loaderType: LOADER, composerType: COMPOSER, ckptName,
         maxSeconds });
    if (ids.editorId == null) throw new Error("no YuE2ABCEditor node on the canvas");
    await showNode(page, ids.editorId);
    return { ...ids, shipped: shipped?.file ?? null };
}

/**
 * Queue what shows that the composer received the editor's text, and wait for its /history entry. No music is
 * sampled (the test weights are random): the composer fed by the editor runs with sample_music off ("score only"),
 * which still tokenizes the score it is given and reports it; composers upstream of the editor (the planner of the
 * shipped workflow) are bypassed, since the edited text replaces their score anyway. The outputs run (ComfyUI's
 * partial execution) are "Preview as Text" nodes: the one on the editor's abc (stand-in) and one on the composer's
 * report (added when the workflow has none). Returns {entry, reportPreviewId}.
 */
export async function queueForEditor(page, { editorId, composerId, timeout = 170000 }) {
    const before = Object.keys(await api("/history"));
    const reportPreviewId = await page.evaluate(async ({ editorId, composerId }) => {
        const graph = window.app.graph;
        const linkOf = (id) => (id == null ? null : graph.getLink?.(id) ?? graph.links?.get?.(id));
        const editor = graph.getNodeById(editorId);
        for (const input of editor.inputs || []) {
            const source = graph.getNodeById(linkOf(input.link)?.origin_id);
            if (source?.type === "YuE2Composer") source.mode = 4; // bypass
        }
        const composer = graph.getNodeById(composerId);
        composer.widgets.find((w) => w.name === "sample_music").value = false;
        const slot = composer.outputs.findIndex((o) => o.name === "report");
        const previews = (composer.outputs[slot].links || []).map((id) => graph.getNodeById(linkOf(id)?.target_id))
            .filter((n) => n?.type === "PreviewAny");
        let report = previews[0];
        if (!report) {
            report = window.LiteGraph.createNode("PreviewAny");
            report.pos = [composer.pos[0], composer.pos[1] + composer.size[1] + 40];
            graph.add(report);
            composer.connect(slot, report, 0);
        }
        const targets = graph.nodes.filter((n) => n.type === "PreviewAny" && n.inputs?.[0]?.link != null
            && [editorId, composerId].includes(linkOf(n.inputs[0].link)?.origin_id)).map((n) => String(n.id));
        await window.app.queuePrompt(0, 1, targets);
        return report.id;
    }, { editorId, composerId });
    return { entry: await waitForHistory(before, timeout), reportPreviewId };
}

/** Scroll the canvas so the node is on screen at zoom 1 (DOM widgets of off-screen or zoomed-out nodes are hidden). */
export async function showNode(page, nodeId) {
    await page.evaluate((id) => {
        const canvas = window.app.canvas;
        const node = window.app.graph.getNodeById(id);
        canvas.ds.scale = 1;
        canvas.ds.offset = [-node.pos[0] + 70, -node.pos[1] + 110];
        canvas.setDirty(true, true);
    }, nodeId);
    await page.locator(".yue2-abc").first().waitFor({ state: "visible", timeout: 15000 });
}

export const editorState = (page) => page.evaluate(() => ({ ...document.querySelector(".yue2-abc").dataset }));
export const editorText = (page) => page.locator(".yue2-abc-textarea").inputValue();
export const svgVersion = async (page) => Number(await page.locator(".yue2-abc-score").getAttribute("data-version"));

/** Wait until the editor finished an analysis newer than `after` (a previous `analyzed` count). */
export async function waitAnalyzed(page, after, timeout = 30000) {
    await page.waitForFunction((n) => {
        const root = document.querySelector(".yue2-abc");
        return root && Number(root.dataset.analyzed) > n;
    }, after, { timeout, polling: 100 });
    return editorState(page);
}

/** Replace the whole text the way a paste does, and wait for the analysis. */
export async function pasteText(page, text) {
    const before = Number((await editorState(page)).analyzed);
    await page.locator(".yue2-abc-textarea").fill(text);
    return waitAnalyzed(page, before);
}

/** As pasteText, for a large score: the text is set in the page and the input event a paste fires is sent (what the
 *  editor reads either way). Playwright's fill() inserts a text through the browser's input pipeline, which took 5 s
 *  for the 85 kB, 1,400-line score of editor_typing.test.mjs (vs. milliseconds here). */
export async function pasteLarge(page, text) {
    const before = Number((await editorState(page)).analyzed);
    await page.evaluate((value) => {
        const t = document.querySelector(".yue2-abc-textarea");
        t.focus();
        t.setRangeText(value, 0, t.value.length, "end");
        t.dispatchEvent(new InputEvent("input", { bubbles: true, inputType: "insertFromPaste" }));
    }, text);
    return waitAnalyzed(page, before);
}

/** Put the caret at character offset `offset` of the text area. */
export async function caretAt(page, offset) {
    await page.evaluate((pos) => {
        const t = document.querySelector(".yue2-abc-textarea");
        t.focus();
        t.setSelectionRange(pos, pos);
    }, offset);
}

/** A screenshot of the editor node alone (for docs and artefacts). */
export async function shootEditor(page, file) {
    fs.mkdirSync(path.dirname(file), { recursive: true });
    await page.locator(".yue2-abc").first().screenshot({ path: file });
    log("screenshot", file);
}

/** The toolbar button of `tool` (undo, redo, up, down, …). */
export const toolButton = (page, tool) => page.locator(`.yue2-abc-toolbar button[data-tool="${tool}"]`);

/** Press ↶ (or ↷: `tool` "undo" / "redo") until it is disabled; the texts it went through (at most 10). */
export async function walkHistory(page, tool) {
    const texts = [];
    for (let i = 0; i < 10 && await toolButton(page, tool).isEnabled(); i++) {
        await toolButton(page, tool).click();
        texts.push(await editorText(page));
    }
    return texts;
}

/** Three undo steps in the shown editor: paste `song`, type "\n% my edit" at its end, transpose up a semitone
 *  (a score in G: to A flat). Returns { edited, transposed } (the texts after the 2nd and 3rd steps). */
export async function threeEdits(page, song) {
    const edited = `${song}\n% my edit`;
    const before = Number((await editorState(page)).analyzed);
    await page.locator(".yue2-abc-textarea").fill(song); // as pasteText, which does not say when the paste ended
    const pastedAt = Date.now();
    let state = await waitAnalyzed(page, before);
    // 1 s past the paste (the typing pause is 900 ms): the edit below is a step of its own. The analysis above took
    // part of that second already; only the rest is waited here (it was a fixed 1 s after the analysis).
    await page.waitForTimeout(Math.max(0, pastedAt + 1000 - Date.now()));
    await caretAt(page, song.length);
    await page.keyboard.type("\n% my edit");
    state = await waitAnalyzed(page, Number(state.analyzed));
    if (await editorText(page) !== edited) throw new Error("typed: the edit did not land");
    await toolButton(page, "up").click();
    await waitAnalyzed(page, Number(state.analyzed));
    const transposed = await editorText(page);
    if (transposed === edited || !transposed.includes("\nK:Ab\n")) throw new Error("not transposed up to A flat");
    return { edited, transposed };
}
