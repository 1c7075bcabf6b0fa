"""The gateway: models fak does not run itself (an OpenAI-compatible upstream: vLLM, SGLang,
llama.cpp's server, another fak, a hosted API), governed as its own (docs/gateway.md): the
upstreams the deployment declares, the gateway session (a ledger of text segments, no KV) and
the registry a withdrawal reaches the running ones through."""
