"""The composition root: builds store, bus, emitter, provider and FleetManager from a config.

prosperod, `prospero demo` and the API tests all start Prospero through `Runtime`, so there is
one wiring of the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prospero.core.aio import wait_for
from prospero.core.automations import AutomationService, Scheduler
from prospero.core.bus import InProcessBus
from prospero.core.bus.postgres import PgBus
from prospero.core.cluster import ClusterInfo, default_replica_id, replica_key
from prospero.core.decisions import DecisionConfig, DecisionService
from prospero.core.drivers.ndjson import NdjsonDriver
from prospero.core.emitter import Emitter
from prospero.core.errors import StoreError
from prospero.core.fleet.local import CalibandNetworkConfig, LocalFleet, LocalFleetConfig
from prospero.core.fleet.manager import FleetConfig, FleetManager
from prospero.core.fleet.provider import FleetProvider, WorkspaceAdmin
from prospero.core.fleet.state import DriverFactory
from prospero.core.leases import LeaseKeeper
from prospero.core.metrics import Metrics
from prospero.core.notify import Notifier, NotifierConfig
from prospero.core.notify.sender import RetryPolicy
from prospero.core.notify.service import NotificationService
from prospero.core.ownership import LeasedOwnership
from prospero.core.ratecard import RateCard
from prospero.core.relay.routing import OwnerRouting, RelayHandler
from prospero.core.retention import RetentionTask
from prospero.core.store.backend import StoreBackend, open_backend
from prospero.core.store.base import AgentMetaStore, ConfigStore, EventStore
from prospero.core.transport import NetworkSecurity

if TYPE_CHECKING:
    from prospero.core.relay.postgres import PgRelay

log = logging.getLogger(__name__)


def default_data_dir() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg:
        return Path(xdg) / "prospero"
    home = os.environ.get("HOME")
    if home:
        return Path(home) / ".local" / "share" / "prospero"
    return Path(".prospero")


FLEET_BACKENDS = ("local", "k8s")


@dataclass(frozen=True)
class K8sBackendConfig:
    """`--fleet-backend k8s` (issue 13): where the CalibanTask CRs live and how their pods'
    calibands are dialled (the daemon-wide `--caliband-ca-file`/`--caliband-token-file`)."""

    namespace: str = "default"
    # None: lightkube's default resolution (in-cluster service account, else $KUBECONFIG,
    # else ~/.kube/config).
    kubeconfig: Path | None = None
    caliband_security: NetworkSecurity | None = None


@dataclass
class DaemonConfig:
    bind_host: str = "127.0.0.1"
    port: int = 7878
    data_dir: Path = field(default_factory=default_data_dir)
    # Set: the stores live in this PostgreSQL database instead of <data_dir>/events.db
    # (core/store/backend.py). The data dir still holds the session key.
    database_url: str | None = None
    # Clustered (a database URL): this replica's lease identity (unique per replica; default
    # $HOSTNAME), the lease TTL (database clock) and the renewal cadence (default TTL/3, at
    # least 1 s).
    replica_id: str | None = None
    lease_ttl: float = 30.0
    heartbeat_interval: float | None = None
    host_label: str = "local"
    poll_interval: float = 2.0
    # Quiet workspaces are polled less often (FleetConfig): up to `poll_idle_backoff` times
    # the interval, once quiet for `poll_quiet_after` seconds.
    poll_idle_backoff: float = FleetConfig.poll_idle_backoff
    poll_quiet_after: float = FleetConfig.poll_quiet_after
    autostart: bool = True
    caliband_bin: str = "caliband"
    default_env: dict[str, str] = field(default_factory=dict)
    retention_days: int = 0
    include_thinking: bool = True
    allow_acp: bool = False
    rate_card: RateCard = field(default_factory=RateCard)
    caliband_network: CalibandNetworkConfig | None = None
    # Who runs the agents: "local" (LocalFleet: calibands per workspace, or `caliband_network`)
    # or "k8s" (K8sFleet: CalibanTask CRs, `k8s`). The stores (SQLite or PostgreSQL) and
    # everything above the provider are the same for both.
    fleet_backend: str = "local"
    k8s: K8sBackendConfig = field(default_factory=K8sBackendConfig)
    # API auth: token name -> token. Empty = no auth (only allowed on loopback binds).
    api_tokens: dict[str, str] = field(default_factory=dict)
    # Scoped, hashed tokens (ADR 0010; `prospero token new`), re-read when the file changes.
    # Configured = auth on (an empty file accepts no token until one is added).
    api_tokens_file: Path | None = None
    # Allow a non-loopback bind without any token (unsafe; refused otherwise).
    insecure_no_auth: bool = False
    log_format: str = "text"
    log_level: str = "info"
    # Per-subscriber live-bus queue; a subscriber further behind self-heals from the store.
    bus_buffer: int = 1024
    # Permission decisions (ADR 0006): webhook URLs notified when a decision becomes pending
    # and when it is resolved; how long a decision left pending by a previous prosperod waits
    # for its rejoined session to ask again before it is cancelled.
    decision_webhooks: list[str] = field(default_factory=list)
    decision_rejoin_grace: float = 30.0
    # Slow clients (api/h11_protocol.py): seconds for a request's headers and for its body;
    # concurrent HTTP connections beyond the bound are refused with 503.
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 2048
    # Host allowlist beyond loopback (api/guard.py) and the origin browsers reach us at.
    allowed_hosts: list[str] = field(default_factory=list)
    public_url: str | None = None
    # Automations (docs/automations.md): seconds between scheduler passes; the webhook replay
    # window (signatures seen are refused, timestamps further off are stale).
    automation_interval: float = 2.0
    automation_replay_window: float = 300.0
    # Notifications (docs/notifications.md): seconds between reads of the fleet stream, and
    # the attempts and first backoff of a delivery.
    notify_interval: float = 0.5
    notify_attempts: int = 5
    notify_backoff: float = 0.5

    @property
    def db_path(self) -> Path:
        return self.data_dir / "events.db"


class Runtime:
    def __init__(self, config: DaemonConfig, *, provider: FleetProvider | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        self._provider_override = provider
        self.backend: StoreBackend | None = None
        self.cluster = ClusterInfo(
            "standalone", config.replica_id or default_replica_id(), "sqlite"
        )
        self.ownership: LeasedOwnership | None = None
        self.store: EventStore | None = None
        self.config_store: ConfigStore | None = None
        self.agents: AgentMetaStore | None = None
        # One process: the in-process bus; PostgreSQL: `PgBus` (set up in `start`).
        self.bus: InProcessBus | PgBus = InProcessBus(
            buffer=config.bus_buffer, metrics=self.metrics
        )
        self.emitter: Emitter | None = None
        self.manager: FleetManager | None = None
        self.decisions: DecisionService | None = None
        self._retention: RetentionTask | None = None
        self.presence: LeaseKeeper | None = None  # clustered: this process's `replica:<id>`
        self.relay: PgRelay | None = None  # clustered: calls to the replica driving an agent
        self._warming: asyncio.Future[Any] | None = None
        self.automations: AutomationService | None = None
        self.scheduler: Scheduler | None = None
        self.notifications: NotificationService | None = None
        self.notifier: Notifier | None = None

    async def start(self) -> None:
        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        # SQLite in the data dir, or PostgreSQL when a database URL is set.
        self.backend = backend = await open_backend(cfg.database_url, cfg.db_path)
        self.store = backend.events
        self.config_store = backend.config
        # Prospero's own per-agent metadata (posture, protocol, spawned or adopted here).
        self.agents = backend.agents
        if backend.kind == "postgres" and backend.leases is not None:
            self.ownership = await self._join_cluster(backend)
        if backend.kind == "postgres" and cfg.database_url:
            # Every replica's events reach this one's subscribers through the store, woken by
            # the NOTIFY each append sends at commit (core/bus/postgres.py).
            self.bus = PgBus(
                backend.events, cfg.database_url, buffer=cfg.bus_buffer, metrics=self.metrics
            )
            await self.bus.start()
        # Clustered: every append is fenced by the lease it is written under (ADR 0012).
        self.emitter = Emitter(self.store, self.bus, self.metrics, ownership=self.ownership)
        await self.emitter.start()
        self.decisions = DecisionService(
            backend.decisions,
            self.emitter,
            self.metrics,
            DecisionConfig(
                webhooks=list(cfg.decision_webhooks),
                rejoin_grace=cfg.decision_rejoin_grace,
                # Other replicas' pending decisions are live there, not orphans of ours.
                clustered=self.ownership is not None,
            ),
        )
        await self.decisions.start()
        factories: dict[str, DriverFactory] = {"ndjson": NdjsonDriver, "acp": self._acp_factory()}
        if cfg.allow_acp:
            # ACP spawns are allowed: import the SDK now, off the loop, not at the first spawn.
            self._warming = asyncio.get_running_loop().run_in_executor(
                None, importlib.import_module, "prospero.core.drivers.acp"
            )
        routing: OwnerRouting | None = None
        if self.ownership is not None and cfg.database_url and backend.leases is not None:
            # Requests that need an ACP agent's driver run on the replica that drives it.
            from prospero.core.relay.postgres import PgRelay

            # Its own pool (closed with it).
            self.relay = PgRelay(cfg.database_url, self.cluster.replica_id)
            routing = OwnerRouting(
                self.relay, backend.leases, self.ownership, settle=min(30.0, cfg.lease_ttl + 2.0)
            )
            self.decisions.remote = routing.decide_remote
        provider: FleetProvider
        workspace_admin: WorkspaceAdmin | None = None
        k8s_fleet = False  # agents are CalibanTask CRs in a cluster
        if self._provider_override is not None:
            provider = self._provider_override
        elif cfg.fleet_backend == "k8s":
            # Imported here: a local fleet does not pay for the Kubernetes client.
            from prospero.core.fleet.k8s import K8sFleet
            from prospero.core.fleet.k8s_workspaces import K8sWorkspaces

            k8s = K8sFleet(
                cfg.k8s.namespace,
                cfg.k8s.kubeconfig,
                caliband_security=cfg.k8s.caliband_security,
            )
            # The CR carries the spawn's posture (spec.task.permissionPosture) for the operator.
            provider = k8s
            # The registry is the namespace's Workspace CRs (ADR 0013).
            workspace_admin = K8sWorkspaces.for_fleet(k8s)
            k8s_fleet = True
            log.info(
                "fleet backend k8s: CalibanTasks in namespace %s (kubeconfig %s)",
                cfg.k8s.namespace,
                cfg.k8s.kubeconfig or "from the environment",
            )
            if cfg.k8s.caliband_security is None:
                log.warning(
                    "fleet backend k8s without --caliband-ca-file: pod calibands are dialled "
                    "in plaintext, without a token"
                )
        else:
            provider = LocalFleet(
                LocalFleetConfig(
                    autostart=cfg.autostart,
                    caliband_bin=cfg.caliband_bin,
                    default_env=cfg.default_env,
                    network=cfg.caliband_network,
                )
            )
        self.manager = FleetManager(
            provider,
            self.config_store,
            self.store,
            self.emitter,
            self.metrics,
            FleetConfig(
                host=cfg.host_label,
                poll_interval=cfg.poll_interval,
                poll_idle_backoff=cfg.poll_idle_backoff,
                poll_quiet_after=cfg.poll_quiet_after,
                include_thinking=cfg.include_thinking,
                rate_card=cfg.rate_card,
                allow_acp=cfg.allow_acp,
                default_env=cfg.default_env,
                kill_removes_agent=k8s_fleet,  # a kill deletes the CR
                provider_keys_here=not k8s_fleet,  # the pods' keys live in the cluster
            ),
            driver_factories=factories,
            decisions=self.decisions,
            agents=self.agents,
            ownership=self.ownership,
            routing=routing,
            fenced_cursors=self.ownership is not None,
            workspace_admin=workspace_admin,
        )
        if self.ownership is not None:
            self.ownership.on_lost(self.manager.lease_lost)
        await self.manager.start()
        if self.relay is not None:
            await self.relay.start(RelayHandler(self.manager, self.decisions))
        if backend.automations is not None:
            # After the manager (it spawns through it); clustered, one replica fires a tick.
            self.automations = AutomationService(
                backend.automations,
                self.manager,
                self.metrics,
                replay_window=cfg.automation_replay_window,
            )
            self.scheduler = Scheduler(
                self.automations,
                interval=cfg.automation_interval,
                leases=backend.leases if self.ownership is not None else None,
                owner=self.cluster.replica_id,
                ttl=cfg.lease_ttl,
                heartbeat=self.cluster.heartbeat if self.ownership is not None else None,
            )
            self.scheduler.start()
        if backend.notifications is not None:
            # Reads the stored fleet stream; clustered, one replica sends (the `notifier` lease).
            self.notifier = Notifier(
                backend.notifications,
                backend.events,
                self.metrics,
                NotifierConfig(
                    public_url=cfg.public_url,
                    poll_interval=cfg.notify_interval,
                    retry=RetryPolicy(attempts=cfg.notify_attempts, backoff=cfg.notify_backoff),
                    leases=backend.leases if self.ownership is not None else None,
                    owner=self.cluster.replica_id,
                    ttl=cfg.lease_ttl,
                    heartbeat=self.cluster.heartbeat if self.ownership is not None else None,
                ),
            )
            self.notifications = NotificationService(backend.notifications, self.notifier)
            self.notifier.start()
        if cfg.retention_days > 0:
            self._retention = RetentionTask(self.store, cfg.retention_days, metrics=self.metrics)
            self._retention.start()

    def _acp_factory(self) -> DriverFactory:
        """The ACP driver factory. Supervised ACP agents' permission requests become pending
        decisions; an agent that requires ACP `authenticate` uses a method its workspace has
        credentials for. The ACP SDK is imported when the first ACP driver is made (it costs
        seconds of CPU, which a fleet that drives no ACP agent need not pay at every start)."""
        made: DriverFactory | None = None

        def factory(*args: Any, **kwargs: Any) -> Any:
            nonlocal made
            if made is None:
                from prospero.core.drivers.acp import acp_driver_factory
                from prospero.core.drivers.acp.auth import workspace_credentials

                assert self.config_store is not None
                made = acp_driver_factory(
                    broker=self.decisions,
                    ownership=self.ownership,
                    credentials=workspace_credentials(self.config_store, self.config.default_env),
                )
            return made(*args, **kwargs)

        return factory

    async def _join_cluster(self, backend: StoreBackend) -> LeasedOwnership:
        """Hold this replica's presence lease (`replica:<id>`) and return the ownership every
        agent and workspace lease is taken through. A live replica with the same id is a
        configuration error (two replicas would take each other's leases for their own)."""
        cfg = self.config
        assert backend.leases is not None
        rid = self.cluster.replica_id
        ttl = cfg.lease_ttl
        beat = cfg.heartbeat_interval or (max(1.0, ttl / 3) if ttl > 3.0 else ttl / 3)
        authority = backend.leases
        key = replica_key(rid)
        # Leases are held by replica id, so a replica restarted under its id would take its
        # predecessor's live leases for its own: wait for its presence lease to expire first
        # (a crashed predecessor's does within the TTL; a live one with the same id renews
        # it, which is a configuration error).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ttl + beat
        waited = False
        while True:
            holder = await authority.holder(key)
            now = await authority.now()
            if holder is None or not holder.owner or holder.expires_at <= now:
                break
            if loop.time() >= deadline:
                raise StoreError(
                    f"replica id {rid!r} is in use by another live prosperod on "
                    f"{backend.where}: give every replica its own --replica-id"
                )
            if not waited:
                waited = True
                log.info(
                    "replica id %s: waiting up to %.0fs for its previous lease to expire",
                    rid,
                    ttl + beat,
                )
            await asyncio.sleep(min(beat, max(0.05, holder.expires_at - now)))
        # The presence lease is held by this *process* (`<id>@<boot nonce>`), not by the id:
        # of two processes that boot at the same instant with one id, exactly one acquires it
        # (the other finds it live under another owner). Agent and workspace leases are held
        # by the replica id (a restarted replica continues under it).
        presence = LeaseKeeper(authority, f"{rid}@{uuid.uuid4().hex[:8]}", ttl=ttl, heartbeat=beat)
        if await presence.acquire(key) is None:  # taken meanwhile by the same id
            await presence.close(release=False)
            raise StoreError(
                f"replica id {rid!r} is in use by another live prosperod: give every replica "
                "its own --replica-id"
            )
        self.presence = presence
        keeper = LeaseKeeper(authority, rid, ttl=ttl, heartbeat=beat)
        self.cluster = ClusterInfo("clustered", rid, "postgres", ttl, beat, authority)
        log.info(
            "joined the cluster on %s as replica %s (lease TTL %.1fs)", backend.where, rid, ttl
        )
        return LeasedOwnership(keeper)

    async def stop(self) -> None:
        """Stop attach tasks and the poll loop, flush the emitter, close the stores."""
        if self._retention is not None:
            await self._retention.stop()
        if self.relay is not None:
            # Calls relayed here from now on go unanswered (their callers withdraw them).
            with contextlib.suppress(Exception):
                await wait_for(self.relay.close(), 5.0)
        if self.notifier is not None:
            # Deliveries it claimed and did not finish are sent by the next prosperod.
            with contextlib.suppress(Exception):
                await wait_for(self.notifier.stop(), 10.0)
        if self.scheduler is not None:
            # Before the manager: no fire spawns into a stopping fleet.
            with contextlib.suppress(Exception):
                await wait_for(self.scheduler.stop(), 10.0)
        if self.decisions is not None:
            # Asks abandoned by the stopping drivers stay pending for the next prosperod.
            self.decisions.begin_shutdown()
        if self.manager is not None:
            await self.manager.stop()
        if self.decisions is not None:
            with contextlib.suppress(Exception):
                await wait_for(self.decisions.close(), 10.0)
        if self.emitter is not None:
            with contextlib.suppress(Exception):
                await wait_for(self.emitter.close(), 10.0)
        if self.ownership is not None:
            # After the last fenced write: hand every lease over now, not after the TTL.
            with contextlib.suppress(Exception):
                await wait_for(self.ownership.close(), 10.0)
        if self.presence is not None:
            with contextlib.suppress(Exception):
                await wait_for(self.presence.close(release=True), 5.0)
        if isinstance(self.bus, PgBus):
            await self.bus.close()
        if self.backend is not None:
            await self.backend.close()

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
