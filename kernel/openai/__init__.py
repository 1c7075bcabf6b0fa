"""The OpenAI door: chat completions and Responses on the kernel (translation, answers, streams, constrained decoding)."""
