// Browser harness for the real ComfyUI frontend: Debian chromium driven by playwright-core (comfyui_host.md §6.3).
//
//   import { withComfy, loadWorkflow, queueAndWait } from "./lib.mjs";
//   await withComfy("my-test", async ({ page }) => { ... });   // screenshot + exit code handled for you
//
// Environment: COMFY_URL (required: the server to open), YUE2_E2E_DIR (where `npm install playwright-core` ran;
// default <repo>/.comfyhost/e2e), YUE2_ARTIFACTS (screenshots; default <repo>/.comfyhost/artifacts),
// YUE2_CHROMIUM (default /usr/bin/chromium), YUE2_BROWSER_CACHE (optional: a disk cache folder for chromium that the
// scripts run against one server share, see openComfy).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const E2E_DIR = process.env.YUE2_E2E_DIR || path.join(REPO, ".comfyhost", "e2e");
export const ARTIFACTS = process.env.YUE2_ARTIFACTS || path.join(REPO, ".comfyhost", "artifacts");
export const CHROMIUM = process.env.YUE2_CHROMIUM || "/usr/bin/chromium";
export const BASE = (process.env.COMFY_URL || "").replace(/\/$/, "");
const CACHE = process.env.YUE2_BROWSER_CACHE || "";

// playwright-core is installed outside the repo (scripts/test.sh puts it in .comfyhost/e2e), so resolve it from there.
const { chromium } = createRequire(path.join(E2E_DIR, "package.json"))("playwright-core");

export function log(...args) {
    console.log("[e2e]", ...args);
}

export async function api(pathname, init = {}) {
    const res = await fetch(BASE + pathname, init);
    if (!res.ok) throw new Error(`${init.method || "GET"} ${pathname} -> HTTP ${res.status}`);
    const type = res.headers.get("content-type") || "";
    return type.includes("json") ? res.json() : res.text();
}

// Launch chromium with a fresh profile and open ComfyUI; returns { context, page, pageErrors, console, close }.
// The profile (storage, settings) is new for every script; with YUE2_BROWSER_CACHE the HTTP and compiled-code caches
// are shared by the scripts one pytest session runs one after another against its server (tests/e2e/test_browser.py
// gives each server a folder): the frontend's ~450 files are revalidated (ComfyUI serves them no-cache) but not
// compiled again, about 1 s less per script on the 2-core CI machine.
export async function openComfy({ url = BASE, timeout = 60000 } = {}) {
    if (!url) throw new Error("COMFY_URL is not set");
    // No first-run Templates dialog over the canvas (it intercepts clicks). The test server pre-seeds this too.
    await api("/api/settings/Comfy.TutorialCompleted", { method: "POST", body: "true" });
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), "pw-profile-"));
    const context = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM,
        headless: true,
        viewport: { width: 1400, height: 900 },
        args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", ...(CACHE ? [`--disk-cache-dir=${CACHE}`] : [])],
    });
    const page = context.pages()[0] || (await context.newPage());
    const pageErrors = [];
    const consoleLines = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    page.on("console", (m) => consoleLines.push(`${m.type()}: ${m.text()}`));
    const ourWarnings = [];
    await context.exposeBinding("__yue2Warned", (_source, text) => { ourWarnings.push(text); });
    await context.addInitScript(watchOurWarnings);
    await page.goto(url);
    await waitForApp(page, timeout);
    const close = async () => {
        await context.close();
        fs.rmSync(profile, { recursive: true, force: true });
    };
    return { context, page, pageErrors, console: consoleLines, ourWarnings, close };
}

/**
 * Runs in the page before the frontend (an init script, again after each reload): every console.warn/console.error
 * whose call stack passes through the pack's web files (/extensions/ComfyUI-YuE2/) is sent to ourWarnings, the
 * message and the first of our frames; withComfy fails a script that left any. This catches the frontend's
 * complaints about how our code uses it, such as LiteGraph's "input.link is deprecated" (frontend 1.58), and errors
 * it logs from inside our calls. Our own "[ComfyUI-YuE2] ..." reports are deliberate and not counted. LiteGraph says
 * each deprecation once per page, to whoever is first (the frontend itself, another extension), so
 * alwaysRepeatWarnings is switched on as soon as the frontend publishes window.LiteGraph.
 */
