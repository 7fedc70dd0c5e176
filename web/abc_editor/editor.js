// The editor inside one "YuE2 ABC Editor" node: text + engraved score + playback + issues + structure + tools.
// It owns no state outside this object; web/yue2_abc_editor.js creates one per node and wires it to the node.
import { el, formatTime, utf8Bytes } from "./dom.js";
import { graphContext } from "./graph.js";
import { keepHistory, takeHistory } from "./history.js";
import { IssueList, StructurePanel } from "./panels.js";
import { ScoreView } from "./score_view.js";
import { callRoute } from "./server.js";
import { Player } from "./synth.js";
import { TextEditor } from "./text_editor.js";

export const MAX_ABC_BYTES = 100_000; // nodes/routes.py refuses larger scores; say so before asking it
const ANALYZE_DELAY_MS = 400; // debounce while typing
const TOKENS_DELAY_MS = 900;
const CONTEXT_POLL_MS = 1500; // re-read max_seconds / checkpoint / lyrics from the graph
const RETRY_MS = 5000; // check again while the server does not answer (it may be restarting)
export const SOURCE_PROPERTY = "yue2_composer_abc"; // node property: the last score received from the composer
export const CHANGED_PROPERTY = "yue2_composer_abc_changed"; // node property: true while the notice below is shown
const CHANGED_NOTICE = "The composer's score changed — Revert to use it";
// The node's execution result (its ui dict, nodes/editor.py) carries "source_abc": [the score it received from the
// composer, or "" when none was connected]. Older results without it still tell us when the text passed through
// unchanged ("unchanged": [true]); then "abc": [text] is that score.
export const SOURCE_UI_KEY = "source_abc";
// The textarea turns CR LF and CR into LF, so a score that arrives with other line ends is compared (and kept as the
// Revert target) with LF ones — else a box never edited read as edited forever (editor review, stop 39).
const lf = (text) => (typeof text === "string" ? text.replace(/\r\n?/g, "\n") : text);

export class AbcEditor {
    /**
     * node: the LiteGraph node. notify(): called after the text changed (the widget tells ComfyUI: dirty canvas,
     * change tracker, widget callback). persist(): called after only the node's properties changed (change tracker).
     * historyKey(): names this node in its workflow (or null while it has no id), under which the undo history
     * outlives the node being re-created (history.js). afterLoad(restore): runs `restore` once the graph load that
     * configures the node has made its workflow the active one (at once when no load is under way).
     */
    constructor(node, { notify, persist = () => {}, historyKey = () => null, afterLoad = (restore) => restore() }) {
        this.node = node;
        this.notify = notify;
        this.persist = persist;
        this.historyKeyOf = historyKey;
        this.historyKey = null; // the key as last read while the node was in its graph (a cleared graph has no id)
        this.afterLoad = afterLoad;
        this.historyPending = false; // configured, waiting for its workflow to take its history back (restoreHistory)
        this.analysis = null; // last /analyze answer
        this.context = {};
        this.sourceText = null; // the composer's score (from the node's execution) or the first text we were given
        this.requestSeq = 0;
        this.tokenSeq = 0;
        this.tokenKey = null;
        this.timers = {};

        this.text = new TextEditor({ onChange: (text, { source }) => this.changed(text, source) });
        this.text.onGutterClick = (line) => this.text.selectLine(line);
        this.score = new ScoreView();
        this.issues = new IssueList({ onPick: (issue) => this.pick(issue) });
        this.panel = new StructurePanel();
        this.player = new Player({
            onTick: (seconds) => this.playbackAt(seconds),
            onStateChange: (playing) => this.playbackState(playing),
        });

        const state = { audioState: "none", playing: "false", errors: "0", warnings: "0", analyzed: "0",
                        sourceChanged: "false" };
        this.element = el("div", { className: "yue2-abc", dataset: state }, [
            this.buildToolbar(),
            el("div", { className: "yue2-abc-main" }, [this.text.element, this.score.element]),
            el("div", { className: "yue2-abc-bottom" }, [this.issues.element, this.panel.element]),
        ]);
        this.timers.context = setInterval(() => this.refreshContext(), CONTEXT_POLL_MS);
        this.refreshContext();
        this.updateButtons();
    }

