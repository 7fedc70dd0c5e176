// Tool (not a test on its own): node graph_to_prompt.mjs WORKFLOW.json OUT.json
// Loads the workflow into the real frontend and writes what the frontend would send to /prompt, so that
// tests/e2e/test_browser.py can compare it with comfy_client.ui_to_api.
import fs from "node:fs";
import path from "node:path";
import { withComfy, loadWorkflow, missingNodeTypes, graphToPrompt } from "./lib.mjs";

const [workflowPath, outPath] = process.argv.slice(2);
const workflow = JSON.parse(fs.readFileSync(workflowPath, "utf8"));

await withComfy(`graph_to_prompt-${path.basename(workflowPath, ".json")}`, async ({ page }) => {
    const missing = await missingNodeTypes(page, workflow);
    await loadWorkflow(page, workflow);
    const output = await graphToPrompt(page);
    fs.writeFileSync(outPath, JSON.stringify({ missing, output }, null, 1));
});
