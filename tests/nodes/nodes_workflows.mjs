// The pack's shipped workflows in the real ComfyUI frontend (run by test_nodes_browser.py):
//   node nodes_workflows.mjs <out.json> <test checkpoint name>
// 1. every workflow the template browser lists is fetched from /api/workflow_templates, has no missing node type,
//    loads with app.loadGraphData, and the API prompt the frontend builds from it is written to <out.json> (the
//    Python side compares it with comfy_client.ui_to_api);
// 2. the text → song workflow is queued from the page with test-size values typed into its widgets; the song must
//    finish and the Save Song node's audio player must point at the saved audio.flac.
import fs from "node:fs";
import { withComfy, api, loadWorkflow, missingNodeTypes, graphToPrompt, queueAndWait, assert, log } from "../e2e/lib.mjs";

const [outPath, ckptName] = process.argv.slice(2);
const PACK = "ComfyUI-YuE2";
const result = { workflows: {}, run: null };

async function setWidgets(page, values) {
    // values: {nodeType: {widget: value}}; every named widget must exist
    return page.evaluate((values) => {
        const missing = [];
        for (const node of window.app.graph._nodes) {
            const wanted = values[node.comfyClass || node.type];
            if (!wanted) continue;
            for (const [name, value] of Object.entries(wanted)) {
                const widget = node.widgets?.find((w) => w.name === name);
                if (!widget) missing.push(`${node.type}.${name}`);
                else widget.value = value;
            }
        }
        return missing;
    }, values);
}

await withComfy("nodes_workflows", async ({ page, pageErrors }) => {
    const names = (await api("/workflow_templates"))[PACK] || [];
    assert(names.length > 0 && new Set(names).size === names.length, `templates listed once each, got ${JSON.stringify(names)}`);
    for (const name of names) {
        const workflow = await api(`/api/workflow_templates/${PACK}/${name}.json`);
        const missing = await missingNodeTypes(page, workflow);
        await loadWorkflow(page, workflow);
        const prompt = await graphToPrompt(page);
        result.workflows[name] = { missing, prompt };
        log(`${name}: ${Object.keys(prompt).length} nodes in the prompt, missing types ${JSON.stringify(missing)}`);
    }

    const full = await api(`/api/workflow_templates/${PACK}/yue2_text_to_song_full.json`);
    await loadWorkflow(page, full);
    const missingWidgets = await setWidgets(page, {
        YuE2CheckpointLoader: { ckpt_name: ckptName },
        YuE2Composer: { max_seconds: 1, max_abc_tokens: 8 },
        YuE2Renderer: { steps: 8 },
        YuE2SaveSong: { name: "browser" },
    });
    assert(missingWidgets.length === 0, `widgets exist: ${JSON.stringify(missingWidgets)}`);
    const errorsBefore = pageErrors.length;
    const entry = await queueAndWait(page, { timeout: 150000 });
    await page.waitForTimeout(500); // let onExecuted / onNodeOutputsUpdated run
    const player = await page.evaluate(() => {
        const save = window.app.graph._nodes.find((n) => (n.comfyClass || n.type) === "YuE2SaveSong");
        const widget = save?.widgets?.find((w) => w.name === "audioUI");
        return { hasWidget: !!widget, src: widget?.element?.src || null };
    });
    result.run = { status: entry.status, outputs: entry.outputs, player, pageErrors: pageErrors.slice(errorsBefore) };
    log(`run: ${entry.status?.status_str}, player ${JSON.stringify(player)}`);
});

fs.writeFileSync(outPath, JSON.stringify(result, null, 1));
