"""`coordinator:` of the fleet file: the coordinator app's options (`CoordinatorSettings`,
read by `pdorch serve`) and its admission queue (`AdmissionSettings`). Its own module so the
fleet file's model (`fleet.py`, which re-exports both) stays one job; reference:
`pools/FLEET_API.md`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pdorch.config.head_shed import HeadShedSettings
from pdorch.config.replica_allow import ReplicaAllowList


class AdmissionSettings(BaseModel):
    """The queue in front of `max_concurrent_requests` (pdorch/app/admission.py)."""

    model_config = ConfigDict(extra="forbid")

    max_queue: int = Field(
        default=0,
        ge=0,
        description="Requests over max_concurrent_requests that wait for a slot (highest "
        "x-pdorch-priority first); beyond it they get 429 at once. 0: no queue.",
    )
    max_wait_s: float = Field(
        default=5.0, gt=0, description="A queued request still waiting this long gets 429."
    )
    retry_after_s: int = Field(
        default=1, ge=0, le=3600, description="The Retry-After (seconds) of every 429 it sends."
    )


class CoordinatorSettings(BaseModel):
    """Options of the coordinator app (read by `pdorch serve`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address the OpenAI endpoint listens on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port of the OpenAI endpoint.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Coordinator processes sharing the port (SO_REUSEPORT; `pdorch serve "
        "--workers` wins; pdorch/app/workers.py). Above 1 the fleet is fixed: no run-time "
        "scaling, no in-process autoscaler.",
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="Whole-request deadline.")
    prefill_timeout_s: float = Field(
        default=30.0, gt=0, description="Prefill leg deadline; past it decode prefills locally."
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, description="TCP connect timeout per leg.")
    decode_retries: int = Field(
        default=1, ge=0, le=10, description="Other decode replicas tried before the first byte."
    )
    migration_limit: int = Field(
        default=3,
        ge=0,
        le=100,
        description="How many times one request may be continued on another decode replica "
        "after its decode engine died or stalled mid-answer (pdorch/app/migration.py); 0: never "
        "(the stream ends with an error event).",
    )
    stall_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A streamed answer with no byte for this long after its first counts as a "
        "hung engine: reported to health and continued elsewhere (default 10 s: a healthy "
        "engine's gap is one decode step, tens of ms, plus a chunked prefill step of others; "
        "a shared CPU box can pause seconds).",
    )
    first_byte_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="A streamed decode leg with no first byte this long is hung up and the "
        "request re-sent to another decode replica (while decode_retries allow and another is "
        "routable; the retry prefills locally, the engine may have pulled the prefill's KV). "
        "null: 2 x stall_timeout_s (20 s by default: the first byte waits for the KV pull, a "
        "queue and a step, longer than a gap between tokens; a local leg also prefills the "
        "prompt, so raise it for very long prompts).",
    )
    api_keys: list[str] = Field(
        default_factory=list, description="Accepted client keys (Bearer); empty: no auth."
    )
    admin_token: str | None = Field(
        default=None, min_length=1, description="Token the /admin endpoints require, if set."
    )
    edge_fast_path: bool = Field(
        default=True,
        description="Serve POST /v1/completions and /v1/chat/completions straight from the "
        "HTTP protocol, without the ASGI layers (pdorch/app/edge_fast.py: the same request "
        "logic and answers; requests it does not fit go through ASGI; default true: 1.3 us "
        "per request less in benchmarks/proxy/edge_micro.py, proxy-10); false: every request "
        "through ASGI.",
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1,
        description="Larger request bodies get 413 (default 32 MiB: a 128k-token prompt as text "
        "is ~0.5 MB, so this only stops abuse).",
    )
    max_concurrent_requests: int | None = Field(
        default=None,
        ge=1,
        description="Client requests in flight beyond this wait in the admission queue "
        "(coordinator.admission) or, when it is full or 0, get 429 with Retry-After; null: "
        "unlimited.",
    )
    admission: AdmissionSettings = Field(
        default_factory=AdmissionSettings,
        description="Bounded admission queue over max_concurrent_requests.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Requests whose headers (names + values) sum past this get 431 (default "
        "64 KiB: real clients send < 2 KiB; the HTTP parser itself sets no limit).",
    )
    upstream_connections_per_replica: int = Field(
        default=1024,
        ge=1,
        description="Open connections to one engine at most (the legs' pool, "
        "pdorch/app/upstream.py): a leg past it waits for a free connection, it does not "
        "fail. One HTTP/1.1 connection carries one request at a time, so this caps the "
        "requests in flight per engine; the default is vLLM's largest default batch "
        "(max_num_seqs 1024), so it never holds back a batch, and it bounds sockets and "
        "connection storms (C=256: 256 connects at once).",
    )
    leg_client: Literal["aiohttp", "native"] = Field(
        default="aiohttp",
        description="The HTTP client of the prefill and decode legs: aiohttp "
        "(pdorch/app/upstream.py) or native, pdorch's own HTTP/1.1 client on asyncio "
        "protocols + httptools (pdorch/app/leg_client.py: less CPU per leg). Same pool cap, "
        "timeouts, failures and migration; health probes, scrapes and passthrough routes stay "
        "on aiohttp.",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        description="Client connections open at once beyond this get 503 and are closed "
        "(pdorch/app/edge.py; default 4096).",
    )
    listen_backlog: int = Field(
        default=1024,
        ge=1,
        le=65535,
        description="Connections the kernel completes and queues before the event loop "
        "accepts them (listen(2); Linux caps it at net.core.somaxconn). They wait there "
        "unprioritised, before any deadline or shedding; past it a connect waits for the "
        "client's SYN retry. Default 1024.",
    )
    head_shed: HeadShedSettings = Field(
        default_factory=HeadShedSettings,
        description="429 at the request head while the event loop lags or too many heads "
        "wait for their handler (pdorch/app/head_shed.py).",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A request's headers must be complete this long after its first byte "
        "(a new connection: after it opens), else 408 and the connection is closed "
        "(slow-loris; default 10 s).",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="A request's body must be complete this long after its headers, else 408 "
        "and the connection is closed (default 60 s: 32 MiB at ~4.5 Mbit/s).",
    )
    replica_allow: ReplicaAllowList = Field(
        default_factory=ReplicaAllowList,
        description="Where replicas added at run time (admin API) may point: an SSRF guard "
        "(pdorch/config/replica_allow.py; default: loopback + private ranges, never "
        "link-local or metadata addresses).",
    )

    def first_byte_deadline_s(self) -> float:
        """`first_byte_timeout_s`, or its default derived from `stall_timeout_s`."""
        if self.first_byte_timeout_s is not None:
            return self.first_byte_timeout_s
        return 2.0 * self.stall_timeout_s
