// The score's text: a plain <textarea> (no wrapping, so line N is always row N) next to a line-number gutter that
// carries the error/warning markers, plus an undo stack of our own. The browser's native undo cannot be used: the
// score tools replace the whole text programmatically, which the native stack does not record.
import { el } from "./dom.js";

const UNDO_LIMIT = 200;
const TYPING_PAUSE_MS = 900; // typing after a pause this long starts a new undo step
const GUTTER_MAX_LINES = 20000; // a pasted 200 kB blob must not build a million gutter rows

/** UTF-16 code units of the `points` code points of `text` from `start`: the server counts columns in code points
 * (Python's str), the textarea in UTF-16 units, so a line with an emoji put the caret one unit early per emoji. */
export function utf16Length(text, start, points) {
    let i = start;
    for (let n = 0; n < points && i < text.length; n++) i += text.codePointAt(i) > 0xffff ? 2 : 1;
    return i - start;
}

export class TextEditor {
    /** onChange(text, {source}) runs after every change: source "typing" | "tool" | "undo" | "external". */
    constructor({ onChange }) {
        this.onChange = onChange;
        this.undoStack = [];
        this.redoStack = [];
        this.lastText = "";
        this.lastInputAt = 0;
        this.frame = 0; // a requestAnimationFrame id while typing's gutter and onChange wait for the next frame
        this.marks = new Map(); // line -> {level, messages}
        this.onGutterClick = null;

        this.gutter = el("div", { className: "yue2-abc-gutter" });
        this.textarea = el("textarea", {
            className: "yue2-abc-textarea",
            spellcheck: false,
            wrap: "off",
            placeholder: "ABC score (X:1, T:, M:, L:, Q:, V: Vocal, V: Ins, K:, then the music).\n"
                + "Run the workflow once to fill it with the composer's score, or paste one.",
        });
        this.textarea.setAttribute("autocomplete", "off");
        this.textarea.setAttribute("autocapitalize", "off");
        this.textarea.setAttribute("aria-label", "ABC score");
        this.element = el("div", { className: "yue2-abc-text" }, [this.gutter, this.textarea]);

        this.textarea.addEventListener("input", () => this.handleInput());
        this.textarea.addEventListener("scroll", () => { this.gutter.scrollTop = this.textarea.scrollTop; });
        this.textarea.addEventListener("keydown", (event) => this.handleKey(event));
        this.gutter.addEventListener("click", (event) => {
            const row = event.target.closest("div[data-line]");
            if (row && row.dataset.level) this.onGutterClick?.(Number(row.dataset.line));
        });
        this.renderGutter();
    }

    get value() {
        return this.textarea.value;
    }

    /** A value set from outside (workflow load, node paste): a new baseline, so the undo history is cleared. */
    setExternal(text) {
        text = typeof text === "string" ? text : text == null ? "" : String(text);
        if (text === this.textarea.value) return;
        this.cancelFrame();
        this.textarea.value = text;
        this.lastText = text;
        this.undoStack = [];
        this.redoStack = [];
        this.renderGutter();
        this.onChange(text, { source: "external" });
    }

    /** Replace the whole text as one undoable step (score tools, revert). */
    replace(text, source = "tool") {
        if (text === this.textarea.value) return false;
        this.pushUndo(this.snapshot());
        this.redoStack = [];
        this.apply({ text, start: 0, end: 0 }, source);
        return true;
    }

    undo() {
        if (!this.undoStack.length) return false;
        this.redoStack.push(this.snapshot());
        this.apply(this.undoStack.pop(), "undo");
        return true;
    }

    redo() {
        if (!this.redoStack.length) return false;
        this.pushUndo(this.snapshot());
        this.apply(this.redoStack.pop(), "undo");
        return true;
    }

    /** The undo history with the text it leads to (web/abc_editor/history.js keeps it while the node is re-made). */
    exportHistory() {
        return { text: this.textarea.value, undo: this.undoStack.slice(), redo: this.redoStack.slice() };
    }

    /**
     * Take back a history `exportHistory` gave for this node's previous editor. The text may have moved meanwhile:
     * a canvas Ctrl+Z (ComfyUI's graph undo re-creates the node) restores an earlier text. When that text is the
     * last undo step (or the next redo step), the history steps there, so ↶ / ↷ go on from it; any other text is
     * one more step after the kept ones, so ↶ brings back the text the node had — nothing of the history is lost.
     */
    importHistory({ text, undo, redo }) {
        const current = this.textarea.value;
        const at = { text, start: 0, end: 0 };
        undo = Array.isArray(undo) ? undo.slice() : [];
        redo = Array.isArray(redo) ? redo.slice() : [];
        if (current !== text) {
            if (undo.length && undo[undo.length - 1].text === current) {
                undo.pop();
                redo.push(at);
            } else if (redo.length && redo[redo.length - 1].text === current) {
                redo.pop();
                undo.push(at);
            } else {
                undo.push(at);
                redo = [];
            }
        }
        this.undoStack = undo.slice(-UNDO_LIMIT);
        this.redoStack = redo;
        this.lastText = current;
        this.lastInputAt = 0;
    }

    get canUndo() {
        return this.undoStack.length > 0;
    }

    get canRedo() {
        return this.redoStack.length > 0;
    }

    snapshot() {
        const t = this.textarea;
        return { text: t.value, start: t.selectionStart, end: t.selectionEnd };
    }

    pushUndo(state) {
        this.undoStack.push(state);
        if (this.undoStack.length > UNDO_LIMIT) this.undoStack.shift();
    }

