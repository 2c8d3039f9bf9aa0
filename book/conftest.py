"""What the browser tests share (test_site.py on the built site, test_lab.py against JupyterLab): one
headless Chromium, Debian's, since Playwright's own browser download cannot work here."""

import os
from pathlib import Path

import pytest
from playwright import sync_api

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium phones home at start; the sandbox needs user
# namespaces that CI (as root) does not give it.
FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run",
         "--disable-sync", "--disable-quic", "--disable-gpu"]


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (or set CHROMIUM=...)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser
        browser.close()
