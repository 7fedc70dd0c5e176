// Tiny DOM helpers. Text always goes in through textContent / attributes, never through innerHTML.

/**
 * el("button", {className: "x", textContent: "Play", title: "...", dataset: {a: 1}, onclick: fn}, [children])
 * Properties are assigned as DOM properties (dataset is merged); children are nodes or strings (as text nodes).
 */
export function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
        if (key === "dataset") Object.assign(node.dataset, value);
        else node[key] = value;
    }
    for (const child of children) node.append(typeof child === "string" ? document.createTextNode(child) : child);
    return node;
}

/** m:ss.s for a time readout. */
export function formatTime(seconds) {
    if (!Number.isFinite(seconds) || seconds < 0) seconds = 0;
    const minutes = Math.floor(seconds / 60);
    const rest = seconds - minutes * 60;
    return `${minutes}:${rest.toFixed(1).padStart(4, "0")}`;
}

/** UTF-8 byte length (the server's 100 kB limit counts bytes, not characters). */
export function utf8Bytes(text) {
    return new TextEncoder().encode(text).length;
}
