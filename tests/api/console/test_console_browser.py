"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium. Skipped, saying why, where no browser or driver is
installed: the test set-up installs Debian's packages with apt-get when it runs as root (a CI
container), else say ``apt-get install chromium chromium-driver``; selenium is a dev extra. Marked
``browser``: ``pytest -m "not browser"`` leaves them out. Screenshots of the main pages are
written under the test's tmp dir (``<tmp>/screenshots``), never into the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
PACKAGES = ["chromium", "chromium-driver"]  # Debian's


def _found() -> tuple[str | None, str | None]:
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    """Chromium and its driver: installed here with apt-get when missing and the tests run as
    root (a CI container); skipped, saying what to install, where neither works."""
    chromium, driver = _found()
    if (chromium is None or driver is None) and os.geteuid() == 0 and shutil.which("apt-get"):
        env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        try:
            if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
                subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=300)
                subprocess.run(install, env=env, capture_output=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired):
            pass  # skipped below, saying so
        chromium, driver = _found()
    if chromium is None or driver is None:
        pytest.skip(f"no headless Chromium here and it could not be installed (apt-get install {' '.join(PACKAGES)})")
    return chromium, driver

from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = tmp_path / "screenshots"
    d.mkdir()
    return d


@pytest.fixture
def chrome(browser_paths: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    chromium, driver_path = browser_paths
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def find(driver, by: str, value: str):  # noqa: ANN001, ANN201
    """The element once the page that has it is loaded (a click's navigation is not awaited)."""
    return WebDriverWait(driver, 15).until(ec.presence_of_element_located((by, value)))


def click(driver, element) -> None:  # noqa: ANN001
    """Click and wait for the next page."""
    old = driver.find_element(By.TAG_NAME, "html")
    element.click()
    try:
        WebDriverWait(driver, 15).until(ec.staleness_of(old))
    except WebDriverException as exc:  # ChromeDriver may report the replaced node as "not in the document": stale
        if "does not belong to the document" not in str(exc):
            raise


def sign_in(driver, url: str, key: str) -> None:  # noqa: ANN001
    driver.delete_all_cookies()
    driver.get(url + "/console/login")
    find(driver, By.NAME, "key").send_keys(key)
    click(driver, driver.find_element(By.CSS_SELECTOR, "form.login button[type=submit]"))  # its staleness wait


def test_auditor_sees_the_quarantined_result_and_admin_forgets(world, chrome, shots) -> None:
    live = world["live"]
    sign_in(chrome, live.url, live.key("acme", "auditor"))
    assert chrome.current_url.endswith("/console/sessions")
    assert find(chrome, By.ID, "tenant").text == "acme"
    chrome.save_screenshot(str(shots / "sessions.png"))
    click(chrome, find(chrome, By.LINK_TEXT, world["sid"]))
    row = find(chrome, By.ID, "seg-" + world["poison_segment"])
    assert "state-quarantined" in row.get_attribute("class")
    assert row.find_element(By.CSS_SELECTOR, "span.state").text == "quarantined"
    assert chrome.find_elements(By.CSS_SELECTOR, "svg.graph")
    chrome.save_screenshot(str(shots / "session.png"))
    chrome.get(live.url + "/console/audit")
    assert "Latest checkpoint" in chrome.page_source
    chrome.save_screenshot(str(shots / "audit.png"))
    chrome.get(live.url + "/console/metrics")
    assert "admission QUARANTINE" in find(chrome, By.ID, "metrics").text
    chrome.save_screenshot(str(shots / "metrics.png"))

    sign_in(chrome, live.url, live.key("acme", "admin"))
    chrome.get(live.url + "/console/refs/" + world["ref"])
    assert find(chrome, By.ID, "ref-state").text == "live"
    click(chrome, find(chrome, By.ID, "forget"))
    chrome.save_screenshot(str(shots / "forget-confirm.png"))
    click(chrome, find(chrome, By.ID, "confirm"))
    verdict = find(chrome, By.ID, "verdict").text
    assert verdict.startswith("VERIFIED"), verdict
    chrome.save_screenshot(str(shots / "receipt.png"))
    chrome.get(live.url + "/console/refs/" + world["ref"])
    assert find(chrome, By.ID, "ref-state").text == "forgotten"
    print(f"screenshots: {shots}")


def test_agent_key_cannot_sign_in_and_other_tenants_session_is_not_found(world, chrome, shots) -> None:
    live = world["live"]
    sign_in(chrome, live.url, live.key("acme", "agent"))
    assert find(chrome, By.ID, "status").text == "Forbidden"
    assert "agent may not sign in" in find(chrome, By.ID, "detail").text
    chrome.save_screenshot(str(shots / "agent-refused.png"))
    chrome.get(live.url + "/console/sessions")
    assert find(chrome, By.ID, "status").text == "Sign in"  # no session: the sign-in form, no data
    sign_in(chrome, live.url, live.key("evil", "auditor"))
    chrome.get(live.url + "/console/sessions/" + world["sid"])
    assert find(chrome, By.ID, "status").text == "not found"
    assert world["sid"] not in find(chrome, By.TAG_NAME, "main").text.replace(
        find(chrome, By.ID, "detail").text, "")
    chrome.save_screenshot(str(shots / "other-tenant.png"))


def test_the_browser_itself_checks_an_entrys_inclusion_and_the_pinned_key(world, chrome, shots) -> None:
    """inclusion.js in Chromium: with no key pinned it checks the proof and says the signature is
    not checked; with the log's key pinned, the signature too (WebCrypto Ed25519); with another
    log's key pinned, it says no signature by that key; a tampered proof is NOT VERIFIED."""
    from fak.audit import note

    live = world["live"]
    index = next(e.index for e in live.kernel.audit.entries("acme", 0, None) if e.event.type == "admission_verdict")
    sign_in(chrome, live.url, live.key("acme", "auditor"))
    chrome.get(live.url + "/console/audit")
    click(chrome, find(chrome, By.LINK_TEXT, str(index)))

    def verdict() -> str:
        WebDriverWait(chrome, 15).until(lambda d: "checking" not in d.find_element(By.ID, "browser-check").text)
        return chrome.find_element(By.ID, "browser-check").text

    def pin(vkey: str) -> str:
        field = find(chrome, By.ID, "pin")
        field.clear()
        field.send_keys(vkey)
        chrome.execute_script("document.getElementById('browser-check').textContent = 'checking again'")
        chrome.find_element(By.CSS_SELECTOR, "#pin-form button").click()
        WebDriverWait(chrome, 15).until(lambda d: "checking" not in d.find_element(By.ID, "browser-check").text)
        return chrome.find_element(By.ID, "browser-check").text

    first = verdict()
    assert first.startswith(f"inclusion verified in your browser: entry {index}") and "no key pinned" in first, first
    ours = pin(live.kernel.audit.public_key())
    assert "signed by the pinned key" in ours and find(chrome, By.ID, "browser-check").get_attribute("class") == "ok"
    chrome.save_screenshot(str(shots / "audit-entry.png"))
    other = note.Signer.generate(live.kernel.audit.origin).verifier().vkey()
    assert "no signature by" in pin(other) and chrome.find_element(By.ID, "browser-check").get_attribute(
        "class") == "error"
    chrome.refresh()  # the pin is kept in this browser: the other key is still pinned
    assert "no signature by" in verdict()
    pin(live.kernel.audit.public_key())
    chrome.execute_script(  # a proof hash changed in the page's data: the walk no longer reaches the root
        "const d = document.getElementById('inclusion-data'); const j = JSON.parse(d.textContent);"
        "j.proof.hashes[0] = j.proof.hashes[0].replace(/^./, c => c === '0' ? '1' : '0');"
        "d.textContent = JSON.stringify(j); document.getElementById('browser-check').textContent = 'checking';"
        "document.getElementById('pin-form').requestSubmit();")
    assert verdict().startswith("NOT VERIFIED: the proof does not lead to the checkpoint's root")


def test_chromium_keeps_the_host_cookie_on_loopback_and_a_signed_out_one_is_refused(world, chrome) -> None:
    """Chromium keeps the ``__Host-`` Secure cookie over http on 127.0.0.1 (a secure context);
    signing out with the page's button, then putting the captured cookie back, gets the sign-in
    form: the server refuses the cookie, not only the browser forgetting it."""
    from fak.api.console import auth

    live = world["live"]
    sign_in(chrome, live.url, live.key("acme", "auditor"))
    kept = {c["name"]: c for c in chrome.get_cookies()}
    cookie = kept[auth.COOKIE]
    assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    click(chrome, find(chrome, By.CSS_SELECTOR, "form[action='/console/logout'] button"))
    assert find(chrome, By.NAME, "key")  # the sign-in form
    assert auth.COOKIE not in {c["name"] for c in chrome.get_cookies()}
    chrome.add_cookie({"name": auth.COOKIE, "value": cookie["value"], "path": "/", "secure": True,
                       "httpOnly": True, "sameSite": "Strict"})
    assert auth.COOKIE in {c["name"] for c in chrome.get_cookies()}  # presented again with the next request
    chrome.get(live.url + "/console/sessions")
    assert find(chrome, By.ID, "status").text == "Sign in" and world["sid"] not in chrome.page_source
