"""``fak.kernel``: the agent kernel (``docs/architecture.md``).

The façade (``facade.Kernel``, also ``from fak import Kernel``), the services it builds and
hands down (``services``) with the session registry (``sessions``), agent sessions
(``agent_session``), withdrawal (``forget``, ``withdraw``, ``replay``), working sets
(``materialise``), tool-call authorization (``authorize``), key operations (``keyops``),
typed events (``events``) and the ``fak chat`` / ``fak demo`` commands (``cli``), over two
mechanism subpackages that never import them: ``model`` (the forward, its weight formats,
the tokenizer) and ``kv`` (the KV cache, its ledger, prefix and PIC reuse, the model
session). Importing this package loads nothing: each module is imported by name."""
