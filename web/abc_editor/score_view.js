// The engraved score: SVG text from /yue2/abc/analyze (Verovio output, already sanitised by the server's allow-list)
// parsed with DOMParser, cleaned once more here, and imported into the page. Notes carry the ids of the time map
// ("Vocal-12"; pieces of a split note "Vocal-12-1"), which is how playback highlights them.
import { el } from "./dom.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const FORBIDDEN = "script, foreignObject, iframe, object, embed, a, image, animate, set, animateMotion, animateTransform";
const VOICE_STAFF = { Vocal: 0, Ins: 1 }; // each measure holds one staff per voice, Vocal first

// Verovio writes accidentals in chord symbols and the tempo's note as SMuFL glyphs (private-use code points) in its
// embedded music font. ComfyUI's Content-Security-Policy (font-src 'self', e.g. with --disable-api-nodes) blocks that
// data: font, so those glyphs would show as boxes: write them as ordinary Unicode music symbols instead.
const SMUFL_TEXT = {
    "\uE260": "\u266D", "\uE261": "\u266E", "\uE262": "\u266F", "\uE263": "\u{1D12A}", "\uE264": "\u{1D12B}",
    "\uEA63": "\u{1D12B}", "\uEA64": "\u266D", "\uEA65": "\u266E", "\uEA66": "\u266F", "\uEA67": "\u{1D12A}",
    "\uECA2": "\u{1D15D}", "\uECA3": "\u{1D15E}", "\uECA5": "\u2669", "\uECA7": "\u266A", "\uECA9": "\u{1D161}",
    "\uECB7": ".",
};
const SMUFL_RE = /[\uE000-\uF8FF]/g;
const SMUFL_ANY = /[\uE000-\uF8FF]/; // (no /g: test() on a global regex keeps state between calls)

/** Replace SMuFL glyphs in text by Unicode symbols and drop the embedded font nobody needs then. */
function plainTextGlyphs(root) {
    for (const span of root.querySelectorAll("text, tspan")) {
        for (const child of span.childNodes) {
            if (child.nodeType === Node.TEXT_NODE && SMUFL_ANY.test(child.data)) {
                child.data = child.data.replace(SMUFL_RE, (c) => SMUFL_TEXT[c] ?? "");
                span.removeAttribute("font-family");
            }
        }
    }
    for (const style of root.querySelectorAll("style")) {
        style.textContent = style.textContent.replace(/@font-face\s*\{[^}]*\}/g, "");
    }
}

/** Parse `svgText` into an <svg> element owned by this document, or null when it is not an SVG document. */
export function importSvg(svgText) {
    if (typeof svgText !== "string" || !svgText) return null;
    const doc = new DOMParser().parseFromString(svgText, "image/svg+xml");
    const root = doc.documentElement;
    if (!root || root.namespaceURI !== SVG_NS || root.localName !== "svg" || doc.querySelector("parsererror")) {
        return null;
    }
    // Defence in depth: the server already removed these; nothing active may reach the page even if it did not.
    for (const bad of root.querySelectorAll(FORBIDDEN)) bad.remove();
    for (const node of [root, ...root.querySelectorAll("*")]) {
        for (const attr of [...node.attributes]) {
            const name = attr.name.toLowerCase();
            const value = attr.value.trim().toLowerCase();
            const isLink = name === "href" || name.endsWith(":href");
            if (name.startsWith("on") || (isLink && !value.startsWith("#")) || value.startsWith("javascript:")) {
                node.removeAttribute(attr.name);
            }
        }
    }
    plainTextGlyphs(root);
    return document.importNode(root, true);
}

export class ScoreView {
    constructor() {
        this.message = el("div", { className: "yue2-abc-score-message", role: "status" });
        this.holder = el("div", { className: "yue2-abc-score-svg" });
        this.element = el("div", { className: "yue2-abc-score", dataset: { version: "0" } }, [this.message, this.holder]);
        this.svg = null;
        this.timeMap = [];
        this.playing = [];
    }

    /** Show a new engraving; returns false (keeping the old one) when the text is not a usable SVG. */
    show(svgText, timeMap) {
        const svg = importSvg(svgText);
        if (!svg) return false;
        this.holder.replaceChildren(svg);
        this.svg = svg;
        this.timeMap = Array.isArray(timeMap) ? timeMap : [];
        this.playing = [];
        this.element.dataset.version = String(Number(this.element.dataset.version) + 1);
        this.element.dataset.stale = "false";
        return true;
    }

    clear() {
        this.holder.replaceChildren();
        this.svg = null;
        this.timeMap = [];
        this.playing = [];
    }

    /** A message over the score (why it could not be engraved); the last good engraving stays, dimmed. */
    setMessage(text, { stale = false } = {}) {
        this.message.textContent = text || "";
        this.element.dataset.stale = String(Boolean(stale && this.svg));
    }

    /** Colour the staves of bars that issues point at (issue.bar is 1-based within issue.voice). */
    markBars(issues) {
        if (!this.svg) return;
        for (const marked of this.svg.querySelectorAll(".yue2-bar-error, .yue2-bar-warning")) {
            marked.classList.remove("yue2-bar-error", "yue2-bar-warning");
        }
        const measures = this.svg.querySelectorAll("g.measure");
        for (const issue of issues || []) {
            if (!Number.isInteger(issue.bar) || !(issue.voice in VOICE_STAFF)) continue;
            const measure = measures[issue.bar - 1];
            const staff = measure && [...measure.children].filter((c) => c.classList.contains("staff"))[VOICE_STAFF[issue.voice]];
            if (!staff) continue;
            if (issue.severity === "error") {
                staff.classList.remove("yue2-bar-warning");
                staff.classList.add("yue2-bar-error");
            } else if (!staff.classList.contains("yue2-bar-error")) {
                staff.classList.add("yue2-bar-warning");
            }
        }
    }

    /** Highlight the notes sounding at `seconds`; returns the ids highlighted. */
    highlightAt(seconds) {
        const ids = this.timeMap
            .filter((e) => e.kind === "note" && e.start_s <= seconds && seconds < e.start_s + e.dur_s)
            .map((e) => e.id);
        this.highlight(ids);
        return ids;
    }

    highlight(ids) {
        for (const node of this.playing) node.classList.remove("yue2-playing");
        this.playing = [];
        if (!this.svg) return;
        for (const id of ids) {
            // CSS.escape: ids come from the server, but a selector is still code; never splice raw text into one.
            const safe = CSS.escape(id);
            for (const node of this.svg.querySelectorAll(`[id="${safe}"], [id^="${safe}-"]`)) {
                node.classList.add("yue2-playing");
                this.playing.push(node);
            }
        }
        if (this.playing.length) this.scrollTo(this.playing[0]);
    }

    /** Scroll the score pane (only it: scrollIntoView would also scroll ComfyUI's own containers) to show `node`. */
    scrollTo(node) {
        const pane = this.element.getBoundingClientRect();
        const box = node.getBoundingClientRect();
        if (box.top < pane.top || box.bottom > pane.bottom) {
            this.element.scrollTop += box.top - pane.top - pane.height / 3;
        }
    }
}
