"""A real headless Chromium driven over the DevTools protocol (CDP), for the status page test.

`async with HeadlessChromium.start(tmp) as browser:` launches Debian's `chromium` on a free
DevTools port (the browser picks it, `--remote-debugging-port=0`; we read it back from
`DevToolsActivePort`, so starts never race), attaches to its first page over a websocket
(aiohttp's client, already a dependency) and records every console error, uncaught exception
and failed load (`browser.errors`). `evaluate(js)` runs an expression in the page,
`screenshot()` returns a PNG. The browser process is killed on exit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from tests.waiting import async_wait_until


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if (found := shutil.which(name)) is not None:
            return found
    return None


class HeadlessChromium:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, workdir: Path, width: int = 1400, height: int = 900
    ) -> AsyncIterator[HeadlessChromium]:
        binary = chromium_binary()
        assert binary is not None
        profile = workdir / "chromium-profile"
        process = await asyncio.create_subprocess_exec(
            binary,
            "--headless=new",
            "--no-sandbox",  # CI and dev boxes run tests as root
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",  # offline: no update or safe-browsing calls
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            active = profile / "DevToolsActivePort"

            async def written() -> bool:
                return active.exists() and len(active.read_text().splitlines()) >= 2

            await async_wait_until(
                written,
                timeout=60.0,
                interval=0.05,
                message="chromium's DevToolsActivePort",
            )
            port = int(active.read_text().splitlines()[0])
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                    targets = await response.json()
                page = next(t for t in targets if t["type"] == "page")
                async with session.ws_connect(
                    page["webSocketDebuggerUrl"], max_msg_size=64 << 20
                ) as ws:
                    browser = cls(ws)
                    try:
                        for domain in ("Runtime", "Log", "Page"):
                            await browser.send(f"{domain}.enable")
                        yield browser
                    finally:
                        browser._reader.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await browser._reader
        finally:
            process.kill()
            await asyncio.wait_for(process.wait(), timeout=30.0)

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type is not aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
                continue
            self._event(data.get("method", ""), data.get("params", {}))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
            self.errors.append("console." + params["type"] + ": " + " ".join(texts))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            exception = details.get("exception", {})
            self.errors.append("exception: " + str(exception.get("description", details["text"])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry['text']} {entry.get('url', '')}".strip())

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        await self._ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, timeout=60.0)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        shot = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])
