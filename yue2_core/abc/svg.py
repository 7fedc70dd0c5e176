"""Allow-list SVG sanitiser: rebuild the document keeping only known-safe elements and attributes.

Parsed with `xml.etree` (no regexes on markup; ElementTree never fetches external entities). Kept: SVG drawing and
text elements, presentation attributes, ids/classes, and `href`/`xlink:href` only when they point inside the document
("#id"). Dropped with their content: everything else — <script>, <foreignObject>, <a>, <image>, animation elements,
elements of other namespaces; dropped attributes: event handlers (on*), style attributes, external references.
A <style> element is kept only when its CSS, once embedded web fonts are set aside (`url(data:font/woff2;base64,…)`,
which Verovio writes for its music font), has no @import, url(, expression or escape sequences.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from .errors import AbcError

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
XML_NS = "http://www.w3.org/XML/1998/namespace"

ALLOWED_ELEMENTS = frozenset({"svg", "g", "defs", "symbol", "use", "path", "rect", "circle", "ellipse", "line",
                              "polyline", "polygon", "text", "tspan", "title", "desc", "style", "clipPath"})
ALLOWED_ATTRIBUTES = frozenset({
    "id", "class", "d", "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "ry", "width", "height",
    "viewBox", "preserveAspectRatio", "transform", "points", "fill", "fill-opacity", "fill-rule", "stroke",
    "stroke-width", "stroke-opacity", "stroke-linecap", "stroke-linejoin", "stroke-dasharray", "stroke-miterlimit",
    "opacity", "color", "font-family", "font-size", "font-style", "font-weight", "text-anchor", "dominant-baseline",
    "overflow", "version", "type", "clip-path", "clipPathUnits", "visibility", "letter-spacing", "word-spacing",
})
_LOCAL_REF = re.compile(r"#[A-Za-z0-9_.:-]+")
_LOCAL_URL = re.compile(r"url\(#[A-Za-z0-9_.:-]+\)")
_UNSAFE_CSS = ("@import", "url(", "expression", "javascript", "\\", "<", "behavior", "-moz-binding")
_EMBEDDED_FONT = re.compile(r"url\((?:data:(?:application/font-woff2?|font/woff2?)(?:;charset=utf-8)?;base64,"
                            r"[A-Za-z0-9+/=]+)\)")


def sanitize_svg(svg: str) -> str:
    """A safe copy of `svg` (text of one <svg> document). Raises `AbcError` when it is not well-formed SVG."""
    if "<!DOCTYPE" in svg or "<!ENTITY" in svg:
        raise AbcError("The SVG has a DOCTYPE or entity declarations, which are not accepted.", code="svg")
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as error:
        raise AbcError(f"The SVG is not well-formed XML: {error}.", code="svg") from None
    clean = _clean(root)
    if clean is None or clean.tag != f"{{{SVG_NS}}}svg":
        raise AbcError("The document is not an <svg> element.", code="svg")
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    return ET.tostring(clean, encoding="unicode")


def _local(tag: str, namespace: str) -> str | None:
    prefix = f"{{{namespace}}}"
    return tag[len(prefix):] if isinstance(tag, str) and tag.startswith(prefix) else None


def _clean(element: ET.Element) -> ET.Element | None:
    name = _local(element.tag, SVG_NS)
    if name not in ALLOWED_ELEMENTS:
        return None
    if name == "style" and not _safe_css(element.text or ""):
        return None
    copy = ET.Element(element.tag)
    for key, value in element.attrib.items():
        if key in ALLOWED_ATTRIBUTES and not _unsafe_value(value):
            copy.set(key, value)
        elif key in ("href", f"{{{XLINK_NS}}}href") and _LOCAL_REF.fullmatch(value.strip()):
            copy.set(key, value.strip())
        elif key == f"{{{XML_NS}}}space" and value in ("default", "preserve"):
            copy.set(key, value)
    copy.text = element.text
    for child in element:
        kept = _clean(child)
        if kept is not None:
            kept.tail = child.tail
            copy.append(kept)
    return copy


def _safe_css(css: str) -> bool:
    """True when the CSS, without embedded font data, holds none of the markers in `_UNSAFE_CSS`."""
    rest = _EMBEDDED_FONT.sub("", css).lower()
    return not any(marker in rest for marker in _UNSAFE_CSS)


def _unsafe_value(value: str) -> bool:
    lowered = value.lower()
    if "url(" in lowered:
        return not _LOCAL_URL.fullmatch(value.strip())
    return "javascript:" in lowered or "data:" in lowered or "expression(" in lowered