    // --- the widget value ------------------------------------------------------------------------------------------
    get value() {
        return this.text.value;
    }

    /** A value from ComfyUI (workflow load, paste); the first non-empty one is the fallback for Revert. */
    setValue(value) {
        this.text.setExternal(value);
        if (this.sourceText == null && this.text.value.trim()) this.sourceText = this.text.value;
    }

    /**
     * The node ran: its ui result may carry the score it received from the composer. An empty box, or one still
     * holding the previous score received (not edited since), takes the new score as an undoable change; an edited
     * text is kept and a notice points to Revert, whose target is now the new score.
     */
    executed(output) {
        const first = (key) => (Array.isArray(output?.[key]) ? output[key][0] : output?.[key]);
        const text = lf(first(SOURCE_UI_KEY) ?? (first("unchanged") === true ? first("abc") : undefined));
        if (typeof text !== "string" || !text.trim()) return;
        this.node.properties ??= {};
        const previous = lf(this.node.properties[SOURCE_PROPERTY]);
        const current = this.text.value;
        const edited = current.trim() !== "" && current !== previous && current !== text;
        this.sourceText = text;
        this.node.properties[SOURCE_PROPERTY] = text;
        if (!edited) {
            this.showSourceChanged(false);
            if (this.text.replace(text, "composer")) {
                this.setStatus(current.trim() ? "Updated to the composer's new score (Ctrl+Z undoes)."
                                              : "Filled with the composer's score.");
            }
        } else if (text !== previous) this.showSourceChanged(true);
        this.persist();
        this.updateButtons();
    }

    /** Node properties restored from a saved workflow (the composer's last score, whether the notice was shown). */
    restoredSource(properties) {
        this.restoreHistory();
        const text = lf(properties?.[SOURCE_PROPERTY]);
        if (typeof text === "string" && text.trim()) this.sourceText = text;
        this.showSourceChanged(properties?.[CHANGED_PROPERTY] === true && this.text.value !== this.sourceText);
        this.updateButtons();
    }

    /** Show or hide "the composer's score changed" (kept in the node's properties, so it survives a reload). */
    showSourceChanged(changed) {
        this.notice.hidden = !changed;
        this.element.dataset.sourceChanged = String(changed);
        this.node.properties ??= {};
        if (changed) this.node.properties[CHANGED_PROPERTY] = true;
        else delete this.node.properties[CHANGED_PROPERTY];
    }

    /**
     * The node was configured (a workflow load, or ComfyUI's undo re-creating it): take back its undo history — once
     * the load has made the node's workflow the active one: a load configures the nodes first, and the key read
     * then would name the workflow being left (on a switch to a duplicate tab, the other tab's histories).
     */
    restoreHistory() {
        this.historyPending = true;
        this.afterLoad(() => {
            if (!this.historyPending) return; // removed meanwhile
            this.historyPending = false;
            this.rememberHistoryKey();
            const kept = takeHistory(this.historyKey);
            if (!kept) return;
            this.text.importHistory(kept);
            this.updateButtons();
        });
    }

    rememberHistoryKey() {
        if (this.historyPending) return; // the active workflow may not be the node's yet
        let key = null;
        try {
            key = this.historyKeyOf();
        } catch {
            /* the graph is being rebuilt */
        }
        if (key) this.historyKey = key;
    }

    dispose() {
        // The node is removed — deleted, or about to be made again by ComfyUI's undo or a workflow switch: keep its
        // undo history for the editor of the node that comes back (history.js). A node removed before it took its
        // own history back leaves the store as it is.
        if (!this.historyPending) {
            keepHistory(this.historyKey, this.text.canUndo || this.text.canRedo ? this.text.exportHistory() : null);
        }
        this.historyPending = false;
        this.text.cancelFrame(); // typing's last frame would tell a node that is gone
        for (const timer of Object.values(this.timers)) {
            clearTimeout(timer);
            clearInterval(timer);
        }
        this.abort?.abort();
        this.player.dispose();
    }

