// The real frontend loads, and the pack's web extension (web/yue2_boot.js) ran its setup().
import { withComfy, assert, log } from "./lib.mjs";

await withComfy("smoke", async ({ page }) => {
    await page.waitForFunction(() => window.__yue2PackLoaded === true, null, { timeout: 20000 });
    const names = await page.evaluate(() => window.app.extensions.map((e) => e.name));
    assert(names.includes("ComfyUI-YuE2.boot"), `extension registered (have ${names.length} extensions)`);
    const version = await page.evaluate(() => window.__COMFYUI_FRONTEND_VERSION__ || "?");
    log(`frontend ${version}, ${names.length} extensions, __yue2PackLoaded = true`);
});
