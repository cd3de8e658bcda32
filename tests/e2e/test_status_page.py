"""The status page in a real Chromium (Debian's ``chromium``, driven by Playwright), against `flexinfer up -f
examples/homelab.yaml` as a user runs it: the token link, a swap appearing without a reload, promote from the
page, a crash with its reason. Screenshots are kept under ``test-artifacts/`` (ignored by git)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_flexinfer_up import CARD, ROOT, Up, card_model, models, wait_until
from tests.e2e.test_flexinfer_up import up as up  # the `up` fixture

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def ensure_chromium() -> Path:
    """Find Debian's chromium, installing it when absent and we may (root with apt-get: a fresh machine)."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], env=env, check=False, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "chromium"], env=env, check=True, capture_output=True, timeout=900)
    if not CHROMIUM.exists():
        pytest.fail("the status page tests need Debian's chromium (/usr/bin/chromium): apt-get install -y chromium")
    return CHROMIUM


# Playwright's sync API keeps an event loop running until it stops: stop it before other modules run
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    executable = ensure_chromium()
    with sync_playwright() as playwright:
        # (a fresh profile: Playwright's launch gives the browser a new temporary user-data-dir of its own)
        launched = playwright.chromium.launch(executable_path=str(executable), args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def token(up: Up) -> str:
    return up.token_file.read_text().strip()


def page_url(up: Up) -> str:
    return up.url("scheduler") + "/ui"


def screenshot(page: object, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"status-page-{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path


def member_cell(page: object, model: str, field: str) -> str:
    locator = page.locator(f'tr[data-model="default/{model}"] [data-field="{field}"]')  # type: ignore[attr-defined]
    return str(locator.inner_text())


def phase(page: object, model: str) -> str:
    return str(page.locator(f'tr[data-model="default/{model}"] .badge').inner_text())  # type: ignore[attr-defined]


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append((child, cmdlines.get(child, "")))
            todo.append(child)
    return out


def test_the_page_refuses_without_the_token_and_shows_no_model(up: Up, browser: object) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    try:
        answer = page.goto(page_url(up))
        assert answer.status == 401
        assert "chat-large" not in page.content() and "needs the admin token" in page.inner_text("body")
        assert page.goto(page_url(up) + "?token=wrong").status == 401
        # the data endpoints refuse too (no cookie, no bearer)
        assert httpx.get(page_url(up) + "/api/state").status_code == 401
        assert httpx.get(page_url(up) + "/api/events").status_code == 401
        assert httpx.post(page_url(up) + "/api/models/default/chat-small/promote").status_code == 401
    finally:
        page.close()


def test_the_token_link_becomes_a_cookie_and_the_page_follows_swaps_promote_and_crashes(
    up: Up, browser: object
) -> None:
    wait_until(lambda: models(up)["chat-large"]["status"]["phase"] == "Ready", 30, "chat-large to be Ready")
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    try:
        page.goto(page_url(up) + "?token=" + token(up))
        # redirected to /ui without the token, holding an HttpOnly, SameSite=Strict session cookie
        assert page.url == page_url(up)
        (cookie,) = [c for c in context.cookies() if c["name"] == "flexinfer_ui_session"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert token(up) not in cookie["value"]
        page.wait_for_selector("#connection.live", timeout=10_000)
        page.wait_for_selector('tr[data-model="default/chat-large"] .phase-Ready', timeout=10_000)
        assert "holding the card: default/chat-large" in page.inner_text('[data-group="homelab-gpu"] .summary')
        screenshot(page, "serving")

        # A swap made while the page is open (promoted through the admin API, as another operator would) appears
        # without a reload.
        marker = page.evaluate("document.body.dataset.updated")
        httpx.post(
            up.url("scheduler") + "/api/v1/models/default/chat-small/promote", headers=up.auth(), timeout=10
        ).raise_for_status()
        # the moment the admin API says the swap is done, the open page shows it within two seconds
        wait_until(lambda: models(up)["chat-small"]["status"]["phase"] == "Ready", 30, "chat-small to be Ready")
        started = time.monotonic()
        page.wait_for_selector('tr[data-model="default/chat-small"] .phase-Ready', timeout=2_000)
        page.wait_for_function(
            "() => document.querySelector('#events').innerText.includes('default/chat-large → default/chat-small')",
            timeout=2_000,
        )
        took = time.monotonic() - started
        assert page.evaluate("document.body.dataset.updated") != marker
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # never reloaded
        assert took < 2, f"the swap appeared {took:.1f} s after the API showed it"
        screenshot(page, "swapped")

        # Promote from the page, by keyboard: focus the button and press Enter.
        button = page.get_by_role("button", name="Promote default/chat-large")
        button.focus()
        page.keyboard.press("Enter")
        page.wait_for_selector("#notice:has-text('promoted default/chat-large')", timeout=5_000)
        page.wait_for_selector('tr[data-model="default/chat-large"] .phase-Ready', timeout=20_000)
        assert models(up)["chat-large"]["status"]["sharedGroup"]["state"] == "Active"

        # A crash after Ready: kill -9 the model's server; the page shows the reason and the restart count.
        (victim,) = [
            pid for pid, cmd in descendants(up.process.pid) if "flexinfer-fake-model" in cmd and "chat-large" in cmd
        ]
        os.kill(victim, signal.SIGKILL)
        page.wait_for_function(
            "() => document.querySelector('#events li[data-kind=\"model.crashed\"]') !== null", timeout=15_000
        )
        crash = page.inner_text('#events li[data-kind="model.crashed"]')
        assert "default/chat-large" in crash and "crashed" in crash and ("9" in crash or "kill" in crash.lower())
        page.wait_for_function(
            '() => document.querySelector(\'tr[data-model="default/chat-large"] [data-field="restarts"]\')'
            ".innerText === '1'",
            timeout=10_000,
        )
        page.wait_for_selector('tr[data-model="default/chat-large"] .phase-Ready', timeout=30_000)
        assert models(up)["chat-large"]["status"]["restarts"] == 1
        shot = screenshot(page, "crashed")
        assert shot.stat().st_size > 10_000
    finally:
        context.close()


def test_park_from_the_page_parks_the_model(up: Up, browser: object) -> None:
    wait_until(lambda: models(up)["chat-large"]["status"]["phase"] == "Ready", 30, "chat-large to be Ready")
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    try:
        page.goto(page_url(up) + "?token=" + token(up))
        page.wait_for_selector('tr[data-model="default/chat-large"] .phase-Ready', timeout=10_000)
        page.get_by_role("button", name="Park default/chat-large").click()
        page.wait_for_selector("#notice:has-text('parking default/chat-large')", timeout=5_000)
        page.wait_for_function(
            "() => document.querySelector('tr[data-model=\"default/chat-large\"] .badge').innerText !== 'Ready'",
            timeout=15_000,
        )
        wait_until(lambda: models(up)["chat-large"]["status"]["phase"] == "Idle", 15, "chat-large parked idle")
    finally:
        context.close()


def test_a_group_with_a_capacity_shows_each_card_and_the_models_on_it(up: Up, browser: object, tmp_path: Path) -> None:
    """Two models that fit on a 24 GiB card serve side by side: the page shows the card, what they hold together
    (11 GiB), what is free (13 GiB) and which models hold it, updated live when a model is parked from the page."""
    manifest = tmp_path / "card.yaml"
    manifest.write_text(CARD + card_model("chat", "6Gi") + card_model("code", "5Gi"))
    up.cli("apply", "-f", str(manifest))
    for name in ("chat", "code"):
        response = up.chat(name, "hi")
        assert response.status_code == 200, response.text
    context = browser.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    try:
        page.goto(page_url(up) + "?token=" + token(up))
        card = '[data-group="card"] [data-device="0"] [data-field="device"]'
        page.wait_for_selector(f"{card}:has-text('11.0 GiB used')", timeout=10_000)
        line = page.inner_text(card)
        assert "13.0 GiB free of 24.0 GiB" in line and "default/chat" in line and "default/code" in line, line
        meter = page.locator('[data-group="card"] [data-device="0"] meter')
        assert meter.get_attribute("value") == str(11 << 30) and meter.get_attribute("max") == str(24 << 30)
        screenshot(page, "card")
        page.get_by_role("button", name="Park default/chat", exact=True).click()
        page.wait_for_selector(f"{card}:has-text('5.0 GiB used')", timeout=20_000)
        assert "default/chat" not in page.inner_text(card)
    finally:
        context.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
