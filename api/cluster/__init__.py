"""``fak serve --replicas N``: N kernels behind one port, on Ray Serve.

Each replica is a whole kernel (``replica.Replica``: its model, sessions, KV and prefix caches,
and the same FastAPI app ``fak serve`` runs) in a Ray actor of its own, one Serve deployment per
replica (``replica-0`` … ``replica-<N-1>``, one actor each) so a replica has a stable name
that sessions are placed on. They share the governance plane (PostgreSQL: sessions'
placement, keys, audit, CAS) and the data directory (the master secret and audit signing
key files: secrets never travel in a deployment's arguments).

``router.Router`` is the ingress: it reads a request, asks ``rules`` where it goes, and
streams it through that replica's app in process (``Replica.handle`` runs the ASGI app through
``asgi.stream_asgi``, which yields the answer's start, then its body chunks, so server-sent
events stay a stream). A session's requests go to its owner: the affinity cache, else a
replica's 421 ``session_elsewhere`` answer names it (the router re-sends once). A request that
may start a conversation asks every replica's ``score`` (prefix-cache hit tokens of its prompt,
load) and goes where the most of its prompt is cached. ``/metrics`` is every replica's,
labelled ``replica``; ``/healthz`` is the router's own. The answer names its replica in
``x-fak-replica``; a request that carries ``x-fak-replica: <name>`` goes to that replica
alone (tests and operators reach one kernel: its ``/healthz``, its view of a ref).

The modules, one job each:

- ``rules``: the routing rules, without Ray (unit-tested alone);
- ``asgi``: one request through an ASGI app in process, streamed (``stream_asgi``);
- ``replica``: one kernel and its app in an actor (``Replica``, ``score_request``);
- ``router``: the ingress (``Router``);
- ``lifecycle``: the Serve application built, started, reached and stopped (``run_cluster``,
  ``shutdown_cluster``, ``wait_ready``, ``replica_handle``).

Ray is imported only when a cluster starts (it is the ``scale`` extra: ``pip install
'fak[scale]'``); the classes are plain until ``lifecycle.build_app`` makes them deployments, so
importing these modules costs nothing.
"""
