// Loaded by ComfyUI's frontend from /extensions/ComfyUI-YuE2/yue2_boot.js (WEB_DIRECTORY = "./web").
// Its only job is to prove the pack's web directory is served and executed; the browser tests check the flag.
import { app } from "../../scripts/app.js";

app.registerExtension({
    name: "ComfyUI-YuE2.boot",
    async setup() {
        window.__yue2PackLoaded = true;
    },
});
