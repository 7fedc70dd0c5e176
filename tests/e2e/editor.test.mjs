// The ABC editor in the real ComfyUI frontend, end to end:
//   a score typed into the widget is engraved; a broken bar gets an error marker (gutter, issue list, SVG staff) that
//   disappears when fixed; transpose changes text and SVG and Ctrl+Z undoes it; set tempo edits Q:; the composer's
//   max_seconds, style and lyrics and the checkpoint's tokenizer feed the structure panel; Play starts an AudioContext
//   and the cursor/time readout move; queueing sends the edited text (history); a page reload keeps the edit; Revert
//   returns to the composer's score.
import path from "node:path";
import { ARTIFACTS, withComfy, assert, log } from "./lib.mjs";
import { CKPT_NAME, caretAt, corpus, editorState, editorText, queueForEditor, setUpGraph, shootEditor, showNode,
         svgVersion, waitAnalyzed } from "./editor_lib.mjs";

await withComfy("editor", async (session) => {
    const { page, pageErrors, ourWarnings } = session;
    const { editorId, previewId, composerId, shipped } = await setUpGraph(page);
    log(`editor node ${editorId}${shipped ? ` in ${shipped}` : " (stand-in workflow)"}`);

    // 1. The node ran with the composer's score and an empty box (the ui result nodes/editor.py sends in that case):
    //    the editor takes that score; it is engraved, has no issues, and the structure panel describes it.
    const song = corpus("song.abc");
    await page.evaluate(([id, text]) => window.app.graph.getNodeById(id).onExecuted(
        { text: ["input score, unchanged"], abc: [text], unchanged: [true], issues: [] }), [editorId, song]);
    let state = await waitAnalyzed(page, 0);
    assert(await editorText(page) === song, "the empty editor took the composer's score");
    assert(state.errors === "0" && state.warnings === "0", `song.abc is clean, got ${JSON.stringify(state)}`);
    assert(await page.locator(".yue2-abc-score svg g.note").count() > 40, "the SVG shows the notes");
    const structure = await page.locator(".yue2-abc-structure").innerText();
    for (const want of ["G · 4/4 · 96 BPM (1/4 beat) · L:1/16", "Vocal 15, Ins 15", "intro 1–2, verse 3–6, chorus 7–13, outro 14–15",
                        "0:37.5 (37.5 s) of max 60 s"]) {
        assert(structure.includes(want), `structure panel shows ${want}: ${structure}`);
    }
    if (CKPT_NAME) {
        // Token count from the checkpoint's embedded tokenizer, music budget from the composer's style and lyrics.
        await page.waitForFunction(() => /s of music fit after the \d+-token prompt/.test(
            document.querySelector(".yue2-abc-structure").innerText), null, { timeout: 30000 });
        const tokens = await page.locator('.yue2-abc-structure dd[data-field="Tokens"]').innerText();
        assert(new RegExp(`^\\d+ score tokens \\(${CKPT_NAME.replace(".", "\\.")}\\)$`).test(tokens), tokens);
        log(tokens, "|", await page.locator('.yue2-abc-structure dd[data-field="Music budget"]').innerText());
    }
    await shootEditor(page, path.join(ARTIFACTS, "editor-valid.png"));
    const version0 = await svgVersion(page);

    // 2. Type into a bar so it has too many beats: error on that line, in the list and on the SVG staff.
    const chorusLine = song.split("\n").indexOf('"C"e4e2c2e4f4|"D"d4e2d2B8|"Em7"z2B2B2c2d4e2d2|"Am"c4B2A2^G8|') + 1;
    assert(chorusLine > 0, "corpus line found");
    const offset = song.indexOf('"C"e4e2c2e4f4|') + '"C"e4'.length;
    let analyzed = Number(state.analyzed);
    await caretAt(page, offset);
    await page.keyboard.type("g4");
    state = await waitAnalyzed(page, analyzed);
    assert(Number(state.errors) >= 1, `an error after breaking the bar: ${JSON.stringify(state)}`);
    assert(await page.locator(`.yue2-abc-gutter > div[data-line="${chorusLine}"][data-level="error"]`).count() === 1,
           `gutter marker on line ${chorusLine}`);
    const issue = page.locator('.yue2-abc-issues li[data-code="bar-length"]');
    assert(await issue.count() >= 1, "bar-length issue listed");
    const where = await issue.first().locator(".yue2-abc-where").innerText();  // one format with the CLI and nodes
    assert(new RegExp(`^line ${chorusLine} column \\d+:$`).test(where), `issue place "${where}"`);
    assert(await page.locator(".yue2-abc-score g.staff.yue2-bar-error").count() >= 1, "the broken bar is marked on the SVG");
    assert(await svgVersion(page) > version0, "the SVG was re-engraved after the edit");
    await shootEditor(page, path.join(ARTIFACTS, "editor-error.png"));

    // Clicking the issue selects its line in the text.
    await issue.first().click();
    const selected = await page.evaluate(() => {
        const t = document.querySelector(".yue2-abc-textarea");
        return t.value.slice(0, t.selectionStart).split("\n").length;
    });
    assert(selected === chorusLine, `clicking the issue selects line ${chorusLine}, got ${selected}`);

    // 3. Fix it: markers go away.
    await caretAt(page, offset + 2);
    analyzed = Number(state.analyzed);
    await page.keyboard.press("Backspace");
    await page.keyboard.press("Backspace");
    state = await waitAnalyzed(page, analyzed);
    assert(state.errors === "0", `no errors after the fix: ${JSON.stringify(state)}`);
    assert(await page.locator(".yue2-abc-gutter > div[data-level]").count() === 0, "no gutter markers left");
    assert(await page.locator(".yue2-abc-score .yue2-bar-error").count() === 0, "no bar marked on the SVG");
    assert(await editorText(page) === song, "the text is the original again");

    // 4. Transpose +1: text and SVG change; Ctrl+Z in the text area undoes it.
    const version1 = await svgVersion(page);
    analyzed = Number(state.analyzed);
    await page.locator('.yue2-abc-toolbar button[data-tool="up"]').click();
    state = await waitAnalyzed(page, analyzed);
    const transposed = await editorText(page);
    assert(transposed !== song && transposed.includes("\nK:Ab\n") && transposed.includes('"Ab"'),
           `transposed to A flat: ${transposed.slice(0, 200)}`);
    assert(await svgVersion(page) > version1, "the SVG changed after transposing");
    assert(state.errors === "0", "the transposed score is valid");
    analyzed = Number(state.analyzed);
    await page.locator(".yue2-abc-textarea").focus();
    await page.keyboard.press("Control+z");
    state = await waitAnalyzed(page, analyzed);
    assert(await editorText(page) === song, "Ctrl+Z restored the text before the transposition");

    // 5. Set tempo: the Q: line changes; this is the edit that is queued and must survive a reload. The BPM differs
    //    from run to run: ComfyUI 0.3.75 leaves a V3 node's ui out of /history when the node's result came from its
    //    cache (same inputs as an earlier run on this server), and step 7 reads that ui.
    const bpm = 110 + (Date.now() % 20);
    const seconds = (37.5 * 96) / bpm;
    const duration = `0:${seconds.toFixed(1).padStart(4, "0")}`; // the panel's m:ss.s
    analyzed = Number(state.analyzed);
    await page.locator(".yue2-abc-bpm").fill(String(bpm));
    await page.locator('.yue2-abc-toolbar button[data-tool="tempo"]').click();
    state = await waitAnalyzed(page, analyzed);
    const edited = await editorText(page);
    assert(edited === song.replace("Q:1/4=96", `Q:1/4=${bpm}`), "set tempo rewrote only the Q: line");
    assert((await page.locator(".yue2-abc-structure").innerText()).includes(duration), `duration follows the tempo: ${duration}`);

    // The composer's max_seconds is read from the graph: below the score's length it is flagged.
    analyzed = Number(state.analyzed);
    await page.evaluate((id) => { window.app.graph.getNodeById(id).widgets.find((w) => w.name === "max_seconds").value = 20; },
                        composerId);
    state = await waitAnalyzed(page, analyzed);
    assert(await page.locator('.yue2-abc-issues li[data-code="too-long"]').count() === 1, "too-long warning");
    assert(await page.locator('.yue2-abc-structure dd[data-field="Duration"][data-level="error"]').count() === 1,
           "duration flagged against max_seconds");
    analyzed = Number(state.analyzed);
    await page.evaluate((id) => { window.app.graph.getNodeById(id).widgets.find((w) => w.name === "max_seconds").value = 60; },
                        composerId);
    state = await waitAnalyzed(page, analyzed);
    assert(state.warnings === "0", "max_seconds back to 60: no warning");

    // 6. Play: the AudioContext runs and the cursor/time readout move.
    await page.locator(".yue2-abc-play").click();
    await page.waitForFunction(() => document.querySelector(".yue2-abc").dataset.audioState === "running", null,
                               { timeout: 10000 });
    const readout0 = await page.locator(".yue2-abc-time").innerText();
    await page.waitForFunction(() => Number(document.querySelector(".yue2-abc").dataset.position) > 1.2, null,
                               { timeout: 10000 });
    // The Ins voice sounds from 0 s, the first sung note after two bars; wait for the cursor to highlight an SVG note.
    await page.waitForFunction(() => document.querySelectorAll(".yue2-abc-score g.note.yue2-playing").length > 0,
                               null, { timeout: 15000 });
    state = await editorState(page);
    const readout1 = await page.locator(".yue2-abc-time").innerText();
    assert(readout1 !== readout0 && state.playing === "true", `time readout moved: ${readout0} -> ${readout1}`);
    assert(/(Vocal|Ins)-\d+/.test(state.highlighted), `highlighted ids come from the time map: ${state.highlighted}`);
    await shootEditor(page, path.join(ARTIFACTS, "editor-playing.png"));
    await page.locator(".yue2-abc-play").click();
    await page.waitForFunction(() => document.querySelector(".yue2-abc").dataset.playing === "false");
    assert(await page.locator(".yue2-abc-score .yue2-playing").count() === 0, "highlight cleared on stop");

    // 7. Queue: the prompt carries the edited text, the editor outputs it, and the composer it feeds tokenizes it
    //    (its report: "lead sheet: given (N ABC tokens, edited text, tokenized here; …)", N = the widget's count).
    const prompt = await page.evaluate(async (id) => (await window.app.graphToPrompt()).output[String(id)], editorId);
    assert(prompt.inputs.abc === edited, "graphToPrompt sends the edited text as the abc input");
    const { entry, reportPreviewId } = await queueForEditor(page, { editorId, composerId });
    assert(entry.status.status_str === "success", `prompt ran: ${JSON.stringify(entry.status).slice(0, 1500)}`);
    assert(entry.prompt[2][String(editorId)].inputs.abc === edited, "history holds the edited abc input");
    // the frontend sends the workflow with the widget's record of the composer's last score: nodes/editor.py reads it
    // to use a new upstream score when the box still holds the previous one unedited
    const sentNode = entry.prompt[3]?.extra_pnginfo?.workflow?.nodes?.find((n) => String(n.id) === String(editorId));
    assert(sentNode?.properties?.yue2_composer_abc === song,
           `the prompt's workflow carries properties.yue2_composer_abc: ${JSON.stringify(sentNode?.properties)?.slice(0, 200)}`);
    assert(entry.outputs[String(editorId)]?.abc?.[0] === edited, "the editor node reports the edited text as its abc");
    assert(JSON.stringify(entry.prompt[2][String(composerId)].inputs.score) === JSON.stringify([String(editorId), 0]),
           "the composer's score input is the editor's score output");
    const report = entry.outputs[String(reportPreviewId)]?.text?.[0] || "";
    assert(report.includes("edited text, tokenized here"), `the composer got the edited score: ${report}`);
    if (CKPT_NAME) {
        const counted = (await page.locator('.yue2-abc-structure dd[data-field="Tokens"]').innerText()).match(/^(\d+)/)[1];
        assert(report.includes(`lead sheet: given (${counted} ABC tokens`), `widget count ${counted} = composer's: ${report}`);
    }
    if (previewId != null) {
        const shown = entry.outputs[String(previewId)]?.text?.[0];
        assert(shown === edited, `the editor's abc output is the edited text, got ${JSON.stringify(shown)?.slice(0, 200)}`);
    }
    log(`prompt ${entry.prompt_id}: ${report.split("\n").find((l) => l.startsWith("lead sheet"))}`);

    // 8. Reload: the frontend restores the workflow it persisted, with the edit.
    // (frontend 1.32 keeps it under localStorage "workflow"; newer ones under other keys, some in sessionStorage)
    await page.waitForFunction((q) => [localStorage, sessionStorage].some((store) => Object.keys(store).some(
        (key) => (store.getItem(key) || "").includes(q))), `Q:1/4=${bpm}`, { timeout: 10000 });
    await page.reload();
    await page.waitForFunction(() => window.app?.graph?.nodes?.some((n) => n.yue2AbcEditor), null, { timeout: 60000 });
    await showNode(page, editorId);
    assert(await editorText(page) === edited, "the edit survived the page reload");
    await waitAnalyzed(page, 0);

    // 9. Revert goes back to the composer's score (kept in the node's properties across the reload); Ctrl+Z undoes it.
    await page.locator('.yue2-abc-toolbar button[data-tool="revert"]').click();
    assert(await editorText(page) === song, "reverted to the composer's score");
    await page.locator(".yue2-abc-textarea").focus();
    await page.keyboard.press("Control+z");
    assert(await editorText(page) === edited, "Ctrl+Z brings the edit back");
    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);

    // 10. withComfy fails a script when the frontend warned about our code (lib.mjs watchOurWarnings); the watcher
    //     sees such warnings, after the reload too: a warning from a script the page knows as one of our files, and a
    //     read of a slot's deprecated `link` (frontend 1.58 warns) although the frontend already warned once about it.
    assert(ourWarnings.length === 0, `no warnings about our code so far: ${JSON.stringify(ourWarnings.slice(0, 3))}`);
    await page.evaluate((id) => {
        const node = window.app.graph.getNodeById(id);
        const link = () => node.inputs.find((input) => input.link != null)?.link; // not ours: uses up the one warning
        link();
        const fromOurFile = (0, eval)(`(read) => { console.warn("watcher probe"); return read(); }
//# sourceURL=${location.origin}/extensions/ComfyUI-YuE2/watcher_probe.js`);
        fromOurFile(link);
    }, composerId);
    const probed = ourWarnings.splice(0);
    assert(probed.some((w) => w.startsWith("warn: watcher probe (") && w.includes("ComfyUI-YuE2/watcher_probe.js")),
           `the watcher saw the warning from our file: ${JSON.stringify(probed)}`);
    if (session.console.some((line) => line.includes("input.link is deprecated"))) {
        assert(probed.some((w) => w.includes("input.link is deprecated")),
               `the watcher saw our read of the deprecated input.link: ${JSON.stringify(probed)}`);
    }
    log(`watcher probe: ${probed.length} warning(s) seen`);
});
