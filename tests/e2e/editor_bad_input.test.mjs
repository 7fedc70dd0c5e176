// Bad input typed or pasted into the ABC editor: markup in the title and lyrics stays text (no script runs, no element
// is created from it), a 200 kB paste is refused with a clear message before anything is sent, binary garbage and an
// empty box give readable errors, a renamed voice / unknown header / bar with too many beats are marked on their lines.
import path from "node:path";
import { ARTIFACTS, withComfy, assert, log } from "./lib.mjs";
import { corpus, editorState, pasteText, setUpGraph, shootEditor } from "./editor_lib.mjs";

const issueTexts = (page) => page.locator(".yue2-abc-issues li").allInnerTexts();
const markedLines = (page) => page.locator(".yue2-abc-gutter > div[data-level]").evaluateAll(
    (rows) => rows.map((r) => `${r.dataset.line}:${r.dataset.level}`));

await withComfy("editor-bad-input", async ({ page, pageErrors }) => {
    await setUpGraph(page, { preferShipped: false });
    const analyzeCalls = [];
    page.on("request", (r) => { if (r.url().includes("/yue2/abc/analyze")) analyzeCalls.push(r.postData()?.length); });
    await page.evaluate(() => { window.__yue2Pwned = 0; });

    // 1. Markup in the title and in a lyrics line: shown as text, never parsed as HTML, nothing runs.
    const hostile = '<script>window.__yue2Pwned = 1</script><img src=x onerror="window.__yue2Pwned = 2">';
    const song = corpus("song.abc").replace("T:\n", `T:${hostile}\n`)
        .replace("V: Ins\nc4B4A4G4|G16|", `V: Ins\nc4B4A4G4|G16|\nw: <svg onload="window.__yue2Pwned = 3"></svg>`);
    let state = await pasteText(page, song);
    await page.waitForTimeout(300);
    assert(await page.evaluate(() => window.__yue2Pwned) === 0, "no script from the score ran");
    assert(await page.locator(".yue2-abc img, .yue2-abc script, .yue2-abc-structure svg, .yue2-abc-issues svg").count() === 0,
           "no element was created from the score's text");
    const title = await page.locator('.yue2-abc-structure dd[data-field="Title"]').textContent();
    assert(title === hostile, `the title is shown literally: ${title}`);
    assert(await page.locator(".yue2-abc-score-svg > svg").count() === 1, "the score is still engraved");
    assert(!(await page.locator(".yue2-abc-score").innerHTML()).includes("__yue2Pwned"), "the title is not in the SVG");
    log(`title shown as text; issues: ${JSON.stringify(await issueTexts(page))}`);

    // 2. A 200 kB paste: refused in the browser with a clear message; nothing is sent to the server.
    const sent = analyzeCalls.length;
    const huge = corpus("song.abc") + "%" + "x".repeat(200_000);
    await page.locator(".yue2-abc-textarea").fill(huge);
    await page.waitForFunction(() => /100 kB/.test(document.querySelector(".yue2-abc-status").textContent), null,
                               { timeout: 10000 });
    const status = await page.locator(".yue2-abc-status").textContent();
    assert(/Too large: 20\d kB \(at most 100 kB\)/.test(status), `status: ${status}`);
    const refusal = (await issueTexts(page)).join("\n");
    assert(/The score is 200,\d{3} bytes; .*at most 100,000 bytes \(100 kB\)/.test(refusal), `listed: ${refusal}`);
    assert(analyzeCalls.length === sent, "no analysis request for an oversized score");
    assert(await page.locator('.yue2-abc-toolbar button[data-tool="up"]').isDisabled(), "tools are disabled");
    assert((await page.locator(".yue2-abc-textarea").inputValue()).length === huge.length, "the text is kept");
    await shootEditor(page, path.join(ARTIFACTS, "editor-oversized.png"));

    // 3. Binary garbage: a readable error on line 1, no page error, tools disabled.
    let garbage = "";
    for (let i = 0; i < 3000; i++) garbage += String.fromCharCode((i * 7919 + 13) % 0xd7ff || 1);
    state = await pasteText(page, "\u0000\u0001\u0002" + garbage);
    assert(Number(state.errors) >= 1, `garbage gives errors: ${JSON.stringify(state)}`);
    const garbageIssues = await issueTexts(page);
    assert(garbageIssues.some((t) => /no ABC header/.test(t)), `says what is wrong: ${garbageIssues[0]}`);
    assert((await markedLines(page)).includes("1:error"), "line 1 is marked");
    assert(await page.locator('.yue2-abc-toolbar button[data-tool="up"]').isDisabled(), "tools disabled on garbage");
    assert(await page.locator(".yue2-abc-play").isDisabled(), "nothing to play");

    // 4. Empty text.
    state = await pasteText(page, "");
    assert((await issueTexts(page)).some((t) => /score is empty/.test(t)), "the empty score is explained");

    // 5. Dialect errors, each marked on its line: renamed voice, unknown header, too many beats in a bar.
    for (const [file, line, words] of [["voice_renamed.abc", 9, /Voice .Melody. is not part/], ["unknown_header.abc", 8, /Header field C:/],
                                       ["too_many_beats.abc", 10, /lasts 20 unit/]]) {
        state = await pasteText(page, corpus(file));
        const texts = await issueTexts(page);
        const marks = await markedLines(page);
        assert(Number(state.errors) >= 1 && texts.some((t) => words.test(t)), `${file}: ${JSON.stringify(texts)}`);
        assert(marks.some((m) => m.endsWith(":error")) && (line == null || marks.includes(`${line}:error`)),
               `${file}: marked lines ${marks}`);
        log(`${file}: ${texts[0]}`);
    }
    assert(await page.locator(".yue2-abc-score g.staff.yue2-bar-error").count() >= 1, "the long bar is marked on the SVG");
    await shootEditor(page, path.join(ARTIFACTS, "editor-too-many-beats.png"));

    assert(await page.evaluate(() => window.__yue2Pwned) === 0, "still nothing ran");
    const ours = pageErrors.filter((e) => /yue2|abc_editor/i.test(e));
    assert(ours.length === 0, `no page errors from the editor: ${JSON.stringify(ours)}`);
});
