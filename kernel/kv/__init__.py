"""``fak.kernel.kv``: the KV mechanisms over the model's cache. The per-segment ledger
(``ledger``), prefix reuse (``prefix_tree``, ``prefix_cache``), position-independent reuse
(``pic``, ``pic_serve``, ``chunking``) and the model session that prefills, generates and evicts
over them (``session``). Policy decides elsewhere; this package only does."""
