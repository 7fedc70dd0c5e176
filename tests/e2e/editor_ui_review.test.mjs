// The stop-56 editor UI review (docs/bad_inputs.md §59): the editor used as a user does in the browser.
//   1. A BPM typed into the tempo box while the analysis of a text edit ends is kept, and Enter sets it (the analysis
//      put the score's old tempo back into the box under the typist: Enter then set that, "nothing to change").
//   2. A STRING link dropped on the abc box's own socket is refused: with it, the linked text replaced the box's text
//      in the prompt while frontend 1.32 still showed the box, editable (newer frontends hide the whole editor);
//      abc_text takes the link, and the prompt still sends the box's text.
//   What held up, kept here: a copied and pasted node is an editor of its own with the text; a collapsed node hides
//   the editor and shows it again with its text; a switch to another workflow tab and back keeps both editors' texts
//   and the undo step; non-ASCII text, tabs, and spaces at line ends come back from a page reload exactly.
import { withComfy, assert, log } from "./lib.mjs";
import { corpus, setUpGraph, showNode } from "./editor_lib.mjs";

const song = corpus("song.abc");

/** Each editor of the open graph: {id, text, analyzed, undo} (ids as strings: 1.58 makes them strings). */
const editors = (page) => page.evaluate(() => window.app.graph.nodes.filter((n) => n.yue2AbcEditor).map((n) => ({
    id: String(n.id), text: n.yue2AbcEditor.value, analyzed: Number(n.yue2AbcEditor.element.dataset.analyzed),
    undo: n.yue2AbcEditor.text.canUndo,
})));
const editorOf = async (page, id) => (await editors(page)).find((e) => e.id === String(id));
const analyzedAfter = (page, id, n) => page.waitForFunction(([id, n]) => Number(window.app.graph.getNodeById(id)
    ?.yue2AbcEditor?.element.dataset.analyzed) > n, [id, n], { timeout: 30000, polling: 100 });
const root = (page, id) => page.locator(".yue2-abc").filter({ has: page.locator(`[data-node="${id}"]`) });

