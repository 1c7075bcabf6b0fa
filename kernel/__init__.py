"""``fak.kernel``: the agent kernel (``docs/architecture.md``).

Four parts over two mechanisms, wired by the root modules. The parts: ``session`` (the agent
session ``KernelSession``, admission, working sets, the durable ledger, the audited transaction,
the registry), ``calls`` (how a model writes tool calls, their authorization and provenance,
held calls), ``withdrawal`` (forget with its receipt and replay check, quarantine and expiry,
key operations, replicas) and ``openai`` (the OpenAI door, chat completions and Responses, on
top: nothing below imports it). The mechanisms, which import none of them: ``model`` (the
forward, its weight formats, the tokenizer, the scheduler that drives it) and ``kv`` (the KV
cache, its ledger, prefix and PIC reuse, the model session). The root: the façade
(``facade.Kernel``, also ``from fak import Kernel``), the services it builds and hands down
(``services``), typed events (``events``), the REST operations (``operations``) and the
``fak chat`` / ``fak demo`` commands (``cli``, ``demo``). ``tests/repo/test_layering.py`` holds
who may import whom. Importing this package loads nothing: each module is imported by name."""
