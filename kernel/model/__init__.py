"""``fak.kernel.model``: the Llama forward (``llama``) and the KV cache it reads and writes
(``kv_cache``), its parameters (``params``), its weight formats (``quant``, ``blockdot`` with its
C kernel in ``csrc/``), loading (``weights``, ``gguf_names``, ``loader``), the decode steps
(``fast_decode``, ``blas_decode``), sampling (``generate``), the tokenizer and chat template, and
``fak generate`` / ``fak info``. It knows nothing of segments, reuse, policy, storage, audit or
the agent kernel above it."""
