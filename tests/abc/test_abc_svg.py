"""The allow-list SVG sanitiser (no verovio needed)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from yue2_core.abc import AbcError
from yue2_core.abc.svg import SVG_NS, XLINK_NS, sanitize_svg

HOSTILE = f"""<svg xmlns="{SVG_NS}" xmlns:xlink="{XLINK_NS}" viewBox="0 0 10 10" onload="alert(1)">
  <script>alert(2)</script>
  <style>g {{ fill: red; }}</style>
  <style>@import url(http://evil.example/x.css);</style>
  <defs><path id="n" d="M0 0L1 1"/></defs>
  <g class="note" id="Vocal-0" onclick="steal()" style="background:url(http://x)">
    <use xlink:href="#n" x="1"/>
    <use xlink:href="http://evil.example/a.svg#n"/>
    <use href="javascript:alert(3)"/>
    <text x="1" y="2">&lt;script&gt; as text</text>
    <foreignObject><div xmlns="http://www.w3.org/1999/xhtml">html</div></foreignObject>
    <a xlink:href="https://evil.example"><path d="M1 1"/></a>
    <image href="https://evil.example/p.png"/>
    <rect fill="url(#grad)" width="1" height="1"/>
    <rect fill="url(https://evil.example/#g)" width="1" height="1"/>
  </g>
</svg>"""


def walk(svg: str):
    root = ET.fromstring(svg)
    return list(root.iter())


def test_hostile_content_is_removed():
    clean = sanitize_svg(HOSTILE)
    elements = walk(clean)
    names = {e.tag.split("}")[1] for e in elements}
    assert names <= {"svg", "g", "defs", "path", "use", "text", "style", "rect"}
    assert not {"script", "foreignObject", "a", "image"} & names
    for element in elements:
        for key, value in element.attrib.items():
            assert not key.split("}")[-1].startswith("on")
            assert key != "style"
            if key.endswith("href"):
                assert value.startswith("#")
            assert "http" not in value and "javascript" not in value
    styles = [e.text for e in elements if e.tag.endswith("style")]
    assert styles == ["g { fill: red; }"]
    assert "&lt;script&gt; as text" in clean
    assert [e.get(f"{{{XLINK_NS}}}href") for e in elements if e.tag.endswith("use")] == ["#n", None, None]
    fills = [e.get("fill") for e in elements if e.tag.endswith("rect")]
    assert fills == ["url(#grad)", None]


def test_ids_and_classes_survive():
    clean = sanitize_svg(HOSTILE)
    assert any(e.get("id") == "Vocal-0" and e.get("class") == "note" for e in walk(clean))


@pytest.mark.parametrize("bad", ["<svg", "<html/>", '<!DOCTYPE svg [<!ENTITY x "y">]><svg/>',
                                 '<svg xmlns="http://example.com/other"/>'])
def test_rejects_non_svg(bad):
    with pytest.raises(AbcError):
        sanitize_svg(bad)
