// A UI-format workflow of core nodes loads with app.loadGraphData, every node type is known, and queueing it from the
// page runs to success with the expected preview text.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { withComfy, loadWorkflow, missingNodeTypes, queueAndWait, assert, log } from "./lib.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const workflow = JSON.parse(fs.readFileSync(path.join(here, "..", "host", "workflows", "core_strings.json"), "utf8"));

await withComfy("core_workflow", async ({ page }) => {
    const missing = await missingNodeTypes(page, workflow);
    assert(missing.length === 0, `no missing node types, got ${JSON.stringify(missing)}`);
    await loadWorkflow(page, workflow);
    const entry = await queueAndWait(page, { timeout: 60000 });
    assert(entry.status.status_str === "success", `status ${JSON.stringify(entry.status)}`);
    assert(JSON.stringify(entry.outputs["5"]?.text) === JSON.stringify(["lo-wo"]), `outputs ${JSON.stringify(entry.outputs)}`);
    log(`prompt ${entry.prompt_id} ran: ${JSON.stringify(entry.outputs["5"].text)}`);
});
