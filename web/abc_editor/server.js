// Calls to the pack's routes (nodes/routes.py). Each answers JSON; a refusal carries {"error": "..."}.
import { api } from "../../../scripts/api.js";

/**
 * POST `body` as JSON to /yue2/abc/<name>. Resolves to the answer object; rejects with an Error whose message is
 * the server's "error" text (or what went wrong on the way). `signal` aborts a request that has been superseded.
 */
export async function callRoute(name, body, { signal } = {}) {
    let response;
    try {
        response = await api.fetchApi(`/yue2/abc/${name}`, {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify(body),
            signal,
        });
    } catch (error) {
        if (error?.name === "AbortError") throw error;
        const away = new Error(`The ComfyUI server did not answer (${error?.message || error}).`);
        away.network = true; // no answer at all: the editor checks again later
        throw away;
    }
    let answer = null;
    try {
        answer = await response.json();
    } catch {
        /* not JSON: handled below */
    }
    if (!response.ok || !answer || typeof answer !== "object" || "error" in answer) {
        const reason = answer?.error
            || (response.status === 404 || response.status === 405
                ? "The editor's server routes are missing: restart ComfyUI after installing or updating ComfyUI-YuE2."
                : `HTTP ${response.status}`);
        const error = new Error(String(reason));
        error.status = response.status;
        error.answer = answer;
        throw error;
    }
    return answer;
}
