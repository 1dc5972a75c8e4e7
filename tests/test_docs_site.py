"""The manual as a site (mkdocs.yml, docs/): it builds strictly without a warning, every link and
anchor between its pages resolves in the built HTML, and in headless Chromium its pages and its
search load nothing from off the machine (no font, script or style from a CDN)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from browser_helpers import CHROMIUM, Browser
from conftest import ROOT

MKDOCS = Path(sys.executable).with_name("mkdocs")
pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed: make installs the docs extra")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built strictly into a temporary folder; the build's output must name no warning."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "WARNING" not in log, log[-3000:]
    return out


class _Links(HTMLParser):
    """The ids a page defines, the links (href, src) it makes, and those a browser fetches by itself
    (a script, a style sheet, an image, a preconnect: not an <a> a reader may follow)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.fetched: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value:
                self.links.append(value)
                if tag != "a":
                    self.fetched.append(value)


def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text())
    return parser


def test_every_page_of_the_nav_is_built_and_every_docs_page_is_in_the_nav(site):
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav: list) -> list[str]:
        out = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(value) if isinstance(value, list) else [value]
        return out

    in_nav = pages(config["nav"])
    assert sorted(in_nav) == sorted(p.name for p in (ROOT / "docs").glob("*.md")), "a page is missing from the nav"
    for name in in_nav:
        assert (site / name.replace(".md", ".html")).is_file(), name
    assert (site / "search" / "search_index.json").is_file()


def test_every_internal_link_and_anchor_resolves(site):
    pages = {page: _parse(page) for page in site.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue  # the anchor's repository, checked by nobody here: no network
            path, fragment = urldefrag(link)
            path = unquote(urlsplit(path).path)
            # 404.html names its assets from the site's root: it is served for any missing path
            target = (site / path.lstrip("/") if path.startswith("/") else (page.parent / path).resolve()) if path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif fragment and target.suffix == ".html" and fragment not in pages.get(target, _parse(target)).ids:
                broken.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert len(pages) >= 17
    assert not broken, "\n".join(broken)


def test_the_site_links_no_cdn(site):
    """What a page fetches by itself is named in it: all of it from the site (links to the anchor's
    repository and to the theme's page are links a reader may follow, not fetches)."""
    fetched = [f"{page.relative_to(site)}: {link}" for page in site.rglob("*.html") for link in _parse(page).fetched
               if urlsplit(link).scheme not in ("", "data") or link.startswith("//")]
    assert not fetched, fetched
    styles = [f"{css.relative_to(site)}: {url}" for css in site.rglob("*.css")
              for url in re.findall(r"url\(['\"]?((?:https?:)?//[^)'\"]+)", css.read_text())]
    assert not styles, styles


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: make test installs Debian's package (sysdeps)")
def test_the_site_in_chromium_searches_and_requests_nothing_off_the_machine(site):
    served: list[str] = []
    handler = functools.partial(_QuietHandler, served, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    # Every host name resolves to nothing, so a page that asked for a CDN would fail here rather
    # than send a DNS query off the machine; its request would still be seen below.
    browser = Browser("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    try:
        browser.open("about:blank")
        browser.call("Network.enable")
        for page in ("index.html", "tutorial.html", "sweep.html"):
            browser.call("Page.navigate", {"url": base + page})
            _until(browser, "document.readyState === 'complete' && document.querySelector('.md-content h1') !== null")
        browser.eval("document.querySelector('.md-search__input').focus()")
        # The search's worker loads its index first (slowly on a busy machine); until then the page
        # says "Initializing search", and a query typed meanwhile could be read before the index.
        _until(browser, "!(document.querySelector('.md-search-result__meta')?.textContent ?? 'Initializing')"
                        ".includes('Initializing')", 120)
        browser.call("Input.insertText", {"text": "netem"})
        # The search reads its box on a key's release, which inserted text does not send.
        browser.eval("document.querySelector('.md-search__input').dispatchEvent(new KeyboardEvent('keyup'))")
        count = _until(browser, "document.querySelectorAll('.md-search-result__item').length", 60)
        title = browser.eval("document.title")
    finally:
        browser.close()
        server.shutdown()
    urls = [e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"]
    assert "/search/search_index.json" in served, served  # fetched by the search's worker
    off = [u for u in urls if not u.startswith((base, "data:", "blob:"))]
    assert not off, f"requests off the machine: {off}"
    assert count >= 3, "the search found fewer than 3 pages on netem"
    assert "ParetoPipe" in title


def _until(browser: Browser, expression: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.eval(expression)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never true in the browser: {expression}")


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves the site, and notes each path it was asked for."""

    def __init__(self, served: list[str], *args: object, **kwargs: object) -> None:
        self.served = served
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.served.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass
