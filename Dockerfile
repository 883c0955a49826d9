# syntax=docker/dockerfile:1
# toolnexus-gateway: a multi-stage build of the release binary on a small Debian runtime.

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY .cargo .cargo
COPY src src
COPY ui ui
RUN cargo build --release --locked --bin toolnexus-gateway

FROM debian:bookworm-20251117-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates=20230311* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin gateway
COPY --from=build /src/target/release/toolnexus-gateway /usr/local/bin/toolnexus-gateway
COPY config/container.toml /etc/toolnexus-gateway/gateway.toml
USER 10001
EXPOSE 8080
ENV TOOLNEXUS_CONFIG=/etc/toolnexus-gateway/gateway.toml
ENTRYPOINT ["/usr/local/bin/toolnexus-gateway"]
