"""`PdRouter`: the coordinator's per-request routing flow, shared by the coordinator and the
fleet simulator.

Flow for one request (pure; `now` is passed, nothing is read from a clock):

1. **Colocated-only fleet** (no prefill and no decode pool): the *prefill* policy picks among
   the colocated replicas (it weighs cached overlap against queued prefill work, which is what a
   colocated replica's TTFT depends on); that replica prefills and decodes.
2. **P/D fleet**: the *decode* policy picks a decode replica `d` (the decode replica's cached
   overlap feeds the P/D decision); `decide_pd` (with `local_overlap_blocks = overlap(d)`)
   decides whether to disaggregate;
   - yes: the *prefill* policy picks a prefill replica `p`; `p` prefills, `d` decodes;
   - no: if a colocated pool exists, the prefill policy picks a colocated replica that serves
     the whole request; otherwise `d` prefills locally.
   With no healthy prefill replica, `decide_pd` says no (the decode side prefills).

Only picks that are used are recorded with `on_request_routed` (round-robin's counter, the
`cache_aware` tree), so a decision that is not executed leaves the policies unchanged when
`route(..., commit=False)` is used (explain API).

`route(..., decisions=False)` (the lifecycle's admissions, issue 15 proxy-8) takes each pick
with `Profile.choose` (the same choice, no scores, terms or reasons) and keeps only the chosen
replica in the route's decisions: explain re-routes with `commit=False`, which builds them.

Policies come from `RouterPolicyConfig` (`router/policies/config.py`): `prefill`, `decode`,
`pd`. `PdRoute.explain(...)` builds the pydantic explain structure on demand.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.explain import DecisionExplanation, explain_pd, explain_pick
from router.latency_predictor import LatencyFitParams
from router.pd_decision import PdDecision, decide_pd
from router.plugins.profile import Profile
from router.policies.config import RouterPolicyConfig, build_policy
from router.replica_columns import overlap_of
from router.replica_state import PolicyDecision, ReplicaSnapshot, RoutingRequest
from router.vocabulary import RouteKind


class NoReplicaError(RuntimeError):
    """No healthy replica can serve the request (every pool empty or unhealthy)."""


@dataclass(slots=True)
class PdRoute:
    """One request's routing: who prefills, who decodes, and the decisions behind it.

    `prefill_replica` is set only when the request is disaggregated; `decode_replica` serves
    the decode (and the prefill too when not disaggregated). `prefill`/`decode` are the policy
    decisions that were used (the decode pick is the colocated pick on colocated routes).
    """

    request_id: str
    disaggregate: bool
    prefill_replica: str | None
    decode_replica: str
    prefill: PolicyDecision | None
    decode: PolicyDecision
    pd: PdDecision | None
    kind: RouteKind  # PD, LOCAL (the decode replica prefills) or COLOCATED; never FALLBACK

    def explain(
        self,
        request: RoutingRequest,
        now: float,
        prefill_snapshots: Sequence[ReplicaSnapshot],
        decode_snapshots: Sequence[ReplicaSnapshot],
    ) -> DecisionExplanation:
        """The explain view (`router/explain.py`); pass the snapshots the route was made from
        (the colocated snapshots as `decode_snapshots` on colocated routes)."""
        return DecisionExplanation(
            request_id=self.request_id,
            now=now,
            prompt_tokens=request.prompt_tokens,
            prompt_blocks=request.prompt_blocks,
            prefill=explain_pick("prefill", self.prefill, prefill_snapshots)
            if self.prefill is not None
            else None,
            pd=explain_pd(self.pd) if self.pd is not None else None,
            decode=explain_pick(
                "colocated" if self.kind is RouteKind.COLOCATED else "decode",
                self.decode,
                decode_snapshots,
            ),
        )


class PdRouter:
    """Prefill pick + P/D decision + decode pick with one prefill policy instance per pool."""

    def __init__(self, config: RouterPolicyConfig, seed: int = 0) -> None:
        self.config = config
        rng = random.Random(seed)
        self.prefill_policy: Profile = build_policy(
            config.prefill, rng=random.Random(rng.random()), field_prefix="prefill"
        )
        self.decode_policy: Profile = build_policy(
            config.decode, rng=random.Random(rng.random()), field_prefix="decode"
        )
        # A separate instance for the colocated pool: stateful policies (round-robin counters,
        # text trees) must not mix two pools' histories.
        self.colocated_policy: Profile = build_policy(
            config.prefill, rng=random.Random(rng.random()), field_prefix="prefill"
        )

    def latency_fit(self) -> LatencyFitParams | None:
        """The latency-fit parameters of the first policy that reads a learnt fit (prefill,
        then decode, then colocated), or None (`Profile.latency_fit`)."""
        for policy in (self.prefill_policy, self.decode_policy, self.colocated_policy):
            fit = policy.latency_fit
            if fit is not None:
                return fit
        return None

    def route(
        self,
        request: RoutingRequest,
        prefill: Sequence[ReplicaSnapshot],
        decode: Sequence[ReplicaSnapshot],
        now: float,
        colocated: Sequence[ReplicaSnapshot] = (),
        commit: bool = True,
        decisions: bool = True,
    ) -> PdRoute:
        """Route one request (see the module docstring). Raises `NoReplicaError`.
        `decisions=False`: choices only (module docstring)."""
        rid = request.request_id
        pick = _pick if decisions else _choose
        if not decode:
            return self._colocated(request, colocated, now, commit, pd=None, picking=pick)
        d_pick = pick(self.decode_policy, request, decode, now)
        if d_pick.chosen is None:
            if colocated:
                return self._colocated(request, colocated, now, commit, pd=None, picking=pick)
            raise NoReplicaError(f"request {rid}: no healthy decode replica")
        local = overlap_of(decode, d_pick.chosen)
        d_snap = None
        if self.config.pd.compare_finish:  # the queue-aware check reads the decode replica
            d_snap = next(r for r in decode if r.replica_id == d_pick.chosen)
        pd = decide_pd(
            request, prefill, self.config.pd, now, local_overlap_blocks=local, local=d_snap
        )
        if pd.disaggregate:
            p_pick = pick(self.prefill_policy, request, prefill, now)
            if p_pick.chosen is not None:
                if commit:
                    self.prefill_policy.on_request_routed(request, p_pick.chosen, now)
                    self.decode_policy.on_request_routed(request, d_pick.chosen, now)
                return PdRoute(
                    rid, True, p_pick.chosen, d_pick.chosen, p_pick, d_pick, pd, RouteKind.PD
                )
        if colocated:
            return self._colocated(request, colocated, now, commit, pd=pd, picking=pick)
        if commit:
            self.decode_policy.on_request_routed(request, d_pick.chosen, now)
        return PdRoute(rid, False, None, d_pick.chosen, None, d_pick, pd, RouteKind.LOCAL)

    def _colocated(
        self,
        request: RoutingRequest,
        colocated: Sequence[ReplicaSnapshot],
        now: float,
        commit: bool,
        pd: PdDecision | None,
        picking: _Picking,
    ) -> PdRoute:
        pick = picking(self.colocated_policy, request, colocated, now)
        if pick.chosen is None:
            raise NoReplicaError(f"request {request.request_id}: no healthy replica")
        if commit:
            self.colocated_policy.on_request_routed(request, pick.chosen, now)
        return PdRoute(
            request.request_id, False, None, pick.chosen, None, pick, pd, RouteKind.COLOCATED
        )


_Picking = Callable[[Profile, RoutingRequest, Sequence[ReplicaSnapshot], float], PolicyDecision]


def _pick(
    policy: Profile, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
) -> PolicyDecision:
    return policy.pick(request, replicas, now)


def _choose(
    policy: Profile, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], now: float
) -> PolicyDecision:
    """The choice only (module docstring): the decision keeps nothing else."""
    chosen = policy.choose(request, replicas, now)
    return PolicyDecision(policy.name, chosen, _CHOICE_ONLY if chosen is not None else _NONE)


_CHOICE_ONLY = "choice only (route(decisions=True) builds the decision)"
_NONE = "no candidate (route(decisions=True) says why)"
