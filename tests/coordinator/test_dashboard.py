"""The status page (`pdorch/app/dashboard.py`) in a real headless Chromium (DevTools protocol).

Skips (with the reason) only when no chromium is installed; CI installs Debian's (.ci/run).
`PDORCH_DASHBOARD_SCREENSHOT=docs/dashboard.png` writes the page's screenshot there (the one
committed in docs/ was made so).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autoscale.policy import parse_policy
from pdorch.app.server import run_coordinator
from pools.http_client import http_client
from tests.coordinator.headless_chromium import HeadlessChromium, chromium_binary
from tests.coordinator.helpers import MODEL, fleet, long_prompt, sim
from tests.waiting import async_wait_until

ADMIN = "dash-t0k"
SHOWN_IDS = "[...document.querySelectorAll('[data-replica]')].map((e) => e.dataset.replica)"


def _needs_chromium() -> None:
    if chromium_binary() is None:
        pytest.skip("no chromium on PATH (apt-get install chromium; CI installs it)")


async def test_the_page_shows_the_fleet_with_no_console_errors(tmp_path: Path) -> None:
    _needs_chromium()
    config = fleet(decode=[sim(2)], coordinator={"admin_token": ADMIN})
    admin = {"Authorization": f"Bearer {ADMIN}"}
    targets = {
        "ttft_ms": {"percentile": 90, "target": 500},
        "itl_ms": {"percentile": 90, "target": 20},
    }
    policy = parse_policy({"slo": targets})
    async with (
        run_coordinator(config, slo_policy=policy) as pd,
        http_client(base_url=pd.url, timeout=60.0) as client,
        HeadlessChromium.start(tmp_path) as browser,
    ):
        for i in range(3):  # long prompts: disaggregated; the short one decodes locally
            prompt = long_prompt() + f" {i}" if i < 2 else "hi"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": True}
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
        scaled = await client.post(
            "/admin/pools/decode/scale",
            json={"replicas": 3, "source": "autoscaler", "reason": "itl_over_slo"},
            headers=admin,
        )
        assert scaled.status_code == 200, scaled.text

        async def fleet_ids() -> list[str]:
            view = (await client.get("/admin/pools", headers=admin)).json()
            return sorted(r["id"] for p in view["pools"].values() for r in p["replicas"])

        await browser.navigate(f"{pd.url}/dashboard#token={ADMIN}")

        async def shows_the_fleet() -> Any:
            shown = await browser.evaluate(SHOWN_IDS)
            expected = await fleet_ids()
            return shown if shown and sorted(shown) == expected and len(expected) == 4 else None

        shown = await async_wait_until(shows_the_fleet, timeout=60.0, message="the replicas")
        assert len(shown) == 4  # 1 prefill + 3 decode (one launched by the decision)
        # offline: the page fetched nothing but itself and its JSON (same origin, no CDN)
        loaded = await browser.evaluate(
            "[...performance.getEntriesByType('resource')].map((e) => e.name)"
        )
        origin = await browser.evaluate("location.origin")
        assert loaded and all(u.startswith(origin + "/admin/dashboard.json") for u in loaded)
        # the token left the address bar; the routing and autoscaler decisions are listed
        assert await browser.evaluate("location.hash") == ""
        routes = await browser.evaluate("document.getElementById('routes').innerText")
        assert routes.count("\tpd\t") == 2 and "\tlocal\t" in routes, routes
        decisions = await browser.evaluate("document.getElementById('decisions').innerText")
        assert "itl_over_slo" in decisions and "decode" in decisions, decisions
        model = await browser.evaluate("document.getElementById('model').textContent")
        assert model == MODEL
        # each pool's observed p90 against its SLO: TTFT for prefill, ITL for decode
        metrics = await browser.evaluate(
            "[...document.querySelectorAll('[data-metric]')].map((e) => e.textContent)"
        )
        assert any(m.startswith("TTFT p90") and "SLO 500.0 ms" in m for m in metrics), metrics
        assert any(m.startswith("ITL p90") and "SLO 20.0 ms" in m for m in metrics), metrics

        async def all_healthy() -> bool:
            states = await browser.evaluate(
                "[...document.querySelectorAll('[data-replica] td:nth-child(2)')]"
                ".map((e) => e.textContent)"
            )
            return bool(states) and all(s == "healthy" for s in states)

        await async_wait_until(all_healthy, timeout=60.0, message="every replica healthy")
        png = await browser.screenshot()
        assert png.startswith(b"\x89PNG")
        target = os.environ.get("PDORCH_DASHBOARD_SCREENSHOT")
        (Path(target) if target else tmp_path / "dashboard.png").write_bytes(png)
        assert browser.errors == []

        # without the token the page says what it needs (the 401 itself is logged by the
        # browser as a failed load: that is the only error)
        await browser.navigate(f"{pd.url}/dashboard")

        async def asks_for_token() -> bool:
            text = await browser.evaluate("document.getElementById('status')?.textContent ?? ''")
            return "admin token" in text

        await async_wait_until(asks_for_token, timeout=30.0, message="the token prompt")
        assert all("401" in e for e in browser.errors), browser.errors
