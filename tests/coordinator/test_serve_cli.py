"""`pdorch serve`: the embedded demo answers an OpenAI client; Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from pools.sim.words import vocabulary_words
from tests.ports import free_port
from tests.waiting import wait_until

PDORCH = [sys.executable, "-c", "from pdorch.cli import main; main()"]


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*PDORCH, "serve", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield process, f"http://127.0.0.1:{port}", log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_demo_serves_openai_clients_and_stops_on_ctrl_c(
    serve_process: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    process, url, log = serve_process
    wait_until(lambda: _healthy(url) or process.poll() is not None, timeout=60.0, message="demo up")
    assert process.poll() is None, log.read_text()
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["llama-3.1-8b"]
    completion = client.completions.create(model="llama-3.1-8b", prompt="Hello", max_tokens=4)
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    chunks = client.chat.completions.create(
        model="llama-3.1-8b",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        stream=True,
    )
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) == 4
    printed = log.read_text()
    for replica in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        assert replica in printed
    assert url in printed
    # the three commands to try, ready to paste
    assert f"curl -s {url}/v1/completions" in printed
    assert f'OpenAI(base_url="{url}/v1"' in printed
    assert f"pdorch scale status --url {url}" in printed
    _answers_in_words_and_the_index_sees_the_engines_blocks(client, url)

    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0, log.read_text()
    assert not _healthy(url)


def _answers_in_words_and_the_index_sees_the_engines_blocks(client: OpenAI, url: str) -> None:
    """The demo's words mode: English in, sentences out, the same ones every time; and the
    coordinator's tokens (`tokenizer: engine`) hash to the block keys the engines publish."""
    vocabulary = set(vocabulary_words())
    first = client.completions.create(
        model="llama-3.1-8b", prompt="Tell me a story about the sea.", max_tokens=24
    ).choices[0]
    words = re.findall(r"[A-Za-z]+", first.text)
    assert len(words) >= 15 and all(w.lower() in vocabulary for w in words), first.text
    assert "." in first.text and first.text.split(".")[1].strip()[0].isupper()  # sentences
    again = client.completions.create(
        model="llama-3.1-8b", prompt="Tell me a story about the sea.", max_tokens=24
    ).choices[0]
    assert again.text == first.text  # deterministic, as greedy decoding

    # long enough to go P/D (over the demo's 512 uncached tokens); its blocks land in the
    # prefill engine's cache and, through its KV events, in the coordinator's precise index
    prompt = "the quiet river carried every old lantern across the valley. " * 70
    body = {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 2}
    assert client.completions.create(model="llama-3.1-8b", prompt=prompt, max_tokens=2).usage

    def explained() -> dict[str, Any]:
        r = httpx.post(f"{url}/admin/explain", json=body, timeout=10.0)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def hit_rate() -> float:
        e = explained()
        full: int = e["prompt_tokens"] // 16
        # once cached, the decode replica that pulled the blocks may serve it alone: any pick
        picks = [e["decision"][role] for role in ("prefill", "decode") if e["decision"][role]]
        return float(max(r["overlap_blocks"] for p in picks for r in p["replicas"])) / full

    assert explained()["tokenized"] is True
    wait_until(lambda: hit_rate() == 1.0, timeout=20.0, message="the index holds every block")


