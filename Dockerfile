# contextgate container image.
#
# Two stages: `build` installs the project and its locked dependencies (constraints.txt)
# into a virtual environment at /opt/contextgate; the runtime stage is a clean slim image
# holding only that environment. The gateway runs as uid/gid 10001 and writes nothing at
# run time, so the root filesystem can be mounted read-only. Configuration comes from the
# environment and, optionally, a YAML file named by CONTEXTGATE_CONFIG (docs/DEPLOY.md).
#
#   docker build -t contextgate .
#   docker run --rm -p 8080:8080 --read-only contextgate

FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/contextgate
ENV PATH=/opt/contextgate/bin:$PATH

WORKDIR /src
# Exactly what the package build needs: pyproject.toml names README.md as its long
# description, and constraints.txt pins every dependency to the version CI tests.
COPY pyproject.toml constraints.txt README.md ./
COPY gateway ./gateway
COPY pipelines ./pipelines
# A regular (not editable) install: the code lands in site-packages and /src is left behind.
# Bytecode is compiled here, at build time, so nothing needs writing when the gateway starts.
RUN pip install -c constraints.txt . \
    && python -m compileall -q /opt/contextgate/lib \
    && contextgate --help > /dev/null


FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="contextgate" \
      org.opencontainers.image.description="An OpenAI-compatible LLM gateway that keeps long agent conversations inside the context window"

ENV PATH=/opt/contextgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN groupadd --system --gid 10001 contextgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin contextgate

COPY --from=build /opt/contextgate /opt/contextgate

USER 10001:10001
WORKDIR /

EXPOSE 8080

# slim has no curl: the probe is the image's own Python.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]

# Exec form: contextgate is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["contextgate", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
