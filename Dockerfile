# syntax=docker/dockerfile:1
# toolnexus-gateway: a multi-stage build of the release binary on a small Debian runtime.
# Build: docker build -t toolnexus-gateway .   Deploy: docs/deploy.md.   Check: scripts/check-container.sh.

# The slim Rust image has gcc, which compiles the SQLite the store bundles.
FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
# Everything the build reads, and nothing else: the web inbox in ui/ is compiled into the binary, and
# cargo refuses a manifest whose [[bench]] or [[test]] has no source, so benches/ and tests/chaos/ come
# along unbuilt.
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY benches benches
COPY tests/chaos tests/chaos
COPY src src
COPY ui ui
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin toolnexus-gateway \
    && cp target/release/toolnexus-gateway /usr/local/bin/toolnexus-gateway

FROM debian:bookworm-20251117-slim
# ca-certificates: for https upstreams and webhooks. tini: process 1, so that the exited grandchildren of
# stdio servers that start processes of their own (npx does) are reaped; it passes signals on to the gateway.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates=20230311* tini=0.19.0* \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gateway \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/toolnexus-gateway
COPY --from=build /usr/local/bin/toolnexus-gateway /usr/local/bin/toolnexus-gateway
COPY config/container.toml /etc/toolnexus-gateway/gateway.toml
ENV TOOLNEXUS_CONFIG=/etc/toolnexus-gateway/gateway.toml
# A config without [store] keeps its state in $XDG_STATE_HOME/toolnexus-gateway: on the volume too.
ENV XDG_STATE_HOME=/var/lib
# The store (config/container.toml): pending Requests, answers and the audit trail outlive the container.
VOLUME /var/lib/toolnexus-gateway
USER 10001:10001
EXPOSE 8080
# Probes GET /healthz at the config's listen address (TOOLNEXUS_LISTEN overrides it); no curl needed.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/toolnexus-gateway", "healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/toolnexus-gateway"]