    // --- toolbar -------------------------------------------------------------------------------------------------
    buildToolbar() {
        const button = (label, title, onclick, extra = {}) =>
            el("button", { type: "button", textContent: label, title, onclick, ...extra });
        this.playButton = button("▶ Play", "Play the Vocal melody, the Ins voice and the chords (WebAudio)",
                                 () => this.togglePlay(), { className: "yue2-abc-play" });
        this.timeReadout = el("span", { className: "yue2-abc-time", textContent: "0:00.0 / 0:00.0" });
        this.tempoInput = el("input", { type: "number", min: 1, max: 1000, step: 1, title: "Beats per minute",
                                        className: "yue2-abc-bpm" });
        this.tempoInput.style.width = "4.5em";
        this.tempoInput.addEventListener("keydown", (event) => {
            event.stopPropagation();
            if (event.key === "Enter") this.setTempo();
        });
        this.buttons = {
            down: button("♭ −1", "Transpose down one semitone (notes, chords and key)", () => this.runTool("transpose", -1)),
            up: button("♯ +1", "Transpose up one semitone (notes, chords and key)", () => this.runTool("transpose", 1)),
            tempo: button("Set tempo", "Set the Q: tempo to the BPM on the left", () => this.setTempo()),
            strip: button("Strip chords", "Remove every chord symbol (for melody mode)", () => this.runTool("strip_chords")),
            silence: button("Instrumental", "Silence the Vocal voice: its bars become rests, chords stay",
                            () => this.runTool("silence_vocal", true)),
            revert: button("Revert", "Go back to the composer's score", () => this.revert()),
            undo: button("↶", "Undo (Ctrl+Z)", () => this.text.undo()),
            redo: button("↷", "Redo (Ctrl+Shift+Z / Ctrl+Y)", () => this.text.redo()),
        };
        for (const [name, b] of Object.entries(this.buttons)) b.dataset.tool = name;
        this.notice = el("span", { className: "yue2-abc-notice", textContent: CHANGED_NOTICE, hidden: true,
                                   title: "A new score came from the composer; your edited text was kept." });
        this.status = el("span", { className: "yue2-abc-status", role: "status" });
        const sep = () => el("span", { className: "yue2-abc-sep" });
        const b = this.buttons;
        return el("div", { className: "yue2-abc-toolbar" }, [
            this.playButton, this.timeReadout, sep(), b.down, b.up, this.tempoInput, b.tempo, b.strip, b.silence,
            sep(), b.revert, b.undo, b.redo, this.notice, this.status,
        ]);
    }

    updateButtons() {
        const parsed = Boolean(this.analysis?.structure);
        for (const name of ["down", "up", "tempo", "strip", "silence"]) this.buttons[name].disabled = !parsed;
        this.buttons.revert.disabled = !this.sourceText || this.sourceText === this.text.value;
        this.buttons.undo.disabled = !this.text.canUndo;
        this.buttons.redo.disabled = !this.text.canRedo;
        this.playButton.disabled = !this.player.playing && !this.analysis?.timeline;
    }

    setStatus(message, level = "") {
        this.status.textContent = message;
        this.status.title = message;
        this.status.dataset.level = level;
    }

    // --- text changes --------------------------------------------------------------------------------------------
    changed(text, source) {
        this.rememberHistoryKey();
        if (!this.notice.hidden && text === this.sourceText) this.showSourceChanged(false); // reverted / undone to it
        if (source !== "external") this.notify(text);
        this.updateButtons();
        this.scheduleAnalysis(source === "typing" ? ANALYZE_DELAY_MS : 0);
    }

    scheduleAnalysis(delay = ANALYZE_DELAY_MS) {
        clearTimeout(this.timers.analyze);
        this.timers.analyze = setTimeout(() => this.analyze(), delay);
    }

