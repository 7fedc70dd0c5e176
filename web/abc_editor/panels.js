// The issues list and the structure panel under the text and the score. Everything is written with textContent.
import { el, formatTime } from "./dom.js";

const MAX_LISTED_ISSUES = 200;

export class IssueList {
    /** onPick(issue) when an issue is clicked (the editor selects its line). */
    constructor({ onPick }) {
        this.element = el("ul", { className: "yue2-abc-issues", ariaLabel: "Problems in the score" });
        this.issues = [];
        this.element.addEventListener("click", (event) => {
            const item = event.target.closest("li[data-index]");
            if (item) onPick(this.issues[Number(item.dataset.index)]);
        });
    }

    /** issues from /analyze, or one pseudo-issue {severity, message} for a message without a place. */
    show(issues) {
        this.issues = (issues || []).slice(0, MAX_LISTED_ISSUES);
        const items = this.issues.map((issue, index) => {
            // the place as every score message writes it: "line 3 column 19" (the CLI, the nodes; stop-50 leftover)
            const where = issue.line ? `line ${issue.line}${issue.column ? " column " + issue.column : ""}:` : "";
            const bar = issue.bar ? ` (${issue.voice || ""} bar ${issue.bar})` : "";
            return el("li", { dataset: { index, level: issue.severity || "warning", code: issue.code || "" },
                              title: issue.code || "" },
                      [el("span", { className: "yue2-abc-where", textContent: where }), `${issue.message}${bar}`]);
        });
        this.element.replaceChildren(...items);
    }
}

/** Key/value rows: key, meter, tempo, sections, bars, duration vs the composer's limit, tokens, music budget. */
export class StructurePanel {
    constructor() {
        this.element = el("dl", { className: "yue2-abc-structure" });
        this.structure = null;
        this.context = {};
        this.tokens = null;
        this.render();
    }

    setStructure(structure) {
        this.structure = structure || null;
        this.render();
    }

    setContext(context) {
        this.context = context || {};
        this.render();
    }

    /** tokens: the /tokens answer, {pending: true}, {error: "..."} or null (no checkpoint known). */
    setTokens(tokens) {
        this.tokens = tokens;
        this.render();
    }

    render() {
        const rows = [];
        const row = (name, value, level) => {
            rows.push(el("dt", { textContent: name }),
                      el("dd", { textContent: value, dataset: level ? { level, field: name } : { field: name } }));
        };
        const s = this.structure;
        if (!s) {
            row("Score", "—  (no readable score yet)");
        } else {
            if (s.title) row("Title", s.title); // raw text from the score: textContent only
            const key = (s.keys || []).length > 1 ? `${s.key} (then ${s.keys.slice(1).map((k) => k.key).join(", ")})` : s.key;
            const meter = s.meters?.length ? `${s.meter} (then ${s.meters.map((m) => m.meter).join(", ")})` : s.meter;
            row("Key, meter", `${key} · ${meter} · ${trim(s.tempo?.bpm)} BPM (${s.tempo?.beat} beat) · L:${s.unit_length}`);
            row("Bars", `Vocal ${s.bars?.Vocal ?? 0}, Ins ${s.bars?.Ins ?? 0}` + (s.truncated ? " — cut off (truncated)" : ""),
                s.truncated || s.bars?.Vocal !== s.bars?.Ins ? "warning" : null);
            row("Sections", sectionsText(s.sections));
            row("Notes", `Vocal ${s.notes?.Vocal ?? 0}, Ins ${s.notes?.Ins ?? 0}; chords ${s.chord_count ?? 0}`
                + (s.chord_symbols?.length ? ` (${s.chord_symbols.slice(0, 12).join(" ")}${s.chord_symbols.length > 12 ? " …" : ""})` : ""));
            const limit = this.context.maxSeconds;
            const over = limit && s.duration_s > limit;
            row("Duration", `${formatTime(s.duration_s)} (${trim(s.duration_s)} s)`
                + (limit ? ` of max ${trim(limit)} s${over ? ` — ${trim(s.duration_s - limit)} s too long` : ""}` : " (no composer connected)"),
                limit ? (over ? "error" : "ok") : null);
        }
        this.tokenRows(row);
        this.element.replaceChildren(...rows);
    }

    tokenRows(row) {
        const t = this.tokens;
        if (!t) {
            row("Tokens", this.context.ckptName === null ? "— (no YuE2 checkpoint loader in the workflow)" : "—");
            return;
        }
        if (t.pending) {
            row("Tokens", "counting…");
            return;
        }
        if (t.error) {
            row("Tokens", t.error, "warning");
            return;
        }
        row("Tokens", `${t.tokens} score tokens (${t.ckpt_name})`);
        if (Number.isFinite(t.music_seconds_max)) {
            const limit = this.context.maxSeconds;
            const short = limit && t.music_seconds_max < limit;
            row("Music budget", `${t.music_tokens_max} tokens = ${trim(t.music_seconds_max)} s of music fit after the `
                + `${t.prefix_tokens}-token prompt (context ${t.context})`
                + (short ? ` — less than max ${trim(limit)} s` : ""), short ? "warning" : "ok");
        } else {
            row("Music budget", "unknown (needs the composer's style and lyrics)");
        }
    }
}

function trim(x) {
    return Number.isFinite(x) ? String(Math.round(x * 10) / 10) : "?";
}

function sectionsText(sections) {
    if (!sections?.length) return "none (add % comment lines such as % verse)";
    return sections.map((s) => `${s.label || "—"} ${s.bars ? `${s.first_bar}–${s.last_bar}` : "(empty)"}`).join(", ");
}