def test_bad_config_exits_with_the_field_named(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("served_model_name: m\npools:\n  decode:\n    endpoints: [{url: nope}]\n")
    result = subprocess.run(
        [*PDORCH, "serve", "--config", str(bad)], capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert b"pools.decode.endpoints[0].url" in result.stderr + result.stdout


def test_bad_sync_override_exits_with_the_field_named(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "served_model_name: m\npools:\n  decode:\n    endpoints: [{url: http://h:1}]\n"
    )
    sync = ["--sync-peer", "tcp://h:7300", "--sync-bind", "localhost:7300"]
    result = subprocess.run(
        [*PDORCH, "serve", "--config", str(fleet), *sync],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    output = result.stderr + result.stdout
    assert b"sync.bind" in output and b"not a ZMQ endpoint" in output


def test_json_prints_one_object_on_stdout_once_serving(tmp_path: Path) -> None:
    """`pdorch serve --json`: stdout is exactly one JSON line (for scripts: `| jq .url`), the
    table and messages go to stderr; `--port 0` reports the port it got."""
    err = tmp_path / "serve.err"
    with err.open("wb") as log:
        process = subprocess.Popen(
            [*PDORCH, "serve", "--port", "0", "--json"],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        assert process.stdout is not None
        stdout = process.stdout
        wait_until(
            lambda: bool(select.select([stdout], [], [], 0)[0]) or process.poll() is not None,
            timeout=60.0,
            message="the JSON line",
        )
        line = stdout.readline()
        assert line, err.read_text()
        started = json.loads(line)
        assert started["served_model_name"] == "llama-3.1-8b"
        assert sorted(r["replica"] for r in started["replicas"]) == [
            "decode-0",
            "decode-1",
            "prefill-0",
            "prefill-1",
        ]
        assert _healthy(started["url"])
        assert "prefill-0" in err.read_text()  # the table, on stderr
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, err.read_text()
        assert process.stdout.read() == b""  # nothing else ever reached stdout
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _pdorch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PDORCH, *args], capture_output=True, text=True, timeout=60)


def _decode_status(url: str) -> dict[str, int]:
    result = _pdorch("scale", "status", "--url", url, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["pools"]["decode"])


def test_the_demo_can_be_scaled_with_pdorch_scale(
    serve_process: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    process, url, log = serve_process
    wait_until(lambda: _healthy(url) or process.poll() is not None, timeout=60.0, message="demo up")
    assert process.poll() is None, log.read_text()
    assert _decode_status(url)["ready"] == 2
    result = _pdorch("scale", "set", "decode", "+1", "--url", url)
    assert result.returncode == 0, result.stderr
    wait_until(lambda: _decode_status(url)["ready"] == 3, timeout=30.0, message="decode 3 ready")
    result = _pdorch("scale", "set", "decode", "2", "--url", url)
    assert result.returncode == 0, result.stderr
    wait_until(
        lambda: (s := _decode_status(url))["ready"] == 2 and s["draining"] == 0,
        timeout=30.0,
        message="decode back to 2",
    )
    completion = httpx.post(
        f"{url}/v1/completions",
        json={"model": "llama-3.1-8b", "prompt": "Hello", "max_tokens": 4},
        timeout=30.0,
    )
    assert completion.status_code == 200, completion.text
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0, log.read_text()


def test_serve_with_slo_policy_runs_the_autoscaler_in_process(tmp_path: Path) -> None:
    policy = tmp_path / "slo.yaml"
    policy.write_text(
        "pools:\n  prefill: {min: 1, max: 2}\n  decode: {min: 1, max: 3}\n"
        "intervals: {reactive_s: 0.5}\n"
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*PDORCH, "serve", "--port", str(port), "--slo-policy", str(policy)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url) or process.poll() is not None, timeout=60.0)
        assert process.poll() is None, log.read_text()

        def decided() -> bool:
            view = httpx.get(f"{url}/admin/autoscale", timeout=5.0).json()
            return view["autoscaler"] == "in-process" and len(view["decisions"]) >= 2

        wait_until(decided, timeout=30.0, message="in-process decisions")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_serve_runs_one_autoscaler_per_model_of_a_models_fleet(tmp_path: Path) -> None:
    """A `models:` fleet file whose models set their own `slo_policy`: `pdorch serve` (no
    `--slo-policy`) runs an in-process loop for each, and each model's decisions are recorded
    by its own coordinator (`/admin/autoscale?model=`, `pdorch scale status --model`)."""
    for name, decode_max in (("a", 2), ("b", 3)):
        (tmp_path / f"slo-{name}.yaml").write_text(
            f"pools:\n  prefill: {{min: 1, max: 1}}\n  decode: {{min: 1, max: {decode_max}}}\n"
            "intervals: {reactive_s: 0.5}\n"
        )
    engine = (
        "{kind: sim, count: 1, model_profile: llama-3.1-8b, gpu: h100, time_scale: 0.01, "
        "kv_transport: tcp}"
    )
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "models:\n"
        + "".join(
            f"  - served_model_name: model-{name}\n"
            f"    pools: {{prefill: {{launch: [{engine}]}}, decode: {{launch: [{engine}]}}}}\n"
            f"    slo_policy: slo-{name}.yaml\n"
            for name in ("a", "b")
        )
    )
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*PDORCH, "serve", "--port", str(port), "--config", str(fleet_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url) or process.poll() is not None, timeout=60.0)
        assert process.poll() is None, log.read_text()

        def decided(model: str) -> bool:
            view = httpx.get(f"{url}/admin/autoscale", params={"model": model}, timeout=5.0)
            body = view.json()
            return body["autoscaler"] == "in-process" and len(body["decisions"]) >= 2

        for model in ("model-a", "model-b"):
            wait_until(partial(decided, model), timeout=30.0, message=f"{model} decisions")
        result = _pdorch(
            "scale", "status", "--url", url, "--served-model-name", "model-b", "--json"
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["pools"]["decode"]["max"] == 3  # model-b's own policy
        assert "autoscaler: in-process, for model-a, model-b" in log.read_text()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
