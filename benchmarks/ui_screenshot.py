"""A PNG of a Prefect flow run page with one of its tabs open, taken by headless Chromium.

``chromium --screenshot URL`` shows the page as it first renders: the flow run page opens on its Logs
tab whatever the URL asks. This drives the same browser over its DevTools protocol instead: open the
page, click the tab by its label, wait for it to render, capture.

    python benchmarks/ui_screenshot.py http://127.0.0.1:4200/runs/flow-run/ID --tab Artifacts --out page.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

_CLICK = """(() => {{
  const wanted = {label};
  const hits = [...document.querySelectorAll('button, a, [role=tab], li, div')]
    .filter(e => e.children.length === 0 && e.textContent.trim() === wanted);
  if (!hits.length) return false;
  hits[0].click();
  return true;
}})()"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _capture(ws_url: str, url: str, tab: str, settle_s: float, width: int, height: int) -> bytes:
    import websockets

    async with websockets.connect(ws_url, max_size=64 * 2**20) as ws:
        counter = 0

        async def call(method: str, **params):
            nonlocal counter
            counter += 1
            await ws.send(json.dumps({"id": counter, "method": method, "params": params}))
            while True:
                reply = json.loads(await ws.recv())
                if reply.get("id") == counter:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})

        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(settle_s)
        if tab:
            deadline = time.monotonic() + 30
            while True:
                done = await call("Runtime.evaluate", expression=_CLICK.format(label=json.dumps(tab)),
                                  returnByValue=True)
                if done.get("result", {}).get("value"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no tab labelled {tab!r} on {url}")
                await asyncio.sleep(1)
            await asyncio.sleep(settle_s)
        shot = await call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


def screenshot(url: str, out: str, tab: str = "Artifacts", width: int = 1400, height: int = 1000,
               settle_s: float = 6.0) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("no Chromium here (Debian: apt-get install chromium)")
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="chromium-")
    process = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu",
                                "--disable-background-networking", "--hide-scrollbars",
                                f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                                f"--window-size={width},{height}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                    pages = [p for p in json.load(r) if p.get("type") == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Chromium's DevTools endpoint did not come up")
            time.sleep(0.3)
        png = asyncio.run(_capture(pages[0]["webSocketDebuggerUrl"], url, tab, settle_s, width, height))
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "wb") as f:
        f.write(png)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--tab", default="Artifacts", help="label of the tab to open ('' for none)")
    p.add_argument("--out", required=True)
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=1000)
    args = p.parse_args()
    print(screenshot(args.url, args.out, args.tab, args.width, args.height))


if __name__ == "__main__":
    main()