await withComfy("editor-ui-review", async ({ page, pageErrors }) => {
    const { editorId } = await setUpGraph(page, { preferShipped: false });
    // tag each editor's root with its node id, so locators below pick one editor of two
    const tag = () => page.evaluate(() => window.app.graph.nodes.filter((n) => n.yue2AbcEditor).forEach((n) => {
        n.yue2AbcEditor.element.querySelector(".yue2-abc-toolbar").dataset.node = String(n.id);
    }));
    await tag();
    const box = () => root(page, editorId).locator(".yue2-abc-textarea");
    const bpm = () => root(page, editorId).locator(".yue2-abc-bpm");
    await box().fill(song);
    await analyzedAfter(page, editorId, 0);

    // 1. Edit the text, then at once type a new tempo: the analysis of the edit ends while the BPM box has focus.
    //    (One more analysis is started after the typing, so one surely ends then, however slow the machine.)
    await box().press("Control+End");
    await box().pressSequentially("% tempo next\n");
    await bpm().fill("140");
    let seen = (await editorOf(page, editorId)).analyzed;
    await page.evaluate((id) => window.app.graph.getNodeById(id).yue2AbcEditor.analyze(), editorId);
    await analyzedAfter(page, editorId, seen);
    assert(await bpm().inputValue() === "140", `the typed BPM is kept: ${await bpm().inputValue()}`);
    seen = (await editorOf(page, editorId)).analyzed;
    await bpm().press("Enter");
    await analyzedAfter(page, editorId, seen);
    const text = (await editorOf(page, editorId)).text;
    assert(text.includes("\nQ:1/4=140\n"), `Enter set the typed tempo: ${text.match(/\nQ:[^\n]*/)?.[0]}`);

    // 2. A STRING output onto the abc box's socket: refused; onto abc_text: taken. The prompt sends the box's text.
    const linked = await page.evaluate((id) => {
        const graph = window.app.graph;
        const editor = graph.getNodeById(id);
        const source = window.LiteGraph.createNode("PrimitiveStringMultiline");
        source.pos = [editor.pos[0] - 420, editor.pos[1]];
        graph.add(source);
        source.widgets[0].value = "X:1\nT:from a link\n";
        const slot = (name) => editor.inputs.findIndex((i) => i.name === name);
        const onBox = source.connect(0, editor, slot("abc"));
        const boxLink = editor.inputs[slot("abc")].link;
        const onText = source.connect(0, editor, slot("abc_text"));
        const textLink = editor.inputs[slot("abc_text")].link;
        return { onBox: Boolean(onBox), boxLink, onText: Boolean(onText), textLink };
    }, editorId);
    assert(!linked.onBox && linked.boxLink == null,
           `a link on the abc box's socket is refused: ${JSON.stringify(linked)}`);
    assert(linked.onText && linked.textLink != null, `abc_text takes the link: ${JSON.stringify(linked)}`);
    const sent = await page.evaluate(async (id) => (await window.app.graphToPrompt()).output[String(id)].inputs,
                                     editorId);
    assert(sent.abc === text && Array.isArray(sent.abc_text),
           `the prompt sends the box's text: ${JSON.stringify(sent).slice(0, 200)}`);
    assert(await box().isEditable(), "the box is still shown and editable");

    // Held up: copy and paste the node (the canvas's Ctrl+C / Ctrl+V): an editor of its own, with the text.
    await page.evaluate((id) => {
        const canvas = window.app.canvas;
        canvas.deselectAll?.();
        canvas.selectNode(window.app.graph.getNodeById(id));
        canvas.copyToClipboard();
        canvas.pasteFromClipboard();
    }, editorId);
    await page.waitForFunction(() => window.app.graph.nodes.filter((n) => n.yue2AbcEditor).length === 2, null,
                               { timeout: 15000 });
    await tag();
    const copy = (await editors(page)).find((e) => e.id !== String(editorId));
    assert(copy.text === text, "the pasted node has the text");
    await page.evaluate(([id, t]) => window.app.graph.getNodeById(id).yue2AbcEditor.text.replace(t, "tool"),
                        [copy.id, song.replace("K:G", "K:D")]);
    assert((await editorOf(page, editorId)).text === text, "an edit of the copy leaves the original's text alone");

    // Held up: collapse and expand.
    const heights = await page.evaluate(async (id) => {
        const node = window.app.graph.getNodeById(id);
        const element = node.yue2AbcEditor.element;
        const frames = () => new Promise((resolve) => setTimeout(resolve, 400));
        node.collapse();
        window.app.canvas.setDirty(true, true);
        await frames();
        const collapsed = element.getBoundingClientRect().height;
        node.collapse();
        window.app.canvas.setDirty(true, true);
        await frames();
        return [collapsed, element.getBoundingClientRect().height];
    }, editorId);
    assert(heights[0] === 0 && heights[1] > 300, `collapsed: hidden; expanded: shown again (${heights})`);
    assert((await editorOf(page, editorId)).text === text, "the text is there after collapse and expand");

    // Held up: a new workflow tab, then a click on this one's tab.
    const name = await page.evaluate(() => window.app.extensionManager.workflow.activeWorkflow.filename);
    await page.evaluate(() => window.app.extensionManager.command.execute("Comfy.NewBlankWorkflow"));
    await page.waitForFunction(() => !window.app.graph.nodes.some((n) => n.yue2AbcEditor), null, { timeout: 15000 });
    await page.locator(".workflow-label", { hasText: new RegExp(`^${name.replace(/[()]/g, "\\$&")}$`) }).click();
    await page.waitForFunction(() => window.app.graph.nodes.filter((n) => n.yue2AbcEditor).length === 2
        && window.app.graph.nodes.every((n) => !n.yue2AbcEditor?.historyPending), null, { timeout: 15000 });
    const back = await editors(page);
    assert(back.find((e) => e.id === String(editorId))?.text === text && back.find((e) => e.id === copy.id)?.text
           === song.replace("K:G", "K:D"), "both editors have their texts after the tab switch");
    assert(back.every((e) => e.undo), "both editors kept their undo steps");

    // Held up: non-ASCII, a tab, spaces at a line end, reloaded exactly.
    await tag();
    await showNode(page, editorId);
    const marker = `ui-review-${Date.now()}`;
    const exact = song.replace("T:", "T:Café ☕ 日本語 😀\tzwei").replace("% intro", "% intro  \t ")
        + `% ${marker}  \n`;
    seen = (await editorOf(page, editorId)).analyzed;
    await box().fill(exact);
    await analyzedAfter(page, editorId, seen);
    await page.waitForFunction((q) => [localStorage, sessionStorage].some((store) => Object.keys(store).some(
        (key) => (store.getItem(key) || "").includes(q))), marker, { timeout: 10000 });
    await page.reload();
    await page.waitForFunction(() => window.app?.graph?.nodes?.filter((n) => n.yue2AbcEditor).length === 2, null,
                               { timeout: 60000 });
    assert((await editorOf(page, editorId)).text === exact, "the text came back from the reload exactly");
    log("tempo kept while typing; abc socket refuses links; paste, collapse, tab switch and reload keep the text");

    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
