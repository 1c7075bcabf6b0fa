"""A replicated deployment's life: the Serve application built (one one-actor deployment per
replica, the router over them), started on a local Ray, reached (``replica_handle``,
``wait_ready``) and stopped. ``run_cluster`` first checks what N kernels cannot share
(``fak.kernel.facade.check_replicated``, as each replica's ``Kernel.open`` does)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from fak.api.cluster.replica import Replica
from fak.api.cluster.router import Router
from fak.api.cluster.rules import BALANCE_SLACK, Placement
from fak.errors import FakError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from fak.settings import Settings

SECRETS = frozenset({"master_secret", "audit_signing_key"})  # read by each replica from the data dir or FAK_* env
MAX_ONGOING = 512  # requests one replica (or the router) holds at once; the kernel's own admission says 429 first
OBJECT_STORE_BYTES = 200 * 1024**2
APP_NAME = "fak"
RAY_MISSING = "fak serve --replicas needs Ray Serve: pip install 'fak[scale]'"


class ClusterError(FakError):
    """A replicated deployment that cannot start as configured."""


def replica_names(replicas: int) -> list[str]:
    return [f"replica-{i}" for i in range(replicas)]


def shared_settings(settings: Settings) -> dict[str, Any]:
    """What every replica is built from: the settings as JSON values, without the secrets and
    without ``replica`` (each replica adds its own name)."""
    return settings.model_dump(mode="json", exclude={*SECRETS, "replica"})


def build_app(settings: Settings, replicas: int, placement: Placement = Placement.PREFIX,
              balance_slack: int | None = BALANCE_SLACK) -> Any:
    """The Serve application: ``replicas`` one-actor deployments and the router over them."""
    try:
        from ray import serve
    except ImportError as exc:
        raise ClusterError(RAY_MISSING) from exc

    shared = shared_settings(settings)
    bound = {
        name: serve.deployment(name=name, num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                               ray_actor_options={"num_cpus": 0}, health_check_period_s=5,
                               graceful_shutdown_timeout_s=30)(Replica).bind(shared, name)
        for name in replica_names(replicas)
    }
    router = serve.deployment(name="router", num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                              ray_actor_options={"num_cpus": 0})(Router)
    return router.bind(bound, placement.value, balance_slack)


def run_cluster(settings: Settings, replicas: int, host: str = "127.0.0.1", port: int = 8077,
                placement: Placement = Placement.PREFIX, balance_slack: int | None = BALANCE_SLACK,
                ) -> DeploymentHandle[Any]:
    """Start Ray locally when none is connected, Serve's HTTP proxy on ``host:port`` and the
    application; returns the router's handle once every replica has opened its kernel."""
    from fak.kernel.facade import check_replicated

    check_replicated(settings, replicas)
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ClusterError(RAY_MISSING) from exc

    if not ray.is_initialized():
        # worker_niceness 0: Ray runs workers at nice 15 by default, and a replica's workers serve requests
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                 logging_level=logging.WARNING, log_to_driver=True, _system_config={"worker_niceness": 0})
    serve.start(http_options={"host": host, "port": port})
    handle: DeploymentHandle[Any] = serve.run(build_app(settings, replicas, placement, balance_slack), name=APP_NAME,
                                         route_prefix="/", blocking=False)
    return handle


def replica_handle(name: str) -> DeploymentHandle[Any]:
    """A running replica's handle (tests: ``replica_handle("replica-1").pid.remote()``)."""
    from ray import serve

    return serve.get_deployment_handle(name, app_name=APP_NAME)


def shutdown_cluster() -> None:
    """Stop the application and Serve (each replica closes its kernel), then Ray if this process started it."""
    import ray
    from ray import serve

    if not ray.is_initialized():  # the start failed before Ray ran: nothing to stop (and no second error)
        return
    with contextlib.suppress(Exception):
        serve.delete(APP_NAME)
    serve.shutdown()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
    ray.shutdown()


def wait_ready(url: str, timeout_s: float = 300.0) -> float:
    """Seconds until the router answers ``/healthz`` at ``url`` (serve.run returns before the proxy listens)."""
    import httpx

    start = time.monotonic()
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while True:
            try:
                if client.get(url.rstrip("/") + "/healthz").status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            if time.monotonic() - start > timeout_s:
                raise ClusterError(f"the router at {url} did not answer /healthz in {timeout_s:.0f} s")
            time.sleep(0.2)