    async analyze() {
        const text = this.text.value;
        const seq = ++this.requestSeq;
        this.abort?.abort();
        const bytes = utf8Bytes(text);
        if (bytes > MAX_ABC_BYTES) {
            this.abort = null;
            this.showRefusal(`The score is ${bytes.toLocaleString("en")} bytes; the editor checks and renders at most `
                + `${MAX_ABC_BYTES.toLocaleString("en")} bytes (100 kB). A generated 6-minute score is about 10 kB.`,
                             `Too large: ${Math.round(bytes / 1000)} kB (at most 100 kB)`);
            return;
        }
        this.abort = new AbortController();
        this.refreshContext({ reanalyze: false }); // this analysis uses the graph as it is now
        this.setStatus("checking…");
        try {
            const answer = await callRoute("analyze", {
                abc: text, engrave: true, max_seconds: this.context.maxSeconds ?? null,
                instrumental: this.context.instrumental === true,
            }, { signal: this.abort.signal });
            if (seq === this.requestSeq) this.showAnalysis(answer, text);
        } catch (error) {
            if (error?.name === "AbortError" || seq !== this.requestSeq) return;
            this.showRefusal(error.message);
            // no answer at all (a restart, a lost connection): check again until the server is back, so the marks
            // and tools come back without a keystroke (editor review, stop 39)
            if (error.network === true || [502, 503, 504].includes(error.status)) {
                clearTimeout(this.timers.analyze);
                this.timers.analyze = setTimeout(() => this.analyze(), RETRY_MS);
            }
        }
    }

    /** A score the server could not check (too large, server unreachable): say why, drop stale marks. */
    showRefusal(message, short = message) {
        this.analysis = null;
        this.text.setIssues([]);
        this.issues.show([{ severity: "error", code: "refused", message }]);
        this.score.setMessage(message, { stale: true });
        this.panel.setStructure(null);
        this.setStatus(short, "error");
        this.status.title = message;
        this.element.dataset.errors = "1";
        this.element.dataset.warnings = "0";
        this.updateButtons();
    }

    showAnalysis(answer, text) {
        this.analysis = answer;
        const issues = answer.issues || [];
        const errors = issues.filter((i) => i.severity === "error").length;
        const warnings = issues.length - errors;
        this.text.setIssues(issues);
        this.issues.show(issues);
        if (answer.svg && this.score.show(answer.svg, answer.time_map)) this.score.setMessage("");
        else if (!text.trim()) {
            this.score.clear();
            this.score.setMessage("");
        } else this.score.setMessage(answer.svg_error || "The score could not be engraved.", { stale: true });
        this.score.markBars(issues);
        this.panel.setStructure(answer.structure);
        // the score's tempo in the BPM box — unless a new one is being typed there: an analysis that ended meanwhile
        // put the old tempo back, and Enter then set that (UI review, stop 56)
        if (answer.structure && document.activeElement !== this.tempoInput) {
            this.tempoInput.value = String(Math.round(answer.structure.tempo?.bpm || 0) || "");
        }
        const summary = errors ? `${errors} error${errors > 1 ? "s" : ""}` : "valid";
        this.setStatus(warnings ? `${summary}, ${warnings} warning${warnings > 1 ? "s" : ""}` : summary,
                       errors ? "error" : warnings ? "warning" : "");
        Object.assign(this.element.dataset, { errors: String(errors), warnings: String(warnings),
                                              analyzed: String(Number(this.element.dataset.analyzed) + 1) });
        if (!this.player.playing) this.timeReadout.textContent = `0:00.0 / ${formatTime(answer.timeline?.duration_s || 0)}`;
        this.updateButtons();
        this.scheduleTokens();
    }

    pick(issue) {
        if (issue?.line) this.text.selectLine(issue.line, issue.column);
    }

    // --- graph context, tokens -----------------------------------------------------------------------------------
    refreshContext({ reanalyze = true } = {}) {
        let context;
        try {
            context = graphContext(this.node);
        } catch (error) {
            return; // the graph is being rebuilt (workflow switch): try again on the next poll
        }
        const before = this.context;
        this.context = context;
        const same = (keys) => keys.every((k) => before[k] === context[k]);
        if (!same(["maxSeconds", "ckptName", "composerId"])) this.panel.setContext(context);
        if (reanalyze && !same(["maxSeconds", "instrumental"]) && this.analysis) this.scheduleAnalysis(0);
        if (!same(["ckptName", "style", "lyrics", "cot"])) this.scheduleTokens();
    }

