"""The chat page in a real browser: headless Chromium (Debian's chromium and
chromium-driver, through selenium), two pages in one room.

``make e2e-deps`` (run by ``make test``) installs chromium and
chromium-driver when they are missing and it runs as root.
"""

import contextlib
import os
import shutil
import signal
import tempfile
import uuid

import pytest
from e2e_support import diagnostics

from helpers import wait_until

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1000,800",
]


def _find(*candidates):
    for name in candidates:
        path = shutil.which(name) or (
            name if os.path.isabs(name) and os.access(name, os.X_OK) else None
        )
        if path:
            return path
    return None


def _pids_using(marker):
    """Pids whose command line contains ``marker`` (our unique profile directory)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                if marker.encode() in handle.read():
                    pids.append(int(entry))
    return pids


@pytest.fixture
def browser():
    chromium = _find("chromium", "/usr/bin/chromium", "chromium-browser")
    driver_path = _find("chromedriver", "/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
    assert chromium and driver_path, (
        "headless Chromium is needed: install chromium and chromium-driver (as root: make e2e-deps)"
    )
    os.environ.setdefault("SE_AVOID_STATS", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="e2e-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + ["--user-data-dir=" + profile]:
        options.add_argument(flag)
    service = Service(executable_path=driver_path)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        # Whatever survived quit() (it should not): by pid, found by our profile dir.
        wait_until(lambda: not _pids_using(profile), 5, interval=0.1, raise_on_timeout=False)
        for pid in _pids_using(profile):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(profile, ignore_errors=True)


def _wait(driver, script, timeout, what):
    return wait_until(
        lambda: driver.execute_script(script), timeout, interval=0.1, message="browser: " + what
    )


def _send(driver, text):
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "text")
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


# The chat messages a page received, as "name:text".
_MESSAGES = "window.chatMessages.filter(m => m.type === 'message').map(m => m.name + ':' + m.text)"


def test_two_pages_in_one_room_see_each_others_messages(chat_stack, browser):
    room = "b%s" % uuid.uuid4().hex[:8]
    url = chat_stack.base_url + "/room/%s/?name=%s"

    browser.get(url % (room, "alice"))
    alice = browser.current_window_handle
    _wait(
        browser,
        "return document.getElementById('status').textContent === 'connected as alice'",
        20,
        "alice connected",
    )
    browser.switch_to.new_window("tab")
    browser.get(url % (room, "bob"))
    bob = browser.current_window_handle
    _wait(
        browser,
        "return document.getElementById('status').textContent === 'connected as bob'",
        20,
        "bob connected",
    )

    _send(browser, "hello from bob")
    browser.switch_to.window(alice)
    _wait(
        browser,
        "return window.chatMessages.some(m => m.type === 'join' && m.name === 'bob')",
        20,
        "alice seeing bob join",
    )
    _send(browser, "hello from alice")

    expected = ["alice:hello from alice", "bob:hello from bob"]
    try:
        for handle, who in ((alice, "alice"), (bob, "bob")):
            browser.switch_to.window(handle)
            _wait(
                browser, "return (%s).length >= 2" % _MESSAGES, 20, "%s seeing both messages" % who
            )
            assert sorted(browser.execute_script("return " + _MESSAGES)) == expected
            # ... and on the page, not only in the script's log.
            log_text = browser.execute_script("return document.getElementById('log').innerText")
            assert "hello from alice" in log_text and "hello from bob" in log_text
    except AssertionError as exc:
        raise AssertionError("%s\n%s" % (exc, diagnostics(chat_stack)))
