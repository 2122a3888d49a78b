# infini-sidecar: one image for every role (single sidecar, shard server, router) and for building
# index shards. No model or index inside: they come from volumes (deploy/k8s).
# Build:  docker build -t infini-sidecar .
FROM rust:1-bookworm AS build
WORKDIR /src
# protox compiles the protos in Rust: no protoc needed.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY benches benches
COPY tests tests
RUN cargo build --release --locked --bin infini-sidecar

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin sidecar
COPY --from=build /src/target/release/infini-sidecar /usr/local/bin/infini-sidecar
USER 10001
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/infini-sidecar"]
CMD ["serve", "--config", "/etc/infini-sidecar/sidecar.toml"]