export function watchOurWarnings() {
    const ours = /\/extensions\/ComfyUI-YuE2\//;
    for (const level of ["warn", "error"]) {
        const original = console[level];
        console[level] = function (...args) {
            const limit = Error.stackTraceLimit;
            Error.stackTraceLimit = 50;
            const frames = (new Error().stack || "").split("\n").slice(2); // not "Error", not this wrapper
            Error.stackTraceLimit = limit;
            const where = frames.find((f) => ours.test(f));
            const text = args.map(String).join(" ");
            if (where && !text.startsWith("[ComfyUI-YuE2]")) {
                window.__yue2Warned?.(`${level}: ${text.slice(0, 300)} (${where.trim()})`);
            }
            return original.apply(this, args);
        };
    }
    let liteGraph;
    Object.defineProperty(window, "LiteGraph", {
        configurable: true,
        enumerable: true,
        get: () => liteGraph,
        set: (value) => {
            liteGraph = value;
            const lg = value && typeof value === "object" ? value : null;
            if (lg && "alwaysRepeatWarnings" in lg) lg.alwaysRepeatWarnings = true;
        },
    });
}

export async function waitForApp(page, timeout = 60000) {
    await page.waitForFunction(() => window.app?.graph && document.querySelector("canvas"), null, { timeout });
    // An open dialog (first-run templates, "what's new") would swallow clicks; close it if there is one.
    if (await page.locator('[role="dialog"]').count()) await page.keyboard.press("Escape");
}

export async function loadWorkflow(page, workflow) {
    await page.evaluate((wf) => window.app.loadGraphData(wf), workflow);
}

// Node types the workflow uses (subgraph interiors included) that this frontend does not know.
export async function missingNodeTypes(page, workflow) {
    return page.evaluate((wf) => {
        const subgraphs = new Set((wf.definitions?.subgraphs || []).map((s) => s.id));
        const nodes = [...(wf.nodes || []), ...(wf.definitions?.subgraphs || []).flatMap((s) => s.nodes || [])];
        const known = window.LiteGraph.registered_node_types;
        return [...new Set(nodes.map((n) => n.type).filter((t) => !subgraphs.has(t) && !(t in known)))];
    }, workflow);
}

// The API prompt the frontend itself would send for the current graph.
export async function graphToPrompt(page) {
    return page.evaluate(async () => (await window.app.graphToPrompt()).output);
}

// Queue the current graph the way the Run button does and wait for its /history entry.
export async function queueAndWait(page, { timeout = 120000 } = {}) {
    const before = Object.keys(await api("/history"));
    await page.evaluate(() => window.app.queuePrompt(0, 1));
    return waitForHistory(before, timeout);
}

/**
 * The first /history entry whose id is not in `seen` (ids) and that has finished (success or error), as
 * {prompt_id, ...entry}. Polled from Node: page.waitForFunction with an async predicate does not poll (the
 * predicate's Promise is truthy, so it resolves on the first call).
 */
export async function waitForHistory(seen, timeout = 120000) {
    const known = new Set(seen);
    const deadline = Date.now() + timeout;
    while (Date.now() < deadline) {
        const history = await api("/history");
        const done = Object.entries(history).find(([id, e]) => !known.has(id)
            && (e.status?.completed || e.status?.status_str === "error"));
        if (done) return { prompt_id: done[0], ...done[1] };
        await new Promise((resolve) => setTimeout(resolve, 250));
    }
    throw new Error(`no finished prompt in /history after ${timeout / 1000} s; queue: ${JSON.stringify(await api("/queue"))}`);
}

export async function screenshot(page, name) {
    fs.mkdirSync(ARTIFACTS, { recursive: true });
    const file = path.join(ARTIFACTS, `${name}.png`);
    await page.screenshot({ path: file });
    log("screenshot", file);
    return file;
}

export function assert(condition, message) {
    if (!condition) throw new Error(`assertion failed: ${message}`);
}

// Run one browser test: open ComfyUI, run body({page, ...}), always screenshot, print PASS/FAIL, set the exit code.
export async function withComfy(name, body) {
    let session;
    try {
        session = await openComfy();
        await body(session);
        const warned = session.ourWarnings;
        assert(warned.length === 0, `the frontend warned about our code ${warned.length} time(s): `
               + JSON.stringify([...new Set(warned)].slice(0, 5)));
        await screenshot(session.page, name);
        log(`PASS ${name}`);
    } catch (e) {
        process.exitCode = 1;
        console.error(`[e2e] FAIL ${name}: ${e.stack || e}`);
        if (session) {
            await screenshot(session.page, `${name}-FAILED`).catch(() => {});
            console.error(`[e2e] page errors: ${JSON.stringify(session.pageErrors)}`);
            console.error(`[e2e] last console lines:\n${session.console.slice(-20).join("\n")}`);
        }
    } finally {
        if (session) await session.close();
    }
}