    scheduleTokens() {
        clearTimeout(this.timers.tokens);
        this.timers.tokens = setTimeout(() => this.countTokens(), TOKENS_DELAY_MS);
    }

    async countTokens() {
        const text = this.text.value;
        const { ckptName, style, lyrics, cot } = this.context;
        if (!ckptName || !text.trim() || utf8Bytes(text) > MAX_ABC_BYTES) {
            this.tokenKey = null;
            this.panel.setTokens(null);
            return;
        }
        const body = { abc: text, ckpt_name: ckptName, cot };
        if (typeof style === "string" && typeof lyrics === "string") Object.assign(body, { style, lyrics });
        const key = JSON.stringify(body);
        if (key === this.tokenKey) return;
        this.tokenKey = key;
        const seq = ++this.tokenSeq;
        this.panel.setTokens({ pending: true });
        try {
            const answer = await callRoute("tokens", body);
            if (seq === this.tokenSeq) this.panel.setTokens(answer);
        } catch (error) {
            if (seq === this.tokenSeq) this.panel.setTokens({ error: error.message });
        }
    }

    // --- tools ---------------------------------------------------------------------------------------------------
    async runTool(tool, arg = null) {
        const text = this.text.value;
        this.setStatus(`${tool.replace("_", " ")}…`);
        try {
            const answer = await callRoute("tool", { tool, abc: text, arg });
            if (this.text.value !== text) {
                this.setStatus("The text changed while the tool ran; nothing was replaced.", "warning");
                return;
            }
            if (typeof answer.abc !== "string") throw new Error("The server answered without a score.");
            if (!this.text.replace(answer.abc, "tool")) this.setStatus(`${tool.replace("_", " ")}: nothing to change.`);
        } catch (error) {
            this.setStatus(error.message, "error");
            if (error.answer?.line) this.text.selectLine(error.answer.line, error.answer.column);
        }
    }

    setTempo() {
        const bpm = Number(this.tempoInput.value);
        if (!Number.isInteger(bpm) || bpm < 1 || bpm > 1000) {
            this.setStatus("Tempo: type a whole number of beats per minute from 1 to 1000.", "error");
            this.tempoInput.focus();
            return;
        }
        this.runTool("set_tempo", bpm);
    }

    revert() {
        if (!this.sourceText) {
            this.setStatus("No composer score yet: run the workflow once.", "warning");
            return;
        }
        if (this.text.replace(this.sourceText, "revert")) this.setStatus("Reverted to the composer's score (Ctrl+Z undoes).");
    }

    // --- playback ------------------------------------------------------------------------------------------------
    async togglePlay() {
        if (this.player.playing) {
            this.player.stop();
            return;
        }
        const timeline = this.analysis?.timeline;
        if (!timeline) {
            this.setStatus("Nothing to play: the score does not parse.", "error");
            return;
        }
        try {
            await this.player.play(timeline);
            if (timeline.cut_s != null) {
                this.setStatus(`Playing the first ${formatTime(timeline.cut_s)}: the score has more notes and chord `
                    + "symbols than the editor plays (12,000).", "warning");
            }
        } catch (error) {
            this.setStatus(`Audio could not start: ${error.message}`, "error");
        }
        this.element.dataset.audioState = this.player.audioState;
    }

    playbackAt(seconds) {
        const total = this.player.duration || 0;
        this.timeReadout.textContent = `${formatTime(Math.min(seconds, total))} / ${formatTime(total)}`;
        this.element.dataset.position = seconds.toFixed(2);
        this.element.dataset.audioState = this.player.audioState;
        if (this.score.element.dataset.stale !== "true") {
            this.element.dataset.highlighted = this.score.highlightAt(seconds).join(" ");
        }
    }

    playbackState(playing) {
        this.playButton.textContent = playing ? "■ Stop" : "▶ Play";
        this.playButton.dataset.playing = String(playing);
        this.element.dataset.playing = String(playing);
        this.element.dataset.audioState = this.player.audioState;
        if (!playing) this.score.highlight([]);
        this.updateButtons();
    }
}
