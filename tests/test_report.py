"""The verify report: valid, self-contained HTML (no network, figures inline, text escaped) and its JSON twin."""
import base64
import json
import re
from html.parser import HTMLParser

import pytest

from attnlab.lab.claims import Check, Claim
from attnlab.lab.report import PNG_SIGNATURE, jsonable, new_figure, png_bytes, render_html, write_report

EVIL = '<script>alert("x")</script> & <img src="https://example.com/t.png">'
VOID = {"meta", "img", "br", "hr", "input", "link", "col", "source", "wbr"}


class _Checker(HTMLParser):
    """Collects start tags with attributes and checks that every non-void element is closed in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.tags, self.errors, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(page: str) -> _Checker:
    c = _Checker()
    c.feed(page)
    c.close()
    assert not c.errors, c.errors[:5]
    assert not c.stack, f"unclosed: {c.stack}"
    return c


@pytest.fixture(scope="module")
def png():
    fig, ax = new_figure()
    ax.plot([1, 2, 3], [1, 4, 9])
    data = png_bytes(fig)
    assert data.startswith(PNG_SIGNATURE)
    return data


def _claims(png):
    return [
        Claim("good-one", "A claim that holds", statement="x is x", criterion="|x - x| <= 0", passed=True,
              measurement={"err": 0.0, "curve": [1.0, 2.0], "nan": float("nan"), "inf": float("-inf")},
              figure=png, notes="first paragraph\n\nsecond paragraph", seconds=1.25, summary="err 0"),
        Claim("../evil/id", EVIL, statement=EVIL, criterion=EVIL, passed=False, measurement={"what": EVIL},
              notes=EVIL, error=f"Traceback ...\nValueError: {EVIL}"),
        Claim("not-png", "A figure that is not a PNG", statement="s", criterion="c", passed=True,
              measurement={"n": 3}, figure=b"GIF89a...."),
        Claim("good-one", "Same id twice", statement="s", criterion="c", passed=True, figure=png),
    ]


def test_criterion_text_comes_from_the_labelled_checks(tmp_path):
    """The report states exactly the checks the judge applied (set-up, then each label), with each verdict."""
    checks = [Check("error <= 1e-12", True, "3.1e-16"), Check(f"control >= 0.01 {EVIL}", False, EVIL)]
    claim = Claim("checked", "Judged by checks", statement="s", criterion="float64, n = 8", checks=checks)
    assert claim.passed is False                                   # derived: one check failed
    assert claim.criterion_text == f"float64, n = 8: error <= 1e-12; control >= 0.01 {EVIL}"
    paths = write_report([claim], tmp_path)
    page = paths["html"].read_text()
    checker = _parse(page)
    text = "".join(checker.text)
    assert "float64, n = 8: error <= 1e-12; control >= 0.01" in text          # the table's criterion cell
    assert page.count('<li class="pass">') == 1 and page.count('<li class="fail">') == 1
    assert "(measured: 3.1e-16)" in text and "<script>" not in page
    row = json.loads(paths["json"].read_text())["claims"][0]
    assert row["criterion_text"] == claim.criterion_text
    assert row["checks"] == [{"label": "error <= 1e-12", "passed": True, "measured": "3.1e-16"},
                             {"label": f"control >= 0.01 {EVIL}", "passed": False, "measured": EVIL}]


def test_a_claim_cannot_contradict_its_checks():
    ok = [Check("a", True)]
    assert Claim("x", "t", statement="s", checks=ok).passed is True
    assert Claim("x", "t", statement="s", checks=ok, passed=True).passed is True
    with pytest.raises(ValueError, match="disagrees with its checks"):
        Claim("x", "t", statement="s", checks=ok, passed=False)
    with pytest.raises(ValueError, match="neither checks= .* nor passed="):
        Claim("x", "t", statement="s")
    assert Claim("x", "t", statement="s", criterion="only set-up", passed=False).criterion_text == "only set-up"
    assert Check("truthy", 1).passed is True                       # stored as a bool


def test_html_is_valid_self_contained_and_escaped(tmp_path, png):
    paths = write_report(_claims(png), tmp_path, meta={"torch": "2.13", "quick": True, "evil": EVIL})
    page = paths["html"].read_text(encoding="utf-8")
    checker = _parse(page)
    assert page.startswith("<!DOCTYPE html>")
    tags = [t for t, _ in checker.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    # No reference leaves the file: every src/href is an in-page anchor or a data: URI.
    for tag, attrs in checker.tags:
        for key in ("src", "href"):
            if key in attrs:
                assert not re.match(r"\s*(https?:)?//", attrs[key]), (tag, attrs[key])
                assert attrs[key].startswith(("#", "data:image/png;base64,")), (tag, attrs[key])
    # The only URL on the page is the hostile text's, escaped (after &quot;, or \&quot; inside the JSON).
    assert all(page[: m.start()].endswith("&quot;") for m in re.finditer("https?://", page))
    # Escaped text: the hostile string appears only as text, never as markup.
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert EVIL in "".join(checker.text)
    # Images inline and byte-exact; the non-PNG figure is left out with a note.
    imgs = [a["src"] for t, a in checker.tags if t == "img"]
    assert len(imgs) == 2
    assert all(base64.b64decode(s.split(",", 1)[1]) == png for s in imgs)
    assert "not a PNG" in page
    # The summary table: a row per claim, pass/fail, seconds, the failed count.
    assert page.count('<tr class="pass">') == 3 and page.count('<tr class="fail">') == 1
    assert "1.2" in page and "1 claim failed" in page and "3 of 4 claims pass" in page


def test_anchors_and_files_are_unique_and_stay_in_the_directory(tmp_path, png):
    paths = write_report(_claims(png), tmp_path)
    checker = _parse(paths["html"].read_text())
    ids = [a["id"] for _, a in checker.tags if "id" in a]
    assert len(ids) == len(set(ids)) == 4
    hrefs = {a["href"][1:] for t, a in checker.tags if t == "a"}
    assert hrefs == set(ids)                                     # every table row links to its section
    names = sorted(p.name for p in paths["figures"])
    assert names == ["good-one-2.png", "good-one.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names + ["report.html", "report.json"]


def test_json_has_everything_but_the_png_bytes(tmp_path, png):
    claims = _claims(png)
    paths = write_report(claims, tmp_path, meta={"torch": "2.13", "path": tmp_path})

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    data = json.loads(paths["json"].read_text(), parse_constant=no_constants)
    assert data["summary"] == {"total": 4, "passed": 3, "failed": 1, "all_passed": False}
    assert data["meta"] == {"torch": "2.13", "path": str(tmp_path)}
    first, evil, not_png, dup = data["claims"]
    assert "figure" not in first and first["figure_file"] == "good-one.png"
    assert (tmp_path / first["figure_file"]).read_bytes() == png
    assert dup["figure_file"] == "good-one-2.png" and not_png["figure_file"] is None
    assert first["measurement"] == {"err": 0.0, "curve": [1.0, 2.0], "nan": "nan", "inf": "-inf"}
    assert first["seconds"] == 1.25 and first["notes"].startswith("first") and first["passed"] is True
    assert evil["id"] == "../evil/id" and evil["title"] == EVIL and EVIL in evil["error"]
    assert not_png["summary"] == "n = 3"                         # no summary given: the scalar measurements
    assert len(paths["json"].read_bytes()) < 20_000               # no base64 figure in it


def test_jsonable_converts_tensors_and_numbers():
    import numpy as np
    import torch
    out = jsonable({"t": torch.tensor([1.5, float("inf")]), 3: np.float64(2.0), "s": {1, 2}, "k": (1, None)})
    assert out == {"t": [1.5, "inf"], "3": 2.0, "s": [1, 2], "k": [1, None]}
    json.dumps(out, allow_nan=False)


def test_render_without_claims_or_meta_and_bad_input(tmp_path):
    _parse(render_html([]))
    with pytest.raises(TypeError, match="write_report takes Claim objects"):
        write_report([{"id": "x"}], tmp_path)


def test_rewrite_replaces_the_report(tmp_path, png):
    write_report(_claims(png), tmp_path)
    paths = write_report(_claims(png)[:1], tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["total"] == 1
    assert not list(tmp_path.glob("*.tmp"))                        # atomic writes leave no temporaries