    apply(state, source) {
        this.cancelFrame();
        const t = this.textarea;
        t.value = state.text;
        const at = Math.min(state.start ?? 0, state.text.length);
        t.setSelectionRange(at, Math.min(state.end ?? at, state.text.length));
        this.lastText = state.text;
        this.lastInputAt = 0;
        this.renderGutter();
        this.onChange(state.text, { source });
    }

    handleInput() {
        // One undo step per burst of typing: the text before the burst is what Ctrl+Z goes back to.
        const now = performance.now();
        if (now - this.lastInputAt > TYPING_PAUSE_MS && this.lastText !== this.textarea.value) {
            this.pushUndo({ text: this.lastText, start: this.textarea.selectionStart, end: this.textarea.selectionStart });
            this.redoStack = [];
        }
        this.lastInputAt = now;
        this.lastText = this.textarea.value;
        // The gutter and onChange (ComfyUI's widget callback, change tracker — a serialisation of the whole graph —
        // and the analysis timer) once per frame, not per key: in a 50–90 kB score each key paid for all of them
        // and a forced layout (the gutter's scrollTop read). The undo bookkeeping above stays per key.
        if (this.frame) return;
        if (document.hidden || typeof requestAnimationFrame !== "function") {
            this.flushInput(); // no frames come to a hidden page
            return;
        }
        this.frame = requestAnimationFrame(() => this.flushInput());
    }

    /** What typing changed, drawn and told once per frame (handleInput). */
    flushInput() {
        this.frame = 0;
        this.renderGutter({ scroll: false });
        this.onChange(this.textarea.value, { source: "typing" });
    }

    /** Drop typing's pending frame: the caller draws and tells the change itself. */
    cancelFrame() {
        if (!this.frame) return;
        cancelAnimationFrame(this.frame);
        this.frame = 0;
    }

    handleKey(event) {
        const key = event.key.toLowerCase();
        const mod = event.ctrlKey || event.metaKey;
        // ComfyUI binds Ctrl+Z / Ctrl+Y / Ctrl+A / Delete and others on the document: keep keys typed here away from
        // it — except Ctrl+S (save the workflow) and Ctrl+Enter (queue), which work in ComfyUI's own text boxes too
        // (editor review, stop 39: swallowed here, Ctrl+S then opened the browser's "Save page as").
        const passOn = mod && !event.altKey && (key === "s" || key === "enter");
        if (!passOn) event.stopPropagation();
        if (mod && !event.altKey && (key === "z" || key === "y")) {
            event.preventDefault();
            if (key === "y" || event.shiftKey) this.redo();
            else this.undo();
        } else if (key === "tab" && !mod) {
            event.preventDefault(); // keep focus in the score; Tab inserts spaces (ABC has no tabs)
            document.execCommand?.("insertText", false, "    ") || this.insertAtCursor("    ");
        }
    }

    insertAtCursor(text) {
        const t = this.textarea;
        t.setRangeText(text, t.selectionStart, t.selectionEnd, "end");
        this.handleInput();
    }

    lineCount() {
        let n = 1;
        const text = this.textarea.value;
        for (let i = text.indexOf("\n"); i !== -1 && n < GUTTER_MAX_LINES; i = text.indexOf("\n", i + 1)) n++;
        return n;
    }

    /**
     * Rebuild the gutter rows when the number of lines changed and re-apply the markers then; match the textarea's
     * scroll position. `scroll` false (typing): only when the rows were rebuilt — otherwise the textarea's own
     * scroll event keeps the gutter in step, and reading its scrollTop here forced a layout of the whole text.
     */
    renderGutter({ scroll = true } = {}) {
        const lines = this.lineCount();
        const rebuilt = this.gutter.childElementCount !== lines;
        if (rebuilt) {
            const rows = [];
            for (let i = 1; i <= lines; i++) rows.push(el("div", { textContent: String(i), dataset: { line: i } }));
            this.gutter.replaceChildren(...rows);
            this.paintMarks();
        }
        if (scroll || rebuilt) this.gutter.scrollTop = this.textarea.scrollTop;
    }

    /** issues: [{severity, line, message}] from /analyze; errors win over warnings on the same line. */
    setIssues(issues) {
        this.marks = new Map();
        for (const issue of issues || []) {
            if (!Number.isInteger(issue.line) || issue.line < 1) continue;
            const mark = this.marks.get(issue.line) || { level: "warning", messages: [] };
            if (issue.severity === "error") mark.level = "error";
            mark.messages.push(issue.message);
            this.marks.set(issue.line, mark);
        }
        this.paintMarks();
    }

    paintMarks() {
        for (const row of this.gutter.children) {
            const mark = this.marks.get(Number(row.dataset.line));
            if (mark) {
                row.dataset.level = mark.level;
                row.title = mark.messages.join("\n"); // an attribute, shown as a tooltip: never parsed as HTML
            } else if (row.dataset.level) {
                delete row.dataset.level;
                row.removeAttribute("title");
            }
        }
    }

    /** Select line `line` (1-based) and scroll it into view; `column` (1-based) puts the caret there instead. */
    selectLine(line, column = null) {
        const t = this.textarea;
        const text = t.value;
        let start = 0;
        for (let n = 1; n < line; n++) {
            const next = text.indexOf("\n", start);
            if (next === -1) break;
            start = next + 1;
        }
        let end = text.indexOf("\n", start);
        if (end === -1) end = text.length;
        t.focus({ preventScroll: true });
        if (column && column > 1) t.setSelectionRange(Math.min(start + utf16Length(text, start, column - 1), end), end);
        else t.setSelectionRange(start, end);
        const lineHeight = parseFloat(getComputedStyle(t).lineHeight) || 16;
        t.scrollTop = Math.max(0, (line - 3) * lineHeight);
        this.gutter.scrollTop = t.scrollTop;
    }
}
