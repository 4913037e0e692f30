"""No secrets or prompts in the coordinator's logs unless asked for (issue 14 item 4).

A real `pdorch serve` (its default log level, stderr) with a secret-looking admin token and
client key serves a distinctive prompt every way it can travel (completions and chat, streamed
and not, a request the engine refuses, a body that is no JSON, `/admin/explain`), admin calls
with the right and a wrong token and a run-time replica whose URL carries credentials; its
whole log must contain none of them. (`test_hostile_requests.py` checks the prompt at DEBUG
in-process.)
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from tests.coordinator.helpers import MODEL, sim
from tests.serve_process import serve_process
from tests.waiting import wait_until

ADMIN_TOKEN = "sk-admin-9f2c41d7e0b34a55b6c1d2e3f4a5b6c7"
API_KEY = "sk-live-5e8a90b1c2d34e56f7a8b9c0d1e2f3a4"
WRONG_TOKEN = "sk-wrong-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
URL_PASSWORD = "pw-3c1f9e7a55d2"
PROMPT = "zq-prompt-marker-8d1e4b the quick brown fox"
SECRETS = (ADMIN_TOKEN, API_KEY, WRONG_TOKEN, URL_PASSWORD, "zq-prompt-marker-8d1e4b")


def test_default_logs_hold_no_token_key_or_prompt(tmp_path: Path) -> None:
    config = {
        "served_model_name": MODEL,
        "block_size": 16,
        "pools": {"prefill": {"launch": [sim()]}, "decode": {"launch": [sim()]}},
        "pd": {"min_uncached_tokens": 32},
        "coordinator": {"port": 0, "admin_token": ADMIN_TOKEN, "api_keys": [API_KEY]},
        "health": {"interval_s": 0.2},
    }
    with serve_process(config, tmp_path) as served:
        url, process, err = served.url, served.process, served.stderr
        client_auth = {"Authorization": f"Bearer {API_KEY}"}
        admin_auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        long_prompt = PROMPT + " " + " ".join(f"w{i}" for i in range(80))  # disaggregated
        with httpx.Client(base_url=url, timeout=60.0) as client:
            for prompt in (PROMPT, long_prompt):
                for stream in (False, True):
                    completion = {"model": MODEL, "prompt": prompt, "max_tokens": 3}
                    chat = {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": 3,
                    }
                    for route, body in (
                        ("/v1/completions", completion),
                        ("/v1/chat/completions", chat),
                    ):
                        answer = client.post(
                            route, json={**body, "stream": stream}, headers=client_auth
                        )
                        assert answer.status_code == 200, answer.text
            refused = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10**6}  # the engine: 400
            assert (
                client.post("/v1/completions", json=refused, headers=client_auth).status_code == 400
            )
            garbage = f'{{"model": "{MODEL}", "prompt": "{PROMPT}"'.encode()  # truncated JSON
            assert (
                client.post("/v1/completions", content=garbage, headers=client_auth).status_code
                == 400
            )
            wrong_key = {"Authorization": f"Bearer {WRONG_TOKEN}"}
            assert (
                client.post("/v1/completions", json=completion, headers=wrong_key).status_code
                == 401
            )
            explain = {"model": MODEL, "prompt": long_prompt}
            assert (
                client.post("/admin/explain", json=explain, headers=admin_auth).status_code == 200
            )
            assert client.get("/admin/pools", headers=wrong_key).status_code == 403
            replica = {"url": f"http://fuzz:{URL_PASSWORD}@127.0.0.1:9", "id": "with-creds"}
            added = client.post("/admin/pools/decode/replicas", json=replica, headers=admin_auth)
            assert added.status_code == 201, added.text

            def probed_and_failed() -> bool:  # health checks of it ran (and were refused)
                view = client.get("/admin/pools", headers=admin_auth).json()
                rows = view["pools"]["decode"]["replicas"]
                return any(r["id"] == "with-creds" and r["last_error"] for r in rows)

            wait_until(probed_and_failed, timeout=30.0, message="probes of the new replica")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, err.read_text()
    logged = err.read_text()
    assert logged.strip(), "pdorch serve logged nothing at all: the test would prove nothing"
    for secret in SECRETS:
        assert secret not in logged, f"{secret!r} in the log:\n{logged}"
