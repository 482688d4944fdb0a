"""The console's tests drive real things: ``python -m gms.console`` as a child process (as ``gms
standalone`` runs it) and Debian's headless Chromium through Selenium and chromedriver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.wait import WebDriverWait

START_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 15.0
PAGE_TIMEOUT_S = 15.0  # a page shows its data within one sampling interval (1 s in tests) plus the reads
SAMPLE_INTERVAL_S = "1"

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The machine has no network: without these Chromium stalls on its own background requests.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000")
REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR_ENV = "GMS_SCREENSHOT_DIR"


class ConsoleProcess:
    """``python -m gms.console`` on 127.0.0.1 with a free port (read from its port file)."""

    def __init__(self, workdir: Path, nameserver: str, *args: str, env: dict[str, str] | None = None) -> None:
        """``env``: variables added for the console (GMS_USER, GMS_TLS_CA...: secrets stay out of argv)."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.port_file = workdir / "console.port"
        self.log_path = workdir / "console.log"
        cmd = [sys.executable, "-P", "-m", "gms.console", "--nameserver", nameserver, "--listen", "127.0.0.1:0",
               "--port-file", str(self.port_file), "--sample-interval", SAMPLE_INTERVAL_S, *args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **env} if env else None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the console did not start: {self.log_tail()}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        return self._call(urllib.request.Request(self.url(path), headers=headers or {}))

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self._call(urllib.request.Request(self.url(path), data=data, method="POST",
                                                 headers=headers or {"Content-Type": "application/json"}))

    @staticmethod
    def _call(request: urllib.request.Request) -> tuple[int, Any]:
        """Status and decoded JSON; every answer of the API, errors included, must be JSON."""
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as err:
            assert err.headers.get_content_type() == "application/json", err.read()
            return err.code, json.loads(err.read())

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self) -> int:
        """SIGTERM and wait; the exit code (0 after a clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return (f"headless Chromium is not installed ({', '.join(missing)} missing): install the Debian packages"
                " chromium and chromium-driver (apt-get install chromium chromium-driver)")
    return None


def screenshot_dir() -> Path:
    """Where the run keeps its screenshots for review: $GMS_SCREENSHOT_DIR, else
    test-artifacts/screenshots under the repository root (gitignored)."""
    path = Path(os.environ.get(SCREENSHOT_DIR_ENV) or REPO_ROOT / "test-artifacts" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Browser:
    """Headless Chromium with the waits and reads the console's pages need."""

    def __init__(self, shots: Path) -> None:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        self._profile = tempfile.TemporaryDirectory(prefix="gms-console-chromium-")
        options.add_argument(f"--user-data-dir={self._profile.name}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        self.shots = shots

    def open(self, url: str, state: str = "ready") -> None:
        """Load ``url`` and wait until the page says ``state`` (ready: its data is shown)."""
        self.driver.get(url)
        self.wait_for(lambda: self.js("return document.getElementById('page').dataset.state") == state,
                      f"page {url} to be {state}")

    def wait_for(self, condition: Any, what: str, timeout_s: float = PAGE_TIMEOUT_S) -> Any:
        try:
            return WebDriverWait(self.driver, timeout_s, poll_frequency=0.1).until(lambda _: condition())
        except TimeoutException as err:
            self.screenshot("failed-wait")
            raise AssertionError(f"waited {timeout_s} s for {what}; the page says: {self.text('main')!r}") from err

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, css: str) -> str:
        return str(self.js("const n = document.querySelector(arguments[0]); return n ? n.textContent : null", css))

    def rows(self, table_id: str) -> list[dict[str, str]]:
        """The rows of table ``table_id``, each as {column label: cell text}."""
        return list(self.js("""
            const table = document.getElementById(arguments[0]);
            if (!table) return [];
            const labels = [...table.tHead.rows[0].cells].map(c => c.textContent);
            return [...table.tBodies[0].rows].filter(r => r.cells.length === labels.length)
                .map(r => Object.fromEntries([...r.cells].map((c, i) => [labels[i], c.textContent])));
        """, table_id))

    def chart_points(self, css: str) -> int:
        """Points a chart drew; fails unless uPlot drew it on a canvas."""
        assert self.js("return document.querySelector(arguments[0] + ' canvas') !== null", css), f"no canvas in {css}"
        return int(self.js("return document.querySelector(arguments[0]).dataset.points", css))

    def script_errors(self) -> list[str]:
        """The page's JavaScript errors since the last call (failed API answers are the page's
        business and are left out)."""
        return [e["message"] for e in self.driver.get_log("browser")
                if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            self._profile.cleanup()
