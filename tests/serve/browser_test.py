#!/usr/bin/env python3
"""The live view in a real browser: headless Chromium driven over WebDriver
(chromium-driver), standard library only.

    browser_test.py TESSERA MODEL.gguf LOG_DIR

Starts `tessera serve MODEL --tp 2`, opens GET / and checks that the page paints,
shows both ranks and live numbers that move while a load runs, and that its
prompt box streams a completion in pieces whose text equals the same greedy
request made with curl's equivalent here. Prints the time to first paint, to the
first live numbers, and the interval between updates; screenshots go to LOG_DIR.
Exits 77 (CTest's skip) with the reason when chromium, chromedriver or the model
is missing.
"""
import base64
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as res:
        return json.loads(res.read() or b"null")


def wait_for(what, check, timeout_s):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (OSError, urllib.error.URLError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class WebDriver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": shutil.which("chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1500"]}}}}
        self.session = http("POST", self.base + "/session", caps, timeout=60)["value"]["sessionId"]

    def cmd(self, method, path, body=None):
        return http(method, f"{self.base}/session/{self.session}{path}", body, timeout=60)["value"]

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.cmd("GET", "/screenshot")))
        print(f"screenshot: {path}")

    def quit(self):
        try:
            http("DELETE", f"{self.base}/session/{self.session}")
        except (OSError, urllib.error.URLError):
            pass


def main():
    tessera, model, log_dir = sys.argv[1:4]
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            print(f"SKIP: no {tool} on PATH (Debian: apt-get install chromium chromium-driver)")
            return SKIP
    if not os.path.exists(model):
        print(f"SKIP: no model at {model}")
        return SKIP
    os.makedirs(log_dir, exist_ok=True)
    procs = []
    server_log = open(os.path.join(log_dir, "serve.log"), "w")
    driver_log = open(os.path.join(log_dir, "chromedriver.log"), "w")
    port, driver_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    procs.append(subprocess.Popen([tessera, "serve", model, "--port", str(port), "--tp", "2",
                                   "-t", "1"], stdout=server_log, stderr=subprocess.STDOUT))
    procs.append(subprocess.Popen(["chromedriver", f"--port={driver_port}"],
                                  stdout=driver_log, stderr=subprocess.STDOUT))
    browser = None
    stop_load = threading.Event()
    try:
        wait_for("the server's /health", lambda: http("GET", base + "/health")["status"] == "ok", 60)
        wait_for("chromedriver", lambda: http("GET", f"http://127.0.0.1:{driver_port}/status")
                 ["value"]["ready"], 30)
        browser = WebDriver(driver_port)

        # Load: the time from navigation to first paint and to the first numbers drawn.
        browser.cmd("POST", "/url", {"url": base + "/"})
        first = wait_for("the first update", lambda: browser.js(
            "return window.tesseraUi && tesseraUi.updates.length > 0 ? tesseraUi.updates[0] : null"),
            10)
        # Paint entries are recorded after the frame is presented: wait for them.
        paint = wait_for("the paint timing entries", lambda: browser.js(
            "const p = Object.fromEntries(performance.getEntriesByType('paint')"
            ".map(e => [e.name, e.startTime]));"
            "return 'first-contentful-paint' in p ? p : null"), 10)
        print(f"time to first paint: {paint.get('first-paint', paint['first-contentful-paint']):.0f} ms, "
              f"first contentful paint {paint['first-contentful-paint']:.0f} ms, "
              f"first live numbers {first:.0f} ms (from navigation start)")
        ranks = wait_for("two rank rows", lambda: browser.js(
            "return document.querySelectorAll('#ranks tbody tr').length") == 2, 5)
        assert ranks
        assert browser.js("return document.getElementById('plan').textContent").startswith("tp2 pp1")

        # Live numbers while a load runs: 3 clients sending requests back to back.
        def client(i):
            while not stop_load.is_set():
                http("POST", base + "/v1/completions",
                     {"prompt": f"Once upon a time {i}", "max_tokens": 48, "temperature": 0.8})
        load = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(3)]
        for t in load:
            t.start()
        read = ("return {steps: Number(document.getElementById('steps').textContent),"
                " rate: Number(document.getElementById('tok-rate').textContent),"
                " running: document.getElementById('running').textContent,"
                " bars: document.querySelectorAll('#ranks .stack').length,"
                " ledger: document.querySelectorAll('#ledger tbody tr').length,"
                " dots: document.querySelectorAll('#latency circle').length}")
        time.sleep(3)
        a = browser.js(read)
        time.sleep(2.5)
        b = browser.js(read)
        print(f"under load: {a} then {b}")
        assert b["steps"] > a["steps"] > 0, (a, b)
        assert b["rate"] > 0, b
        assert b["bars"] == 2, b  # both ranks' compute / comm / wait bars drawn
        assert b["ledger"] >= 3, b  # ctl send/recv, tp all_reduce, tp gather
        assert b["dots"] >= 1, b
        browser.screenshot(os.path.join(log_dir, "live-view-under-load.png"))
        stop_load.set()
        for t in load:
            t.join(timeout=30)

        updates = browser.js("return tesseraUi.updates")
        gaps = [y - x for x, y in zip(updates, updates[1:])][-20:]
        print(f"update interval: median {statistics.median(gaps):.0f} ms, "
              f"min {min(gaps):.0f}, max {max(gaps):.0f} over {len(gaps)} updates")
        assert 900 <= statistics.median(gaps) <= 2000, gaps

        # The prompt box streams a greedy completion: several pieces, the same text
        # as the API gives the same request.
        prompt, max_tokens = "The little dog", 120
        want = http("POST", base + "/v1/completions",
                    {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        want_text = want["choices"][0]["text"]
        browser.js("document.getElementById('prompt').value = arguments[0];"
                   "document.getElementById('max-tokens').value = arguments[1];"
                   "document.getElementById('temperature').value = '0';"
                   "document.getElementById('send').click();", prompt, max_tokens)
        wait_for("the stream's end", lambda: browser.js("return tesseraUi.streamDone"), 30)
        got = browser.js("return {text: document.getElementById('output').textContent,"
                         " chunks: tesseraUi.chunks,"
                         " stats: document.getElementById('output-stats').textContent}")
        print(f"prompt box: {got['chunks']} streamed pieces, {got['stats']}")
        assert got["text"] == want_text, (got["text"], want_text)
        assert got["chunks"] >= 2, got
        browser.screenshot(os.path.join(log_dir, "live-view-prompt.png"))
        print("PASS")
        return 0
    finally:
        stop_load.set()
        if browser is not None:
            browser.quit()
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
