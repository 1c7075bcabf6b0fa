"""fak.api: the REST and OpenAI-compatible front door over the Kernel (``create_app``,
served by ``fak serve``). Routes are thin adapters; every rule lives in the Kernel."""
