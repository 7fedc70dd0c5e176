// Tool (not a test on its own): node graph_to_prompt.mjs WORKFLOW.json OUT.json [WORKFLOW2.json OUT2.json ...]
// Loads each workflow in turn into the real frontend (one browser session, as a user opens one workflow after
// another) and writes what the frontend would send to /prompt, so that tests/e2e/test_browser.py can compare it with
// comfy_client.ui_to_api.
import fs from "node:fs";
import path from "node:path";
import { withComfy, loadWorkflow, missingNodeTypes, graphToPrompt, screenshot } from "./lib.mjs";

const args = process.argv.slice(2);
if (!args.length || args.length % 2) {
    console.error("usage: node graph_to_prompt.mjs WORKFLOW.json OUT.json [WORKFLOW2.json OUT2.json ...]");
    process.exit(2);
}
const pairs = [];
for (let i = 0; i < args.length; i += 2) pairs.push([args[i], args[i + 1]]);

await withComfy("graph_to_prompt", async ({ page }) => {
    for (const [workflowPath, outPath] of pairs) {
        const workflow = JSON.parse(fs.readFileSync(workflowPath, "utf8"));
        const missing = await missingNodeTypes(page, workflow);
        await loadWorkflow(page, workflow);
        const output = await graphToPrompt(page);
        fs.writeFileSync(outPath, JSON.stringify({ missing, output }, null, 1));
        await screenshot(page, `graph_to_prompt-${path.basename(workflowPath, ".json")}`);
    }
});
